"""One real ``horovodrun -np 2 -H localhost:2 --gloo`` job on CPU, checked from several sides.

The test writes the container config (layout hyperparameter, Pipe channels train_0/1 and
validation_0/1) under a temporary /opt/ml root, seeds a checkpoint for epoch 1 (plus a crashed
writer's leftovers), and feeds each rank's FIFOs with generated TFRecords whose ``id`` feature says
which record it is. Epoch-1 FIFOs are created only once TensorBoard events from epoch 0 are in S3
(moto server), so those events provably arrive before training ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import numpy as np
import pytest
from helpers.stop_jobs import feed_fifo, shard_bytes, write_config

REPO = Path(__file__).resolve().parents[2]
WORLD = 2
EPOCHS = 3
RESUME_EPOCH = 1  # a checkpoint for epoch 1 exists, so the job trains epochs 2 and 3
FIFO_EPOCHS = EPOCHS - RESUME_EPOCH
BATCH = 8
TRAIN_PER_RANK = 32
VALIDATION_PER_RANK = 16
TIMEOUT = 240


def seed_checkpoint(root: Path) -> dict[str, np.ndarray]:
    """A checkpoint for epoch 1 of the example model, as rank 0 of an earlier run would leave it."""
    import tensorflow as tf
    from helpers.horovod_job import load_example

    from sagemaker_dist.runtime.tensorflow.keras.checkpoints import save_checkpoint

    model = load_example().build_model()
    model.compile(tf.keras.optimizers.legacy.SGD(0.01, momentum=0.9), loss="mse")
    rng = np.random.default_rng(7)
    model.train_on_batch(rng.random((4, 32, 32, 3), dtype=np.float32), rng.random((4, 10), dtype=np.float32))
    directory = root / "checkpoints"
    save_checkpoint(model, directory, RESUME_EPOCH)
    (directory / ".tmp-epoch-00009-crashed").mkdir()  # a writer that died mid-way
    (directory / "epoch-00004").mkdir()  # copied without meta.json: not complete, never resumed
    (directory / "epoch-00004" / "ckpt.index").write_bytes(b"partial")
    return {f"w{i}": w for i, w in enumerate(model.get_weights())}


def events_with_epoch_scalars(s3, bucket: str) -> bool:
    listing = s3.list_objects_v2(Bucket=bucket, Prefix="tb/job/train/").get("Contents", [])
    return any(b"epoch_loss" in s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listing)


@pytest.fixture(scope="module")
def job(tmp_path_factory, moto_server):
    root = tmp_path_factory.mktemp("opt_ml")
    out = tmp_path_factory.mktemp("job_out")
    write_config(root, WORLD, validation="per-worker")
    seeded_weights = seed_checkpoint(root)
    aws = {
        "AWS_ENDPOINT_URL": moto_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    s3 = boto3.client(
        "s3",
        endpoint_url=moto_server,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    bucket = "horovod-job-tb"
    s3.create_bucket(Bucket=bucket)

    shards = {
        role: [shard_bytes(base + r * per_rank, per_rank, seed=base + r) for r in range(WORLD)]
        for role, base, per_rank in (("train", 0, TRAIN_PER_RANK), ("validation", 1000, VALIDATION_PER_RANK))
    }
    deadline = time.monotonic() + TIMEOUT
    data_dir = root / "input" / "data"

    def feed_epoch(epoch: int) -> None:
        for role, per_rank in shards.items():
            for r, data in enumerate(per_rank):
                feed_fifo(data_dir / f"{role}_{r}_{epoch}", data, deadline)

    feed_epoch(0)
    env = {**os.environ, **aws, "SAGEMAKER_DIST_OPT_ML": str(root), "PYTHONPATH": str(REPO)}
    horovodrun = Path(sys.executable).with_name("horovodrun")
    command = [
        str(horovodrun),
        "-np",
        str(WORLD),
        "-H",
        f"localhost:{WORLD}",
        "--gloo",
        sys.executable,
        str(REPO / "tests" / "helpers" / "horovod_job.py"),
        str(out),
        str(EPOCHS),
        str(BATCH),
        str(TRAIN_PER_RANK),
        str(VALIDATION_PER_RANK),
        f"s3://{bucket}/tb/job",
    ]
    log_path = out / "horovodrun.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            seen_while_running = False
            while time.monotonic() < deadline and proc.poll() is None:
                if events_with_epoch_scalars(s3, bucket):
                    seen_while_running = proc.poll() is None
                    break
                time.sleep(0.2)
            for epoch in range(1, FIFO_EPOCHS):  # now the job may go on
                feed_epoch(epoch)
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    output = log_path.read_text(errors="replace")
    assert proc.returncode == 0, f"horovodrun exited {proc.returncode}:\n{output[-6000:]}"
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return {
        "root": root,
        "out": out,
        "reports": reports,
        "seeded_weights": seeded_weights,
        "events_seen_while_running": seen_while_running,
        "s3": s3,
        "bucket": bucket,
        "output": output,
    }


def _load(path: Path) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[f"w{i}"] for i in range(len(data.files))]


def test_ranks_read_disjoint_shards_whose_union_is_every_record_once(job):
    for role, base, per_rank in (("train", 0, TRAIN_PER_RANK), ("validation", 1000, VALIDATION_PER_RANK)):
        everything = list(range(base, base + WORLD * per_rank))
        per_epoch = [[] for _ in range(FIFO_EPOCHS)]
        for report in job["reports"]:
            seen = report["seen"][role]
            assert len(seen) == FIFO_EPOCHS * per_rank, (role, report["rank"])
            for epoch in range(FIFO_EPOCHS):
                ids = seen[epoch * per_rank : (epoch + 1) * per_rank]
                own = range(base + report["rank"] * per_rank, base + (report["rank"] + 1) * per_rank)
                assert sorted(ids) == list(own)  # this rank's own shard, each record once
                per_epoch[epoch].extend(ids)
        for ids in per_epoch:
            assert sorted(ids) == everything  # ranks disjoint, union = every record exactly once


def test_steps_and_learning_rate_agreed_on_every_rank(job):
    for report in job["reports"]:
        assert report["size"] == WORLD
        assert report["steps_per_epoch"] == TRAIN_PER_RANK // BATCH
        assert report["validation_steps"] == VALIDATION_PER_RANK // BATCH
        assert report["learning_rate"] == pytest.approx(0.01 * WORLD)
        assert report["initial_epoch"] == RESUME_EPOCH  # rank 0 found it, every rank got it


def test_resumed_from_rank0_checkpoint_and_final_weights_equal(job):
    out = job["out"]
    for r in range(WORLD):  # rank 0 restored the checkpoint, the broadcast gave it to rank 1
        for got, want in zip(_load(out / f"start-rank{r}.npz"), job["seeded_weights"].values()):
            np.testing.assert_array_equal(got, want)
    finals = [_load(out / f"final-rank{r}.npz") for r in range(WORLD)]
    for a, b in zip(*finals):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(finals[0], job["seeded_weights"].values()))


def test_metrics_averaged_so_every_rank_logs_the_same(job):
    histories = [r["history"] for r in job["reports"]]
    assert set(histories[0]) >= {"loss", "accuracy", "val_loss", "val_accuracy", "lr"}
    assert histories[0].keys() == histories[1].keys()
    for key in histories[0]:
        assert len(histories[0][key]) == FIFO_EPOCHS
        np.testing.assert_allclose(histories[0][key], histories[1][key], rtol=1e-6, err_msg=key)
    # 3-epoch warm-up from 0.01 to 0.02, resumed after epoch 1: 2/3 of the way, then the full rate
    assert histories[0]["lr"] == pytest.approx([0.01 * (1 + 2 / 3) * WORLD / 2, 0.01 * WORLD])


def test_checkpoints_written_by_rank0_only_and_atomically(job):
    from sagemaker_dist.runtime.checkpoint_format import list_checkpoints

    directory = job["root"] / "checkpoints"
    complete = list_checkpoints(directory)
    assert [c.epoch for c in complete] == [1, 2, 3]
    rank0_pid = job["reports"][0]["pid"]
    assert job["reports"][0]["checkpoint_saves"] == [2, 3]  # epoch 1 was seeded (resumed from)
    assert job["reports"][1]["checkpoint_saves"] == []  # rank 1's callback never wrote one
    for c in complete[1:]:
        meta = json.loads((c.path / "meta.json").read_text())
        assert (meta["rank"], meta["pid"]) == (0, rank0_pid)
    leftovers = sorted(p.name for p in directory.iterdir() if p.name.startswith("."))
    assert leftovers == []  # the crashed writer's temp dir was cleared, none of ours remain
    assert (directory / "epoch-00004").exists()  # incomplete: ignored, not resumed from


def test_tensorboard_events_in_s3_before_training_ended(job):
    assert job["events_seen_while_running"]
    assert job["reports"][0]["syncer_failures"] == 0
    assert job["reports"][1]["syncer_failures"] is None  # only rank 0 syncs
    keys = [o["Key"] for o in job["s3"].list_objects_v2(Bucket=job["bucket"])["Contents"]]
    assert any(k.startswith("tb/job/validation/") for k in keys)
