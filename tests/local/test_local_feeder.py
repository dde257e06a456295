"""Pipe-mode feeder against a real moto S3 server and real FIFOs (no mocks)."""

from __future__ import annotations

import json
import struct
import threading
import time
from pathlib import Path

import pytest
from helpers.local_s3_proxy import cutting_proxy

from sagemaker_dist.aws.s3_objects import s3_client
from sagemaker_dist.contract.record_formats import RECORDIO_MAGIC
from sagemaker_dist.host.feeder import (
    ChannelFeeder,
    ChannelSpec,
    FeedError,
    epoch_objects,
    recordio_headers,
    resolve_objects,
)
from sagemaker_dist.host.lifecycle import download_channel
from sagemaker_dist.local.demo_data import tfrecord_frame


def _put_objects(s3, bucket, prefix, names):
    for name in names:
        s3.put_object(Bucket=bucket, Key=f"{prefix}{name}", Body=tfrecord_frame(name.encode()) * 3)


def _names_from_tfrecords(data: bytes) -> list[str]:
    names, i = [], 0
    while i < len(data):
        (length,) = struct.unpack_from("<Q", data, i)
        names.append(data[i + 12 : i + 12 + length].decode())
        i += 16 + length
    return names[::3]


def _read_fifo(path: Path, timeout: float = 10.0) -> bytes:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)
    with open(path, "rb") as f:
        return f.read()


class _Feed:
    """Runs a feeder thread for a test and stops it (and removes its FIFOs) afterwards."""

    def __init__(self, spec, client, tmp_path, host_index=0, hosts=1, attempts=3):
        self.errors: list[str] = []
        self.stop = threading.Event()
        items = resolve_objects(spec, client)
        self.feeder = ChannelFeeder(
            spec, items, tmp_path, host_index, hosts, client, self.stop, self.errors.append, attempts=attempts
        )

    def __enter__(self):
        self.feeder.start()
        return self.feeder

    def __exit__(self, *exc):
        self.stop.set()
        self.feeder.join(5)
        self.feeder.remove_fifos()
        assert not self.feeder.is_alive()


def test_prefix_channel_streams_key_order_and_next_fifo_after_close(s3, bucket, tmp_path):
    _put_objects(s3, bucket, "data/", ["b", "a", "c"])
    spec = ChannelSpec("train_0", f"s3://{bucket}/data/")
    with _Feed(spec, s3_client(), tmp_path) as feeder:
        first = tmp_path / "train_0_0"
        deadline = time.monotonic() + 10
        while not first.exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with open(first, "rb") as f:
            data = f.read()
            time.sleep(0.3)  # at EOF but still open: the next epoch's FIFO must not exist yet
            assert not (tmp_path / "train_0_1").exists()
        assert _names_from_tfrecords(data) == ["a", "b", "c"]
        assert _names_from_tfrecords(_read_fifo(tmp_path / "train_0_1")) == ["a", "b", "c"]
        assert not first.exists()  # consumed FIFOs are removed
        assert feeder.stats.records == 18 and feeder.stats.epochs == 2
    assert not list(tmp_path.iterdir())


def test_manifest_channel_streams_listed_keys_in_manifest_order(s3, bucket, tmp_path):
    _put_objects(s3, bucket, "data/", ["a", "b", "c", "d"])
    manifest = [{"prefix": f"s3://{bucket}/data/"}, "d", "b"]
    s3.put_object(Bucket=bucket, Key="manifests/train_0.json", Body=json.dumps(manifest))
    spec = ChannelSpec("train_0", f"s3://{bucket}/manifests/train_0.json", data_type="ManifestFile")
    with _Feed(spec, s3_client(), tmp_path):
        assert _names_from_tfrecords(_read_fifo(tmp_path / "train_0_0")) == ["d", "b"]


def test_sharded_by_s3_key_splits_objects_across_hosts_by_count(s3, bucket, tmp_path):
    names = [f"{i:02d}" for i in range(7)]
    _put_objects(s3, bucket, "data/", names)
    spec = ChannelSpec("train_0", f"s3://{bucket}/data/", distribution="ShardedByS3Key")
    got = []
    for host in range(2):
        (tmp_path / f"h{host}").mkdir()
        with _Feed(spec, s3_client(), tmp_path / f"h{host}", host_index=host, hosts=2):
            got.append(_names_from_tfrecords(_read_fifo(tmp_path / f"h{host}" / "train_0_0")))
    assert sorted(got[0] + got[1]) == names
    assert not set(got[0]) & set(got[1])
    assert sorted(map(len, got)) == [3, 4]


