"""Records into samples without TensorFlow: raw bytes as tensors, and ``tf.train.Example`` records.

``parse_example`` reads the protobuf wire format of ``tf.train.Example`` itself (``Example.features``
-> ``Features.feature`` map -> ``Feature`` oneof ``bytes_list`` / ``float_list`` / ``int64_list``),
packed and unpacked repeated fields alike, and gives what protobuf's own parser gives (a fuzz test holds
it to ``Example.FromString``): it accepts the records protobuf accepts, with the same features, and
refuses the others with ``ExampleParseError`` saying where. It trusts no length beyond its buffer: it
never reads past the end or allocates what the record only claims, and it takes time linear in the
record's size whatever its shape. Values come as a list of ``bytes``, a float32 numpy array or an int64
numpy array; ``example_decoder`` makes tensors of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from sagemaker_dist.errors import DataError

# Wire types
VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
MAX_VARINT_BYTES = 10
MAX_TAG_BYTES = 5  # protobuf reads a tag as a 32-bit varint
MAX_DEPTH = 100  # protobuf's own nesting limit: messages and the unknown groups skipped, together
MAX_LENGTH = 0x7FFFFFFF  # protobuf refuses a length of 2**31 - 1 or more
_MASK64 = 0xFFFFFFFFFFFFFFFF
# Tags (field number << 3 | wire type) of the fields read; any other field is skipped as unknown, as
# protobuf does with an unknown number and with a known number of another wire type.
_TAG_1_LEN, _TAG_2_LEN, _TAG_3_LEN, _TAG_1_VARINT, _TAG_1_I32 = 0x0A, 0x12, 0x1A, 0x08, 0x0D
_SMALL_VARINTS = 128  # packed int64 bytes decoded in Python below this, vectorised (numpy) above
_VARINT_CHUNK = 16384  # bytes of varints decoded at a time: bounds the vectorised decoder's temporaries
_CONTINUATION = bytes(int(b >= 0x80) for b in range(256))  # bytes.translate table: 1 where a varint goes on
_TOO_LONG = b"\x01" * MAX_VARINT_BYTES  # ten bytes that all go on: a varint longer than protobuf reads


class ExampleParseError(DataError):
    """A record that is not a valid serialised ``tf.train.Example``; says what and at which byte."""


def _tag(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The tag starting at ``pos`` (at most 5 bytes and 32 bits, as protobuf reads it), and the position
    after it. Callers read a one-byte tag themselves and come here for the rest."""
    result = shift = 0
    start = pos
    while pos < end and pos - start < MAX_TAG_BYTES:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if result > 0xFFFFFFFF:
                raise ExampleParseError(f"tag over 32 bits at byte {start}")
            return result, pos
        shift += 7
    if pos - start >= MAX_TAG_BYTES:
        raise ExampleParseError(f"tag longer than {MAX_TAG_BYTES} bytes at byte {start}")
    raise ExampleParseError(f"tag runs past the end of its message at byte {start}")


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint starting at ``pos`` (taken modulo 2**64, as protobuf does) and the position after it."""
    result = shift = 0
    start = pos
    while pos < end:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result & _MASK64, pos
        if pos - start >= MAX_VARINT_BYTES:
            raise ExampleParseError(f"varint longer than {MAX_VARINT_BYTES} bytes ending at byte {pos}")
        shift += 7
    raise ExampleParseError(f"varint runs past the end of its field at byte {start}")


def _span(data: bytes, pos: int, end: int, tag: int) -> tuple[int, int]:
    """The payload ``(start, stop)`` of the LEN field whose length varint starts at ``pos``."""
    length = data[pos] if pos < end else 0x80
    if length < 0x80:
        pos += 1
    else:
        length, pos = _varint(data, pos, end)
    if length > end - pos or length >= MAX_LENGTH:
        raise ExampleParseError(
            f"field {tag >> 3} claims {length} bytes at byte {pos}, only {end - pos} are left"
        )
    return pos, pos + length


def _skip(data: bytes, pos: int, end: int, tag: int, depth: int) -> int:
    """Skip the payload of an unknown field (its tag read, its payload at ``pos``) as protobuf does;
    returns the position after it. ``depth``: the nesting levels left for groups."""
    number, wire = tag >> 3, tag & 7
    if number == 0:
        raise ExampleParseError(f"field number 0 at byte {pos}")
    if wire == VARINT:
        return _varint(data, pos, end)[1]
    if wire == LEN:
        return _span(data, pos, end, tag)[1]
    if wire == I32 or wire == I64:
        size = 4 if wire == I32 else 8
        if size > end - pos:
            raise ExampleParseError(f"field {number} needs {size} bytes at byte {pos}, {end - pos} left")
        return pos + size
    if wire == SGROUP:
        if depth <= 0:
            raise ExampleParseError(f"messages and groups nested deeper than {MAX_DEPTH} at byte {pos}")
        while pos < end:
            inner = data[pos]
            pos += 1
            if inner >= 0x80:
                inner, pos = _tag(data, pos - 1, end)
            if inner & 7 == EGROUP:
                if inner >> 3 != number:
                    raise ExampleParseError(
                        f"group {number} ends with the end tag of {inner >> 3} at byte {pos}"
                    )
                return pos
            pos = _skip(data, pos, end, inner, depth - 1)
        raise ExampleParseError(f"group {number} has no end tag before byte {end}")
    if wire == EGROUP:
        raise ExampleParseError(f"end of group {number} without its start at byte {pos}")
    raise ExampleParseError(f"field {number} has wire type {wire} at byte {pos}, which protobuf lacks")


# Each level of the message is a loop of its own over its fields: a one-byte tag is read inline (nearly
# every tag of a real record), a longer one by ``_tag``, a length by ``_span``, the rest skipped. The
# values of a feature are gathered as they come (a list of bytes; the raw bytes of floats or of varints
# in a bytearray) and converted once, when its map entry ends: linear however often the record repeats
# a sub-message (protobuf merges the repeats), where concatenating at each repeat was quadratic.


def _bytes_list(data: bytes, pos: int, end: int, out: list[bytes]) -> None:
    append = out.append
    while pos < end:
        tag = data[pos]
        pos += 1
        if tag >= 0x80:
            tag, pos = _tag(data, pos - 1, end)
        if tag == _TAG_1_LEN:
            start, pos = _span(data, pos, end, tag)
            append(data[start:pos])
        else:
            pos = _skip(data, pos, end, tag, MAX_DEPTH - 4)


def _float_list(data: bytes, view: memoryview, pos: int, end: int, out: bytearray) -> None:
    while pos < end:
        tag = data[pos]
        pos += 1
        if tag >= 0x80:
            tag, pos = _tag(data, pos - 1, end)
        if tag == _TAG_1_I32:
            if pos + 4 > end:
                raise ExampleParseError(f"float value needs 4 bytes at byte {pos}, {end - pos} left")
            out += view[pos : pos + 4]
            pos += 4
        elif tag == _TAG_1_LEN:  # packed
            start, pos = _span(data, pos, end, tag)
            if (pos - start) % 4:
                raise ExampleParseError(
                    f"packed float list of {pos - start} bytes (not a multiple of 4) at byte {start}"
                )
            out += view[start:pos]
        else:
            pos = _skip(data, pos, end, tag, MAX_DEPTH - 4)


def _int64_list(data: bytes, view: memoryview, pos: int, end: int, out: bytearray) -> None:
    """Appends the raw varints of the values to ``out`` (checked: each complete, at most 10 bytes)."""
    while pos < end:
        tag = data[pos]
        pos += 1
        if tag >= 0x80:
            tag, pos = _tag(data, pos - 1, end)
        if tag == _TAG_1_VARINT:
            byte = data[pos] if pos < end else 0x80
            if byte < 0x80:
                out.append(byte)
                pos += 1
            else:
                start, pos = pos, _varint(data, pos, end)[1]
                out += view[start:pos]
        elif tag == _TAG_1_LEN:  # packed
            start, pos = _span(data, pos, end, tag)
            if pos > start:
                if data[pos - 1] >= 0x80:
                    raise ExampleParseError(f"packed int64 list ends inside a varint at byte {pos}")
                if pos - start > MAX_VARINT_BYTES:
                    at = data[start:pos].translate(_CONTINUATION).find(_TOO_LONG)
                    if at >= 0:
                        raise ExampleParseError(
                            f"varint longer than {MAX_VARINT_BYTES} bytes at byte {start + at}"
                        )
                out += view[start:pos]
        else:
            pos = _skip(data, pos, end, tag, MAX_DEPTH - 4)


def _feature(data: bytes, view: memoryview, pos: int, end: int, kind: int, values):
    """One ``Feature`` message merged into ``(kind, values)``, as protobuf merges a repeated message
    field: a list of the kind set so far extends its values, one of another kind replaces them."""
    while pos < end:
        tag = data[pos]
        pos += 1
        if tag >= 0x80:
            tag, pos = _tag(data, pos - 1, end)
        if tag == _TAG_1_LEN or tag == _TAG_2_LEN or tag == _TAG_3_LEN:
            number = tag >> 3
            start, pos = _span(data, pos, end, tag)
            if number != kind:
                kind, values = number, ([] if number == 1 else bytearray())
            if pos > start:
                if number == 1:
                    _bytes_list(data, start, pos, values)
                elif number == 2:
                    _float_list(data, view, start, pos, values)
                else:
                    _int64_list(data, view, start, pos, values)
        else:
            pos = _skip(data, pos, end, tag, MAX_DEPTH - 3)
    return kind, values


def _decode_varints(raw: bytearray) -> np.ndarray:
    """Complete varints (checked as such) -> int64 array: in Python when few, else vectorised in
    chunks of at most ``_VARINT_CHUNK`` bytes, its temporaries a few dozen bytes per byte of a chunk."""
    if len(raw) < _SMALL_VARINTS:
        out, value, shift = [], 0, 0
        for byte in raw:
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                value &= _MASK64
                out.append(value - (1 << 64) if value >> 63 else value)
                value = shift = 0
            else:
                shift += 7
        return np.array(out, dtype=np.int64)
    data = np.frombuffer(raw, dtype=np.uint8)
    total = sum(
        int(np.count_nonzero(data[at : at + _VARINT_CHUNK] < 0x80))
        for at in range(0, len(data), _VARINT_CHUNK)
    )
    out = np.empty(total, dtype=np.uint64)
    done = at = 0
    while at < len(data):
        chunk = data[at : at + _VARINT_CHUNK]
        ends = np.flatnonzero(chunk < 0x80)  # the last byte of each varint
        if at + len(chunk) < len(data):  # a varint may go on into the next chunk: stop before it
            chunk = chunk[: ends[-1] + 1]
        starts = np.empty_like(ends)
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
        values = (chunk[starts] & 0x7F).astype(np.uint64)
        extra = ends - starts  # bytes after the first
        for k in range(1, int(extra.max()) + 1):
            which = np.flatnonzero(extra >= k)
            values[which] |= (chunk[starts[which] + k] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
        out[done : done + len(values)] = values
        done += len(values)
        at += len(chunk)
    return out.view(np.int64)


def _values(kind: int, values):
    if kind == 1:
        return values
    if kind == 2:
        if not values:
            return np.zeros(0, np.float32)
        return np.frombuffer(values, dtype="<f4").astype(np.float32)  # a copy: owns its memory
    if kind == 3:
        return _decode_varints(values)
    return []


def _features(data: bytes, view: memoryview, pos: int, end: int, features: dict) -> None:
    """A ``Features`` message into ``features``. Each map entry replaces the feature of its key (the
    last wins); an entry holding an unknown field is left out of the map, as protobuf does (it keeps
    such an entry among the message's unknown fields), and replaces nothing."""
    while pos < end:
        tag = data[pos]
        pos += 1
        if tag >= 0x80:
            tag, pos = _tag(data, pos - 1, end)
        if tag != _TAG_1_LEN:
            pos = _skip(data, pos, end, tag, MAX_DEPTH - 1)
            continue
        at, stop = _span(data, pos, end, tag)
        pos = stop
        key, kind, values, known = "", 0, None, True
        while at < stop:  # the map entry: key = 1, value = 2
            tag = data[at]
            at += 1
            if tag >= 0x80:
                tag, at = _tag(data, at - 1, stop)
            if tag == _TAG_1_LEN:
                start, at = _span(data, at, stop, tag)
                try:
                    key = data[start:at].decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ExampleParseError(f"feature name is not UTF-8 at byte {start}") from exc
            elif tag == _TAG_2_LEN:  # repeated, the Feature messages merge
                start, at = _span(data, at, stop, tag)
                kind, values = _feature(data, view, start, at, kind, values)
            else:
                known = False
                at = _skip(data, at, stop, tag, MAX_DEPTH - 2)
        if known:
            features[key] = _values(kind, values)


def parse_example(record: bytes | bytearray | memoryview) -> dict[str, list[bytes] | np.ndarray]:
    """The features of a serialised ``tf.train.Example``: name -> list of bytes (bytes_list), float32
    array (float_list) or int64 array (int64_list); a feature with no kind set -> ``[]``.

    Protobuf's semantics throughout: repeated ``Example.features`` fields merge (a later map entry
    replaces the feature of its key); repeated ``Feature`` fields of one kind concatenate their values,
    of another kind replace them; a map entry with an unknown field is not in the map; a known field
    of an unexpected wire type is an unknown field. Anything protobuf refuses (a truncated field, a
    varint over 10 bytes, a tag over 5, a name that is not UTF-8, groups nested deeper than protobuf's
    limit, ...) raises ``ExampleParseError``.

    Time is linear in the record's size, and so is memory: a copy of the record unless it is
    ``bytes``; the raw values of the feature being read (at most the record's size); and the result,
    whose arrays take at most 8 bytes per byte of record (an int64 list of one-byte varints) and whose
    Python objects (a name, a list or array and a dict slot per feature, a ``bytes`` object per value)
    at most about 20 (a record of nothing but tiny features or values). Decoding a long int64 list
    adds at most about 1 MiB of temporaries, however long it is.
    """
    data = record if type(record) is bytes else memoryview(record).cast("B").tobytes()
    view = memoryview(data)
    end = len(data)
    features: dict[str, list[bytes] | np.ndarray] = {}
    pos = 0
    while pos < end:
        tag = data[pos]
        pos += 1
        if tag >= 0x80:
            tag, pos = _tag(data, pos - 1, end)
        if tag == _TAG_1_LEN:  # Example.features; repeated, the messages merge
            start, pos = _span(data, pos, end, tag)
            _features(data, view, start, pos, features)
        else:
            pos = _skip(data, pos, end, tag, MAX_DEPTH)
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
