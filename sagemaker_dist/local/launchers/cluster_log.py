"""What the toolkit on each host of a several-host job has said so far, read from its log lines (pure).

sagemaker-training 4.8.3 waits without a bound on the master for every worker's SSH (an hour) and on
each worker for the master's (for ever); it reports each attempt in its log. Local mode bounds these
waits, and when one runs out it says from these lines which host never let the other in and why
(``Authentication failed.``, ``Unable to connect to port 22``), before any mpirun started.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

WAITING_FOR_WORKERS = "Waiting for MPI workers to establish their SSH connections"
MASTER_ONLINE = "MPI Master online, creating SSH daemon"  # a worker reached the master; its sshd starts
_WORKER_AVAILABLE = re.compile(r"Worker (\S+) available for communication")
_CANNOT_CONNECT = re.compile(r"Cannot connect to host (\S+)")
_CONNECTION_FAILED = "Connection failed with exception:"
_CAN_BE_IGNORED = re.compile(r"\.?\s*Can be ignored for worker.*$")
MPIRUN_LINE = re.compile(r"^mpirun --host ")  # the toolkit logs the command it runs


@dataclass
class HostProgress:
    """One host's toolkit, as far as its log tells."""

    name: str
    waiting_for_workers_since: float | None = None  # the master's SSH wait began (time.monotonic())
    available: set[str] = field(default_factory=set)  # workers the master reached
    reached_master: bool = False  # a worker reached the master, so started its own sshd
    last_refusal: dict[str, str] = field(default_factory=dict)  # host -> why the last SSH attempt failed
    mpirun_started: bool = False
    _refused: str | None = None  # the host of a "Cannot connect" whose reason is on a later line
    _reason_next: bool = False


def note_line(progress: HostProgress, line: str, now: float) -> None:
    """Update ``progress`` with one line of its host's output."""
    if WAITING_FOR_WORKERS in line and progress.waiting_for_workers_since is None:
        progress.waiting_for_workers_since = now
    elif MASTER_ONLINE in line:
        progress.reached_master = True
    elif MPIRUN_LINE.match(line):
        progress.mpirun_started = True
    if match := _WORKER_AVAILABLE.search(line):
        progress.available.add(match.group(1))
        return
    if match := _CANNOT_CONNECT.search(line):
        progress._refused = match.group(1)
        progress.last_refusal.setdefault(progress._refused, "no reason given")
        return
    if progress._refused and _CONNECTION_FAILED in line:
        rest = line.split(_CONNECTION_FAILED, 1)[1].strip()
        if rest:
            progress.last_refusal[progress._refused] = _CAN_BE_IGNORED.sub("", rest).strip() or rest
            progress._refused = None
        else:
            progress._reason_next = True  # "exception: \n <reason>. Can be ignored ..."
        return
    if progress._reason_next and progress._refused:
        reason = _CAN_BE_IGNORED.sub("", line).strip()
        progress.last_refusal[progress._refused] = reason or "no reason given"
        progress._refused, progress._reason_next = None, False


def hosts_not_reached(master: HostProgress, workers: list[str]) -> list[str]:
    """The workers the master has not reached by SSH yet."""
    return [w for w in workers if w not in master.available]


def ssh_wait_report(master: HostProgress, worker: HostProgress, waited_s: float) -> str:
    """Why ``worker`` never let ``master`` in, from both toolkits' lines."""
    said = master.last_refusal.get(worker.name)
    lines = [
        f"Its SSH did not let {master.name} in within {waited_s:.0f} s (local mode's bound on the toolkit's "
        "wait), so the toolkit's mpirun never started"
    ]
    if said:
        lines.append(f"{master.name}'s toolkit last said: cannot connect to host {worker.name}: {said}")
    if worker.reached_master:
        lines.append(f"{worker.name}'s toolkit reached {master.name} and started its sshd")
    elif master.name in worker.last_refusal:
        why = worker.last_refusal.get(master.name, "no reason given")
        lines.append(
            f"{worker.name}'s toolkit is still waiting to log into {master.name} ({why}); it starts its own "
            "sshd only after that"
        )
    else:
        lines.append(f"{worker.name}'s toolkit has said nothing about SSH yet")
    lines.append(
        "The image must give root password-less SSH between hosts, as the DLC does: /usr/sbin/sshd, root's "
        "key pair in /root/.ssh (id_rsa, with its id_rsa.pub in authorized_keys) and no host-key prompt "
        "(StrictHostKeyChecking no)"
    )
    return ". ".join(lines)
