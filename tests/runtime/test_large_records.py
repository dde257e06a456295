"""Large TFRecords read one by one straight from the stream (Framer.read_large through frame_views).

Pure Python (no TensorFlow): in-memory streams whose ``read`` can return short, as a pipe does, and
a real FIFO fed by a separate process.
"""

from __future__ import annotations

import io
import logging
import os

import pytest
from helpers.runtime_helpers import write_in_short_writes
from hypothesis import given, settings
from hypothesis import strategies as st

from sagemaker_dist.contract.record_formats import encode_tfrecord
from sagemaker_dist.runtime import RecordFormatError
from sagemaker_dist.runtime.fifo import FifoReader
from sagemaker_dist.runtime.framing import LARGE_RECORD_BYTES, frame_views, make_framer

LARGE = LARGE_RECORD_BYTES

pytestmark = pytest.mark.usefixtures("tfrecord_scan")  # both scans: compiled and numpy


class ShortReads(io.BytesIO):
    """A stream whose reads return at most ``most`` bytes, like a pipe the writer has not filled."""

    def __init__(self, data: bytes, most: int):
        super().__init__(data)
        self.most = most
        self.reads = 0

    def read(self, n=-1):
        self.reads += 1
        return super().read(min(n, self.most))

    def readinto(self, buffer):
        with memoryview(buffer) as mv:
            return super().readinto(mv[: self.most])


def read_items(stream, chunk_size=1 << 16, group=0, framer=None, ready=None):
    """(records, kinds, record count after each list of large records) read with ``read=``."""
    framer = framer or make_framer("TFRecord", "train_0", 0)
    records, kinds, counts = [], [], []
    for item in frame_views(stream.readinto, framer, chunk_size, ready=ready, read=stream.read, group=group):
        if isinstance(item, list):
            records += item
            kinds.append("large")
            counts.append(len(records))
        else:
            view, starts, lengths, extra = item
            blob = bytes(view) + b"".join(extra)
            view.release()
            records += [blob[s : s + n] for s, n in zip(starts.tolist(), lengths.tolist())]
            kinds.append("chunk")
    return records, kinds, counts


sizes = st.one_of(st.integers(0, 300), st.integers(LARGE - 2, LARGE + 3000))


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(sizes, max_size=12),
    chunk=st.integers(64, 3 * LARGE),
    most=st.integers(1, 2 * LARGE),
    group=st.integers(0, 4),
)
def test_mixed_sizes_round_trip_with_short_reads(lengths, chunk, most, group):
    records = [os.urandom(n) for n in lengths]
    stream = ShortReads(b"".join(encode_tfrecord(r) for r in records), most)
    got, kinds, _ = read_items(stream, chunk, group)
    assert got == records


def test_large_records_come_in_whole_groups_and_leave_for_small_ones():
    large = [os.urandom(LARGE + i) for i in range(10)]
    small = [os.urandom(50) for _ in range(5)]
    records = large + small + large
    data = b"".join(encode_tfrecord(r) for r in records)
    got, kinds, counts = read_items(io.BytesIO(data), chunk_size=3 * LARGE, group=4)
    assert got == records
    assert "large" in kinds and "chunk" in kinds
    # A list of large records ends on a multiple of the group (a batch boundary), except where a
    # small record or the end of the stream cuts it short.
    cut_short = {10, len(records)}
    assert all(n % 4 == 0 or n in cut_short for n in counts), counts


def test_one_read_per_record_when_the_pipe_has_the_bytes():
    records = [os.urandom(LARGE * 3) for _ in range(20)]
    stream = ShortReads(b"".join(encode_tfrecord(r) for r in records), 1 << 30)
    got, kinds, counts = read_items(stream, chunk_size=4 * LARGE)
    assert got == records
    # The first read stops at the first chunk's target (64 KiB), inside the first record; from there
    # each record is one read of its data and one of its CRC plus the next header, in one list.
    assert kinds == ["large"] and counts == [len(records)]
    assert len(records) <= stream.reads <= 2 * len(records) + 4


