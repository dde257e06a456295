"""Stops mid-epoch and resume inside the epoch, with real ``horovodrun -np 2 --gloo`` ranks, real FIFOs
and TensorFlow (tests/helpers/stop_job.py).

Attempt 1 is sent SIGTERM (every rank, or one rank only) once rank 0 has trained a few batches of the
second epoch; it must end 0 with rank 0's checkpoint of the agreed step. Attempt 2 gets a fresh /opt/ml
tree (its FIFOs start again at ``train_<r>_0``, as after a spot restart) and the checkpoints, and must
train each remaining batch once: no epoch restarted, no batch skipped, at most the step in flight
repeated. Counted from the ids of the records each rank's train step saw.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.stop_jobs import feed_epochs, write_config

from sagemaker_dist.runtime.checkpoint_format import list_checkpoints

REPO = Path(__file__).resolve().parents[2]
WORLD, EPOCHS, BATCH, PER_RANK = 2, 3, 4, 64  # 16 steps an epoch
STEP_SLEEP = 0.15
ATTEMPT_TIMEOUT_S = 180  # one attempt: TensorFlow start-up per rank, 3 short epochs
SIGNAL_AFTER_BATCHES = 16 + 5  # of rank 0: the 6th batch of epoch 2


def _trained(out: Path, rank: int) -> list[dict]:
    path = out / f"trained-rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _run_attempt(
    attempt: int, root: Path, out: Path, stop_ranks=None, every=None, forwarder=False, extra_env=None
) -> tuple[int, str, float]:
    """One attempt under horovodrun; with ``stop_ranks``, SIGTERM those ranks mid-epoch (with
    ``forwarder``, horovodrun runs under the image's entry point and only it gets SIGTERM). Returns
    (exit code, output, seconds from the SIGTERM to the job's end)."""
    write_config(root, WORLD)
    deadline = time.monotonic() + ATTEMPT_TIMEOUT_S
    feed_epochs(root / "input" / "data", WORLD, PER_RANK, EPOCHS, deadline)
    env = {
        **(extra_env or {}),
        **os.environ,
        "SAGEMAKER_DIST_OPT_ML": str(root),
        "PYTHONPATH": str(REPO),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    entry = [sys.executable, "-m", "sagemaker_dist.host.stop_forwarding"] if forwarder else []
    command = [
        *entry,
        str(Path(sys.executable).with_name("horovodrun")), "-np", str(WORLD), "-H", f"localhost:{WORLD}",
        "--gloo",
        sys.executable, str(REPO / "tests" / "helpers" / "stop_job.py"), str(out), str(attempt), str(EPOCHS),
        str(BATCH), str(STEP_SLEEP), *([str(every)] if every else []),
    ]  # fmt: skip
    log_path = out / f"attempt{attempt}.log"
    signalled = None
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            while stop_ranks and proc.poll() is None and time.monotonic() < deadline:
                if len([b for b in _trained(out, 0) if b["attempt"] == str(attempt)]) >= SIGNAL_AFTER_BATCHES:
                    pids = (
                        [proc.pid]
                        if forwarder
                        else [int((out / f"pid-rank{r}").read_text()) for r in stop_ranks]
                    )
                    for pid in pids:
                        os.kill(pid, signal.SIGTERM)
                    signalled = time.monotonic()
                    break
                time.sleep(0.05)
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    took = time.monotonic() - signalled if signalled else 0.0
    return proc.returncode, log_path.read_text(errors="replace"), took


def _by_epoch(batches: list[dict], attempt: str) -> dict[int, list[list[int]]]:
    epochs: dict[int, list[list[int]]] = {}
    for b in batches:
        if b["attempt"] == attempt:
            epochs.setdefault(b["epoch"], []).append(b["ids"])
    return epochs


@pytest.mark.parametrize("stop_ranks", [(0, 1), (1,)], ids=["every-rank", "one-rank-only"])
def test_stopped_mid_epoch_then_resumed_trains_each_remaining_batch_once(tmp_path, stop_ranks):
    out = tmp_path / "out"
    out.mkdir()
    first, second = tmp_path / "attempt1", tmp_path / "attempt2"
    code, output, took = _run_attempt(1, first, out, stop_ranks)
    assert code == 0, output[-5000:]
    assert "stopped in epoch 2 after step" in output, output[-3000:]
    assert took < 30, f"the job took {took:.1f} s to end after SIGTERM"
    stops = [c for c in list_checkpoints(first / "checkpoints") if c.meta.get("stopped")]
    assert len(stops) == 1, list_checkpoints(first / "checkpoints")
    stop = stops[0]
    assert stop.epoch == 1 and 0 < stop.step < PER_RANK // BATCH
    assert stop.meta["records_consumed"] == [stop.step * BATCH] * WORLD  # every rank, the same steps
    for r in range(WORLD):  # the ranks trained exactly the checkpoint's steps of epoch 2, then stopped
        assert len(_by_epoch(_trained(out, r), "1")[1]) == stop.step
        assert not (out / f"finished-rank{r}-attempt1").exists()

    shutil.copytree(first / "checkpoints", second / "checkpoints")  # as managed spot restores them
    code, output, _ = _run_attempt(2, second, out)
    assert code == 0, output[-5000:]
    for r in range(WORLD):
        start = json.loads((out / f"start-rank{r}-attempt2.json").read_text())
        assert (start["initial_epoch"], start["resume_step"]) == (1, stop.step)
        shard = list(range(r * PER_RANK, (r + 1) * PER_RANK))
        batches = _trained(out, r)
        one, two = _by_epoch(batches, "1"), _by_epoch(batches, "2")
        assert sorted(sum(one[0], [])) == shard  # epoch 1: whole, in attempt 1
        assert 0 not in two  # no epoch restarted
        resumed = sum(one[1], []) + sum(two[1], [])
        assert resumed == shard, "epoch 2 across both attempts: every batch once, in order"
        assert sorted(sum(two[2], [])) == shard  # epoch 3: whole, in attempt 2


def test_sigterm_to_the_image_entry_point_reaches_every_rank_and_the_job_ends_0(tmp_path):
    """``python -m sagemaker_dist.host.stop_forwarding horovodrun ...``, as the image's PID 1 would run
    ``train``: SIGTERM to it alone, and every rank stops after the same step with rank 0's checkpoint."""
    out = tmp_path / "out"
    out.mkdir()
    code, output, took = _run_attempt(1, tmp_path / "job", out, stop_ranks=(0, 1), forwarder=True)
    assert code == 0, output[-5000:]
    assert "SIGTERM: forwarded to rank process(es)" in output and "stopped in epoch 2 after step" in output
    assert took < 30, f"the job took {took:.1f} s to end after SIGTERM"
    assert [c for c in list_checkpoints(tmp_path / "job" / "checkpoints") if c.meta.get("stopped")]


def test_a_stop_on_the_epochs_last_step_checkpoints_the_whole_epoch(tmp_path):
    """Rank 0 wants to stop from the agreement of epoch 2's last batch on (each epoch: 16 batches and the
    end marker), so the ranks agree on that epoch's last step: the checkpoint is of 2 whole epochs and
    the resumed job trains epoch 3 only."""
    out = tmp_path / "out"
    out.mkdir()
    last = (PER_RANK // BATCH + 1) + PER_RANK // BATCH
    code, output, _ = _run_attempt(1, tmp_path / "a1", out, extra_env={"STOP_AT_AGREEMENT": str(last)})
    assert code == 0, output[-5000:]
    assert f"stopped in epoch 2 after step {PER_RANK // BATCH} (its last) on every rank" in output, output[
        -3000:
    ]
    stop = list_checkpoints(tmp_path / "a1" / "checkpoints")[-1]
    assert stop.position == (2, 0) and stop.meta["stopped"]
    shutil.copytree(tmp_path / "a1" / "checkpoints", tmp_path / "a2" / "checkpoints")
    code, output, _ = _run_attempt(2, tmp_path / "a2", out)
    assert code == 0, output[-5000:]
    for r in range(WORLD):
        two = _by_epoch(_trained(out, r), "2")
        assert sorted(two) == [2] and sorted(sum(two[2], [])) == list(range(r * PER_RANK, (r + 1) * PER_RANK))


def test_periodic_step_checkpoints_on_rank0_only(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    code, output, _ = _run_attempt(1, tmp_path / "job", out, every=5)
    assert code == 0, output[-5000:]
    found = list_checkpoints(tmp_path / "job" / "checkpoints")
    # keep=3: the newest three of (epoch, step) ... ending with the last epoch's own checkpoint
    assert found[-1].position == (EPOCHS, 0)
    assert all(c.meta["rank"] == 0 for c in found)
    steps = [c for c in found if c.step]
    assert steps and all(c.step % 5 == 0 for c in steps)
