"""RecordBatches' shuffled records of any size over real FIFOs: windows read on a thread of their own and
gathered a group of batches at a time into shared buffers, in the window order; an error in the stream,
an epoch left early."""

from __future__ import annotations

import threading
import time

import pytest
from helpers.runtime_helpers import FifoFeeder, write_opt_ml
from helpers.shuffled_ids import window_order

from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.contract.record_formats import encode_tfrecord
from sagemaker_dist.runtime.framing import shuffle as sh
from sagemaker_dist.runtime.framing.base import RecordFormatError

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch


def record(i: int, size: int) -> bytes:
    return i.to_bytes(4, "little") * (size // 4)


def ids(batch) -> list[int]:
    return [int.from_bytes(bytes(batch.record(i)[:4].numpy()), "little") for i in range(len(batch.lengths))]


def batches_of(tmp_path, epochs: list[bytes], batch: int, window: sh.ShuffleWindow):
    from sagemaker_dist.runtime import RecordBatches
    from sagemaker_dist.runtime.config import ContainerConfig

    root = write_opt_ml(tmp_path / "opt_ml", ["train_0"], plan_layout(1, 1))
    feeder = FifoFeeder(root / "input" / "data", "train_0", epochs)
    feeder.start()
    config = ContainerConfig.load(root, {})
    return RecordBatches("train_0", batch, config=config, shuffle=window, pin_memory=False), feeder


def window_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.endswith("train_0 windows")]


def test_batches_larger_than_a_group_come_from_several_buffers_a_window_in_the_window_order(tmp_path):
    from sagemaker_dist.runtime.torch.batch_cutter import GROUP_BYTES

    size, count, batch = 100_000, 300, 4  # 400 KB batches: a window's 25 whole batches in 3 buffers
    stream = b"".join(encode_tfrecord(record(i, size)) for i in range(count))
    window = sh.ShuffleWindow(11, records=100)
    batches, feeder = batches_of(tmp_path, [stream], batch, window)
    got = list(batches)
    feeder.join(10)
    assert feeder.error is None
    assert [i for b in got for i in ids(b)] == window_order(
        list(range(count)), [size] * count, window, 0, "train_0", 0, batch
    )
    assert all(bytes(b.record(i).numpy()) == record(j, size) for b in got for i, j in enumerate(ids(b)))
    buffers = {b.data.untyped_storage().data_ptr() for b in got}
    assert 3 <= len(buffers) < len(got)  # shared by a group's batches, more than one a window
    assert batch * size * (GROUP_BYTES // (batch * size)) <= max(
        b.data.untyped_storage().nbytes() for b in got
    )


def test_an_error_in_the_stream_comes_after_the_batches_of_the_windows_before_it(tmp_path):
    stream = b"".join(encode_tfrecord(record(i, 1000)) for i in range(300))
    stream += b"\x00" * 40  # a frame whose length CRC does not match
    window = sh.ShuffleWindow(3, records=100)
    batches, feeder = batches_of(tmp_path, [stream], 32, window)
    got = []
    with pytest.raises(RecordFormatError, match="length CRC"):
        for b in batches:
            got.extend(ids(b))
    feeder.join(10)
    reference = window_order(list(range(300)), [1000] * 300, window, 0, "train_0", 0, 32)
    assert got == reference[: len(got)] and len(got) >= 288  # every whole batch of the three windows


def test_an_epoch_left_early_ends_its_window_thread_and_the_next_epoch_reads_its_own_stream(tmp_path):
    streams = [b"".join(encode_tfrecord(record(e * 1000 + i, 1000)) for i in range(500)) for e in range(2)]
    window = sh.ShuffleWindow(5, records=100)
    batches, feeder = batches_of(tmp_path, streams, 32, window)
    epoch = iter(batches)
    first = ids(next(epoch))
    epoch.close()  # the loop leaves the epoch after one batch
    deadline = time.monotonic() + 10
    while window_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not window_threads()
    second = [i for b in batches for i in ids(b)]
    feeder.join(10)
    assert feeder.error is None
    reference = window_order(list(range(500)), [1000] * 500, window, 0, "train_0", 0, 32)
    assert first == reference[:32]
    assert sorted(second) == list(range(1000, 1500))
