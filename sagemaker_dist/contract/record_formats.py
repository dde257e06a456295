"""The record formats a Pipe-mode channel carries, written once: TFRecord and SageMaker RecordIO.

Readers (``runtime.framing``) frame these bytes; writers (the public ``launch.records`` writers, local
mode's feeder, demo data, tests and benchmarks) encode them with the functions here. The one dependency
beyond the stdlib is the C-backed ``crc32c`` that TFRecord's checksums need, imported by the encoder
that uses it: a job that only checks a format name (``PipeModeDataset`` on the compiled reader) does
not load it, nor does the SDK side until it writes a TFRecord.
"""

from __future__ import annotations

import operator
import struct

from sagemaker_dist.contract.environment import variable
from sagemaker_dist.errors import ConfigurationError

RECORD_FORMATS = ("RecordIO", "TFRecord", "TextLine")
# WebDataset shards (tar), one record per sample: read by the PyTorch readers (PipeBatches, RecordBatches)
# and the plain-Python ones (framing.iter_records), not by PipeModeDataset's TensorFlow op
WEBDATASET = "WebDataset"
FRAMED_FORMATS = (*RECORD_FORMATS, WEBDATASET)

# The longest record a reader accepts (a TFRecord's data, a RecordIO record's parts joined, a text line
# without its newline): a length field is the stream's word, not a fact, so every reader refuses a
# longer one before it allocates anything for it. 2 GiB - 1 is what a protobuf message (a
# tf.train.Example) can hold. Set per dataset (``max_record_bytes=``) or per process (the variable).
MAX_RECORD_BYTES = 2**31 - 1
MAX_RECORD_BYTES_ENV = "SAGEMAKER_DIST_MAX_RECORD_BYTES"
# The highest limit that may be set: lengths up to it plus a frame's few bytes never wrap 64 bits.
MAX_RECORD_BYTES_CEILING = 2**62

CRC_MASK_DELTA = 0xA282EAD8
U32 = 0xFFFFFFFF
RECORDIO_MAGIC = 0xCED7230A
RECORDIO_LENGTH_BITS = 29
RECORDIO_LENGTH_MASK = (1 << RECORDIO_LENGTH_BITS) - 1
RECORDIO_MAX_PART = RECORDIO_LENGTH_MASK  # the largest part one RecordIO frame can hold
# RecordIO continuation flag (top 3 bits): 0 whole record, 1 first part, 2 middle part, 3 last part.
RECORDIO_WHOLE, RECORDIO_START, RECORDIO_MIDDLE, RECORDIO_END = 0, 1, 2, 3


def check_record_format(record_format: str, formats: tuple[str, ...] = RECORD_FORMATS) -> str:
    """``record_format`` if it is one of ``formats`` (default ``RECORD_FORMATS``, what every reader reads;
    ``FRAMED_FORMATS`` for the readers that frame WebDataset shards too), else a ConfigurationError
    naming them."""
    if record_format not in formats:
        raise ConfigurationError(f"record_format {record_format!r} is not one of {', '.join(formats)}")
    return record_format


def check_corrupted_skip(record_format: str, max_corrupted_records_to_skip: int) -> int:
    """``max_corrupted_records_to_skip`` if a reader of ``record_format`` can honour it, else a
    ConfigurationError. Only a TFRecord's data CRC tells a corrupted record from a good one, so AWS's
    PipeModeDataset refuses the option for other formats, and so does every reader here."""
    if max_corrupted_records_to_skip < 0:
        raise ConfigurationError(
            f"max_corrupted_records_to_skip is {max_corrupted_records_to_skip}; use 0 or more"
        )
    if max_corrupted_records_to_skip and record_format != "TFRecord":
        raise ConfigurationError(
            f"max_corrupted_records_to_skip={max_corrupted_records_to_skip} can only be set for "
            f"record_format='TFRecord' (got {record_format!r}: it has no CRC to find a corrupted record by)"
        )
    return max_corrupted_records_to_skip


def max_record_bytes(value: int | None = None) -> int:
    """The record length limit: ``value``, else ``$SAGEMAKER_DIST_MAX_RECORD_BYTES``, else the default.

    A ConfigurationError names a value that is not a whole number from 1 to ``MAX_RECORD_BYTES_CEILING``.
    """
    where, given = "max_record_bytes", value
    if value is None:
        given = (variable(MAX_RECORD_BYTES_ENV) or "").strip()
        if not given:
            return MAX_RECORD_BYTES
        where = f"${MAX_RECORD_BYTES_ENV}"
        value = int(given) if given.isascii() and given.isdigit() else None
    elif not isinstance(value, bool):
        try:
            value = operator.index(value)  # ints, numpy's too
        except TypeError:
            value = None
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_RECORD_BYTES_CEILING:
        raise ConfigurationError(
            f"{where} is {given!r}; use a whole number of bytes from 1 to 2**62 "
            f"(default {MAX_RECORD_BYTES}, 2 GiB - 1)"
        )
    return value


def masked_crc32c(data) -> int:
    """The masked CRC32C TFRecord stores: rotate right by 15 bits, add a constant, mod 2^32."""
    import crc32c

    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + CRC_MASK_DELTA) & U32


def encode_tfrecord(data: bytes) -> bytes:
    """One TFRecord frame: length, its masked CRC, the data, the data's masked CRC."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


def recordio_header(flag: int, length: int) -> bytes:
    return struct.pack("<II", RECORDIO_MAGIC, (flag << RECORDIO_LENGTH_BITS) | length)


def recordio_parts(size: int, max_part: int | None = None) -> list[tuple[int, int, int]]:
    """(offset, flag, length) of each frame of a ``size``-byte record split into parts of ``max_part``."""
    limit = RECORDIO_MAX_PART if max_part is None else min(max_part, RECORDIO_MAX_PART)
    if size <= limit:
        return [(0, RECORDIO_WHOLE, size)]
    parts, offset = [], 0
    while offset < size:
        length = min(limit, size - offset)
        last = offset + length == size
        flag = RECORDIO_START if offset == 0 else (RECORDIO_END if last else RECORDIO_MIDDLE)
        parts.append((offset, flag, length))
        offset += length
    return parts


def recordio_padding(length: int) -> bytes:
    """RecordIO pads each frame's data to a multiple of 4 bytes."""
    return b"\0" * (-length % 4)


def encode_recordio(data: bytes, max_part: int | None = None) -> bytes:
    """One SageMaker RecordIO record, split into multipart frames of at most ``max_part`` bytes."""
    out = bytearray()
    for offset, flag, length in recordio_parts(len(data), max_part):
        out += recordio_header(flag, length) + data[offset : offset + length] + recordio_padding(length)
    return bytes(out)
