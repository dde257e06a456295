"""Record framers: TFRecord (masked CRC32C), SageMaker RecordIO (multipart, padding), text lines.

Pure Python (no TensorFlow): streams are in-memory or real FIFOs fed by a separate process.
"""

from __future__ import annotations

import io
import logging
import os
import platform
import struct
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sagemaker_dist.contract.record_formats import (
    FRAMED_FORMATS,
    RECORD_FORMATS,
    RECORDIO_MAGIC,
    encode_recordio,
    encode_tfrecord,
    masked_crc32c,
)
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.runtime import RecordFormatError
from sagemaker_dist.runtime.fifo import FifoReader
from sagemaker_dist.runtime.framing import FRAMERS, iter_records, make_framer

pytestmark = pytest.mark.usefixtures("tfrecord_scan")  # both scans: compiled and numpy


def test_every_record_format_has_a_framer_and_no_other_name_is_taken():
    assert sorted(FRAMERS) == sorted(FRAMED_FORMATS)  # RECORD_FORMATS and WebDataset (framed, no TF op)
    assert set(RECORD_FORMATS) < set(FRAMED_FORMATS)
    with pytest.raises(ConfigurationError, match="'Parquet' is not one of RecordIO, TFRecord, TextLine"):
        make_framer("Parquet")


def read_all(data: bytes, record_format: str, chunk_size: int = 64, **kw) -> list[bytes]:
    return list(iter_records(io.BytesIO(data).readinto, record_format, chunk_size=chunk_size, **kw))


def corrupt(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]


payloads = st.lists(st.binary(min_size=0, max_size=300), max_size=40)


