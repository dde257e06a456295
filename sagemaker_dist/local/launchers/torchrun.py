"""The launcher of a local ``distribution='torchrun'`` job: ``torchrun`` once per simulated host, as
sagemaker-training's ``TorchDistributedRunner`` runs it on each SageMaker host.

Host ``R`` of ``H`` gets ``torchrun --nnodes H --node_rank R --nproc_per_node P --master_addr
127.0.0.1 --master_port <free port>`` (a static rendezvous, as on SageMaker with ``algo-1:7777``), with
that host's ``/opt/ml`` tree and ``SM_*`` variables (local mode's job description, ``$SAGEMAKER_DIST_
LOCAL_JOB``); each rank it starts enters its host through ``sagemaker_dist.local.rank_entry``, which
runs the script with the arguments the toolkit passes. Local mode runs this module inside the job's
private network namespace, so the port is free there and nothing listens beyond loopback; there it
gives torchrun and the ranks an /etc/hosts that names the loopback's IPv4-mapped address, which
c10d's client looks up (``name_the_loopback``: no DNS answers in that namespace).

Under ``launcher="toolkit"`` (``--toolkit-state``) each simulated host is a toolkit host instead
(``toolkit_host``: AWS's ``train`` in a namespace of its own, its tree at ``/opt/ml``), and the toolkit
runs ``torchrun`` there as it does in the PyTorch DLC: ``--master_addr algo-1 --master_port 7777``
with several hosts. The hosts share the job's network namespace, where ``algo-N`` is loopback and
only algo-1 listens on 7777; ``PET_TEE=3`` in their environment makes torchrun tag each line.

It behaves like horovodrun towards local mode's supervisor: rank output relayed as
``[rank]<stdout>:line`` (torchrun's ``--tee 3`` tags a line with its local rank), the first host that
fails reported as ``Process name: rank`` / ``Exit code: c`` (the rank torchrun names), the other
hosts then stopped, and its exit code that host's.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

from sagemaker_dist.contract.environment import inherited, variable
from sagemaker_dist.local.launchers.tf_config import free_ports
from sagemaker_dist.local.launchers.toolkit_host import LOOPBACK_V4_MAPPED, hosts_file, toolkit_host_command
from sagemaker_dist.local.launchers.worker_group import supervise_workers
from sagemaker_dist.local.rank_entry import JOB_ENV

STOP_GRACE_S = 5.0
MASTER_ADDR = "127.0.0.1"
_TEE = re.compile(r"^\[[A-Za-z_]*?(\d+)\]:(.*)$")  # --tee 3: "[default0]:line" (role, local rank)
# torchrun's ChildFailedError summary: "  rank      : 1 (local_rank: 1)" then "  exitcode  : 1 (pid: ...)"
_FAILED_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank")
_FAILED_CODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_ROOT_CAUSE = "Root Cause (first observed failure)"
CLONE_NEWNS = 0x00020000


def torchrun_executable(python: str) -> list[str]:
    """``torchrun`` beside ``python`` (its venv), else ``python -m torch.distributed.run``."""
    beside = Path(python).parent / "torchrun"
    return [str(beside)] if beside.is_file() else [python, "-m", "torch.distributed.run"]


def host_command(
    python: str,
    hosts: int,
    node_rank: int,
    per_host: int,
    port: int,
    rank_cmd: list[str],
    log_dir: Path | None = None,
) -> list[str]:
    """One simulated host's torchrun, starting ``per_host`` ranks of ``rank_cmd`` (its own logs in
    ``log_dir``)."""
    logs = ["--log-dir", str(log_dir)] if log_dir is not None else []
    return [
        *torchrun_executable(python),
        "--nnodes",
        str(hosts),
        "--node_rank",
        str(node_rank),
        "--nproc_per_node",
        str(per_host),
        "--master_addr",
        MASTER_ADDR,
        "--master_port",
        str(port),
        "--tee",
        "3",
        *logs,
        "--no-python",
        *rank_cmd,
    ]


def host_group_command(
    python: str, host_python: str | os.PathLike, toolkit_state: Path | None = None, rank_cmd=()
) -> list[str]:
    """The command (run with ``python``) that starts every simulated host: torchrun from
    ``host_python``'s environment starting ``rank_cmd`` per rank, or, given ``toolkit_state``, a
    toolkit host with ``host_python`` as the container Python."""
    toolkit = ["--toolkit-state", str(toolkit_state)] if toolkit_state is not None else []
    launcher = [python, "-u", "-m", "sagemaker_dist.local.launchers.torchrun", "--python", str(host_python)]
    return [*launcher, *toolkit, "--", *rank_cmd]


def tee_tagged(line: str, first_rank: int) -> tuple[int, str] | None:
    """A line torchrun's ``--tee 3`` tagged with its local rank, as (the job's rank, text), on a host whose
    first rank is ``first_rank``; None for an untagged line."""
    tagged = _TEE.match(line)
    return (first_rank + int(tagged.group(1)), tagged.group(2)) if tagged else None


class TorchrunFailure:
    """The rank torchrun's error summary blames on one host, read line by line (``note``)."""

    def __init__(self):
        self.rank: int | None = None
        self.code: int | None = None
        self.root_cause = False

    def note(self, line: str) -> None:
        """Its "Root Cause (first observed failure)" wins, which torchrun prints after the ranks it
        stopped because of it (and the toolkit prints the summary twice)."""
        if _ROOT_CAUSE in line and not self.root_cause:
            self.root_cause, self.rank, self.code = True, None, None
        failed = _FAILED_RANK.match(line)
        if failed and self.rank is None:
            self.rank = int(failed.group(1))
        code = _FAILED_CODE.match(line)
        if code and self.code is None:
            self.code = int(code.group(1))


