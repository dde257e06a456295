"""Real ``torchrun`` jobs over real FIFOs fed like SageMaker's Pipe mode, for the PyTorch runtime's tests.

A job's script writes one JSON line per event to ``$TEST_OUT/rank<R>.jsonl``; ``TorchrunJob.events``
reads them back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from helpers.runtime_helpers import FifoFeeder

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")
JOB_TIMEOUT_S = 120  # no job may hang: every collective is bounded too (30 s)


class TorchrunJob:
    def __init__(self, proc: subprocess.CompletedProcess, out: Path, seconds: float, feeders):
        self.proc, self.out, self.seconds, self.feeders = proc, out, seconds, feeders

    @property
    def output(self) -> str:
        return self.proc.stdout + self.proc.stderr

    def events(self, rank: int, event: str | None = None) -> list[dict]:
        path = self.out / f"rank{rank}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [r for r in rows if event is None or r["event"] == event]


def run_torchrun(
    script: Path,
    root: Path,
    out: Path,
    shards: dict[str, list[bytes]],
    *,
    nproc: int = 2,
    timeout: float = JOB_TIMEOUT_S,
    monitor_interval: float | None = None,
    **env,
) -> TorchrunJob:
    """Feed each channel's epochs through FIFOs and run ``script`` under torchrun with ``nproc`` ranks
    (``monitor_interval``: how often torchrun looks at its ranks, and so how soon after one fails it stops
    the others; torchrun's own default where None)."""
    out.mkdir(parents=True, exist_ok=True)
    feeders = [FifoFeeder(root / "input" / "data", ch, epochs) for ch, epochs in shards.items()]
    for f in feeders:
        f.start()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "HOROVOD_", "PMIX_", "SM_"))}
    environ.update(
        SAGEMAKER_DIST_OPT_ML=str(root),
        SAGEMAKER_DIST_COLLECTIVE_TIMEOUT="30",
        SAGEMAKER_DIST_STOP_GRACE="30",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO),
        TEST_OUT=str(out),
    )
    environ.update(env)  # the test's own settings win
    command = [str(TORCHRUN), "--standalone", "--nnodes", "1", "--nproc_per_node", str(nproc)]
    if monitor_interval is not None:
        command += ["--monitor-interval", str(monitor_interval)]
    command.append(str(script))
    started = time.monotonic()
    proc = subprocess.run(command, cwd=REPO, env=environ, capture_output=True, text=True, timeout=timeout)
    return TorchrunJob(proc, out, time.monotonic() - started, feeders)