def test_shuffle_order_differs_per_epoch_and_is_a_permutation(s3, bucket, tmp_path):
    names = [f"{i:02d}" for i in range(12)]
    _put_objects(s3, bucket, "data/", names)
    spec = ChannelSpec("train_0", f"s3://{bucket}/data/", shuffle_seed=7)
    with _Feed(spec, s3_client(), tmp_path):
        epochs = [_names_from_tfrecords(_read_fifo(tmp_path / f"train_0_{e}")) for e in range(3)]
    assert all(sorted(e) == names for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3
    # the order is the seed's: the same seed gives the same per-epoch orders
    items = resolve_objects(spec, s3_client())
    assert [i.rel for i in epoch_objects(items, spec, 1, 0, 1)] == epochs[1]


def test_recordio_wrapping_frames_each_object_as_one_record(s3, bucket, tmp_path):
    bodies = {"a": b"x" * 5, "b": b"", "c": b"0123456789abcdef"}
    for name, body in bodies.items():
        s3.put_object(Bucket=bucket, Key=f"raw/{name}", Body=body)
    spec = ChannelSpec("train_0", f"s3://{bucket}/raw/", record_wrapper="RecordIO")
    with _Feed(spec, s3_client(), tmp_path) as feeder:
        data = _read_fifo(tmp_path / "train_0_0")
    payloads, i = [], 0
    while i < len(data):
        magic, word = struct.unpack_from("<II", data, i)
        assert magic == RECORDIO_MAGIC and word >> 29 == 0
        length = word & ((1 << 29) - 1)
        payloads.append(data[i + 8 : i + 8 + length])
        i += 8 + length + (-length % 4)
    assert payloads == list(bodies.values())
    assert len(data) % 4 == 0 and feeder.stats.records == 3


def test_recordio_headers_split_large_objects_into_multipart_records():
    big = (1 << 29) - 1
    parts = recordio_headers(2 * big + 10)
    flags = [struct.unpack("<II", h)[1] >> 29 for _, h in parts]
    lengths = [struct.unpack("<II", h)[1] & big for _, h in parts]
    assert flags == [1, 2, 3] and lengths == [big, big, 10]
    assert [o for o, _ in parts] == [0, big, 2 * big]


def test_file_mode_downloads_this_hosts_objects(s3, bucket, tmp_path):
    _put_objects(s3, bucket, "data/", ["a", "b", "sub/c"])
    spec = ChannelSpec("train", f"s3://{bucket}/data/", input_mode="File")
    client = s3_client()
    total = download_channel(spec, resolve_objects(spec, client), tmp_path / "train", client, 0, 1)
    files = sorted(p.relative_to(tmp_path / "train").as_posix() for p in (tmp_path / "train").rglob("*"))
    assert files == ["a", "b", "sub", "sub/c"]
    assert total == sum(p.stat().st_size for p in (tmp_path / "train").rglob("*") if p.is_file())


def test_endpoint_failing_mid_stream_is_resumed_when_it_recovers(s3, bucket, tmp_path, aws_env):
    _put_objects(s3, bucket, "data/", ["a", "broken", "c"])
    spec = ChannelSpec("train_0", f"s3://{bucket}/data/")
    with cutting_proxy(aws_env["AWS_ENDPOINT_URL"], fail_times=1) as (proxy, url):
        with _Feed(spec, s3_client(endpoint_url=url), tmp_path) as feeder:
            assert _names_from_tfrecords(_read_fifo(tmp_path / "train_0_0")) == ["a", "broken", "c"]
    assert proxy.cut == 1 and not feeder.stats.errors


def test_endpoint_failing_mid_stream_fails_naming_the_object(s3, bucket, tmp_path, aws_env):
    _put_objects(s3, bucket, "data/", ["a", "broken"])
    spec = ChannelSpec("train_0", f"s3://{bucket}/data/")
    with cutting_proxy(aws_env["AWS_ENDPOINT_URL"], fail_times=100) as (_, url):
        feed = _Feed(spec, s3_client(endpoint_url=url), tmp_path, attempts=3)
        with feed:
            data = _read_fifo(tmp_path / "train_0_0")  # EOF after the feeder gives up: a short stream
            feed.feeder.join(10)
    full = s3.get_object(Bucket=bucket, Key="data/a")["ContentLength"] * 2 + 9
    assert len(data) < full
    assert len(feed.errors) == 1
    assert f"s3://{bucket}/data/broken" in feed.errors[0] and "after 3 attempts" in feed.errors[0]


def test_missing_manifest_is_a_clear_error(s3, bucket):
    spec = ChannelSpec("train_0", f"s3://{bucket}/nope.json", data_type="ManifestFile")
    with pytest.raises(FeedError, match="nope.json does not exist"):
        resolve_objects(spec, s3_client())
