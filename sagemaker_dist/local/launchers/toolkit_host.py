"""One simulated SageMaker host running AWS's own entry point: ``train`` of the sagemaker-training
toolkit, which reads /opt/ml and starts the ranks as in the DLC (its mpirun command, or torchrun on
each host of a torchrun job, several such hosts side by side).

This module is PID 1 of a private mount and PID namespace (``unshare -m -p -f --mount-proc``), so
its mounts vanish with it and killing it ends every process of the host. It needs what the toolkit
hard-codes and the platform provides:

- the host's tree at ``/opt/ml`` (an overlay on /opt, the tree bind-mounted on ``/opt/ml``): the
  ``gethostname.so`` that mpirun preloads into each rank opens
  ``/opt/ml/input/config/resourceconfig.json`` itself, whatever ``SAGEMAKER_BASE_DIR`` says;
- ``/usr/sbin/sshd``, which the MPI master only checks for and starts: a stub that sleeps, on an
  overlay of /usr/sbin (one host needs no SSH; a real sshd would also take port 22 on this machine);
- ``algo-N`` resolving in ``/etc/hosts`` (a copy with the names added, bind-mounted), and the
  loopback's IPv4-mapped address named there too (``hosts_file``).

It runs in the container environment (no SageMaker SDK) and imports nothing but the standard library.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sagemaker_dist.contract.paths import DEFAULT_ROOT

SSHD_STUB = (
    "#!/bin/sh\n# stands in for sshd: the toolkit's MPI master only starts it\nexec sleep 2147483647\n"
)
STOP_GRACE_S = 3.0
# torch.distributed's c10d client (TCPStore's, in torchrun and in every rank) tries the master's
# address as IPv6 first: the loopback as ::ffff:127.0.0.1, which it names with getnameinfo, a reverse
# lookup. /etc/hosts names 127.0.0.1 only and the job's network namespace reaches no DNS server, so
# the lookup fails (EAI_AGAIN) and each process prints "[c10d] The hostname of the client socket
# cannot be retrieved. err=-3". A line naming that address answers the lookup from the file.
LOOPBACK_V4_MAPPED = "::ffff:127.0.0.1"


def _mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"toolkit host: mount {' '.join(args)} failed: {proc.stderr.strip()}")


def _overlay(target: str, state: Path, files: dict[str, str]) -> Path:
    """Lay a writable overlay on ``target`` whose upper dir holds ``files``; returns the upper dir."""
    name = target.strip("/").replace("/", "-")
    upper, work = state / f"{name}-upper", state / f"{name}-work"
    for d in (upper, work):
        d.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        path = upper / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    _mount("-t", "overlay", "overlay", "-o", f"lowerdir={target},upperdir={upper},workdir={work}", target)
    return upper


def prepare_host(tree: Path, state: Path, hosts: list[str]) -> None:
    """Mount what the toolkit expects of a SageMaker host (inside this private mount namespace)."""
    # The overlays' upper and work dirs on a tmpfs of this namespace's own: an overlay's upper dir cannot
    # lie on an overlay, which a container's own root (its /tmp included) is. They hold next to nothing.
    state.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", "mode=0700,size=64m", "tmpfs", str(state))
    _overlay("/opt", state, {})
    Path(DEFAULT_ROOT).mkdir(exist_ok=True)
    _mount("--bind", str(tree), DEFAULT_ROOT)
    _overlay("/usr/sbin", state, {"sshd": SSHD_STUB})
    etc_hosts = state / "hosts"
    etc_hosts.write_text(hosts_file(hosts))
    _mount("--bind", str(etc_hosts), "/etc/hosts")


def hosts_file(hosts: list[str], etc_hosts: Path = Path("/etc/hosts")) -> str:
    """This machine's /etc/hosts with ``hosts`` (``algo-N``) on the loopback and the loopback's
    IPv4-mapped address named (``LOOPBACK_V4_MAPPED``), which c10d looks up."""
    known = etc_hosts.read_text() if etc_hosts.exists() else ""
    text = known.rstrip("\n") + "\n"
    if hosts:
        text += "127.0.0.1 " + " ".join(hosts) + "\n"
    return text + f"{LOOPBACK_V4_MAPPED} localhost\n"


def run_toolkit(train: list[str]) -> int:
    """Start the toolkit's entry point and reap orphans (PID 1's duty) until it ends; SIGTERM or
    SIGINT is passed to every process of the host, which gets ``STOP_GRACE_S`` before PID 1 leaves
    (and the kernel kills what is left)."""
    child = subprocess.Popen(train, cwd="/")
    stopping: list[float] = []

    def stop(signum, frame):
        if not stopping:
            stopping.append(time.monotonic())
            os.kill(-1, signal.SIGTERM)  # from PID 1: every other process of this namespace

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 1
        if pid == child.pid:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code  # killed by a signal: the shell's 128 + N
        if pid == 0:
            if stopping and time.monotonic() - stopping[0] > STOP_GRACE_S:
                return 128 + signal.SIGTERM
            time.sleep(0.05)


def toolkit_host_command(python: Path, tree: Path, state: Path, hosts: list[str]) -> list[str]:
    """The command that runs one simulated host: a new namespace, our set-up as its PID 1, then the
    toolkit's ``train`` (the DLC's entry point) from the container environment."""
    train = python.parent / "train"
    return [
        # --kill-child: unshare ignores SIGTERM; when it is killed, this host's PID 1 gets SIGTERM and
        # stops every process of the host (the namespace ends with it)
        "unshare", "-m", "-p", "-f", "--kill-child=SIGTERM", "--mount-proc",
        str(python), "-m", "sagemaker_dist.local.launchers.toolkit_host",
        "--tree", str(tree), "--state", str(state), "--hosts", ",".join(hosts),
        str(python), str(train),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sagemaker_dist.local.launchers.toolkit_host")
    parser.add_argument("--tree", required=True, type=Path, help="the host's /opt/ml tree")
    parser.add_argument("--state", required=True, type=Path, help="a private dir for overlays")
    parser.add_argument("--hosts", required=True, help="comma-separated algo-N names")
    parser.add_argument("train", nargs=argparse.REMAINDER, help="the toolkit's entry point command")
    args = parser.parse_args(argv)
    if os.getpid() != 1:
        raise SystemExit("toolkit host: run me as PID 1 of a new namespace (unshare -m -p -f --mount-proc)")
    prepare_host(args.tree, args.state, args.hosts.split(","))
    code = run_toolkit(args.train)
    sys.stdout.flush()
    raise SystemExit(code)


if __name__ == "__main__":
    main()
