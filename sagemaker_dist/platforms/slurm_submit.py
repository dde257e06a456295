"""Submit an sbatch script to the cluster ``$SLURM_CONF`` names and wait for its end (the I/O edge of
``slurm``). Waiting polls ``scontrol show job`` each second rather than ``sbatch --wait`` (which polls
at 2, 10 and 42 s), then returns the job's exit code."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from sagemaker_dist.errors import ConfigurationError, JobFailedError

TERMINAL_STATES = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE",
}  # fmt: skip
POLL_S = 1.0


class SlurmClientError(ConfigurationError):
    """No usable Slurm client here: SLURM_CONF or sbatch missing; says what to do."""


class SlurmJobFailed(JobFailedError):
    """sbatch refused the script, or the job's state could not be read."""


def check_slurm_client(environ=None) -> Path:
    """``$SLURM_CONF`` set to a readable file, and sbatch/scontrol on PATH; returns the conf path."""
    env = os.environ if environ is None else environ
    conf = env.get("SLURM_CONF")
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
        if not shutil.which(tool, path=env.get("PATH")):
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


def wait_for_job(job_id: str, echo=print, timeout: float | None = None) -> tuple[int, dict[str, str]]:
    """Wait until job ``job_id`` ends; returns (its exit code, its last fields). A job killed by a signal
    gives 128 + the signal, as the shell does."""
    started, last = time.monotonic(), None
    while True:
        fields = job_fields(job_id)
        state = fields.get("JobState", "")
        if state != last:
            echo(
                f"slurm job {job_id}: {state}"
                + (f" on {fields['NodeList']}" if fields.get("NodeList") else "")
            )
            last = state
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
