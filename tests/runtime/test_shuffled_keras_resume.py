"""A shuffled Keras epoch stopped and resumed exactly: real ``horovodrun -np 2 --gloo`` ranks, real FIFOs.

Each rank's shard is 64 records with ids (``rank * 1000 + i``), read by ``rank_dataset(...,
shuffle=ShuffleWindow(5, records=24))`` in batches of 4 for 3 epochs; rank 0 asks for a stop at its
22nd per-step agreement (inside epoch 1, 0-based), every rank stops after the same step and rank 0
checkpoints it; the next attempt gets a fresh /opt/ml tree (FIFOs from ``_0`` again). Counted per rank
and epoch over both attempts: every id exactly once, in the order the uninterrupted job trains them
(the window's arithmetic on the FIFO's stream), another order each epoch; with the channel's objects
in another order each epoch (a ShuffleConfig in the layout: FIFO n carries the n-th permutation), the
resumed epoch reads the FIFO the stopped one read.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.stop_jobs import feed_fifo

from sagemaker_dist.contract.layout import LAYOUT_HYPERPARAMETER, plan_layout
from sagemaker_dist.contract.record_formats import encode_tfrecord
from sagemaker_dist.local.demo_data import encode_example
from sagemaker_dist.runtime.checkpoint_format import list_checkpoints
from sagemaker_dist.runtime.framing import shuffle as sh

pytestmark = [pytest.mark.slow, pytest.mark.horovod, pytest.mark.tensorflow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("keras_shuffle_resume_script.py")
WORLD, EPOCHS, BATCH, RECORDS, OBJECT, SEED, WINDOW = 2, 3, 4, 64, 8, 5, 24
SHUFFLE_CONFIG_SEED = 11
ATTEMPT_TIMEOUT_S = 240


def fifo_ids(rank: int, fifo: int, per_epoch: bool) -> list[int]:
    objects = [list(range(rank * 1000 + o, rank * 1000 + o + OBJECT)) for o in range(0, RECORDS, OBJECT)]
    if per_epoch:
        random.Random(f"{SHUFFLE_CONFIG_SEED}:{fifo}").shuffle(objects)
    return [i for obj in objects for i in obj]


def reference(rank: int, epoch: int, fifo: int, per_epoch: bool) -> list[int]:
    ids = fifo_ids(rank, fifo, per_epoch)
    window = sh.ShuffleWindow(SEED, records=WINDOW)
    order = sh.EpochOrder(window, window.stream_key(rank, f"train_{rank}"), epoch)
    out = []
    for start in range(0, len(ids), WINDOW):
        chunk = ids[start : start + WINDOW]
        out += [chunk[i] for i in order.order(len(chunk)).tolist()]
    return out


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


def run_attempt(attempt: int, root: Path, out: Path, per_epoch: bool, **env) -> subprocess.CompletedProcess:
    write_tree(root, per_epoch)
    deadline = time.monotonic() + ATTEMPT_TIMEOUT_S
    for rank in range(WORLD):
        before = None
        for fifo in range(EPOCHS):
            data = b"".join(
                encode_tfrecord(encode_example({"id": i})) for i in fifo_ids(rank, fifo, per_epoch)
            )
            before = feed_fifo(root / "input" / "data" / f"train_{rank}_{fifo}", data, deadline, before)
    environ = {**os.environ, **env, "SAGEMAKER_DIST_OPT_ML": str(root), "PYTHONPATH": str(REPO)}
    environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    horovodrun = str(Path(sys.executable).with_name("horovodrun"))
    command = [
        horovodrun, "-np", str(WORLD), "-H", f"localhost:{WORLD}", "--gloo",
        sys.executable, str(SCRIPT), str(out), str(attempt), str(EPOCHS), str(BATCH), str(SEED), str(WINDOW),
    ]  # fmt: skip
    return subprocess.run(
        command,
        env=environ,
        capture_output=True,
        text=True,
        timeout=ATTEMPT_TIMEOUT_S,
        start_new_session=True,
    )


def trained(out: Path, rank: int, attempt: str) -> tuple[list, dict[int, list[int]]]:
    start, by_epoch = None, {}
    for line in (out / f"trained-rank{rank}.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["attempt"] != attempt:
            continue
        if "start" in row:
            start = row["start"]
        else:
            by_epoch.setdefault(row["epoch"], []).extend(row["ids"])
    return start, by_epoch


@pytest.fixture(scope="module", params=[False, True], ids=["same-objects", "ShuffleConfig"])
def attempts(request, tmp_path_factory):
    base = tmp_path_factory.mktemp("keras-shuffle")
    out = base / "out"
    out.mkdir()
    first = run_attempt(1, base / "attempt1", out, request.param, STOP_AT_AGREEMENT="22")
    checkpoints = base / "attempt2" / "checkpoints"
    checkpoints.parent.mkdir()
    (base / "attempt1" / "checkpoints").rename(checkpoints)  # what the checkpoint S3 URI restores
    second = run_attempt(2, base / "attempt2", out, request.param)
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
        _, one = trained(out, rank, "1")
        start, two = trained(out, rank, "2")
        assert start == [1, stop.step]
        shard = sorted(fifo_ids(rank, 0, False))
        assert 0 not in two and len(one[1]) == stop.step * BATCH
        for epoch, ids in ((0, one[0]), (1, one[1] + two[1]), (2, two[2])):
            assert sorted(ids) == shard, f"rank {rank} epoch {epoch}: every record once"
            fifo = epoch if per_epoch else 0
            assert ids == reference(rank, epoch, fifo, per_epoch), f"rank {rank} epoch {epoch}: the order"
        assert len({tuple(one[0]), tuple(one[1] + two[1]), tuple(two[2])}) == 3
