"""RecordBatches' shuffle windows of large records of any size placed straight into their batches, over real
FIFOs and files: each batch a view of its window's buffer, the batches the window order makes with their
records in stream order; a record too long for its region, a corrupted record, a resume, a window across
two files, a stream ending inside a window."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers.runtime_helpers import FifoFeeder, write_opt_ml
from helpers.shuffled_ids import window_order

from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.contract.record_formats import encode_recordio, encode_tfrecord
from sagemaker_dist.runtime.framing import shuffle as sh
from sagemaker_dist.runtime.framing.batch_fill import compiled_available

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _compiled():
    if not compiled_available():
        pytest.fail("the compiled batch reader is not built (pip install -e . needs a C compiler)")


def records_of(sizes: list[int], seed: int = 0) -> list[bytes]:
    """Records of ``sizes`` bytes, each led by its index (4 bytes) and otherwise random."""
    rng = np.random.default_rng(seed)
    return [i.to_bytes(4, "little") + rng.bytes(n - 4) for i, n in enumerate(sizes)]


def encode(records: list[bytes], record_format: str) -> bytes:
    if record_format == "RecordIO":
        return b"".join(encode_recordio(r, max_part=4000) for r in records)
    return b"".join(encode_tfrecord(r) for r in records)


def reader(tmp_path, epochs: list[bytes], batch: int, window, record_format="TFRecord", **options):
    from sagemaker_dist.runtime import RecordBatches
    from sagemaker_dist.runtime.config import ContainerConfig

    wrapper = "RecordIO" if record_format == "RecordIO" else "None"
    root = write_opt_ml(tmp_path / "opt_ml", ["train_0"], plan_layout(1, 1), wrapper=wrapper)
    feeder = FifoFeeder(root / "input" / "data", "train_0", epochs)
    feeder.start()
    config = ContainerConfig.load(root, {})
    batches = RecordBatches(
        "train_0", batch, config=config, shuffle=window, pin_memory=False, compiled=True, **options
    )
    return batches, feeder


def ids(batch) -> list[int]:
    return [int.from_bytes(bytes(batch.record(i)[:4].numpy()), "little") for i in range(len(batch.lengths))]


def placed_buffers(batches) -> list[tuple[int, int]]:
    """The (start, end) addresses of the reader's placed windows' buffers."""
    pool = batches._buffers[("placed", False)]
    return [(s.array.ctypes.data, s.array.ctypes.data + len(s.array)) for s in pool.pool]


def in_placed_buffer(batch, buffers) -> bool:
    at = batch.data.data_ptr()
    return any(a <= at < b for a, b in buffers)


def check_epoch(got: list, records: list[bytes], expected: list[int]) -> None:
    """The batches hold every record whole, in the expected order."""
    assert [i for b in got for i in ids(b)] == expected
    for b in got:
        for k, i in enumerate(ids(b)):
            assert bytes(b.record(k).numpy()) == records[i]


def test_large_records_are_read_straight_into_batches_that_are_views_of_their_windows_buffer(tmp_path):
    sizes = [30_000] * 400
    records = records_of(sizes)
    stream = encode(records, "TFRecord")
    window = sh.ShuffleWindow(6, records=1000, bytes=1_500_000)  # 8 windows of 50 records
    batches, feeder = reader(tmp_path, [stream, stream], 8, window)
    epochs, held = [], []
    for _ in range(2):  # every batch held: the pool keeps the buffers of an epoch's windows
        epochs.append(list(batches))
        held.append(placed_buffers(batches))
    feeder.join(10)
    assert feeder.error is None
    for epoch, got in enumerate(epochs):
        check_epoch(got, records, window_order(list(range(400)), sizes, window, 0, "train_0", epoch, 8))
        views = sum(in_placed_buffer(b, held[epoch]) for b in got)
        # every batch is a view of a placed window, those across two windows too (in the first one's)
        assert views == len(got) == 50
        # the views of one window share its buffer
        shared = {b.data.untyped_storage().data_ptr() for b in got if in_placed_buffer(b, held[epoch])}
        assert len(shared) < views
    assert [ids(b) for b in epochs[0]] != [ids(b) for b in epochs[1]]


@pytest.mark.parametrize("record_format", ["TFRecord", "RecordIO"])
def test_a_record_too_long_for_its_batchs_region_sends_its_window_the_usual_way(tmp_path, record_format):
    """Regions are sized from the window before's mean record: a record ten times as long does not fit
    (a RecordIO record's parts that did are carried over), and its window is read whole and gathered."""
    sizes = [20_000] * 300
    sizes[170] = 300_000
    records = records_of(sizes)
    window = sh.ShuffleWindow(2, records=40, bytes=1 << 30)  # 40 records a window
    batches, feeder = reader(tmp_path, [encode(records, record_format)], 4, window, record_format)
    got = list(batches)
    feeder.join(10)
    assert feeder.error is None
    check_epoch(got, records, window_order(list(range(300)), sizes, window, 0, "train_0", 0, 4))
    big = [b for b in got if 170 in ids(b)]
    assert len(big) == 1 and not in_placed_buffer(big[0], placed_buffers(batches))  # gathered


def test_a_corrupted_record_skipped_in_a_placed_window_leaves_the_order_of_the_others(tmp_path):
    sizes = [18_000 + 16 * (i % 7) for i in range(200)]
    records = records_of(sizes)
    frames = [bytearray(encode_tfrecord(r)) for r in records]
    frames[90][-5] ^= 0xFF  # its data CRC no longer matches: skipped
    window = sh.ShuffleWindow(9, records=30, bytes=1 << 30)
    batches, feeder = reader(tmp_path, [b"".join(frames)], 5, window, max_corrupted_records_to_skip=1)
    got = list(batches)
    feeder.join(10)
    kept = [i for i in range(200) if i != 90]
    order = window_order(kept, [sizes[i] for i in kept], window, 0, "train_0", 0, 5)
    check_epoch(got, records, order)


def test_a_resumed_epoch_reads_the_records_not_trained_in_placed_windows(tmp_path):
    sizes = [17_000 + 64 * (i % 11) for i in range(240)]
    records = records_of(sizes)
    stream = encode(records, "TFRecord")
    window = sh.ShuffleWindow(4, records=25, bytes=1 << 30)
    batches, feeder = reader(tmp_path / "one", [stream], 6, window)
    handed = []
    for b in batches:
        handed += ids(b)
        if len(handed) == 9 * 6:  # a stop after 9 batches, inside the third window
            break
    state = batches.state_dict()
    feeder.join(10)
    again, feeder = reader(tmp_path / "two", [stream], 6, window)
    again.load_state_dict(state)
    rest = list(again)
    feeder.join(10)
    whole = window_order(list(range(240)), sizes, window, 0, "train_0", 0, 6)
    assert handed == whole[:54]
    check_epoch(rest, records, whole[54:])


def test_a_window_goes_on_across_a_file_channels_files(tmp_path):
    from sagemaker_dist.runtime import RecordBatches
    from sagemaker_dist.runtime.config import ContainerConfig

    sizes = [16_384 + 8 * i for i in range(150)]
    records = records_of(sizes)
    root = write_opt_ml(tmp_path / "opt_ml", {"train_0": "File"}, plan_layout(1, 1, input_mode="File"))
    channel = root / "input" / "data" / "train_0"
    channel.mkdir(parents=True)
    for name, part in (("a", records[:55]), ("b", records[55:101]), ("c", records[101:])):
        (channel / name).write_bytes(encode(part, "TFRecord"))
    window = sh.ShuffleWindow(3, records=20, bytes=1 << 30)
    config = ContainerConfig.load(root, {})
    batches = RecordBatches("train_0", 7, config=config, shuffle=window, pin_memory=False, compiled=True)
    check_epoch(list(batches), records, window_order(list(range(150)), sizes, window, 0, "train_0", 0, 7))


def test_place_refuses_regions_and_slots_that_do_not_fit_its_buffers(tmp_path):
    from sagemaker_dist.runtime.framing import batch_fill

    path = tmp_path / "records"
    path.write_bytes(encode(records_of([100] * 4), "TFRecord"))
    fd = os.open(path, os.O_RDONLY)
    try:
        reader_ = batch_fill._native.Reader(fd, "TFRecord", 1 << 20)
        data = np.zeros(1000, dtype=np.uint8)
        spans, state = np.zeros(8, dtype=np.int64), np.array([0, 0, -1], dtype=np.int64)
        fine = np.array([[0, 0, 1000]], dtype=np.int64)
        with pytest.raises(ValueError, match="a slot names no region"):
            reader_.place(data, None, spans, np.array([0, 1, 0, 0]), fine, state, 4, 0)
        with pytest.raises(ValueError, match="a region lies outside its buffer"):
            reader_.place(data, None, spans, np.zeros(4, dtype=np.int64), fine + [0, 0, 1], state, 4, 0)
        with pytest.raises(ValueError, match="a region lies outside its buffer"):  # the carry buffer: none
            reader_.place(data, None, spans, np.zeros(4, dtype=np.int64), fine + [1, 0, 0], state, 4, 0)
        status, count, nbytes, *_ = reader_.place(
            data, None, spans, np.zeros(4, dtype=np.int64), fine, state, 4, 0
        )
        assert (status, count, nbytes) == (batch_fill._native.FULL, 4, 400)
        assert spans.tolist() == [0, 100, 100, 200, 200, 300, 300, 400]
    finally:
        os.close(fd)
