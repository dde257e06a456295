"""Submit an sbatch script to the cluster ``$SLURM_CONF`` names and wait for its end (the I/O edge of
``slurm``). Waiting polls ``scontrol show job`` each second rather than ``sbatch --wait`` (which polls
at 2, 10 and 42 s), says why a pending job waits whenever Slurm's reason changes, cancels a job whose
reason never clears (``never_clears``) and otherwise returns the job's exit code."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

from sagemaker_dist.contract.environment import search_path, slurm_conf
from sagemaker_dist.errors import ConfigurationError, JobFailedError

TERMINAL_STATES = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE",
}  # fmt: skip
POLL_S = 1.0
NO_REASON = {"", "None", "(null)"}  # the scheduler has not looked at the job yet, or it runs

# What a pending job's reason (squeue(1)'s JOB REASON CODES, Slurm 22.05) says while it waits: the
# reasons that clear on their own (nodes come back, other jobs end, a hold is released).
WAITING = {
    "Resources": "waiting for nodes to be free",
    "Priority": "jobs of higher priority go first",
    "ReqNodeNotAvail": "a node it needs is not available now (in use, reserved, down or drained)",
    "NodeDown": "a node it needs is down",
    "PartitionDown": "its partition is DOWN",
    "PartitionInactive": "its partition is INACTIVE",
    "PartitionNodeLimit": "nodes it needs are down or drained",
    "QOSJobLimit": "its QOS runs as many jobs as it may",
    "Dependency": "waiting for a job it depends on",
    "BeginTime": "its start time has not come",
    "JobHeldUser": "held by its user (scontrol release)",
    "JobHeldAdmin": "held by an administrator",
    "Reservation": "waiting for its reservation",
    "Licenses": "waiting for a license",
}
# A maximum per job or per node, or a minimum, of the job's QOS or association (QOSMaxNodePerJobLimit,
# AssocMaxGRESPerNode, QOSMinGRES, ...): the request itself breaks it, so only a smaller (larger)
# request or an administrator's new limit lets it run. Not the PerUser, PerAccount and Grp limits:
# those clear as the user's other jobs end.
PER_REQUEST_LIMIT = re.compile(r"^(QOS|Assoc)(Max\w*Per(Job|Node)\w*|Min\w+)$")


class SlurmClientError(ConfigurationError):
    """No usable Slurm client here: SLURM_CONF or sbatch missing; says what to do."""


class SlurmJobFailed(JobFailedError):
    """sbatch refused the script, the job's state could not be read, or it can never start."""


def check_slurm_client(environ=None) -> Path:
    """``$SLURM_CONF`` set to a readable file, and sbatch/scontrol on PATH; returns the conf path."""
    conf = slurm_conf(environ)
    if not conf:
        raise SlurmClientError(
            "SLURM_CONF is not set: point it at your cluster's slurm.conf (export "
            "SLURM_CONF=/etc/slurm/slurm.conf; for a private test cluster: "
            'eval "$(scripts/slurm-cluster.sh up)"), '
            "or drop --submit to only write the script"
        )
    if not Path(conf).is_file():
        raise SlurmClientError(f"SLURM_CONF={conf} is not a file; point it at your cluster's slurm.conf")
    for tool in ("sbatch", "scontrol"):
        if not shutil.which(tool, path=search_path(environ)):
            raise SlurmClientError(
                f"{tool} is not on PATH: install the Slurm client (Debian: apt-get install slurm-client) or "
                "run on a login node, or drop --submit to only write the script"
            )
    return Path(conf)


def submit(script: Path) -> str:
    """``sbatch --parsable script``; returns the job id."""
    proc = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    if proc.returncode:
        raise SlurmJobFailed(f"sbatch refused {script}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout.strip().split(";")[0]


def job_fields(job_id: str) -> dict[str, str]:
    """``scontrol show job -o ID`` as a dict (JobState, ExitCode, StdOut, NodeList, ...)."""
    proc = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=60
    )
    if proc.returncode:
        raise SlurmJobFailed(f"cannot read the state of job {job_id}: {proc.stderr.strip()}")
    return dict(re.findall(r"(\w+)=(\S*)", proc.stdout))


def partition_fields(name: str) -> dict[str, str]:
    """``scontrol show partition -o NAME`` as a dict (TotalNodes, MaxNodes, MinNodes, MaxTime, ...);
    empty when it cannot be read."""
    proc = subprocess.run(
        ["scontrol", "show", "partition", "-o", name], capture_output=True, text=True, timeout=60
    )
    return {} if proc.returncode else dict(re.findall(r"(\w+)=(\S*)", proc.stdout))