def test_truncated_large_record_names_its_offset_after_the_records_before_it():
    records = [os.urandom(LARGE + 100) for _ in range(4)]
    data = b"".join(encode_tfrecord(r) for r in records)
    frame = LARGE + 116
    stream = io.BytesIO(data[: 3 * frame + 5000])
    framer = make_framer("TFRecord", "train_2", 5)
    got = []
    with pytest.raises(RecordFormatError) as info:
        for item in frame_views(stream.readinto, framer, 1024, read=stream.read):
            got += item if isinstance(item, list) else []
    err = info.value
    assert got == records[:3]
    assert (err.channel, err.epoch, err.offset) == ("train_2", 5, 3 * frame)
    assert f"ended inside a record: 5000 byte(s) of a {frame}-byte frame" in str(err)


def test_corrupt_large_record_fails_or_is_skipped_and_counted(caplog):
    records = [bytes([i]) * (LARGE + 10) for i in range(6)]
    frame = LARGE + 26
    data = bytearray(b"".join(encode_tfrecord(r) for r in records))
    data[4 * frame + 12 + 7] ^= 0x01  # a bit of record 4's data
    with pytest.raises(RecordFormatError, match=f"byte offset {4 * frame}: TFRecord: data CRC mismatch"):
        read_items(io.BytesIO(bytes(data)), chunk_size=2 * LARGE)
    framer = make_framer("TFRecord", "train_0", 1, max_corrupted_records_to_skip=1)
    with caplog.at_level(logging.WARNING, logger="sagemaker_dist.runtime.framing.base"):
        got, _, _ = read_items(io.BytesIO(bytes(data)), chunk_size=2 * LARGE, framer=framer)
    assert got == records[:4] + records[5:]
    assert framer.skipped == 1 and framer.records == 5
    assert f"epoch 1, byte offset {4 * frame}: skipped corrupted TFRecord record" in caplog.text


def test_corrupt_length_of_a_large_record_is_never_skipped():
    records = [b"x" * (LARGE + 10) for _ in range(4)]
    frame = LARGE + 26
    data = bytearray(b"".join(encode_tfrecord(r) for r in records))
    data[2 * frame + 9] ^= 0x01  # record 2's length CRC
    framer = make_framer("TFRecord", "train_0", 0, max_corrupted_records_to_skip=5)
    with pytest.raises(RecordFormatError, match=f"byte offset {2 * frame}: TFRecord: length CRC mismatch"):
        read_items(io.BytesIO(bytes(data)), chunk_size=2 * LARGE, framer=framer)


def test_a_quiet_writer_gets_the_large_records_read_so_far_handed_over():
    records = [os.urandom(LARGE) for _ in range(6)]
    data = b"".join(encode_tfrecord(r) for r in records)
    quiet = []

    def ready(timeout):  # the writer never has more ready: every record is handed over at once
        quiet.append(timeout)
        return False

    got, kinds, counts = read_items(io.BytesIO(data), chunk_size=2 * LARGE, group=100, ready=ready)
    assert got == records
    assert quiet, "the stall check was never asked"
    assert counts == sorted(set(counts)) and len(counts) >= 4  # one by one, not one group of 100


def test_large_records_through_a_real_fifo_from_another_process(tmp_path):
    records = [os.urandom(LARGE + 1000 * i) for i in range(30)] + [b"tail"]
    (tmp_path / "src").write_bytes(b"".join(encode_tfrecord(r) for r in records))
    fifo = tmp_path / "train_0_0"
    os.mkfifo(fifo)
    writer = write_in_short_writes(fifo, tmp_path / "src")
    with FifoReader(fifo) as reader:
        got, kinds, _ = read_items(reader, 1 << 16, group=8, ready=reader.ready)
        assert reader.bytes_read == (tmp_path / "src").stat().st_size
    assert writer.wait(30) == 0
    assert got == records
    assert "large" in kinds
