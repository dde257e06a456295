"""A shuffled epoch stopped and resumed exactly: real ``torchrun`` jobs (2 Gloo ranks) over real FIFOs.

Each job trains 3 epochs of 64 records per rank (ids ``rank * 1000 + i``) in batches of 4 through a
seeded shuffle window of 24 records; rank 1 takes a SIGTERM in epoch 1 (0-based), every rank stops
after the same step and rank 0 checkpoints it; the next attempt gets fresh FIFOs from ``_0`` again, as
a restarted SageMaker job does. Counted per rank and epoch over both attempts: every id exactly once,
in the order the uninterrupted job would have trained them (the window's arithmetic on each FIFO's
stream), another order each epoch. Two orders of the channel's objects: the same every epoch (no
ShuffleConfig; the planner's seeded order), and another each epoch (ShuffleConfig: FIFO n carries the
objects in the n-th permutation, so the resumed epoch must read the FIFO the stopped one read).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import shuffled_ids
from helpers.runtime_helpers import write_opt_ml
from helpers.torchrun_job import run_torchrun

from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.contract.record_formats import encode_tfrecord
from sagemaker_dist.local.demo_data import encode_example
from sagemaker_dist.runtime.framing import shuffle as sh

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).with_name("shuffle_resume_script.py")
RECORDS, OBJECT, BATCH, EPOCHS, SEED, WINDOW = 64, 8, 4, 3, 5, 24
SHUFFLE_CONFIG_SEED = 11


def fifo_ids(rank: int, fifo: int, per_epoch: bool) -> list[int]:
    return shuffled_ids.fifo_ids(rank, fifo, RECORDS, OBJECT, SHUFFLE_CONFIG_SEED if per_epoch else None)


def encode(ids: list[int], reader: str) -> bytes:
    if reader == "pipe":
        return b"".join(encode_tfrecord(encode_example({"id": i})) for i in ids)
    return b"".join(encode_tfrecord(i.to_bytes(8, "little") + bytes(8)) for i in ids)


def reference(rank: int, epoch: int, fifo: int, per_epoch: bool) -> list[int]:
    """The order the uninterrupted job trains epoch ``epoch`` of rank ``rank`` in, reading FIFO ``fifo``."""
    ids = fifo_ids(rank, fifo, per_epoch)
    return shuffled_ids.window_order(
        ids, [1] * len(ids), sh.ShuffleWindow(SEED, records=WINDOW), rank, f"train_{rank}", epoch
    )


def trained(job, rank: int) -> dict[int, list[int]]:
    by_epoch: dict[int, list[int]] = {}
    for row in job.events(rank, "step"):
        by_epoch.setdefault(row["epoch"], []).extend(row["ids"])
    return by_epoch


def run_stopped_and_resumed(base: Path, reader: str, per_epoch: bool):
    layout = plan_layout(1, 2, shuffle_seed=SHUFFLE_CONFIG_SEED if per_epoch else None)
    root = write_opt_ml(base / "opt_ml", ["train_0", "train_1"], layout)

    def feeds(fifos: int):
        return {
            f"train_{r}": [encode(fifo_ids(r, n, per_epoch), reader) for n in range(fifos)] for r in (0, 1)
        }

    env = {
        "TEST_READER": reader,
        "TEST_SEED": str(SEED),
        "TEST_WINDOW": str(WINDOW),
        "TEST_EPOCHS": str(EPOCHS),
    }
    stopped = run_torchrun(SCRIPT, root, base / "out-1", feeds(EPOCHS), TEST_STOP_AT="1:5", **env)
    # the restarted job: fresh /opt/ml FIFOs and epoch counters, the checkpoints kept
    for path in (root / "input" / "data").iterdir():
        path.unlink()
    shutil.rmtree(root / "pipe_state", ignore_errors=True)
    resumed = run_torchrun(SCRIPT, root, base / "out-2", feeds(EPOCHS), **env)
    return stopped, resumed


@pytest.fixture(
    scope="module",
    params=[("pipe", False), ("pipe", True), ("fixed", True)],
    ids=["PipeBatches-same-objects", "PipeBatches-ShuffleConfig", "RecordBatches-ShuffleConfig"],
)
def jobs(request, tmp_path_factory):
    reader, per_epoch = request.param
    stopped, resumed = run_stopped_and_resumed(
        tmp_path_factory.mktemp(f"{reader}-{per_epoch}"), reader, per_epoch
    )
    return stopped, resumed, per_epoch


def test_every_record_of_every_epoch_is_trained_once_over_the_two_attempts(jobs):
    stopped, resumed, per_epoch = jobs
    assert stopped.proc.returncode == 0, stopped.output[-4000:]
    assert resumed.proc.returncode == 0, resumed.output[-4000:]
    assert "does not start with the records" not in resumed.output  # the stream replayed: heads equal
    for rank in (0, 1):
        (stop,) = stopped.events(rank, "stopped")
        epoch, step = stop["epoch"], stop["step"]
        assert epoch == 1 and 0 < step < RECORDS // BATCH  # stopped inside epoch 1
        (start,) = resumed.events(rank, "start")
        assert (start["epoch"], start["step"]) == (1, step)
        one, two = trained(stopped, rank), trained(resumed, rank)
        shard = sorted(fifo_ids(rank, 0, False))
        assert sorted(one[0]) == shard and 0 not in two  # epoch 0 whole, once, not again
        assert len(one[1]) == step * BATCH
        assert sorted(one[1] + two[1]) == shard  # the stopped epoch: every record once over both
        assert sorted(two[2]) == shard  # the later epoch whole
        orders = [one[0], one[1] + two[1], two[2]]
        assert len({tuple(o) for o in orders}) == 3  # another order each epoch


def test_the_resumed_epoch_trains_the_rest_of_the_uninterrupted_order(jobs):
    stopped, resumed, per_epoch = jobs
    for rank in (0, 1):
        one, two = trained(stopped, rank), trained(resumed, rank)
        # the uninterrupted job: epoch e reads FIFO e; the restarted one reads FIFO 1 for epoch 1 again
        # where the objects come in another order each epoch (FIFO 0 closed unread first)
        assert one[0] == reference(rank, 0, 0, per_epoch)
        assert one[1] + two[1] == reference(rank, 1, 1, per_epoch)
        assert two[2] == reference(rank, 2, 2 if per_epoch else 0, per_epoch)
    if per_epoch:  # FIFOs 0 (closed unread), 1 and 2 of the second attempt were opened
        assert all(f.served == EPOCHS for f in resumed.feeders)


def test_a_resume_on_another_world_size_starts_the_next_epoch_and_says_so(tmp_path_factory):
    """The stopped 2-rank job relaunched with 1 rank (a new layout, the same checkpoints)."""
    base = tmp_path_factory.mktemp("other-world")
    root = write_opt_ml(base / "opt_ml", ["train_0", "train_1"], plan_layout(1, 2))
    env = {
        "TEST_READER": "pipe",
        "TEST_SEED": str(SEED),
        "TEST_WINDOW": str(WINDOW),
        "TEST_EPOCHS": str(EPOCHS),
    }
    feeds = {f"train_{r}": [encode(fifo_ids(r, 0, False), "pipe")] * EPOCHS for r in (0, 1)}
    stopped = run_torchrun(SCRIPT, root, base / "out-1", feeds, TEST_STOP_AT="1:5", **env)
    assert stopped.proc.returncode == 0, stopped.output[-4000:]
    (stop,) = stopped.events(0, "stopped")
    one = write_opt_ml(base / "one" / "opt_ml", ["train_0"], plan_layout(1, 1))
    shutil.copytree(root / "checkpoints", one / "checkpoints")
    feeds = {"train_0": [encode(fifo_ids(0, 0, False), "pipe")] * EPOCHS}
    resumed = run_torchrun(SCRIPT, one, base / "out-2", feeds, nproc=1, **env)
    assert resumed.proc.returncode == 0, resumed.output[-4000:]
    assert (
        f"the checkpoint was written inside epoch 2 (after step {stop['step']}) by 2 rank(s) and this job "
        "runs 1" in resumed.output
    )
    assert "resuming at the start of epoch 3" in resumed.output
    (start,) = resumed.events(0, "start")
    assert (start["epoch"], start["step"]) == (2, 0)
    assert sorted(trained(resumed, 0)[2]) == sorted(fifo_ids(0, 0, False)) and 1 not in trained(resumed, 0)
