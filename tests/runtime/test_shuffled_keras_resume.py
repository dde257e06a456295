"""A shuffled Keras epoch stopped and resumed exactly: real ``horovodrun -np 2 --gloo`` ranks, real FIFOs.

Each rank's shard is 64 records with ids (``rank * 1000 + i``), read by ``rank_dataset(...,
shuffle=ShuffleWindow(5, records=24))`` in batches of 4 for 3 epochs (``local_scripts/train_ids.py``);
rank 0 asks for a stop at its 22nd per-step agreement (inside epoch 1, 0-based), every rank stops after
the same step and rank 0 checkpoints it; the next attempt gets a fresh /opt/ml tree (FIFOs from ``_0``
again). Counted per rank and epoch over both attempts: every id exactly once, in the order the
uninterrupted job trains them (the window's arithmetic on the FIFO's stream), another order each epoch;
with the channel's objects in another order each epoch (a ShuffleConfig in the layout: FIFO n carries
the n-th permutation), the resumed epoch reads the FIFO the stopped one read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import shuffled_ids
from helpers.stop_jobs import feed_fifo, trained_segments

from sagemaker_dist.contract.layout import LAYOUT_HYPERPARAMETER, plan_layout
from sagemaker_dist.contract.record_formats import encode_tfrecord
from sagemaker_dist.local.demo_data import encode_example, generate_examples
from sagemaker_dist.runtime.checkpoint_format import list_checkpoints
from sagemaker_dist.runtime.framing import shuffle as sh

pytestmark = [pytest.mark.slow, pytest.mark.horovod, pytest.mark.tensorflow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "helpers" / "local_scripts" / "train_ids.py"
WORLD, EPOCHS, BATCH, RECORDS, OBJECT, SEED, WINDOW = 2, 3, 4, 64, 8, 5, 24
SHUFFLE_CONFIG_SEED = 11
ATTEMPT_TIMEOUT_S = 240


def fifo_ids(rank: int, fifo: int, per_epoch: bool) -> list[int]:
    return shuffled_ids.fifo_ids(rank, fifo, RECORDS, OBJECT, SHUFFLE_CONFIG_SEED if per_epoch else None)


def reference(rank: int, epoch: int, fifo: int, per_epoch: bool) -> list[int]:
    ids = fifo_ids(rank, fifo, per_epoch)
    return shuffled_ids.window_order(
        ids, [1] * len(ids), sh.ShuffleWindow(SEED, records=WINDOW), rank, f"train_{rank}", epoch
    )


def write_tree(root: Path, per_epoch: bool) -> None:
    config = root / "input" / "config"
    config.mkdir(parents=True)
    (root / "input" / "data").mkdir(parents=True)
    layout = plan_layout(1, WORLD, shuffle_seed=SHUFFLE_CONFIG_SEED if per_epoch else None)
    pipe = {"TrainingInputMode": "Pipe", "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"}
    (config / "inputdataconfig.json").write_text(json.dumps({n: pipe for n in layout.channel_names}))
    (config / "hyperparameters.json").write_text(json.dumps({LAYOUT_HYPERPARAMETER: layout.to_json()}))
    resource = {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": "lo"}
    (config / "resourceconfig.json").write_text(json.dumps(resource))


def run_attempt(root: Path, out: Path, per_epoch: bool, *more) -> subprocess.CompletedProcess:
    write_tree(root, per_epoch)
    deadline = time.monotonic() + ATTEMPT_TIMEOUT_S
    images = list(generate_examples(RECORDS, seed=0))
    for rank in range(WORLD):
        before = None
        for fifo in range(EPOCHS):
            data = b"".join(
                encode_tfrecord(
                    encode_example(
                        {"image": images[i % RECORDS][0], "label": images[i % RECORDS][1], "id": i}
                    )
                )
                for i in fifo_ids(rank, fifo, per_epoch)
            )
            before = feed_fifo(root / "input" / "data" / f"train_{rank}_{fifo}", data, deadline, before)
    environ = {**os.environ, "SAGEMAKER_DIST_OPT_ML": str(root), "PYTHONPATH": str(REPO)}
    environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    horovodrun = str(Path(sys.executable).with_name("horovodrun"))
    command = [
        horovodrun, "-np", str(WORLD), "-H", f"localhost:{WORLD}", "--gloo", sys.executable, str(SCRIPT),
        "--out", str(out), "--epochs", str(EPOCHS), "--batch_size", str(BATCH), "--pause", "0",
        "--shuffle_seed", str(SEED), "--shuffle_window", str(WINDOW), *more,
    ]  # fmt: skip
    return subprocess.run(
        command,
        env=environ,
        capture_output=True,
        text=True,
        timeout=ATTEMPT_TIMEOUT_S,
        start_new_session=True,
    )


def trained(out: Path, rank: int) -> tuple[dict, dict]:
    """The two attempts of ``rank``: each its start line and its ids by epoch."""
    one, two = trained_segments(out / f"trained-rank{rank}.jsonl")
    flat = [{e: [i for b in batches for i in b] for e, batches in a["epochs"].items()} for a in (one, two)]
    return (one["start"], flat[0]), (two["start"], flat[1])


@pytest.fixture(scope="module", params=[False, True], ids=["same-objects", "ShuffleConfig"])
def attempts(request, tmp_path_factory):
    base = tmp_path_factory.mktemp("keras-shuffle")
    out = base / "out"
    out.mkdir()
    first = run_attempt(base / "attempt1", out, request.param, "--stop_after_steps", "22")
    checkpoints = base / "attempt2" / "checkpoints"
    checkpoints.parent.mkdir()
    (base / "attempt1" / "checkpoints").rename(checkpoints)  # what the checkpoint S3 URI restores
    second = run_attempt(base / "attempt2", out, request.param)
    return first, second, out, request.param, checkpoints


def test_the_stopped_epoch_is_trained_once_in_the_uninterrupted_order(attempts):
    first, second, out, per_epoch, checkpoints = attempts
    assert first.returncode == 0, (first.stdout + first.stderr)[-5000:]
    assert second.returncode == 0, (second.stdout + second.stderr)[-5000:]
    (stop,) = [c for c in list_checkpoints(checkpoints) if c.meta.get("stopped")]
    assert stop.epoch == 1 and 0 < stop.step < RECORDS // BATCH
    assert {k: stop.meta["reader"][k] for k in ("fifo", "world_size")} == {"fifo": 1, "world_size": WORLD}
    assert stop.meta["reader"]["head"] is not None  # the stopped stream's head, checked on resume
    assert "does not start with the records" not in second.stdout + second.stderr
    for rank in range(WORLD):
        (_, one), (start, two) = trained(out, rank)
        assert (start["epoch"], start["step"]) == (1, stop.step)
        shard = sorted(fifo_ids(rank, 0, False))
        assert 0 not in two and len(one[1]) == stop.step * BATCH
        for epoch, ids in ((0, one[0]), (1, one[1] + two[1]), (2, two[2])):
            assert sorted(ids) == shard, f"rank {rank} epoch {epoch}: every record once"
            fifo = epoch if per_epoch else 0
            assert ids == reference(rank, epoch, fifo, per_epoch), f"rank {rank} epoch {epoch}: the order"
        assert len({tuple(one[0]), tuple(one[1] + two[1]), tuple(two[2])}) == 3
