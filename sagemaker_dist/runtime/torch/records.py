"""Records into samples without TensorFlow: raw bytes as tensors, and ``tf.train.Example`` records.

``parse_example`` reads the protobuf wire format of ``tf.train.Example`` itself (``Example.features``
-> ``Features.feature`` map -> ``Feature`` oneof ``bytes_list`` / ``float_list`` / ``int64_list``),
packed and unpacked repeated fields alike, skipping unknown fields as protobuf does. It trusts no
length beyond its buffer: a truncated or malformed record raises ``ExampleParseError`` saying where,
never reads past the end or allocates what the record only claims. Values come as a list of
``bytes``, a float32 numpy array or an int64 numpy array; ``example_decoder`` makes tensors of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from sagemaker_dist.errors import DataError

# Wire types
VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
MAX_VARINT_BYTES = 10
MAX_DEPTH = 100  # protobuf's own nesting limit, for the unknown groups skipped


class ExampleParseError(DataError):
    """A record that is not a valid serialised ``tf.train.Example``; says what and at which byte."""


def _varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    for _ in range(MAX_VARINT_BYTES):
        if pos >= end:
            raise ExampleParseError(f"varint runs past the end of its field at byte {pos}")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7
    raise ExampleParseError(f"varint longer than {MAX_VARINT_BYTES} bytes ending at byte {pos}")


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _fields(buf: memoryview, pos: int, end: int, depth: int = 0):
    """``(field number, wire type, value)`` of a message in ``buf[pos:end]``: ``value`` is an int for
    VARINT, ``(start, stop)`` for LEN (checked against ``end``), raw bytes for I32/I64."""
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise ExampleParseError(f"field number 0 at byte {pos}")
        if wire == VARINT:
            value, pos = _varint(buf, pos, end)
        elif wire == LEN:
            length, pos = _varint(buf, pos, end)
            if length > end - pos:
                raise ExampleParseError(
                    f"field {number} claims {length} bytes at byte {pos}, only {end - pos} are left"
                )
            value, pos = (pos, pos + length), pos + length
        elif wire in (I32, I64):
            size = 4 if wire == I32 else 8
            if size > end - pos:
                raise ExampleParseError(f"field {number} needs {size} bytes at byte {pos}, {end - pos} left")
            value, pos = bytes(buf[pos : pos + size]), pos + size
        elif wire == SGROUP:
            if depth >= MAX_DEPTH:
                raise ExampleParseError(f"groups nested deeper than {MAX_DEPTH} at byte {pos}")
            pos = _skip_group(buf, pos, end, number, depth + 1)
            continue
        elif wire == EGROUP:
            raise ExampleParseError(f"end of group {number} without its start at byte {pos}")
        else:
            raise ExampleParseError(
                f"field {number} has wire type {wire} at byte {pos}, which protobuf lacks"
            )
        yield number, wire, value


def _skip_group(buf: memoryview, pos: int, end: int, number: int, depth: int) -> int:
    """Skip an (unknown, deprecated) group up to its end tag; returns the position after it."""
    while pos < end:
        key, pos = _varint(buf, pos, end)
        inner, wire = key >> 3, key & 7
        if wire == EGROUP:
            if inner != number:
                raise ExampleParseError(f"group {number} ends with the end tag of {inner} at byte {pos}")
            return pos
        if wire == VARINT:
            pos = _varint(buf, pos, end)[1]
        elif wire == LEN:
            length, pos = _varint(buf, pos, end)
            if length > end - pos:
                raise ExampleParseError(
                    f"field {inner} claims {length} bytes at byte {pos}, {end - pos} left"
                )
            pos += length
        elif wire in (I32, I64):
            pos += 4 if wire == I32 else 8
            if pos > end:
                raise ExampleParseError(f"field {inner} runs past the end at byte {end}")
        elif wire == SGROUP:
            if depth >= MAX_DEPTH:
                raise ExampleParseError(f"groups nested deeper than {MAX_DEPTH} at byte {pos}")
            pos = _skip_group(buf, pos, end, inner, depth + 1)
        else:
            raise ExampleParseError(f"field {inner} has wire type {wire} at byte {pos}, which protobuf lacks")
    raise ExampleParseError(f"group {number} has no end tag before byte {end}")


def _float_list(buf, start, stop) -> np.ndarray:
    parts = []
    for number, wire, value in _fields(buf, start, stop):
        if number != 1:
            continue
        if wire == LEN:  # packed
            a, b = value
            if (b - a) % 4:
                raise ExampleParseError(
                    f"packed float list of {b - a} bytes (not a multiple of 4) at byte {a}"
                )
            parts.append(np.frombuffer(buf[a:b], dtype="<f4"))
        elif wire == I32:
            parts.append(np.frombuffer(value, dtype="<f4"))
        else:
            raise ExampleParseError(f"float list value with wire type {wire} at byte {start}")
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)


def _int64_list(buf, start, stop) -> np.ndarray:
    values: list[int] = []
    for number, wire, value in _fields(buf, start, stop):
        if number != 1:
            continue
        if wire == LEN:  # packed varints
            a, b = value
            while a < b:
                v, a = _varint(buf, a, b)
                values.append(_signed64(v))
        elif wire == VARINT:
            values.append(_signed64(value))
        else:
            raise ExampleParseError(f"int64 list value with wire type {wire} at byte {start}")
    return np.array(values, dtype=np.int64)


def _bytes_list(buf, start, stop) -> list[bytes]:
    out = []
    for number, wire, value in _fields(buf, start, stop):
        if number != 1:
            continue
        if wire != LEN:
            raise ExampleParseError(f"bytes list value with wire type {wire} at byte {start}")
        out.append(bytes(buf[value[0] : value[1]]))
    return out


_KINDS = {1: _bytes_list, 2: _float_list, 3: _int64_list}


def _feature(buf, start, stop):
    """One ``Feature``: the last of its oneof fields wins; repeats of the same kind concatenate."""
    kind, value = None, None
    for number, wire, span in _fields(buf, start, stop):
        if number not in _KINDS:
            continue
        if wire != LEN:
            raise ExampleParseError(f"Feature field {number} has wire type {wire} at byte {start}")
        parsed = _KINDS[number](buf, *span)
        if kind == number:
            value = value + parsed if number == 1 else np.concatenate([value, parsed])
        else:
            kind, value = number, parsed
    return value if kind is not None else []


def parse_example(record: bytes | bytearray | memoryview) -> dict[str, list[bytes] | np.ndarray]:
    """The features of a serialised ``tf.train.Example``: name -> list of bytes (bytes_list), float32
    array (float_list) or int64 array (int64_list); a feature with no kind set -> ``[]``."""
    buf = memoryview(record).cast("B")
    end = len(buf)
    features: dict[str, list[bytes] | np.ndarray] = {}
    for number, wire, span in _fields(buf, 0, end):
        if number != 1:
            continue
        if wire != LEN:
            raise ExampleParseError(f"Example.features has wire type {wire}")
        for entry_number, entry_wire, entry in _fields(buf, *span):
            if entry_number != 1:
                continue
            if entry_wire != LEN:
                raise ExampleParseError(
                    f"Features.feature entry has wire type {entry_wire} at byte {span[0]}"
                )
            key, value = None, []
            for n, w, part in _fields(buf, *entry):
                if w != LEN:
                    if n in (1, 2):
                        raise ExampleParseError(f"map entry field {n} has wire type {w} at byte {entry[0]}")
                    continue
                if n == 1:
                    try:
                        key = bytes(buf[part[0] : part[1]]).decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise ExampleParseError(f"feature name is not UTF-8 at byte {part[0]}") from exc
                elif n == 2:
                    value = _feature(buf, *part)
            features[key or ""] = value
    return features


def example_decoder(
    features: Mapping[str, tuple[str, Sequence[int] | None] | str] | Sequence[str] | None = None,
    *,
    as_tuple: bool = False,
) -> Callable[[bytes], dict | tuple]:
    """A ``decode`` for ``PipeBatches``: an Example record -> a dict of tensors (or a tuple, in the
    order of ``features``). ``features``: names to keep, or name -> ``"bytes"``/``"float"``/``"int64"``
    or ``(kind, shape)`` (values reshaped, a wrong kind or size raises). Bytes features stay a list of
    ``bytes``, or ``bytes`` when they hold one value."""
    import torch

    names = list(features) if features is not None else None
    specs: dict[str, tuple[str | None, Sequence[int] | None]] = {}
    if isinstance(features, Mapping):
        for name, spec in features.items():
            kind, shape = (spec, None) if isinstance(spec, str) else spec
            if kind not in ("bytes", "float", "int64"):
                raise ValueError(f"feature {name!r}: kind {kind!r} is not 'bytes', 'float' or 'int64'")
            specs[name] = (kind, shape)

    def decode(record):
        parsed = parse_example(record)
        out = {}
        for name in names if names is not None else sorted(parsed):
            if name not in parsed:
                raise ExampleParseError(
                    f"the record has no feature {name!r} (it has: {', '.join(sorted(parsed))})"
                )
            value = parsed[name]
            kind, shape = specs.get(name, (None, None))
            actual = (
                "bytes" if isinstance(value, list) else ("float" if value.dtype == np.float32 else "int64")
            )
            if kind is not None and actual != kind and len(value):
                raise ExampleParseError(f"feature {name!r} is a {actual} list, expected {kind}")
            if actual == "bytes":
                out[name] = value[0] if len(value) == 1 else value
                continue
            tensor = torch.from_numpy(np.ascontiguousarray(value))
            if shape is not None:
                try:
                    tensor = tensor.reshape(tuple(shape))
                except RuntimeError as exc:
                    raise ExampleParseError(f"feature {name!r}: {exc}") from exc
            out[name] = tensor
        return tuple(out[n] for n in out) if as_tuple else out

    return decode


def raw_decoder(dtype: str = "uint8", shape: Sequence[int] | None = None) -> Callable[[bytes], object]:
    """A ``decode`` for raw records: the bytes as a tensor of numpy ``dtype`` (little-endian), reshaped
    to ``shape`` when given (a record of another size raises ``DataError``)."""
    import torch

    dt = np.dtype(dtype).newbyteorder("<") if np.dtype(dtype).itemsize > 1 else np.dtype(dtype)

    def decode(record):
        if len(record) % dt.itemsize:
            raise DataError(f"a raw record of {len(record)} bytes is not a whole number of {dt} values")
        array = np.frombuffer(record, dtype=dt).astype(dt.newbyteorder("="), copy=True)
        tensor = torch.from_numpy(array)
        if shape is not None:
            try:
                tensor = tensor.reshape(tuple(shape))
            except RuntimeError as exc:
                raise DataError(
                    f"a raw record of {len(record)} bytes does not fit shape {tuple(shape)}: {exc}"
                ) from exc
        return tensor

    return decode
