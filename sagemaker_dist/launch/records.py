"""Write the records a Pipe-mode channel carries, without TensorFlow or PyTorch.

- ``encode_example``: a ``tf.train.Example`` serialised in the protobuf wire format (``Example.features``
  -> ``Features.feature``, a map of name -> ``Feature``, whose oneof is a ``BytesList``, ``FloatList`` or
  ``Int64List``), readable by ``tf.train.Example.FromString``, ``tf.io.parse_example`` and the
  runtime's ``example_decoder``;
- ``TFRecordWriter``, ``RecordIOWriter``: files of TFRecord or SageMaker RecordIO frames, framed by the
  encoders of ``contract.record_formats`` (the ones the readers are tested against). Given a path, a
  writer fills a temporary file beside it and renames it into place on a clean close, so the final name
  never holds half a file;
- ``write_tfrecords``, ``write_recordio``: a whole file from an iterable of records.

TFRecord's checksums need the C-backed ``crc32c`` package (in ``sagemaker-dist[local]``,
``[runtime]`` and ``[torch]``). numpy arrays are accepted as feature values without importing numpy
here: a value can only be an array where the caller has loaded numpy.
"""

from __future__ import annotations

import os
import secrets
import struct
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, NamedTuple

from sagemaker_dist.contract.record_formats import encode_recordio, encode_tfrecord
from sagemaker_dist.errors import ConfigurationError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Feature's oneof: the field number of each kind of list
BYTES_LIST, FLOAT_LIST, INT64_LIST = 1, 2, 3
_KINDS = {BYTES_LIST: "bytes", FLOAT_LIST: "float", INT64_LIST: "int64"}
_SUPPORTED = "bytes, str, int, bool, float, a flat list or tuple of one kind of them, or a numpy array"


class RecordEncodeError(ConfigurationError):
    """A value that cannot be encoded or written as asked (names the feature, or says what to do)."""


class RecordTypeError(RecordEncodeError, TypeError):
    """A value of a type that cannot be encoded (a feature's value, a record that is not bytes)."""


class RecordsWritten(NamedTuple):
    """What a file got: ``records`` records in ``bytes`` bytes (framing included)."""

    records: int
    bytes: int