class _Host:
    """One simulated host's torchrun: its name and first rank (local mode's job description's)."""

    def __init__(self, name: str, first_rank: int, proc: subprocess.Popen):
        self.name, self.first_rank, self.proc = name, first_rank, proc
        self.failure = TorchrunFailure()


def _relay(host: _Host, lock: threading.Lock) -> None:
    for raw in host.proc.stdout:
        line = raw.rstrip("\n")
        tagged = tee_tagged(line, host.first_rank)
        with lock:
            if tagged:
                sys.stdout.write(f"[{tagged[0]}]<stdout>:{tagged[1]}\n")
            else:
                sys.stdout.write(f"{host.name}: {line}\n")
                host.failure.note(line)
            sys.stdout.flush()


def loopback_unnamed() -> bool:
    """The lookup c10d makes of the loopback (``LOOPBACK_V4_MAPPED``) fails here: in the job's network
    namespace /etc/hosts does not name it and no DNS server answers."""
    try:
        socket.getnameinfo((LOOPBACK_V4_MAPPED, 0), socket.NI_NUMERICSERV)
    except socket.gaierror:
        return True
    return False


def name_the_loopback(work: Path) -> bool:
    """Where the loopback is unnamed, move this process into a mount namespace of its own whose
    /etc/hosts (a copy in ``work``, bind-mounted) names it: torchrun and its ranks inherit it, so
    c10d's lookup is answered from the file (``toolkit_host.LOOPBACK_V4_MAPPED``). Call it before any
    thread starts. False when nothing was needed or it cannot be done (not root: then the job runs on
    this machine's network, whose DNS answers the lookup)."""
    if not loopback_unnamed():
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        return False
    copy = work / "etc-hosts"
    copy.write_text(hosts_file([]))
    for args in (["--make-rprivate", "/"], ["--bind", str(copy), "/etc/hosts"]):  # nothing leaks out
        if subprocess.run(["mount", *args], capture_output=True).returncode:
            return False
    return True


def _log_dir() -> Path:
    """torchrun's log dir: in local mode's work dir (beside its job description), removed with the
    job. Without one, torchrun makes a ``torchelastic_*`` folder in /tmp each run and leaves it."""
    logs = Path(variable(JOB_ENV)).parent / "torchelastic"
    logs.mkdir(exist_ok=True)
    return logs


def run_hosts(python: str, rank_cmd: list[str], toolkit_state: Path | None = None) -> int:
    """Start torchrun for every simulated host of local mode's job (or, given ``toolkit_state``, a
    toolkit host whose toolkit starts torchrun, its overlays under that dir); 0 when all end 0, else
    the first failure's code."""
    job = json.loads(Path(variable(JOB_ENV)).read_text())
    hosts = job["hosts"]
    names = [host["name"] for host in hosts]
    port = free_ports(1)[0] if toolkit_state is None else None  # the toolkit's: algo-1:7777
    logs = _log_dir() if toolkit_state is None else None
    lock = threading.Lock()
    running: list[_Host] = []
    relays = []
    for index, host in enumerate(hosts):
        if toolkit_state is None:  # the host's SM_* and /opt/ml are each rank's, from the rank entry
            env = inherited()
            # torchrun sets 1 and prints a banner about it where it is unset; every simulated host's
            # ranks share this machine's cores: say so once, quietly
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // len(job["ranks"]))))
            command = host_command(python, len(hosts), index, host["ranks"], port, rank_cmd, logs)
        else:  # the toolkit makes the host's SM_* and its torchrun command itself
            env = inherited()
            tree, state = Path(host["tree"]), toolkit_state / host["name"]
            command = toolkit_host_command(Path(python), tree, state, names)
        with lock:
            print("$ " + " ".join(command), flush=True)
        proc = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        running.append(_Host(host["name"], host["first_rank"], proc))
        relays.append(threading.Thread(target=_relay, args=(running[-1], lock), daemon=True))
        relays[-1].start()

    def failed_name(index: int, code: int) -> tuple[int, int]:  # the rank torchrun blamed, if it said
        failure = running[index].failure
        rank = failure.rank if failure.rank is not None else running[index].first_rank
        return rank, failure.code if failure.code is not None else code

    return supervise_workers([host.proc for host in running], relays, STOP_GRACE_S, failed_name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sagemaker_dist.local.launchers.torchrun")
    parser.add_argument("--python", default=sys.executable, help="the Python torchrun and the ranks run with")
    parser.add_argument(
        "--toolkit-state",
        type=Path,
        help="run each host as a toolkit host (AWS's train runs torchrun) with --python as the container "
        "Python and its overlays under this dir",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="each rank's command (after --)")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if variable(JOB_ENV) is None:
        raise SystemExit(f"{parser.prog}: ${JOB_ENV} is not set; local mode starts this module")
    if args.toolkit_state is None:  # a toolkit host names the loopback in its own /etc/hosts
        name_the_loopback(Path(variable(JOB_ENV)).parent)
    raise SystemExit(run_hosts(args.python, command, args.toolkit_state))


if __name__ == "__main__":
    main()
