"""Epochs that end together without record counts, under real ``horovodrun`` ranks (Gloo) and Keras."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.horovod, pytest.mark.tensorflow]

HELPERS = Path(__file__).resolve().parents[1] / "helpers"


def test_ranks_agree_on_every_epochs_end_even_when_epochs_differ_in_length():
    """Rank 0 has 6, 3, then 8 batches, rank 1 has 7: every epoch ends at the shorter one's end on both
    ranks (Keras would otherwise take the first epoch's 6 steps for all and stop at the short one)."""
    horovodrun = str(Path(sys.executable).parent / "horovodrun")
    command = [
        horovodrun,
        "--gloo",
        "-np",
        "2",
        "-H",
        "localhost:2",
        sys.executable,
        str(HELPERS / "agreement_job.py"),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = sorted(
        (json.loads(line.split("RESULT ", 1)[1]) for line in proc.stdout.splitlines() if "RESULT " in line),
        key=lambda r: r["rank"],
    )
    assert [r["steps"] for r in results] == [[6, 3, 7], [6, 3, 7]]
    assert results[0]["weights"] == results[1]["weights"]
    # what the longer rank had read ahead at each cut is reported, not silently dropped
    assert results[0]["left"] == [[0, 4], [0, 4], [4, 0]]
    assert "train epoch ended for every rank after 3 step(s): rank(s) 0 ran out of data" in proc.stdout
