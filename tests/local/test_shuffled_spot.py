"""Shuffled jobs stopped by a spot interruption in local mode and resumed: every record once per epoch.

2 hosts x 2 ranks, records with ids on S3 (the moto server), real FIFOs fed by the hosts' feeders, real
ranks (horovodrun for TensorFlow, our torchrun launcher for PyTorch); every rank reads its channel
through the seeded shuffle window (``--shuffle_seed``). ``--interrupt-at`` sends SIGTERM to every rank
mid-job, the job stops after the same step on every rank, and the next attempt starts on fresh /opt/ml
trees (FIFOs from ``_0`` again) with the checkpoints restored. Two orders of the objects: per-rank
channels in the planner's order (the same every epoch), and a ShuffleConfig over per-local-rank channels
ShardedByS3Key across the 2 hosts (each FIFO another permutation, each host other objects each epoch).
Counted from the ids each rank's train step trained: every id of the dataset exactly once per epoch
over the ranks and both attempts, the stopped epoch included, and each rank's order another each epoch.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from helpers.stop_jobs import after_batches, shard_bytes, trained_segments

from sagemaker_dist.local.backend import LocalBackend
from sagemaker_dist.local.demo import demo_estimator
from sagemaker_dist.local.job import run_local
from sagemaker_dist.local.spot import run_interrupted

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "helpers" / "local_scripts"
FILES, PER_FILE, BATCH, EPOCHS = 8, 80, 4, 3  # 4 ranks: 160 records a rank, 40 steps an epoch
HOSTS, PER_HOST = 2, 2
SEED, WINDOW = 17, 24
# The interruption comes once rank 0 has trained half of its second epoch, whatever the start-up of 4
# ranks on 2 cores took, INTERRUPT_BY_S at the latest; a step sleeps PAUSE_S, so the stop, agreed a step
# or two after SIGTERM, lands inside the epoch.
STEPS = FILES * PER_FILE // BATCH // (HOSTS * PER_HOST)
INTERRUPT_BY_S, PAUSE_S = 200.0, 0.1
JOB_TIMEOUT_S = 300


def _data(s3, bucket) -> set[int]:
    for i in range(FILES):
        body = shard_bytes(i * PER_FILE, PER_FILE, seed=i)
        s3.put_object(Bucket=bucket, Key=f"ids/train/part-{i:05d}.tfrecord", Body=body)
    return set(range(FILES * PER_FILE))


def _request(bucket, out: Path, distribution: str, shuffle_config: bool):
    torch = distribution == "torchrun"
    hps = {"epochs": EPOCHS, "batch_size": BATCH, "pause": PAUSE_S, "out": str(out), "helper": "horovod",
           "shuffle_seed": SEED, "shuffle_window": WINDOW}  # fmt: skip
    layout = {"strategy": "per-local-rank", "shuffle_seed": 3} if shuffle_config else {}
    estimator = demo_estimator(
        bucket, HOSTS, PER_HOST, "Pipe", hps, distribution=distribution, source_dir=SCRIPTS,
        entry_point="train_ids_torch.py" if torch else "train_ids.py",
        checkpoint_s3_uri=f"s3://{bucket}/ckpt/shuffled-spot", **layout,
    )  # fmt: skip
    return estimator.prepare(
        {"train": f"s3://{bucket}/ids/train/"}, printer=None, backend=LocalBackend()
    ).request


@pytest.mark.parametrize("shuffle_config", [False, True], ids=["planner-order", "ShuffleConfig-sharded"])
@pytest.mark.parametrize("distribution", ["horovod", "torchrun"])
def test_a_spot_stop_of_a_shuffled_job_trains_every_record_once_per_epoch(
    s3, bucket, tmp_path, distribution, shuffle_config
):
    everything = _data(s3, bucket)
    out = tmp_path / "out"
    out.mkdir()
    lines: list[str] = []
    request = _request(bucket, out, distribution, shuffle_config)
    channel = next(c for c in request["InputDataConfig"] if c["ChannelName"].startswith("train"))
    assert (channel.get("ShuffleConfig") is not None) == shuffle_config
    if shuffle_config:
        assert channel["DataSource"]["S3DataSource"]["S3DataDistributionType"] == "ShardedByS3Key"
    attempts, _ = run_interrupted(
        request, SCRIPTS, [INTERRUPT_BY_S], run=run_local, echo=lines.append,
        when=after_batches(out, STEPS * 3 // 2),
        launcher="torchrun" if distribution == "torchrun" else "horovodrun",
        work_dir=tmp_path / "work", timeout=JOB_TIMEOUT_S,
    )  # fmt: skip
    log = "\n".join(lines)
    (tmp_path / "job.log").write_text(log)
    assert [a.status for a in attempts] == ["Stopped", "Completed"], log[-4000:]
    assert "does not start with the records" not in log  # each resumed stream began as the stopped one
    stopped_epoch, step = attempts[0].stopped_at  # the epoch counted from 1
    assert 0 < step < STEPS, log[-3000:]  # inside an epoch
    per_epoch: dict[int, Counter] = {e: Counter() for e in range(EPOCHS)}
    for rank in range(HOSTS * PER_HOST):
        one, two = trained_segments(out / f"trained-rank{rank}.jsonl")
        assert (two["start"]["epoch"], two["start"]["step"]) == (
            stopped_epoch - 1,
            step,
        )  # no epoch restarted
        orders = {}
        for segment in (one, two):
            for epoch, batches in segment["epochs"].items():
                ids = [i for b in batches for i in b]
                per_epoch[epoch].update(ids)
                orders[epoch] = orders.get(epoch, []) + ids
        assert len({tuple(o) for o in orders.values()}) == EPOCHS  # another order each epoch
        assert all(o != sorted(o) for o in orders.values())  # shuffled
    for epoch, counts in per_epoch.items():
        assert set(counts) == everything and set(counts.values()) == {1}, (
            f"epoch {epoch}: ids trained twice {sorted(i for i, n in counts.items() if n > 1)[:10]}, never "
            f"{sorted(everything - set(counts))[:10]}"
        )
