"""Crafted and random streams at every reader: no crash, bounded memory, and no error but the named one.

Streams that break a naive reader: a TFRecord length field near 2**64 (which would wrap ``n + 16``),
one of 2**40 (which would reach TensorFlow's ``resize_uninitialized`` in the compiled reader, a write
through NULL), a claimed 1 GiB record in a 1 KB stream (which must not be allocated). The length CRC
is no defence (anyone computes it), so the streams here carry valid ones too.

In this process, with many examples: the Python framers (TFRecord through both scans, RecordIO,
TextLine), the C scan itself, and the compiled batch reader against the Python framers. In a child
process, with few: PipeModeDataset on both readers, the compiled op included, from regular files and
real FIFOs; a crash there is a negative return code, and the child runs under an address-space limit
and reports its peak RSS.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc

import numpy as np
import pytest
from helpers.runtime_helpers import write_opt_ml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sagemaker_dist.contract.record_formats import (
    MAX_RECORD_BYTES,
    MAX_RECORD_BYTES_ENV,
    RECORDIO_MAGIC,
    encode_recordio,
    encode_tfrecord,
    masked_crc32c,
    max_record_bytes,
    recordio_header,
)
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.runtime import RecordFormatError
from sagemaker_dist.runtime.fifo import F_SETPIPE_SZ, PIPE_BUFFER_BYTES, FifoReader
from sagemaker_dist.runtime.framing import LARGE_RECORD_BYTES, frame_views, make_framer
from sagemaker_dist.runtime.framing.base import READ_STEP

LARGE = LARGE_RECORD_BYTES
GIB = 1 << 30
# Lengths that broke a reader or sit at an edge: near 2**64 (n + 16 wraps), 2**40 (no such allocation),
# the limit and around it, the read step, the large-record threshold.
SPECIAL_LENGTHS = [
    *(2**64 - k for k in (1, 8, 12, 16, 17)),
    2**63,
    2**62 + 1,
    2**40,
    2**32 + 5,
    2**31,
    MAX_RECORD_BYTES,
    MAX_RECORD_BYTES - 100,
    GIB,
    READ_STEP + 1,
    LARGE,
    LARGE - 1,
    0,
    1,
]
MEMORY_BOUND = 200 << 20  # what a reader may take for a stream that claims more than it holds


def tfrecord_header(n: int, crc_ok: bool = True) -> bytes:
    """A TFRecord length field with its masked CRC (anyone can compute it), or a wrong one."""
    length = struct.pack("<Q", n)
    crc = masked_crc32c(length)
    return length + struct.pack("<I", crc if crc_ok else crc ^ 1)


lengths = st.one_of(st.sampled_from(SPECIAL_LENGTHS), st.integers(0, 2**64 - 1), st.integers(0, 4 * LARGE))


# Hypothesis's first example is its simplest: with few examples (the child processes), the simplest
# must already attack, so the strategies there put claims first and draw a few parts at least.
FEW = {"kinds": ("claim", "large", "record", "garbage"), "min_parts": 3}
valid_crc = st.sampled_from([True, False])  # the simplest: a valid CRC, which anyone can compute


@st.composite
def tfrecord_streams(draw, kinds=("record", "large", "claim", "garbage"), min_parts=0):
    """Valid records, length fields claiming anything (CRC valid or not), garbage; perhaps truncated."""
    parts = []
    for kind in draw(st.lists(st.sampled_from(kinds), min_size=min_parts, max_size=6)):
        if kind == "record":
            parts.append(encode_tfrecord(draw(st.binary(max_size=200))))
        elif kind == "large":
            size = draw(st.integers(LARGE, 2 * LARGE))
            parts.append(encode_tfrecord(bytes([draw(st.integers(0, 255))]) * size))
        elif kind == "claim":
            parts.append(tfrecord_header(draw(lengths), draw(valid_crc)) + draw(st.binary(max_size=3000)))
        else:
            parts.append(draw(st.binary(max_size=300)))
    data = b"".join(parts)
    return data[: draw(st.integers(0, len(data)))] if draw(st.booleans()) else data


@st.composite
def recordio_streams(draw, kinds=("record", "frame", "garbage"), min_parts=0):
    """Valid (multipart) records, frames with any flag and length, bad magic, garbage; perhaps truncated."""
    parts = []
    kinds = [kind for kind in kinds if kind != "large"]
    kinds = ["frame" if kind == "claim" else kind for kind in kinds]
    for kind in draw(st.lists(st.sampled_from(kinds), min_size=min_parts, max_size=6)):
        if kind == "record":
            parts.append(encode_recordio(draw(st.binary(max_size=200)), max_part=draw(st.integers(1, 64))))
        elif kind == "frame":
            flag = draw(st.integers(0, 7))
            n = draw(st.one_of(st.sampled_from([2**29 - 1, 2**28, 0, 1]), st.integers(0, 2**29 - 1)))
            magic = RECORDIO_MAGIC if draw(valid_crc) else draw(st.integers(0, 2**32 - 1))
            word = ((flag & 7) << 29) | n
            parts.append(struct.pack("<II", magic, word) + draw(st.binary(max_size=500)))
        else:
            parts.append(draw(st.binary(max_size=300)))
    data = b"".join(parts)
    return data[: draw(st.integers(0, len(data)))] if draw(st.booleans()) else data


@st.composite
def text_streams(draw, min_parts=0, **_):
    """Lines of any length (few newlines), \\r before some; the last perhaps without its newline."""
    line = st.binary(min_size=min(min_parts, 1) * 300, max_size=400).map(lambda b: b.replace(b"\n", b""))
    lines = draw(st.lists(line, min_size=min_parts, max_size=8))
    ends = draw(st.lists(st.sampled_from([b"\n", b"\r\n", b"\r"]), min_size=len(lines), max_size=len(lines)))
    data = b"".join(line + end for line, end in zip(lines, ends))
    return data[: draw(st.integers(0, len(data)))] if draw(st.booleans()) else data


class ShortReads(io.BytesIO):
    """A stream whose reads return at most ``most`` bytes, like a pipe the writer has not filled."""

    def __init__(self, data: bytes, most: int):
        super().__init__(data)
        self.most = most

    def read(self, n=-1):
        return super().read(min(n, self.most))

    def readinto(self, buffer):
        with memoryview(buffer) as mv:
            return super().readinto(mv[: self.most])


def frame_all(
    data: bytes,
    record_format: str,
    limit: int | None,
    chunk: int,
    most: int,
    large_reads: bool,
    skip: int = 0,
):
    """(records, error) of the framer over ``data`` (``skip``: corrupted TFRecords it may skip): any
    failure but a RecordFormatError naming this channel, epoch and an offset inside the stream fails the
    test; no record is over the limit."""
    stream = ShortReads(data, most)
    framer = make_framer(record_format, "fuzz_0", 7, skip, max_record_bytes=limit)
    read = stream.read if large_reads else None
    records, error = [], None
    try:
        for item in frame_views(stream.readinto, framer, chunk, read=read):
            if isinstance(item, list):
                records += item
                continue
            view, starts, ends, extra = item
            blob = bytes(view) + b"".join(extra)
            view.release()
            records += [blob[s : s + n] for s, n in zip(starts.tolist(), ends.tolist())]
    except RecordFormatError as err:
        assert (err.channel, err.epoch) == ("fuzz_0", 7)
        assert 0 <= err.offset <= len(data), err
        assert str(err).startswith(f"channel 'fuzz_0', epoch 7, byte offset {err.offset}: {record_format}: ")
        error = err
    assert all(len(r) <= framer.max_record for r in records)
    return records, error


limits = st.one_of(st.none(), st.integers(1, 3 * LARGE), st.sampled_from([MAX_RECORD_BYTES, 2**62]))
framing = dict(
    limit=limits,
    chunk=st.sampled_from([16, 100, 4096, 1 << 16, 1 << 20]),
    most=st.sampled_from([1, 7, 4096, 1 << 20]),
    large_reads=st.booleans(),
)
fuzz = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.usefixtures("tfrecord_scan")  # both scans: compiled and numpy
@fuzz
@given(data=tfrecord_streams(), **framing)
def test_tfrecord_framer_on_crafted_streams(data, limit, chunk, most, large_reads):
    frame_all(data, "TFRecord", limit, chunk, most, large_reads)


@pytest.mark.usefixtures("tfrecord_scan")
@fuzz
@given(data=st.binary(max_size=2000), **framing)
def test_tfrecord_framer_on_random_bytes(data, limit, chunk, most, large_reads):
    frame_all(data, "TFRecord", limit, chunk, most, large_reads)


@fuzz
@given(data=recordio_streams(), **framing)
def test_recordio_framer_on_crafted_streams(data, limit, chunk, most, large_reads):
    frame_all(data, "RecordIO", limit, chunk, most, large_reads)


@fuzz
@given(data=text_streams(), limit=st.one_of(st.none(), st.integers(1, 500)), chunk=framing["chunk"])
def test_text_lines_over_the_limit_are_refused(data, limit, chunk):
    records, error = frame_all(data, "TextLine", limit, chunk, 1 << 20, False)
    raw = data.split(b"\n")
    if not raw[-1]:
        raw.pop()  # the stream ends with its newline (or is empty)
    lines = [line[:-1] if line.endswith(b"\r") else line for line in raw]
    if error is None:
        assert records == lines
    else:  # the lines before the long one came; the error is at its offset, and it is long
        assert records == lines[: len(records)]
        assert len(lines[len(records)]) > (limit or MAX_RECORD_BYTES)
        assert error.offset == sum(len(line) + 1 for line in raw[: len(records)])


# The compiled batch reader (framing.batch_fill, runtime.torch's RecordBatches) on the same streams: the
# records the Python framer reads, and its error, word for word (text lines: the same offset; whether a
# line over the limit is "at least" that long depends on how the bytes came).


def fill_compiled(
    data: bytes,
    record_format: str,
    limit: int | None,
    batch: int,
    skip: int = 0,
    record_bytes: int = 0,
    capacity: int = 64,
    writes: int | None = None,
):
    """(records, error) of the compiled batch reader over ``data``, ``batch`` records at a time into
    buffers of ``capacity`` bytes at first: from a file, or with ``writes`` from a pipe a thread fills in
    writes of that many bytes (reads that end anywhere)."""
    from sagemaker_dist.runtime.framing.batch_fill import Batch, StreamFill

    framer = make_framer(record_format, "fuzz_0", 7, skip, max_record_bytes=limit)
    records, error = [], None
    with contextlib.ExitStack() as stack:
        if writes is None:
            source = stack.enter_context(tempfile.TemporaryFile())
            source.write(data)
            source.seek(0)
        else:
            source = stack.enter_context(pipe_fed_by_a_thread(data, writes))
        fill = StreamFill(source, framer, record_bytes, compiled=True)
        try:
            while True:
                b = Batch(batch, capacity)
                more = fill.fill(b)
                records += [b.data[b.offsets[i] : b.offsets[i + 1]].tobytes() for i in range(b.count)]
                if not more:
                    break
        except RecordFormatError as err:
            assert (err.channel, err.epoch) == ("fuzz_0", 7) and 0 <= err.offset <= len(data), err
            error = err
    assert all(len(r) <= framer.max_record for r in records)
    return records, error


@contextlib.contextmanager
def pipe_fed_by_a_thread(data: bytes, writes: int):
    """The read end of a pipe (of a FIFO's size) a thread writes ``data`` into, ``writes`` bytes a
    write, then closes."""
    read_fd, write_fd = os.pipe()
    fcntl.fcntl(read_fd, F_SETPIPE_SZ, PIPE_BUFFER_BYTES)

    def feed():
        try:
            for at in range(0, len(data), writes):
                os.write(write_fd, data[at : at + writes])
        except BrokenPipeError:  # the reader stopped at an error
            pass
        finally:
            os.close(write_fd)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    reader = os.fdopen(read_fd, "rb", buffering=0)
    try:
        yield reader
    finally:
        reader.close()
        writer.join(timeout=10)
        assert not writer.is_alive(), "the pipe's writer did not finish in 10 s"


def same_as_the_python_framer(
    data: bytes, record_format: str, limit: int | None, batch: int, **kwargs
) -> None:
    records, error = fill_compiled(data, record_format, limit, batch, **kwargs)
    expected, expected_error = frame_all(
        data, record_format, limit, 1 << 20, 1 << 20, False, kwargs.get("skip", 0)
    )
    if expected_error is None:
        assert error is None and records == expected
        return
    assert error is not None, expected_error
    # the records before the error, less a batch it did not fill
    assert records == expected[: len(records)] and len(expected) - len(records) < batch
    assert error.offset == expected_error.offset
    if record_format == "TextLine":
        assert "is longer than max_record_bytes" in str(error) and "is longer" in str(expected_error)
    else:
        assert str(error) == str(expected_error)


batches = st.sampled_from([1, 2, 5])


@pytest.mark.usefixtures("tfrecord_scan")
@fuzz
@given(data=tfrecord_streams(), limit=limits, batch=batches)
def test_the_compiled_batch_reader_reads_crafted_tfrecord_streams_as_the_framer_does(data, limit, batch):
    same_as_the_python_framer(data, "TFRecord", limit, batch)


@st.composite
def large_record_runs(draw):
    """(stream, length): runs of large TFRecords of one length (read by the kernel straight into the
    batch, CRC and next header in the same read), broken by records of another length, corrupted
    ones, a header with a bad CRC, garbage; perhaps truncated."""
    size = draw(st.sampled_from([LARGE, LARGE + 3, 3 * LARGE]))
    kinds = st.sampled_from(["run", "run", "corrupt", "other", "bad header", "garbage"])
    parts = []
    for i, kind in enumerate(draw(st.lists(kinds, min_size=1, max_size=8))):
        if kind == "run":
            parts += [
                encode_tfrecord(bytes([i, j]) * (size // 2) + bytes(size % 2))
                for j in range(draw(st.integers(1, 40)))
            ]
        elif kind == "corrupt":
            record = bytearray(encode_tfrecord(bytes([i]) * size))
            record[12 + draw(st.integers(0, size - 1))] ^= 1
            parts.append(bytes(record))
        elif kind == "other":
            parts.append(encode_tfrecord(bytes([i]) * draw(st.integers(0, 2 * LARGE))))
        elif kind == "bad header":
            parts.append(tfrecord_header(size, crc_ok=False) + bytes(size + 4))
        else:
            parts.append(draw(st.binary(min_size=1, max_size=20)))
    data = b"".join(parts)
    return (data[: draw(st.integers(0, len(data)))] if draw(st.booleans()) else data), size


@fuzz
@given(
    stream=large_record_runs(),
    batch=st.sampled_from([1, 3, 8, 64, 256]),
    skip=st.sampled_from([0, 2]),
    room=st.sampled_from(["small", "batch"]),
    writes=st.sampled_from([None, 4096, 50_000, 1 << 20]),
)
def test_the_compiled_batch_reader_reads_runs_of_large_records_from_a_pipe_as_the_framer_does(
    stream, batch, skip, room, writes
):
    data, size = stream
    capacity = 64 if room == "small" else batch * size
    same_as_the_python_framer(data, "TFRecord", None, batch, skip=skip, capacity=capacity, writes=writes)


@fuzz
@given(
    stream=large_record_runs(), batch=st.sampled_from([1, 3, 8, 64]), writes=st.sampled_from([None, 50_000])
)
def test_records_of_another_length_are_named_when_record_bytes_is_given(stream, batch, writes):
    data, size = stream
    records, error = fill_compiled(
        data, "TFRecord", None, batch, record_bytes=size, capacity=batch * size, writes=writes
    )
    expected, expected_error = frame_all(data, "TFRecord", None, 1 << 20, 1 << 20, False)
    other = next((i for i, r in enumerate(expected) if len(r) != size), None)
    if other is None and expected_error is None:
        assert error is None and records == expected
        return
    assert error is not None and records == expected[: len(records)]
    if other is not None:  # named at that record, before anything after it
        assert (
            f"a record of {len(expected[other])} bytes where every record is to be record_bytes={size}"
            in str(error)
        )
        assert other - len(records) < batch
    else:  # the stream's own error, or a record of another length that the stream cuts short
        assert str(error) == str(expected_error) or f"where every record is to be record_bytes={size}" in str(
            error
        )


@fuzz
@given(data=st.binary(max_size=2000), limit=limits, batch=batches)
def test_the_compiled_batch_reader_on_random_bytes(data, limit, batch):
    same_as_the_python_framer(data, "TFRecord", limit, batch)


@fuzz
@given(data=recordio_streams(), limit=limits, batch=batches)
def test_the_compiled_batch_reader_reads_crafted_recordio_streams_as_the_framer_does(data, limit, batch):
    same_as_the_python_framer(data, "RecordIO", limit, batch)


@fuzz
@given(data=text_streams(), limit=st.one_of(st.none(), st.integers(1, 500)), batch=batches)
def test_the_compiled_batch_reader_reads_text_lines_as_the_framer_does(data, limit, batch):
    same_as_the_python_framer(data, "TextLine", limit, batch)


@pytest.mark.scans("compiled")
@pytest.mark.usefixtures("tfrecord_scan")
@settings(max_examples=300, deadline=None)
@given(data=tfrecord_streams(), limit=st.integers(1, 2**62), end_cut=st.integers(0, 64))
def test_the_c_scan_stays_in_its_buffer_and_its_limit(data, limit, end_cut):
    from sagemaker_dist.runtime.framing import tfrecord

    end = max(len(data) - end_cut, 0)
    room = end // 16 + 1
    positions, frame_lengths = np.empty(room, np.int64), np.empty(room, np.int64)
    codes = np.empty(room, np.uint8)
    count, need = tfrecord._native.scan(data, end, positions, frame_lengths, codes, limit)
    assert 0 <= count <= room
    at = 0
    for i in range(count):  # frames follow each other, inside buf[:end], each within the limit
        assert positions[i] == at and 0 <= frame_lengths[i] <= limit
        assert at + frame_lengths[i] + 16 <= end and codes[i] in (0, 1, 2)
        at += int(frame_lengths[i]) + 16
    if need:  # a frame that does not fit: its real size, never a wrapped one
        n = struct.unpack_from("<Q", data, at)[0]
        assert need == n + 16 and n <= limit and at + need > end


@pytest.mark.scans("compiled")
@pytest.mark.usefixtures("tfrecord_scan")
def test_the_c_scan_refuses_a_limit_it_cannot_honour():
    from sagemaker_dist.runtime.framing import tfrecord

    buf = np.empty(1, np.int64)
    ok = np.empty(1, np.uint8)
    for bad in (0, 2**62 + 1, 2**64 - 1):
        with pytest.raises(ValueError, match="max_length"):
            tfrecord._native.scan(b"", 0, buf, buf, ok, bad)
    for bad in (-1, 2**64):
        with pytest.raises(OverflowError):
            tfrecord._native.scan(b"", 0, buf, buf, ok, bad)


# The reported attacks, exactly, and what memory a short stream that claims a long record costs.

ATTACKS = {  # name -> (stream after one good record, what the error says)
    "wraps": (tfrecord_header(2**64 - 8) + b"\0" * 1000, "a record of 18446744073709551608 bytes is longer"),
    "tib": (tfrecord_header(2**40) + b"\0" * 1000, "a record of 1099511627776 bytes is longer"),
    "gib": (tfrecord_header(GIB) + b"\0" * 1000, f"1012 byte(s) of a {GIB + 16}-byte frame"),
    "limit": (tfrecord_header(MAX_RECORD_BYTES) + b"\0" * 1000, "stream ended inside a record: 1012 byte(s)"),
    "over": (tfrecord_header(MAX_RECORD_BYTES + 1), f"is longer than max_record_bytes={MAX_RECORD_BYTES}"),
}
GOOD = encode_tfrecord(b"first")


def slow_writer(path, data: bytes) -> threading.Thread:
    """A FIFO at ``path`` and a writer that sends ``data`` and keeps its end open a while, as a slow feed
    does: the reader then hands over what it has and reads on (large records one ``read`` each)."""
    os.mkfifo(path)

    def write():
        with contextlib.suppress(BrokenPipeError), open(path, "wb") as f:
            f.write(data)
            f.flush()
            time.sleep(0.1)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    return writer


@pytest.mark.usefixtures("tfrecord_scan")
@pytest.mark.parametrize("name", sorted(ATTACKS))
@pytest.mark.parametrize("path", ["chunks", "large reads"])
def test_the_reported_attacks_on_the_python_framer_in_bounded_memory(name, path, tmp_path):
    stream, words = ATTACKS[name]
    writer = slow_writer(tmp_path / "train_0_0", GOOD + stream)
    framer = make_framer("TFRecord", "train_0", 0)
    got = []
    tracemalloc.start()
    try:  # os.read(fd, n) (FifoReader.read) allocates all n bytes: no read may ask for a claimed length
        with FifoReader(tmp_path / "train_0_0") as reader, pytest.raises(RecordFormatError) as info:
            read = reader.read if path == "large reads" else None
            for item in frame_views(reader.readinto, framer, 1 << 16, ready=reader.ready, read=read):
                got += item if isinstance(item, list) else [b"first"]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    writer.join(10)
    assert got == [b"first"]
    assert str(info.value).startswith("channel 'train_0', epoch 0, byte offset 21: TFRecord: ")
    assert words in str(info.value)
    assert peak < 2 * READ_STEP + (16 << 20), f"{peak >> 20} MiB for a {len(stream)}-byte stream"


def test_a_recordio_claim_and_a_line_without_end_cost_no_more_than_the_read_step():
    claim = recordio_header(0, 2**29 - 1) + b"\0" * 1000  # a 512 MiB part in a 1 KB stream
    tracemalloc.start()
    try:
        _, error = frame_all(claim, "RecordIO", None, 1 << 16, 1 << 20, True)
        _, line_error = frame_all(b"x" * (3 << 20), "TextLine", 1 << 20, 1 << 16, 1 << 20, False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "1008 byte(s) of a 536870920-byte frame" in str(error)
    assert "a record of at least" in str(line_error) and "max_record_bytes=1048576" in str(line_error)
    assert peak < 2 * READ_STEP + (16 << 20), f"{peak >> 20} MiB"


@pytest.mark.usefixtures("tfrecord_scan")
@pytest.mark.parametrize("large_reads", [False, True])
def test_records_longer_than_the_read_step_come_whole(monkeypatch, large_reads):
    from sagemaker_dist.runtime.framing import stream, tfrecord

    monkeypatch.setattr(tfrecord, "READ_STEP", 4096)  # buffers and reads grow past it in steps
    monkeypatch.setattr(stream, "READ_STEP", 4096)
    records = [os.urandom(n) for n in (3 * LARGE + 5, 10, 5 * LARGE, 4097, 0)]
    for record_format, encode in (("TFRecord", encode_tfrecord), ("RecordIO", encode_recordio)):
        data = b"".join(encode(r) for r in records)
        for most in (1000, 1 << 20):
            assert frame_all(data, record_format, None, 1 << 12, most, large_reads) == (records, None)
    lines = [r.replace(b"\n", b"-").replace(b"\r", b"-") for r in records]
    text = b"".join(line + b"\n" for line in lines)
    assert frame_all(text, "TextLine", None, 1 << 12, 1 << 20, False) == (lines, None)


def test_the_limit_is_set_once_and_checked(monkeypatch):
    monkeypatch.delenv(MAX_RECORD_BYTES_ENV, raising=False)
    assert max_record_bytes() == MAX_RECORD_BYTES == 2**31 - 1
    assert max_record_bytes(np.int64(5)) == 5
    monkeypatch.setenv(MAX_RECORD_BYTES_ENV, "4096")
    assert max_record_bytes() == 4096 and max_record_bytes(10) == 10  # the argument first
    assert make_framer("RecordIO").max_record == 4096
    for bad in ("0", "-1", "1e9", "2 GiB", str(2**62 + 1)):
        monkeypatch.setenv(MAX_RECORD_BYTES_ENV, bad)
        with pytest.raises(ConfigurationError, match=f"\\${MAX_RECORD_BYTES_ENV} is {bad!r}"):
            make_framer("TFRecord")
    monkeypatch.delenv(MAX_RECORD_BYTES_ENV)
    for bad in (0, -5, 2**62 + 1, 1.5, True, "100"):
        with pytest.raises(ConfigurationError, match="max_record_bytes is"):
            make_framer("TextLine", max_record_bytes=bad)


# PipeModeDataset on both readers, in a child process: a crash is its return code, memory its peak RSS.

CHILD = r"""
import json, os, resource, sys, threading, time
spec = json.load(sys.stdin)
os.environ["SAGEMAKER_DIST_OPT_ML"] = spec["root"]
import tensorflow as tf
from sagemaker_dist.runtime import PipeModeDataset
from sagemaker_dist.runtime.tensorflow.data import native_build

data_dir = os.path.join(spec["root"], "input", "data")


def feed(path, data, fifo):  # a regular file stands in for the FIFO, or a real FIFO and its writer
    if not fifo:
        with open(path, "wb") as f:
            f.write(data)
        return None

    def write():  # kept open a while, as a slow feed does: the Python reader reads large records on
        try:
            with open(path, "wb") as f:
                f.write(data)
                f.flush()
                time.sleep(0.1)
        except BrokenPipeError:  # the reader stopped at the error
            pass

    os.mkfifo(path)
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    return writer


def run(reader, epoch, case):
    os.environ[native_build.READER_ENV] = reader
    with open(case["data"], "rb") as f:
        writer = feed(os.path.join(data_dir, f"{case['channel']}_{epoch}"), f.read(), case["fifo"])
    out = {"reader": reader, "channel": case["channel"], "records": []}
    try:
        ds = PipeModeDataset(case["channel"], case["format"], max_record_bytes=case["limit"], fifo_timeout=10)
        for record in ds:
            out["records"].append(len(record.numpy()))
        out["ok"] = True
    except Exception as exc:
        out.update(ok=False, type=type(exc).__name__, error=str(exc)[:3000])
    if writer is not None:
        writer.join(10)
    return out


def vm_size():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmSize:"))


for epoch, reader in enumerate(spec["readers"]):  # each reader's threads, buffers and kernels made
    assert run(reader, epoch, spec["warm"])["ok"]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
# No allocation of a claimed length gets through: a claim of GiBs fails to allocate (and a reader that
# tried would crash or raise MemoryError) where it once merely reserved address space.
limit = vm_size() + spec["headroom"]
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
for epoch, reader in enumerate(spec["readers"]):
    for case in spec["cases"]:
        print(json.dumps(run(reader, epoch, case)), flush=True)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
print(json.dumps({"rss_growth": after - before}), flush=True)
"""
READERS = ("python", "compiled")
HEADROOM = 768 << 20  # address space past the warmed-up reader's: room for threads, not for a claim


@pytest.fixture(scope="module")
def compiled_reader():
    """The compiled reader built (once, into the build cache) before a child needs it; else a skip."""
    pytest.importorskip("tensorflow")
    from sagemaker_dist.runtime.tensorflow.data import native_build

    saved = os.environ.get(native_build.READER_ENV)
    os.environ[native_build.READER_ENV] = "compiled"
    try:
        native_build.compiled_op()
    except native_build.NativeReaderError as exc:
        pytest.skip(str(exc))
    finally:
        if saved is None:
            del os.environ[native_build.READER_ENV]
        else:
            os.environ[native_build.READER_ENV] = saved


def read_in_a_child(root, streams: list[tuple], fifo: bool = False) -> tuple[list[dict], int]:
    """Each (format, stream, limit[, through a FIFO]) read by PipeModeDataset on both readers in one
    child process: (one result per stream and reader, the child's RSS growth); a crash fails here."""
    cases = []
    for i, (record_format, data, limit, *through_fifo) in enumerate(streams):
        fifo = through_fifo[0] if through_fifo else fifo
        (root / f"case{i}.bin").write_bytes(data)
        cases.append(
            {"channel": f"case{i}", "format": record_format, "data": str(root / f"case{i}.bin"),
             "limit": limit, "fifo": fifo}
        )  # fmt: skip
    warm = [os.urandom(n) for n in (10, 100_000, 50, 3 * LARGE)] * 8
    (root / "warm.bin").write_bytes(b"".join(encode_tfrecord(r) for r in warm))
    write_opt_ml(root, [c["channel"] for c in cases] + ["warm"])
    spec = {
        "root": str(root),
        "readers": READERS,
        "cases": cases,
        "warm": {"channel": "warm", "format": "TFRecord", "data": str(root / "warm.bin"), "limit": None,
                 "fifo": False},
        "headroom": HEADROOM,
    }  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != MAX_RECORD_BYTES_ENV}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert child.returncode == 0, f"the child exited {child.returncode}:\n{child.stderr[-4000:]}"
    lines = [json.loads(line) for line in child.stdout.splitlines()]
    growth = lines.pop()["rss_growth"]
    assert len(lines) == len(READERS) * len(cases)
    return lines, growth


def check_named(result: dict, record_format: str, epoch: int, size: int) -> int:
    """The byte offset a failed read names; any other failure fails the test."""
    error = result["error"]
    channel = result["channel"]
    # A stream that is not RecordIO (a bad magic number) is InternalError from either, as from AWS's reader.
    not_recordio = record_format == "RecordIO" and ": RecordIO: bad magic number" in error
    if result["reader"] == "compiled":
        assert result["type"] == ("InternalError" if not_recordio else "DataLossError"), error
        named = f"}} channel '{channel}', epoch {epoch}, byte offset "
    else:  # the reader thread's exception, through py_function
        assert result["type"] == ("InternalError" if not_recordio else "InvalidArgumentError"), error
        kind = "NotRecordIOError" if not_recordio else "RecordFormatError"
        named = f"}} {kind}: channel '{channel}', epoch {epoch}, byte offset "
    assert named in error, error
    offset = int(error.split(named, 1)[1].split(":", 1)[0])
    assert 0 <= offset <= size and f"byte offset {offset}: {record_format}: " in error, error
    return offset


@pytest.mark.usefixtures("compiled_reader")
def test_the_reported_attacks_on_both_readers_of_pipe_mode_dataset(tmp_path):
    # (format, the first record, what follows it, max_record_bytes, what the error says)
    attacks = [("TFRecord", GOOD, stream, None, words) for stream, words in ATTACKS.values()]
    over = "bytes is longer than max_record_bytes=4096"
    # The same through RecordIO and text lines: a 512 MiB part in 1 KB, a line with no end, over a limit.
    attacks += [
        ("RecordIO", encode_recordio(b"first"), recordio_header(1, 2**29 - 1) + b"\0" * 1000, None,
         "1008 byte(s) of a 536870920-byte frame"),
        ("RecordIO", encode_recordio(b"first"), encode_recordio(b"y" * 5000, max_part=1000), 4096,
         f"a record of at least 5000 {over}"),
        ("TextLine", b"first\n", b"x" * (3 << 20), 1 << 20,
         "a record of at least"),
        ("TFRecord", GOOD, encode_tfrecord(b"z" * 5000), 4096, f"a record of 5000 {over}"),
    ]  # fmt: skip
    # Each from a regular file and through a real FIFO whose writer keeps it open a while: the Python
    # reader then reads large records one by one, where it once asked os.read for the claimed length.
    streams = [
        (f, first + rest, limit, fifo) for fifo in (False, True) for f, first, rest, limit, _ in attacks
    ]
    results, growth = read_in_a_child(tmp_path, streams)
    for result in results:
        i = int(result["channel"][4:])
        record_format, first, _, _, words = attacks[i % len(attacks)]
        assert not result["ok"] and result["records"] == [5], result  # b"first", then the named error
        offset = check_named(result, record_format, READERS.index(result["reader"]), len(streams[i][1]))
        assert offset == len(first) and words in result["error"], result
    assert growth < MEMORY_BOUND, f"the readers grew by {growth >> 20} MiB"


small_limits = st.one_of(st.none(), st.integers(1, 3 * LARGE))


@pytest.mark.usefixtures("compiled_reader")
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    streams=st.lists(
        st.one_of(
            st.tuples(st.just("TFRecord"), tfrecord_streams(**FEW), small_limits),
            st.tuples(st.just("RecordIO"), recordio_streams(**FEW), small_limits),
            st.tuples(st.just("TextLine"), text_streams(**FEW), st.one_of(st.none(), st.integers(1, 300))),
        ),
        min_size=12,
        max_size=12,
    )
)
def test_both_readers_of_pipe_mode_dataset_on_crafted_streams(tmp_path_factory, streams):
    results, growth = read_in_a_child(tmp_path_factory.mktemp("fuzz"), streams, fifo=False)
    by_stream = {}
    for result in results:
        i = int(result["channel"][4:])
        record_format, data, limit = streams[i]
        epoch = READERS.index(result["reader"])
        if result["ok"]:
            outcome = ("ok", tuple(result["records"]))
        else:
            offset = check_named(result, record_format, epoch, len(data))
            outcome = ("error", tuple(result["records"]), offset)
        assert all(n <= (limit or MAX_RECORD_BYTES) for n in result["records"])
        by_stream.setdefault(i, []).append(outcome)
    for outcomes in by_stream.values():  # both readers read the same records and fail at the same place
        assert outcomes[0] == outcomes[1], outcomes
    assert growth < MEMORY_BOUND, f"the readers grew by {growth >> 20} MiB"