def _number(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:  # UNLIMITED, (null)
        return None


def _outside_partition(fields: dict[str, str]) -> str | None:
    """How the job's node count is outside its partition's (more nodes than it has or allows, fewer than
    it needs), or None: PartitionNodeLimit then means nodes it needs are down or drained."""
    partition = fields.get("Partition", "")
    low, _, high = fields.get("NumNodes", "").partition("-")
    low_n, high_n = _number(low), _number(high or low)
    if not partition or low_n is None:
        return None
    part = partition_fields(partition)
    total, most, least = (_number(part.get(k)) for k in ("TotalNodes", "MaxNodes", "MinNodes"))
    if total is not None and low_n > total:
        return f"it asks for {low_n} node(s), partition {partition} has {total}"
    if most is not None and low_n > most:
        return f"it asks for {low_n} node(s), partition {partition} allows a job {most} (MaxNodes)"
    if least and high_n is not None and high_n < least:
        return f"it asks for {high_n} node(s), partition {partition} needs a job to take {least} (MinNodes)"
    return None


def never_clears(reason: str, fields: dict[str, str]) -> tuple[str, str] | None:
    """(what the reason means for this job, what to do) when a pending job's ``reason`` is one Slurm
    never clears by itself: only an administrator's change of the cluster or a different request lets
    the job run, so waiting on it waits forever. None for a reason that can clear: the nodes come back
    (ReqNodeNotAvail, NodeDown, and PartitionNodeLimit within the partition's node count), the partition
    comes back up (PartitionDown, PartitionInactive: maintenance), other jobs end (QOSJobLimit, the Grp,
    PerUser and PerAccount limits), a hold is released, or the scheduler gets to it."""
    partition = fields.get("Partition") or "?"
    asks = (
        f"it asks for {fields.get('NumTasks', '?')} task(s) on {fields.get('NumNodes', '?')} node(s), "
        f"{fields.get('NumCPUs', '?')} CPU(s)"
    )
    where = f"--partition, or ask the cluster's administrators (scontrol show partition {partition})"
    if reason == "PartitionConfig":
        return (
            f"partition {partition}'s nodes cannot hold what the job asks for ({asks}; more tasks, CPUs, "
            "memory or GPUs per node than its nodes have)",
            f"ask for what its nodes have (--tasks-per-node, --gpus-per-node, --nodes; sinfo -p {partition} "
            f"-o '%N %c %m %G' lists them), or pick another {where}",
        )
    if reason == "PartitionNodeLimit":
        outside = _outside_partition(fields)
        if outside is None:
            return None
        return outside, f"ask for fewer --nodes (or as many as it needs), or pick another {where}"
    if reason == "PartitionTimeLimit":
        return (
            f"the job's time limit ({fields.get('TimeLimit', '?')}) exceeds partition {partition}'s MaxTime",
            "lower the request's StoppingCondition.MaxRuntimeInSeconds (max_run), which sets the script's "
            f"--time, or pick another {where}",
        )
    if reason == "BadConstraints":
        return (
            f"no node can satisfy the job's constraints ({fields.get('Features', '?')})",
            "change or drop the constraint",
        )
    if reason in ("InvalidAccount", "AccountNotAllowed"):
        return (
            f"the job's account ({fields.get('Account', '?')}) is not valid"
            + (f" in partition {partition}" if reason == "AccountNotAllowed" else ""),
            "submit under an account of yours that may use the partition (SBATCH_ACCOUNT; sacctmgr show "
            f"assoc user=$USER lists them), or pick another {where}",
        )
    if reason in ("InvalidQOS", "QOSNotAllowed"):
        return (
            f"the job's QOS ({fields.get('QOS', '?')}) is not valid"
            + (f" in partition {partition}" if reason == "QOSNotAllowed" else ""),
            "submit with a QOS of your association (SBATCH_QOS; sacctmgr show assoc user=$USER), or pick "
            f"another {where}",
        )
    if reason == "DependencyNeverSatisfied":
        return (
            "a job it depends on ended in a way its dependency rules out",
            "submit it without that dependency",
        )
    if PER_REQUEST_LIMIT.match(reason):
        kind, table = ("QOS", "qos") if reason.startswith("QOS") else ("association", "assoc")
        return (
            f"the request itself breaks a per-job or per-node limit of its {kind} ({asks})",
            f"ask for less (sacctmgr show {table} lists the limits), or ask the cluster's administrators",
        )
    return None


def _pending_line(reason: str, fields: dict[str, str]) -> str:
    """`` (REASON: what it means)`` for a pending job's reason, Slurm's own words kept
    (``ReqNodeNotAvail,_UnavailableNodes:n2`` is shown with its spaces)."""
    code = reason.split(",")[0]
    shown = reason.replace("_", " ")
    meaning = WAITING.get(code)
    if code == "PartitionNodeLimit":
        meaning = _outside_partition(fields) or meaning
    return f" ({shown}: {meaning})" if meaning else f" ({shown})"


def wait_for_job(job_id: str, echo=print, timeout: float | None = None) -> tuple[int, dict[str, str]]:
    """Wait until job ``job_id`` ends; returns (its exit code, its last fields). A job killed by a signal
    gives 128 + the signal, as the shell does. Says why a pending job waits each time Slurm's reason
    changes; a pending job whose reason never clears (``never_clears``) is cancelled and raises
    SlurmJobFailed naming the reason, what it means and what to do."""
    started, last = time.monotonic(), None
    while True:
        fields = job_fields(job_id)
        state = fields.get("JobState", "")
        reason = fields.get("Reason", "") if state == "PENDING" else ""
        reason = "" if reason in NO_REASON else reason
        if (state, reason) != last:
            echo(
                f"slurm job {job_id}: {state}"
                + (f" on {fields['NodeList']}" if fields.get("NodeList") else "")
                + (_pending_line(reason, fields) if reason else "")
            )
            last = state, reason
        stuck = never_clears(reason.split(",")[0], fields) if reason else None
        if stuck is not None:
            meaning, what_to_do = stuck
            subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
            raise SlurmJobFailed(
                f"slurm job {job_id} can never start: it is pending with reason {reason} ({meaning}), which "
                "Slurm does not clear by itself, so it was cancelled. To run it, "
                f"{what_to_do}"
            )
        if state in TERMINAL_STATES:
            code, _, signal = fields.get("ExitCode", "0:0").partition(":")
            code = int(code or 0) or (128 + int(signal) if signal and int(signal) else 0)
            if state != "COMPLETED" and code == 0:
                code = 1  # cancelled, timed out, node failure: not a success
            return code, fields
        if timeout is not None and time.monotonic() - started > timeout:
            subprocess.run(["scancel", job_id], capture_output=True, timeout=60)
            raise SlurmJobFailed(f"job {job_id} ran past {timeout:.0f} s; cancelled it")
        time.sleep(POLL_S)
