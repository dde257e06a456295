"""An entry point that hands a stop to every rank: ``python -m sagemaker_dist.host.stop_forwarding CMD ...``.

SageMaker stops a job (a stop, a spot interruption) by sending SIGTERM to the container's PID 1 and
SIGKILL about 120 s later. In the DLC, PID 1 is the toolkit's ``train`` (sagemaker-training 4.8.3 installs
no SIGTERM handler, so it just dies) and the ranks are mpirun's children, or orted's on the other hosts:
what reaches them depends on who dies first. Run as the image's entry point, this module starts CMD
(``train``; the toolkit itself unchanged) and, on SIGTERM, sends SIGTERM to every rank process of the
container (the Python processes below it whose environment names a rank), and to nothing else: the ranks
agree on a step, checkpoint it and exit 0 (``runtime/stop.py``), then mpirun and the toolkit end
as after a normal run. CMD's exit status is this process's. As PID 1 it also reaps orphans.
If CMD has not ended ``grace`` seconds after the signal, it and its processes get SIGKILL (bounded,
before the platform's own). Local mode's interruptions find the ranks the same way (``rank_processes``).

A rank takes SIGTERM once the runtime's ``setup()`` has installed its handler; before that (TensorFlow's
import, a rank mpirun is still starting) SIGTERM would kill it, and with it the job. So a rank gets the
signal once its handler is in (``SigCgt`` in /proc), or ``HANDLER_WAIT_S`` after the stop (a script
without the runtime); ranks that start after the stop get it too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sagemaker_dist.contract.distributions import rank_markers
from sagemaker_dist.host.processes import descendants

# OMPI_COMM_WORLD_RANK, HOROVOD_RANK, TF_CONFIG: each registered distribution's (its registry entry)
RANK_ENVIRONMENT = tuple(f"{name}=".encode() for name in rank_markers())
DEFAULT_GRACE_S = 110.0  # SIGTERM to SIGKILL of what is left: inside SageMaker's 120 s
HANDLER_WAIT_S = 30.0  # the longest a rank's SIGTERM waits for its handler


def is_rank(exe: str, environ: bytes) -> bool:
    """A rank process: a Python interpreter whose environment names its rank (mpirun's, horovodrun's
    or TF_CONFIG: a registered distribution's); mpirun, orted, the toolkit and horovodrun's shell
    wrappers are not."""
    return os.path.basename(exe).startswith("python") and any(
        b"\0" + key in b"\0" + environ for key in RANK_ENVIRONMENT
    )


def rank_processes(root: int) -> list[int]:
    """The rank processes below ``root``."""
    found = []
    for pid in sorted(descendants([root])):
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if is_rank(exe, environ):
            found.append(pid)
    return found


def takes_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a SIGTERM handler installed (its ``SigCgt`` mask in /proc)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _signal_all(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def run(command: list[str], grace: float = DEFAULT_GRACE_S, echo=None, term_after_ranks: bool = False) -> int:
    """Run ``command``; forward SIGTERM to its ranks and SIGINT to it; return its exit status. With
    ``term_after_ranks`` (a command that does not end with its ranks: a Kubernetes worker's sshd), the
    command itself gets SIGTERM once the ranks signalled have ended."""
    echo = echo or (lambda text: print(f"[stop-forwarding] {text}", file=sys.stderr, flush=True))
    child = subprocess.Popen(command)
    stopped_at: list[float] = []
    signalled: set[int] = set()

    def forward() -> None:
        """SIGTERM to each rank not signalled yet whose handler is in (or that waited long enough)."""
        waited = time.monotonic() - stopped_at[0] > HANDLER_WAIT_S
        ranks = [p for p in rank_processes(child.pid) if p not in signalled and (waited or takes_sigterm(p))]
        if ranks:
            echo(f"SIGTERM: forwarded to rank process(es) {ranks}; {grace:.0f} s for the job to end")
            _signal_all(ranks, signal.SIGTERM)
            signalled.update(ranks)

    def on_term(signum, frame):
        if not stopped_at:
            stopped_at.append(time.monotonic())
            echo(f"SIGTERM: to be forwarded to every rank once its handler is in; {grace:.0f} s for the job")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, lambda signum, frame: _signal_all([child.pid], signal.SIGINT))
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)  # as PID 1: orphans are ours to reap
        except ChildProcessError:
            break
        if pid == child.pid:
            code = os.waitstatus_to_exitcode(status)
            return code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as a shell says
        if pid == 0:
            if stopped_at and stopped_at[0] != float("inf"):
                forward()
                if term_after_ranks and signalled and not rank_processes(child.pid):
                    echo("the ranks have ended: SIGTERM to the command")
                    _signal_all([child.pid], signal.SIGTERM)
                    term_after_ranks = False
            if stopped_at and time.monotonic() - stopped_at[0] > grace:
                echo(f"the job did not end within {grace:.0f} s of SIGTERM: SIGKILL")
                _signal_all([*descendants([child.pid]), child.pid], signal.SIGKILL)
                stopped_at[0] = float("inf")  # once
            time.sleep(0.1)
    return child.wait()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    grace, term_after_ranks = DEFAULT_GRACE_S, False
    while args[:1] in (["--grace"], ["--term-after-ranks"]):
        if args[0] == "--term-after-ranks":
            term_after_ranks, args = True, args[1:]
        elif len(args) > 1:
            grace, args = float(args[1]), args[2:]
        else:
            args = []
    if not args:
        print(
            f"usage: python -m {__name__} [--grace SECONDS] [--term-after-ranks] COMMAND [ARG ...]",
            file=sys.stderr,
        )
        return 2
    return run(args, grace, term_after_ranks=term_after_ranks)


if __name__ == "__main__":
    sys.exit(main())