def test_masked_crc32c_matches_the_tfrecord_spec():
    # Known value: CRC32C("123456789") = 0xE3069283, then masked as TFRecord does.
    crc = 0xE3069283
    assert masked_crc32c(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@settings(max_examples=60, deadline=None)
@given(records=payloads, chunk=st.integers(min_value=1, max_value=700))
def test_tfrecord_round_trip_at_any_chunk_size(records, chunk):
    data = b"".join(encode_tfrecord(r) for r in records)
    assert read_all(data, "TFRecord", chunk) == records


def test_tfrecord_fixed_size_records_take_the_vectorised_path_and_still_verify():
    records = [os.urandom(100) for _ in range(500)] + [b"odd length"] + [os.urandom(100) for _ in range(50)]
    data = b"".join(encode_tfrecord(r) for r in records)
    assert read_all(data, "TFRecord", 1 << 16) == records
    bad_at = 300 * 116 + 12 + 5  # inside the data of record 300
    with pytest.raises(RecordFormatError, match=f"byte offset {300 * 116}.*data CRC mismatch"):
        read_all(corrupt(data, bad_at), "TFRecord", 1 << 16)


def test_records_larger_than_the_buffer_grow_it():
    records = [os.urandom(5000), b"", os.urandom(70_000)]
    data = b"".join(encode_tfrecord(r) for r in records)
    assert read_all(data, "TFRecord", 1024) == records


def test_truncated_last_record_is_an_error_with_its_offset():
    records = [b"a" * 10, b"b" * 20, b"c" * 30]
    data = b"".join(encode_tfrecord(r) for r in records)
    last = len(encode_tfrecord(records[0])) + len(encode_tfrecord(records[1]))
    with pytest.raises(RecordFormatError) as info:
        read_all(data[:-5], "TFRecord", channel="train_3", epoch=2)
    err = info.value
    assert (err.channel, err.epoch, err.offset) == ("train_3", 2, last)
    assert f"channel 'train_3', epoch 2, byte offset {last}" in str(err)
    assert "ended inside a record: 41 byte(s) of a 46-byte frame" in str(err)


def test_corrupt_data_crc_is_an_error_naming_the_offset():
    data = b"".join(encode_tfrecord(bytes([i]) * 40) for i in range(5))
    bad_record_at = 2 * 56
    with pytest.raises(RecordFormatError, match=f"byte offset {bad_record_at}: TFRecord: data CRC mismatch"):
        read_all(corrupt(data, bad_record_at + 20), "TFRecord")


def test_corrupt_records_are_skipped_within_the_limit_and_counted(caplog):
    records = [bytes([i]) * 40 for i in range(6)]
    data = b"".join(encode_tfrecord(r) for r in records)
    data = corrupt(corrupt(data, 1 * 56 + 20), 4 * 56 + 20)  # records 1 and 4
    framer = make_framer("TFRecord", "train_0", 0, max_corrupted_records_to_skip=1)
    from sagemaker_dist.runtime.framing import frame_stream

    with caplog.at_level(logging.WARNING, logger="sagemaker_dist.runtime.framing.base"):
        out = []
        for blob, starts, lengths in frame_stream(io.BytesIO(data).readinto, framer, 64):
            out += [blob[s : s + n] for s, n in zip(starts, lengths)]
    assert out == [records[i] for i in (0, 2, 3, 5)]
    assert framer.skipped == 2
    assert "2 skipped so far" in caplog.text and "byte offset 224" in caplog.text


def test_skip_limit_counts_corrupted_records_in_a_row():
    data = b"".join(encode_tfrecord(bytes([i]) * 40) for i in range(5))
    data = corrupt(corrupt(data, 1 * 56 + 20), 2 * 56 + 20)  # two in a row
    with pytest.raises(RecordFormatError, match="2 corrupted records in a row, over max_corrupted"):
        read_all(data, "TFRecord", max_corrupted_records_to_skip=1)


def test_corrupt_length_is_never_skipped():
    data = b"".join(encode_tfrecord(b"x" * 40) for _ in range(3))
    with pytest.raises(RecordFormatError, match="byte offset 56: TFRecord: length CRC mismatch"):
        read_all(corrupt(data, 56 + 1), "TFRecord", max_corrupted_records_to_skip=5)


def test_wrong_format_is_reported_early():
    data = b"".join(encode_recordio(b"x" * 40) for _ in range(3))
    match = "byte offset 0: TFRecord: length CRC mismatch.*record_format"
    with pytest.raises(RecordFormatError, match=match):
        read_all(data, "TFRecord")


@settings(max_examples=60, deadline=None)
@given(records=payloads, chunk=st.integers(min_value=1, max_value=700), part=st.integers(1, 64))
def test_recordio_round_trip_with_multipart_records(records, chunk, part):
    data = b"".join(encode_recordio(r, max_part=part) for r in records)
    assert read_all(data, "RecordIO", chunk) == records


def test_recordio_frames_are_padded_to_four_bytes():
    frame = encode_recordio(b"abcde")
    magic, word = struct.unpack_from("<II", frame)
    assert (magic, word, len(frame)) == (RECORDIO_MAGIC, 5, 8 + 8)
    assert frame[8:] == b"abcde\0\0\0"
    multi = encode_recordio(b"abcdefghij", max_part=4)
    flags = []
    pos = 0
    while pos < len(multi):
        _, word = struct.unpack_from("<II", multi, pos)
        flags.append(word >> 29)
        pos += 8 + (word & 0x1FFFFFFF) + (-(word & 0x1FFFFFFF) % 4)
    assert flags == [1, 2, 3]


def test_recordio_bad_magic_and_flag_sequence_are_errors():
    data = encode_recordio(b"a" * 12) + encode_recordio(b"b" * 12)
    with pytest.raises(RecordFormatError, match="byte offset 20: RecordIO: bad magic number"):
        read_all(corrupt(data, 20), "RecordIO")
    # The record before the bad frame is delivered first, then the error.
    it = iter_records(io.BytesIO(corrupt(data, 20)).readinto, "RecordIO")
    assert next(it) == b"a" * 12
    with pytest.raises(RecordFormatError, match="byte offset 20"):
        next(it)
    middle_first = struct.pack("<II", RECORDIO_MAGIC, (2 << 29) | 4) + b"abcd"
    with pytest.raises(RecordFormatError, match="byte offset 0: RecordIO: multipart flag 2 out of sequence"):
        read_all(middle_first, "RecordIO")
    unfinished = encode_recordio(b"abcdefgh", max_part=4)[:12]
    with pytest.raises(RecordFormatError, match="ended inside a record"):
        read_all(unfinished, "RecordIO")


def test_text_lines():
    data = b"first\nsecond\r\n\nlast without newline"
    assert read_all(data, "TextLine", 4) == [b"first", b"second", b"", b"last without newline"]
    assert read_all(b"a\nb\n", "TextLine") == [b"a", b"b"]
    assert read_all(b"", "TextLine") == []


def test_unknown_format_and_negative_skip_are_rejected():
    with pytest.raises(ValueError, match="'Parquet' is not one of RecordIO, TFRecord, TextLine"):
        make_framer("Parquet")
    with pytest.raises(ValueError, match="max_corrupted_records_to_skip is -1"):
        make_framer("TFRecord", max_corrupted_records_to_skip=-1)


@pytest.mark.parametrize("record_format", ["RecordIO", "TextLine"])
def test_a_skip_count_is_refused_for_formats_without_a_crc(record_format):
    """As AWS's PipeModeDataset: only a TFRecord's data CRC finds a corrupted record to skip."""
    with pytest.raises(
        ConfigurationError, match=f"only be set for record_format='TFRecord' .got '{record_format}'"
    ):
        make_framer(record_format, max_corrupted_records_to_skip=1)
    assert make_framer(record_format, max_corrupted_records_to_skip=0).max_skip == 0
    assert make_framer("TFRecord", max_corrupted_records_to_skip=3).max_skip == 3


WRITER_DIES = """
import os, sys
out = os.open(sys.argv[1], os.O_WRONLY)
data = open(sys.argv[2], "rb").read()
os.write(out, data)
os._exit(3)  # dies mid-record: no flush, no close
"""


def test_writer_process_dying_mid_record_on_a_real_fifo(tmp_path):
    records = [os.urandom(1000) for _ in range(10)]
    data = b"".join(encode_tfrecord(r) for r in records)
    cut = 7 * 1016 + 500  # in the middle of record 7
    (tmp_path / "partial").write_bytes(data[:cut])
    fifo = tmp_path / "train_0_0"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", WRITER_DIES, str(fifo), str(tmp_path / "partial")])
    got = []
    with FifoReader(fifo) as reader, pytest.raises(RecordFormatError) as info:
        for record in iter_records(reader.readinto, "TFRecord", channel="train_0", epoch=0):
            got.append(record)
    assert writer.wait(timeout=30) == 3
    assert got == records[:7]
    assert info.value.offset == 7 * 1016
    assert "channel 'train_0', epoch 0, byte offset 7112" in str(info.value)


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=3000), min_size=1, max_size=60),
    chunk=st.sampled_from([16, 100, 4096, 1 << 16]),
    flip=st.integers(min_value=0),
)
def test_records_of_varying_length_and_one_flipped_bit(sizes, chunk, flip):
    """Both scans frame varying lengths, and a flipped bit anywhere is an error naming its offset."""
    records = [os.urandom(n) for n in sizes]
    data = b"".join(encode_tfrecord(r) for r in records)
    assert read_all(data, "TFRecord", chunk_size=chunk) == records
    at = flip % len(data)
    with pytest.raises(RecordFormatError, match=r"byte offset \d+: TFRecord"):
        read_all(corrupt(data, at), "TFRecord", chunk_size=chunk)