# ---------------------------------------------------------------------------------------------------
# tf.train.Example


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 values are 10-byte varints (two's complement), as protobuf's
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _scalar_kind(name: str, index: int | None, item) -> int:
    """The list kind one plain Python value goes to."""
    if isinstance(item, (bytes, bytearray, memoryview, str)):
        return BYTES_LIST
    if isinstance(item, int):  # bool too
        return INT64_LIST
    if isinstance(item, float):
        return FLOAT_LIST
    where = f"feature {name!r}" if index is None else f"feature {name!r}, value {index}"
    if isinstance(item, Iterable):
        raise RecordTypeError(
            f"{where}: a {type(item).__name__} inside a list; a feature is a flat list of values "
            "(flatten it, or pass a numpy array: it is written flattened in C order)"
        )
    raise RecordTypeError(f"{where}: {type(item).__name__} is not supported; use {_SUPPORTED}")


def _plain(item, np):
    """A numpy scalar as the Python value of its kind (numpy's bytes, str and float64 already are)."""
    if np is not None and isinstance(item, np.generic) and not isinstance(item, (bytes, str, float)):
        if item.dtype.kind in "biuf":
            return item.item()
    return item


def _utf8(name: str, text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RecordEncodeError(
            f"feature {name!r}: {text!r} cannot be written as UTF-8 ({exc.reason})"
        ) from None


def _as_bytes(name: str, value) -> bytes:
    return _utf8(name, value) if isinstance(value, str) else bytes(value)


def _fits_float32(value: float) -> bool:
    try:
        struct.pack("<f", value)
    except OverflowError:
        return False
    return True


def _pack_floats(name: str, values: list[float]) -> bytes:
    try:
        return struct.pack(f"<{len(values)}f", *values)
    except OverflowError:
        big = next(v for v in values if not _fits_float32(v))
        raise RecordEncodeError(
            f"feature {name!r}: {big!r} does not fit a float32 (a FloatList holds float32 values)"
        ) from None


def _check_int64(name: str, values: list[int]) -> None:
    for value in values:
        if not INT64_MIN <= value <= INT64_MAX:
            raise RecordEncodeError(
                f"feature {name!r}: {value} does not fit an int64 (an Int64List's values)"
            )


def _list_body(name: str, items: list, np) -> tuple[int | None, bytes]:
    """(kind, the serialised BytesList/FloatList/Int64List) of a list of plain values; kind None: empty."""
    items = [_plain(item, np) for item in items]
    kinds = {_scalar_kind(name, None if len(items) == 1 else i, item) for i, item in enumerate(items)}
    if not kinds:
        return None, b""
    if BYTES_LIST in kinds:
        if kinds != {BYTES_LIST}:
            raise RecordTypeError(
                f"feature {name!r} mixes bytes or str with numbers; one feature holds one kind of value"
            )
        return BYTES_LIST, b"".join(_field(1, _as_bytes(name, item)) for item in items)
    if FLOAT_LIST in kinds:  # ints among floats are floats, as FloatList takes them
        return FLOAT_LIST, _field(1, _pack_floats(name, [float(v) for v in items]))
    values = [int(v) for v in items]
    _check_int64(name, values)
    return INT64_LIST, _field(1, b"".join(_varint(v) for v in values))


def _array_body(name: str, array, np) -> tuple[int | None, bytes]:
    """(kind, serialised list) of a numpy array, flattened in C order."""
    flat = array.ravel()
    kind = array.dtype.kind
    if kind in "biu":
        if kind == "u" and flat.size and int(flat.max()) > INT64_MAX:
            raise RecordEncodeError(f"feature {name!r}: {int(flat.max())} does not fit an int64")
        values = flat.astype(np.int64).tolist()
        return INT64_LIST, _field(1, b"".join(_varint(v) for v in values)) if values else b""
    if kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            as32 = flat.astype("<f4")
        overflow = np.isinf(as32) & np.isfinite(flat)
        if overflow.any():
            big = flat[overflow][0].item()
            raise RecordEncodeError(
                f"feature {name!r}: {big!r} does not fit a float32 (a FloatList holds float32 values)"
            )
        return FLOAT_LIST, _field(1, as32.tobytes()) if flat.size else b""
    if kind == "S":  # numpy's fixed-width bytes drop trailing NULs
        return BYTES_LIST, b"".join(_field(1, item) for item in flat.tolist())
    if kind == "U":
        return BYTES_LIST, b"".join(_field(1, _utf8(name, item)) for item in flat.tolist())
    if kind == "O":
        return _list_body(name, flat.tolist(), np)
    raise RecordTypeError(
        f"feature {name!r}: a numpy array of dtype {array.dtype} is not supported; use {_SUPPORTED}"
    )


def _feature(name: str, value) -> bytes:
    """One serialised ``Feature``: its oneof set to the list the value makes (none for an empty list)."""
    np = sys.modules.get("numpy")  # an array can only come from a caller that loaded numpy
    if np is not None and isinstance(value, (np.ndarray, np.generic)):
        kind, body = _array_body(name, np.asarray(value), np)
    elif isinstance(value, (bytes, bytearray, memoryview, str, int, float)):
        kind, body = _list_body(name, [value], np)
    elif isinstance(value, Sequence):
        kind, body = _list_body(name, list(value), np)
    else:
        raise RecordTypeError(f"feature {name!r}: {type(value).__name__} is not supported; use {_SUPPORTED}")
    # An empty Python list has no kind: a Feature with none set reads as an empty list of any kind
    # (tf.io.parse_example's VarLenFeature of every dtype, and parse_example here).
    return b"" if kind is None else _field(kind, body)


def encode_example(features: Mapping[str, object]) -> bytes:
    """Serialise a ``tf.train.Example`` (``tf.train.Example(...).SerializeToString()``, without TensorFlow).

    Each value becomes one ``Feature``:

    - ``bytes`` (or ``bytearray``, ``memoryview``), ``str`` (UTF-8), or a list of them -> ``bytes_list``;
    - ``int``, ``bool``, or a list of them -> ``int64_list`` (a negative value as protobuf writes an
      int64: a 10-byte varint of its two's complement);
    - ``float``, or a list of floats (ints among them become floats) -> ``float_list`` of float32;
    - a numpy array or scalar, flattened in C order: integer and bool dtypes -> ``int64_list``, float
      dtypes -> ``float_list`` (float32), ``S``/``U`` dtypes -> ``bytes_list``. A uint8 image array
      becomes one int64 per pixel: write ``image.tobytes()`` to keep it one ``bytes`` value;
    - an empty list -> a ``Feature`` with no list set, which reads as empty of any kind.

    Features are written in name order, so equal dicts give equal bytes.

    A name that is not a ``str``, a value of another type, a list mixing bytes or str with numbers or a
    nested list raises ``RecordTypeError`` (a ``TypeError``); an int outside int64 or a finite float
    outside float32 or a ``str`` that is not valid Unicode (a lone surrogate) raises ``RecordEncodeError``
    (a ``ValueError``). Both are ``ConfigurationError``s and
    name the feature.
    """
    if not isinstance(features, Mapping):
        raise RecordTypeError(
            f"encode_example takes a mapping of feature name -> value, not a {type(features).__name__}"
        )
    for name in features:
        if not isinstance(name, str):
            raise RecordTypeError(f"feature name {name!r} ({type(name).__name__}) is not a str")
    entries = b"".join(
        _field(1, _field(1, _utf8(name, name)) + _field(2, _feature(name, features[name])))
        for name in sorted(features)
    )  # Features.feature: map entries (key 1, value 2)
    return _field(1, entries)  # Example.features(1)


# ---------------------------------------------------------------------------------------------------
# Record files


class RecordFileWriter:
    """Frames records into a file; see ``TFRecordWriter``."""

    _frame: Callable[[bytes], bytes]

    def __init__(self, path_or_fileobj: str | os.PathLike | BinaryIO):
        self.records = 0
        self.bytes = 0
        self.path: Path | None = None
        self._temporary: Path | None = None
        self._closed = False
        if isinstance(path_or_fileobj, (str, os.PathLike)):
            path = Path(path_or_fileobj)
            if path.is_dir():
                raise IsADirectoryError(f"{path} is a directory; give the path of the file to write")
            self._check_ready()
            temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
            # the mode open() gives (0666 less the umask), not mkstemp's 0600: the file is the user's data
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            self.path, self._temporary = path, temporary
            self._file = os.fdopen(fd, "wb")
        elif callable(getattr(path_or_fileobj, "write", None)):
            self._check_ready()
            self._file = path_or_fileobj
        else:
            raise RecordTypeError(
                f"{type(self).__name__} writes to a path or a binary file object, "
                f"not a {type(path_or_fileobj).__name__}"
            )

    def _check_ready(self) -> None:
        """Fail before anything is created where the format's encoder cannot run."""

    @property
    def closed(self) -> bool:
        return self._closed

    def write(self, record: bytes | bytearray | memoryview) -> None:
        """Append one record (its bytes, framed by the format)."""
        if self._closed:
            raise RecordEncodeError(f"write() on a closed {type(self).__name__}")
        if not isinstance(record, (bytes, bytearray, memoryview)):
            hint = (
                " (encode it, or write encode_example(features))"
                if isinstance(record, (str, Mapping))
                else ""
            )
            raise RecordTypeError(f"a record is bytes, not a {type(record).__name__}{hint}")
        frame = self._frame(record if isinstance(record, bytes) else bytes(record))
        self._file.write(frame)
        self.records += 1
        self.bytes += len(frame)

    def close(self) -> None:
        """Finish the file. Given a path: flush, fsync and rename the temporary file to it (replacing a
        file there). Given a file object: flush it, and leave it open (it is the caller's)."""
        if self._closed:
            return
        self._closed = True
        if self._temporary is None:
            flush = getattr(self._file, "flush", None)
            if flush is not None:
                flush()
            return
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self._temporary, self.path)
            self._temporary = None
        except BaseException:
            self._remove_temporary()
            raise

    def discard(self) -> None:
        """Stop without finishing: given a path, the temporary file is removed and nothing is written
        under the path (a file already there stays as it was). Given a file object, what was written to
        it stays there."""
        self._closed = True
        self._remove_temporary()

    def _remove_temporary(self) -> None:
        if self._temporary is None:
            return
        try:
            self._file.close()
        finally:
            self._temporary.unlink(missing_ok=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.discard()

    def __repr__(self) -> str:
        where = self.path if self.path is not None else self._file
        return f"{type(self).__name__}({where!r}, records={self.records}, bytes={self.bytes})"


class TFRecordWriter(RecordFileWriter):
    """Write records as TFRecord frames (length, masked CRC32C of the length, data, masked CRC32C of
    the data): what ``tf.data.TFRecordDataset``, Pipe-mode TFRecord channels and the runtime's readers read.

    Given a path, the records go to a temporary file beside it (``.<name>.<random>.tmp``) that a clean
    close renames to the path; leaving the ``with`` block by an exception removes it, so the path never
    holds half a file. Given a binary file object, frames are written to it and it stays open.

    ``write(record)`` appends one record (bytes); ``close()`` finishes the file (what a clean end of the
    ``with`` block does); ``discard()`` drops it (what an exception does). ``records`` and ``bytes`` count
    what was written so far (``bytes`` includes the framing).

    ```python
    with TFRecordWriter("train-0.tfrecord") as out:
        for image, label in samples:
            out.write(encode_example({"image": image.tobytes(), "label": label}))
    ```
    """

    _frame = staticmethod(encode_tfrecord)

    def _check_ready(self) -> None:
        try:
            import crc32c  # noqa: F401 - TFRecord's checksums (contract.record_formats.masked_crc32c)
        except ImportError:
            raise RecordEncodeError(
                "TFRecord's checksums need the crc32c package: pip install crc32c "
                "(sagemaker-dist[local], [runtime] and [torch] include it)"
            ) from None


class RecordIOWriter(RecordFileWriter):
    """Write records as SageMaker RecordIO (MXNet RecordIO) frames: magic number, flag and length, the
    data padded to 4 bytes; a record longer than a frame holds is split into multipart frames. This is
    what a channel with ``RecordWrapperType: RecordIO`` carries, and what ``record_format="RecordIO"``
    reads. Used like ``TFRecordWriter`` (``write``, ``close``, ``discard``; atomic on a path)."""

    _frame = staticmethod(encode_recordio)


def _write_all(writer_class, path_or_fileobj, records: Iterable[bytes]) -> RecordsWritten:
    with writer_class(path_or_fileobj) as writer:
        for record in records:
            writer.write(record)
    return RecordsWritten(writer.records, writer.bytes)


def write_tfrecords(
    path_or_fileobj: str | os.PathLike | BinaryIO, records: Iterable[bytes]
) -> RecordsWritten:
    """Write ``records`` (each one's bytes, e.g. ``encode_example(...)``) as one TFRecord file, atomically
    on a path (see ``TFRecordWriter``); returns how many records and bytes were written."""
    return _write_all(TFRecordWriter, path_or_fileobj, records)


def write_recordio(path_or_fileobj: str | os.PathLike | BinaryIO, records: Iterable[bytes]) -> RecordsWritten:
    """Write ``records`` as one SageMaker RecordIO file, atomically on a path (see ``RecordIOWriter``);
    returns how many records and bytes were written."""
    return _write_all(RecordIOWriter, path_or_fileobj, records)
