"""The order of a channel's objects: the planner's seeded order in each rank's manifest, and a feeder
that permutes them each epoch (ShuffleConfig, the pipe agent's --shuffle-seed) marking the channel so
that a restarted reader replays the FIFOs up to its stopped epoch's and reads the same objects again."""

from __future__ import annotations

import json
import struct
from types import SimpleNamespace

import pytest
from test_local_feeder import _Feed

from sagemaker_dist.aws.s3_objects import s3_client
from sagemaker_dist.contract.s3_uri import parse_s3_uri
from sagemaker_dist.host.feeder import ChannelSpec
from sagemaker_dist.launch.shard_writer import write_shards
from sagemaker_dist.launch.sharding import ShardingError, plan_shards
from sagemaker_dist.local.demo_data import tfrecord_frame
from sagemaker_dist.runtime.epoch_reader.epochs import next_epoch_fifo
from sagemaker_dist.runtime.epoch_reader.order import per_epoch_order_marker, replay_fifos
from sagemaker_dist.runtime.fifo import FifoReader

CLASSES, PER_CLASS = 6, 20


def objects_by_class() -> list[tuple[str, int]]:
    """One object per (class, part), named class-major as data laid out by class is."""
    return [
        (f"data/class{c}/part{p:02d}", 1000 + (c * 7 + p) % 5)
        for c in range(CLASSES)
        for p in range(PER_CLASS)
    ]


def runs_of_one_class(keys: list[str]) -> int:
    """Neighbours in the stream of the same class."""
    return sum(a.split("/")[1] == b.split("/")[1] for a, b in zip(keys, keys[1:]))


def test_a_seeded_order_spreads_each_shards_objects_and_keeps_the_split():
    objects = objects_by_class()
    by_name = plan_shards(objects, 3)
    seeded = plan_shards(objects, 3, order_seed=5)
    assert [sorted(s) for s in seeded.shards] == by_name.shards  # the same objects in each shard
    assert seeded.bytes_per_shard == by_name.bytes_per_shard
    for keys, sizes in zip(seeded.shards, seeded.sizes):
        assert sizes == [dict(objects)[k] for k in keys]  # sizes follow their keys
    assert plan_shards(objects[::-1], 3, order_seed=5) == seeded  # any input order, the same plan
    assert plan_shards(objects, 3, order_seed=6) != seeded
    for keys, named in zip(seeded.shards, by_name.shards):
        # name order: a class's objects one after another; seeded: about 1 in CLASSES neighbours alike
        assert runs_of_one_class(named) >= len(named) - CLASSES
        assert runs_of_one_class(keys) <= len(keys) // 3
    with pytest.raises(ShardingError, match="order seed -1"):
        plan_shards(objects, 3, order_seed=-1)


def test_each_manifest_lists_its_objects_in_the_plans_order(s3, bucket):
    for key, size in objects_by_class():
        s3.put_object(Bucket=bucket, Key=key, Body=b"x" * size)
    source = f"s3://{bucket}/data/"
    plan = plan_shards(objects_by_class(), 2, order_seed=1)
    shard_set = write_shards(plan, source, f"s3://{bucket}/out", client=s3)
    for i, uri in enumerate(shard_set.uris):
        b, k = parse_s3_uri(uri)
        manifest = json.loads(s3.get_object(Bucket=b, Key=k)["Body"].read())
        assert ["data/" + rel for rel in manifest[1:]] == plan.shards[i] != sorted(plan.shards[i])


def _read_all(path) -> bytes:
    chunks = []
    with FifoReader(path) as reader:
        while chunk := reader.read(1 << 20):
            chunks.append(chunk)
    return b"".join(chunks)


def _names(data: bytes) -> list[str]:
    names, i = [], 0
    while i < len(data):
        (length,) = struct.unpack_from("<Q", data, i)
        names.append(data[i + 12 : i + 12 + length].decode())
        i += 16 + length
    return names


def test_a_restarted_reader_replays_a_per_epoch_feeders_fifos_to_read_the_stopped_epochs_objects(
    s3, bucket, tmp_path
):
    names = [f"{i:02d}" for i in range(10)]
    for name in names:
        s3.put_object(Bucket=bucket, Key=f"ids/{name}", Body=tfrecord_frame(name.encode()))
    spec = ChannelSpec("train_0", f"s3://{bucket}/ids/", shuffle_seed=4)  # no layout says so: the marker
    first, second = tmp_path / "one", tmp_path / "two"
    epochs = []
    for root in (first, second):
        (root / "data").mkdir(parents=True)
    config = {
        r: SimpleNamespace(data_dir=r / "data", pipe_state_dir=r / "state", layout=None)
        for r in (first, second)
    }
    with _Feed(spec, s3_client(), first / "data"):
        for _ in range(3):
            number, path = next_epoch_fifo(first / "state", first / "data", "train_0", 10)
            epochs.append(_names(_read_all(path)))
        assert per_epoch_order_marker(first / "data", "train_0").exists()
    assert len({tuple(e) for e in epochs}) == 3 and all(sorted(e) == names for e in epochs)
    assert not per_epoch_order_marker(first / "data", "train_0").exists()  # removed with the FIFOs
    with _Feed(spec, s3_client(), second / "data") as feeder:  # the restarted job: FIFOs from _0 again
        assert replay_fifos(config[second], "train_0", 2, 10) == 2  # _0 and _1 opened, closed unread
        number, path = next_epoch_fifo(second / "state", second / "data", "train_0", 10)
        again = _names(_read_all(path))
        assert number == 2 and again == epochs[2]
        assert feeder.stats.epochs >= 2
    # where every FIFO carries the same order, nothing is replayed
    assert (
        replay_fifos(SimpleNamespace(data_dir=tmp_path, pipe_state_dir=tmp_path, layout=None), "x", 2, 1) == 0
    )
