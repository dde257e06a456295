"""The seeded shuffle window of PipeModeDataset and rank_dataset, through both readers (the compiled op
and Python's) on real FIFOs: the order PipeBatches gives the same stream (the arithmetic of
framing/shuffle.py, window by window), records and batches alike, another order each epoch, the epoch
shifted by a resumed job's epoch base, and the byte bound on records of any size."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers.runtime_helpers import write_opt_ml
from helpers.shuffled_ids import window_order
from test_pipe_dataset import feed

from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.contract.record_formats import encode_recordio, encode_tfrecord
from sagemaker_dist.runtime.config import ROOT_ENV
from sagemaker_dist.runtime.epoch_reader.order import set_epoch_base
from sagemaker_dist.runtime.framing import shuffle as sh

tf = pytest.importorskip("tensorflow")

from sagemaker_dist.runtime import PipeModeDataset, PipeModeDatasetError, rank_dataset  # noqa: E402

pytestmark = pytest.mark.tensorflow


@pytest.fixture
def opt_ml(tmp_path, monkeypatch, pipe_reader):
    write_opt_ml(tmp_path, ["train_0", "train_1", "rio"], plan_layout(1, 2))
    monkeypatch.setenv(ROOT_ENV, str(tmp_path))
    return tmp_path


def record(i: int) -> bytes:
    return i.to_bytes(4, "little") * 25


def ident(r: bytes) -> int:
    return int.from_bytes(r[:4], "little")


def reference(sizes, window: sh.ShuffleWindow, rank: int, channel: str, epoch: int) -> list[int]:
    return window_order(list(range(len(sizes))), sizes, window, rank, channel, epoch)


def test_records_and_batches_come_in_the_seeded_window_order_another_each_epoch(opt_ml):
    n = 700
    stream = b"".join(encode_tfrecord(record(i)) for i in range(n))
    window = sh.ShuffleWindow(21, records=100, bytes=4000)  # 40 records of 100 bytes: the byte bound cuts
    feeder = feed(opt_ml, "train_1", [stream] * 4)
    ds = PipeModeDataset("train_1", "TFRecord", shuffle=window, rank=1)
    got = [[ident(x.numpy()) for x in ds] for _ in range(2)]
    batched = PipeModeDataset("train_1", "TFRecord", shuffle=window, rank=1, batch_size=32)
    got.append([ident(r) for b in batched for r in b.numpy()])
    got.append([ident(r) for b in ds.batch(50) for r in b.numpy()])
    feeder.join(10)
    assert feeder.error is None and feeder.served == 4
    for epoch, ids in enumerate(got):  # FIFO n is epoch n
        assert ids == reference([100] * n, window, 1, "train_1", epoch)
    assert len({tuple(ids) for ids in got}) == 4 and got[0] != list(range(n))


def test_a_resumed_job_shuffles_each_fifo_as_the_epoch_its_base_says(opt_ml):
    stream = b"".join(encode_tfrecord(record(i)) for i in range(300))
    window = sh.ShuffleWindow(4, records=64)
    set_epoch_base(opt_ml / "pipe_state", "train_0", 5)  # FIFO 0 of the restarted job is epoch 5
    feeder = feed(opt_ml, "train_0", [stream] * 2)
    ds = PipeModeDataset("train_0", "TFRecord", shuffle=window, rank=0)
    first, second = [[ident(x.numpy()) for x in ds] for _ in range(2)]
    feeder.join(10)
    assert first == reference([100] * 300, window, 0, "train_0", 5)
    assert second == reference([100] * 300, window, 0, "train_0", 6)


def test_records_of_any_size_close_the_window_at_its_count_or_its_byte_cap(opt_ml):
    rng = np.random.default_rng(8)
    sizes = [int(s) for s in rng.integers(4, 5000, 300)]
    sizes[7] = 100_000  # read into its own tensor by the compiled reader
    records = [i.to_bytes(4, "little") + os.urandom(s - 4) for i, s in enumerate(sizes)]
    stream = b"".join(encode_recordio(r, max_part=3000) for r in records)
    window = sh.ShuffleWindow(2, records=50, bytes=30_000)
    feeder = feed(opt_ml, "rio", [stream])
    got = [x.numpy() for x in PipeModeDataset("rio", "RecordIO", shuffle=window, rank=0)]
    feeder.join(10)
    position = {r: i for i, r in enumerate(records)}
    assert [position[r] for r in got] == reference(sizes, window, 0, "rio", 0)


def test_rank_dataset_keys_the_order_by_the_rank_and_refuses_a_bad_shuffle(opt_ml):
    from sagemaker_dist.runtime.ranks import RankInfo

    stream = b"".join(encode_tfrecord(record(i)) for i in range(200))
    feeder = feed(opt_ml, "train_1", [stream])
    info = RankInfo(rank=1, local_rank=1, size=2, local_size=2)
    ds = rank_dataset("train", rank_info=info, shuffle=8)
    ids = [ident(x.numpy()) for x in ds]
    feeder.join(10)
    assert ids == reference([100] * 200, sh.ShuffleWindow(8), 1, "train_1", 0)
    with pytest.raises(PipeModeDatasetError, match="shuffle=1.5"):
        PipeModeDataset("train_0", "TFRecord", shuffle=1.5)


def test_each_fifos_stream_head_is_noted_as_the_pytorch_readers_compute_it(opt_ml):
    from sagemaker_dist.runtime.epoch_reader.order import read_head

    records = [record(i) for i in range(40)]
    few = [record(i) for i in range(5)]  # a stream of fewer records than a head: its head is all of them
    stream = b"".join(encode_tfrecord(r) for r in records)
    feeder = feed(opt_ml, "train_0", [stream, b"".join(encode_tfrecord(r) for r in few)])
    ds = PipeModeDataset("train_0", "TFRecord", shuffle=3, rank=0)
    for _ in range(2):
        assert len(list(ds)) in (40, 5)
    feeder.join(10)
    for fifo, recs in ((0, records[:16]), (1, few)):
        head = sh.StreamHead()
        for r in recs:
            head.add(r)
        assert read_head(opt_ml / "pipe_state", "train_0", fifo) == head.value


def test_records_go_to_their_places_strings_whatever_their_sizes_and_an_error_comes_after_them(opt_ml):
    """Windows of short records of about one size are read into strings allocated first for the last
    window's longest record: records longer (grown), much shorter, large ones, multipart RecordIO and
    text lines land whole in their places; a window cut by an error hands out what it read, in its
    order, then fails."""
    rng = np.random.default_rng(11)
    sizes = [int(s) for s in rng.integers(100, 111, 200)]  # windows of 16: reserved from the second
    # past the reservation (the window's byte bound then frees the places not taken), far under it,
    # under half of it (its string re-made to its size), a large one
    sizes[20], sizes[21], sizes[40], sizes[90] = 3000, 4, 30, 40_000
    records = [i.to_bytes(4, "little") + bytes([65 + i % 26]) * (s - 4) for i, s in enumerate(sizes)]
    window = sh.ShuffleWindow(5, records=16, bytes=4000)
    streams = {
        "TFRecord": b"".join(encode_tfrecord(r) for r in records),
        "RecordIO": b"".join(encode_recordio(r, max_part=50) for r in records),
    }
    lines = [r.replace(b"\n", b"n") for r in records]
    streams["TextLine"] = b"\n".join(lines) + b"\n"
    feeder = feed(opt_ml, "rio", list(streams.values()))
    for epoch, (kind, want) in enumerate(zip(streams, (records, records, lines))):
        got = [x.numpy() for x in PipeModeDataset("rio", kind, shuffle=window, rank=0)]
        assert got == window_order(want, sizes, window, 0, "rio", epoch), kind
    feeder.join(10)
    assert feeder.error is None

    bad = bytearray(streams["TFRecord"])
    at = sum(len(encode_tfrecord(r)) for r in records[:70])
    bad[at + 12] ^= 0x01  # record 70's data: windows of 16, 12, 16, 16, then 10 records before it
    feeder = feed(opt_ml, "train_0", [bytes(bad)])
    got = []
    with pytest.raises(tf.errors.OpError, match=f"byte offset {at}: TFRecord: data CRC mismatch"):
        for x in PipeModeDataset("train_0", "TFRecord", shuffle=window, rank=0):
            got.append(x.numpy())
    feeder.join(10)
    assert got == window_order(records[:70], sizes[:70], window, 0, "train_0", 0)