# Lengths around the folded CRC32C's edges (from 256 bytes, 256 a step) and the three lanes' (3 x 4096).
CRC_SIZES = [
    0,
    1,
    7,
    8,
    9,
    63,
    64,
    1000,
    *range(250, 300),
    *range(316, 324),
    *range(500, 530),
    *range(760, 780),
    *range(1016, 1040),
    2048,
]
CRC_SIZES += [3 * 4096 + 769, 100_001, 1 << 20]
CRC_CHECK = """
import os, sys
from sagemaker_dist.contract.record_formats import masked_crc32c
from sagemaker_dist.runtime.framing import _record_reader, _tfrecord_scan
for module in (_record_reader, _tfrecord_scan):
    for n in map(int, sys.argv[1].split(",")):
        data = os.urandom(n + 3)
        for at in range(4):  # every alignment
            view = memoryview(data)[at : at + n]
            assert module.masked_crc32c(view) == masked_crc32c(bytes(view)), (module.__name__, n, at)
print(_record_reader.HARDWARE_CRC, _tfrecord_scan.HARDWARE_CRC)
"""


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())


@pytest.mark.scans("compiled")  # the numpy scan has no CRC of its own
@pytest.mark.parametrize("path", ["default", "lanes"])
def test_the_compiled_crc_matches_the_crc32c_package(path):
    # each path the CPU can take: folded where it has AVX-512 and VPCLMULQDQ, else (and with
    # SAGEMAKER_DIST_CRC32C=lanes) the CRC32C instruction in three lanes
    env = {**os.environ, "SAGEMAKER_DIST_CRC32C": path}
    argv = [sys.executable, "-c", CRC_CHECK, ",".join(map(str, CRC_SIZES))]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    if platform.machine() != "x86_64":
        return
    flags = cpu_flags()
    expected = "1" if "sse4_2" in flags else "0"
    if path == "default" and {"avx512f", "vpclmulqdq"} <= flags:
        expected = "2"
    assert out.stdout.split() == [expected, expected]
