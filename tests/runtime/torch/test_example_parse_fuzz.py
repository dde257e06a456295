"""``parse_example`` against protobuf's own parser: the same features where protobuf accepts a record,
``ExampleParseError`` (and never another exception) where it refuses one.

The records: Examples protobuf serialises; arbitrary concatenations of field encodings at every level
of the message (repeated ``Example.features``, map entries of one key, repeated ``Feature`` fields of
one kind and of others, packed and unpacked lists, unknown fields of every wire type, groups, known
numbers of the wrong wire type, overlong varints, names that are not UTF-8); and random byte edits
of them. The message classes come from a descriptor built here with ``google.protobuf`` (TensorFlow's
``feature.proto`` and ``example.proto``, checked against TensorFlow's own where it is installed), so
the fuzz runs without TensorFlow.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sagemaker_dist.runtime.torch.records import ExampleParseError, parse_example

_F = descriptor_pb2.FieldDescriptorProto
_LISTS = {"bytes_list": _F.TYPE_BYTES, "float_list": _F.TYPE_FLOAT, "int64_list": _F.TYPE_INT64}


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """``tensorflow/core/example/{feature,example}.proto``'s messages read here, in one proto3 file."""
    fd = descriptor_pb2.FileDescriptorProto(name="example_fuzz.proto", package="tensorflow", syntax="proto3")
    for name, kind in _LISTS.items():
        message = fd.message_type.add(name=name.title().replace("_", ""))
        value = message.field.add(name="value", number=1, label=_F.LABEL_REPEATED, type=kind)
        if kind != _F.TYPE_BYTES:
            value.options.packed = True
    feature = fd.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, message) in enumerate(zip(_LISTS, ("BytesList", "FloatList", "Int64List")), 1):
        feature.field.add(
            name=name,
            number=number,
            label=_F.LABEL_OPTIONAL,
            type=_F.TYPE_MESSAGE,
            type_name=f".tensorflow.{message}",
            oneof_index=0,
        )
    features = fd.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, label=_F.LABEL_OPTIONAL, type=_F.TYPE_STRING)
    entry.field.add(
        name="value", number=2, label=_F.LABEL_OPTIONAL, type=_F.TYPE_MESSAGE, type_name=".tensorflow.Feature"
    )
    features.field.add(
        name="feature",
        number=1,
        label=_F.LABEL_REPEATED,
        type=_F.TYPE_MESSAGE,
        type_name=".tensorflow.Features.FeatureEntry",
    )
    fd.message_type.add(name="Example").field.add(
        name="features",
        number=1,
        label=_F.LABEL_OPTIONAL,
        type=_F.TYPE_MESSAGE,
        type_name=".tensorflow.Features",
    )
    return fd


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file_descriptor())
Example = message_factory.GetMessageClass(_POOL.FindMessageTypeByName("tensorflow.Example"))


@pytest.mark.tensorflow
def test_the_message_classes_here_are_tensorflows():
    example_pb2 = pytest.importorskip("tensorflow.core.example.example_pb2")
    for name in ("BytesList", "FloatList", "Int64List", "Feature", "Features", "Example"):
        ours, theirs = descriptor_pb2.DescriptorProto(), descriptor_pb2.DescriptorProto()
        _POOL.FindMessageTypeByName(f"tensorflow.{name}").CopyToProto(ours)
        example_pb2.DESCRIPTOR.pool.FindMessageTypeByName(f"tensorflow.{name}").CopyToProto(theirs)
        for proto in (ours, theirs):  # what the wire format does not see
            for field in [*proto.field, *(f for n in proto.nested_type for f in n.field)]:
                field.ClearField("json_name")
        assert ours == theirs, name
    file = descriptor_pb2.FileDescriptorProto()
    example_pb2.DESCRIPTOR.CopyToProto(file)
    assert file.syntax == "proto3"


# --- the wire format, written by hand ---


def varint(value: int, pad: int = 0) -> bytes:
    """``value`` as a varint, ``pad`` bytes longer than it needs (an overlong encoding protobuf reads)."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value or pad else 0))
        if not value:
            break
    out += b"\x80" * max(pad - 1, 0) + (b"\x00" if pad else b"")
    return bytes(out)


def field(number: int, wire: int, payload: bytes | int, tag_pad: int = 0, len_pad: int = 0) -> bytes:
    tag = varint(number << 3 | wire, tag_pad)
    if wire == 0:
        return tag + varint(payload, len_pad)
    if wire == 2:
        return tag + varint(len(payload), len_pad) + payload
    return tag + payload


def entry(key: bytes, feature: bytes) -> bytes:
    return field(1, 2, field(1, 2, key) + field(2, 2, feature))


# --- comparing with protobuf ---


def expected_features(message) -> dict:
    """protobuf's features, in parse_example's terms (no kind and an empty bytes_list both give [])."""
    out = {}
    for key, feature in message.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind is None or kind == "bytes_list":
            out[key] = ("bytes", list(feature.bytes_list.value))
        elif kind == "float_list":
            out[key] = ("float", np.array(feature.float_list.value, dtype=np.float32))
        else:
            out[key] = ("int64", list(feature.int64_list.value))
    return out


def our_features(parsed: dict) -> dict:
    out = {}
    for key, value in parsed.items():
        assert type(key) is str
        if isinstance(value, list):
            assert all(type(v) is bytes for v in value)
            out[key] = ("bytes", value)
        else:
            assert isinstance(value, np.ndarray) and value.ndim == 1, (key, value)
            assert value.dtype in (np.float32, np.int64), (key, value.dtype)
            kind = "float" if value.dtype == np.float32 else "int64"
            out[key] = (kind, value if kind == "float" else value.tolist())
    return out


def same_floats(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, but any NaN equals any NaN (protobuf hands floats through Python's double)."""
    if a.shape != b.shape:
        return False
    nan = np.isnan(a)
    return bool((nan == np.isnan(b)).all() and (a.view(np.uint32)[~nan] == b.view(np.uint32)[~nan]).all())


def check(record: bytes) -> str:
    """Parse ``record`` with both; fail unless they agree. Returns which way it went."""
    try:
        message = Example.FromString(record)
    except DecodeError:
        message = None
    try:
        ours = parse_example(record)
    except ExampleParseError as exc:  # any other exception fails the test
        assert message is None, f"protobuf reads {record.hex()}, parse_example refuses: {exc}"
        return "refused"
    assert message is not None, f"protobuf refuses {record.hex()}, parse_example reads {ours}"
    want, got = expected_features(message), our_features(ours)
    assert want.keys() == got.keys(), record.hex()
    for key, (kind, values) in want.items():
        assert got[key][0] == kind, (record.hex(), key)
        if kind == "float":
            assert same_floats(got[key][1], values), (record.hex(), key, got[key][1], values)
        else:
            assert got[key][1] == values, (record.hex(), key)
    return "read"


# --- random Examples, serialised by protobuf ---

names = st.one_of(st.sampled_from(["", "a", "label", "ü", "日本"]), st.text(max_size=6))
int64s = st.integers(-(2**63), 2**63 - 1)
feature_values = st.one_of(
    st.none(),
    st.tuples(st.just("bytes_list"), st.lists(st.binary(max_size=12), max_size=6)),
    st.tuples(st.just("float_list"), st.lists(st.floats(width=32), max_size=8)),
    st.tuples(st.just("int64_list"), st.lists(int64s, max_size=8)),
)


def serialised(features: dict) -> bytes:
    message = Example()
    for key, value in features.items():
        feature = message.features.feature[key]
        if value is not None:
            kind, values = value
            getattr(feature, kind).SetInParent()
            getattr(feature, kind).value.extend(values)
    return message.SerializeToString()


protobuf_examples = st.dictionaries(names, feature_values, max_size=6).map(serialised)

fuzz = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@fuzz
@given(protobuf_examples)
def test_examples_protobuf_writes_read_the_same(record):
    assert check(record) == "read"


# --- any sequence of field encodings, at every level ---

pads = st.sampled_from([0] * 24 + [1, 3, 9])  # overlong varints (9: too long for a value over 127)
tag_pads = st.sampled_from([0] * 16 + [1, 4])
# Varints as they come: up to 10 bytes and one of 11, a last byte that overflows 64 bits, and the edges.
raw_varints = st.one_of(
    st.builds(
        lambda more, last: bytes(more) + bytes([last]),
        st.lists(st.integers(0x80, 0xFF), max_size=9),
        st.integers(0, 0x7F),
    ),
    st.sampled_from(
        [b"\xff" * 9 + b"\x01", b"\xff" * 9 + b"\x7f", b"\x80" * 9 + b"\x02", b"\xff" * 10 + b"\x01"]
    ),
)
# Tags at the edges of 32 bits: the largest field number, and one bit over (refused).
raw_tags = st.sampled_from([b"\xf8\xff\xff\xff\x0f", b"\x80\x80\x80\x80\x10", b"\xf8\xff\xff\xff\x8f\x00"])


@st.composite
def fields_of(draw, *known, max_size=5, unknown=1):
    """The encoding of a message: ``known`` fields (strategies of bytes) and unknown ones, any order;
    ``unknown``: 0 for an unknown field as likely as each known one, more for rarer ones."""
    field_kinds = st.one_of(*(known * (1 + 3 * unknown)), unknown_fields()) if known else unknown_fields()
    return b"".join(draw(st.lists(field_kinds, max_size=max_size)))


@st.composite
def unknown_fields(draw, depth: int = 0) -> bytes:
    """A field of any number (the known ones too) and any wire type, groups included."""
    number = draw(st.sampled_from([1, 2, 3, 4, 15, 16, 2047, 2**29 - 1] * 3 + [0]))
    wire = draw(st.sampled_from([0, 1, 2, 5, 3, 4, 6] if depth < 3 else [0, 1, 2, 5]))
    tag_pad = draw(tag_pads)
    if wire == 0:
        if draw(st.integers(0, 9)) == 0:
            return draw(raw_tags) + draw(raw_varints)
        return field(number, 0, draw(st.integers(0, 2**64 - 1)), tag_pad, draw(pads))
    if wire == 2:
        return field(number, 2, draw(st.binary(max_size=8)), tag_pad, draw(pads))
    if wire in (1, 5):
        return field(number, wire, draw(st.binary(min_size=4 << (wire == 1), max_size=4 << (wire == 1))))
    if wire in (4, 6):  # an end without its group, a wire type protobuf lacks: refused, now and then
        return varint(number << 3 | wire) if draw(st.integers(0, 9)) == 0 else b""
    inner = b"".join(draw(st.lists(unknown_fields(depth + 1), max_size=3)))
    end = number if draw(st.integers(0, 19)) else draw(st.sampled_from([1, 2, 5]))
    return varint(number << 3 | 3, tag_pad) + inner + varint(end << 3 | 4)


def len_field(number: int, payloads):
    return st.builds(lambda p, tp, lp: field(number, 2, p, tp, lp), payloads, tag_pads, pads)


packed_varints = st.builds(
    lambda vs, cut: b"".join(vs)[: -1 if cut else None],  # cut: the last varint runs past the end
    st.lists(raw_varints | int64s.map(lambda v: varint(v & (2**64 - 1))), max_size=6),
    st.integers(0, 9).map(lambda n: n == 0),
)
int64_list = fields_of(
    len_field(1, packed_varints),
    st.builds(lambda v, pad: field(1, 0, v, 0, pad), st.integers(0, 2**64 - 1), pads),
    raw_varints.map(lambda v: b"\x08" + v),
)
floats = st.lists(st.floats(width=32), max_size=5).map(lambda fs: struct.pack(f"<{len(fs)}f", *fs))
float_list = fields_of(
    st.builds(lambda f: field(1, 5, struct.pack("<f", f)), st.floats(width=32)),
    len_field(1, floats),
    len_field(1, st.binary(max_size=9)),  # not a multiple of 4 bytes: refused
)
bytes_list = fields_of(len_field(1, st.binary(max_size=6)))
features_kinds = fields_of(len_field(1, bytes_list), len_field(2, float_list), len_field(3, int64_list))
keys = st.one_of(  # names protobuf refuses too, now and then
    st.sampled_from([b"", b"a", b"b", "ü".encode()] * 4 + [b"\xff", b"\xed\xa0\x80"]),
    st.text(max_size=3).map(str.encode),
)
map_entries = st.one_of(
    len_field(1, st.builds(lambda k, f: field(1, 2, k) + field(2, 2, f), keys, features_kinds)),
    len_field(  # values repeated: the Features merge
        1,
        st.builds(
            lambda k, fs: field(1, 2, k) + b"".join(field(2, 2, f) for f in fs),
            keys,
            st.lists(features_kinds, min_size=2, max_size=3),
        ),
    ),
    # an entry with no key, two keys, no value or two (merged), an unknown field now and then
    len_field(1, fields_of(len_field(1, keys), len_field(2, features_kinds), max_size=4, unknown=3)),
)
wire_examples = fields_of(len_field(1, fields_of(map_entries, max_size=6)), max_size=3)


@fuzz
@given(st.lists(wire_examples, min_size=1, max_size=3).map(b"".join))
@example(entry(b"a", field(3, 2, field(1, 2, b"\x05"))) * 2)
def test_any_sequence_of_fields_reads_as_protobuf_reads_it(record):
    check(record)


# --- random edits of both ---


@st.composite
def edited(draw):
    record = bytearray(draw(st.one_of(protobuf_examples, wire_examples)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["set", "insert", "delete", "truncate", "splice"]))
        at = draw(st.integers(0, len(record)))
        if op == "set" and at < len(record):
            record[at] = draw(st.integers(0, 255))
        elif op == "insert":
            record[at:at] = draw(st.binary(min_size=1, max_size=3))
        elif op == "delete":
            del record[at : at + draw(st.integers(1, 3))]
        elif op == "truncate":
            del record[at:]
        elif op == "splice" and record:
            start = draw(st.integers(0, len(record) - 1))
            record[at:at] = record[start : start + draw(st.integers(1, 12))]
    return bytes(record)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edited())
def test_edited_records_read_or_are_refused_as_protobuf_does(record):
    check(record)


# --- the cases spelt out: what protobuf gives, parse_example gives ---


def ex(*entries: bytes) -> bytes:
    """An Example of one ``features`` field holding these map entries."""
    return field(1, 2, b"".join(entries))


def ints(payload: bytes) -> bytes:
    """A Feature holding an int64_list of this encoding."""
    return field(3, 2, payload)


def nested_groups(n: int, number: int = 5) -> bytes:
    return varint(number << 3 | 3) * n + varint(number << 3 | 4) * n


FEATURE = field(1, 2, field(1, 2, b"x"))  # bytes_list [b"x"]
INTS = ints(field(1, 0, 4))  # int64_list [4]
KEY_A = field(1, 2, b"a")

SPELT_OUT = {
    # merges: repeated Example.features, a key's last entry, Feature fields of one kind and of others
    "Example.features twice: later keys replace": (
        ex(entry(b"a", FEATURE), entry(b"b", FEATURE)) + ex(entry(b"a", INTS)),
        {"a": [4], "b": [b"x"]},
    ),
    "one key twice: the last entry wins": (ex(entry(b"a", INTS), entry(b"a", FEATURE)), {"a": [b"x"]}),
    "one kind twice in a Feature: concatenated": (
        ex(entry(b"a", INTS + ints(b"\x0a\x02\x01\x02"))),
        {"a": [4, 1, 2]},
    ),
    "another kind: replaces": (ex(entry(b"a", INTS + FEATURE)), {"a": [b"x"]}),
    "the first kind again: starts over": (ex(entry(b"a", INTS + FEATURE + INTS)), {"a": [4]}),
    "an empty list sets the kind": (ex(entry(b"a", INTS + field(2, 2, b""))), {"a": []}),
    "two values in one entry: merged": (ex(field(1, 2, KEY_A + field(2, 2, INTS) * 2)), {"a": [4, 4]}),
    "two keys in one entry: the last": (
        ex(field(1, 2, KEY_A + field(2, 2, INTS) + field(1, 2, b"b"))),
        {"b": [4]},
    ),
    "an entry with no key": (ex(field(1, 2, field(2, 2, INTS))), {"": [4]}),
    "an entry with no value": (ex(field(1, 2, KEY_A)), {"a": []}),
    # unknown fields, and known numbers of another wire type, which protobuf takes for unknown
    "an entry with an unknown field is not in the map": (
        ex(entry(b"a", INTS), field(1, 2, KEY_A + field(2, 2, FEATURE) + field(3, 0, 1))),
        {"a": [4]},
    ),
    "an entry with a key of the wrong wire type is not in the map": (
        ex(field(1, 2, field(1, 0, 1) + field(2, 2, FEATURE))),
        {},
    ),
    "Example.features of the wrong wire type: unknown": (field(1, 0, 5) + ex(entry(b"a", INTS)), {"a": [4]}),
    "a Feature field of the wrong wire type: unknown": (ex(entry(b"a", INTS + field(1, 0, 1))), {"a": [4]}),
    "an int64 of the wrong wire type: unknown": (
        ex(entry(b"a", ints(field(1, 0, 3) + field(1, 1, b"12345678")))),
        {"a": [3]},
    ),
    "a group in a list": (ex(entry(b"a", ints(field(1, 0, 3) + nested_groups(3)))), {"a": [3]}),
    "the deepest groups protobuf skips at the top": (nested_groups(100), {}),
    "the deepest groups protobuf skips in a list": (ex(entry(b"a", ints(nested_groups(96)))), {"a": []}),
    # varints
    "a 10-byte varint wraps to 64 bits": (
        ex(entry(b"a", ints(field(1, 2, b"\xff" * 9 + b"\x7f") + field(1, 0, 2**64 - 1)))),
        {"a": [-1, -1]},
    ),
    "overlong tags and lengths": (
        field(1, 2, field(1, 2, field(1, 2, b"a", 4, 9) + field(2, 2, INTS, 2, 3), 1, 1), 4, 9),
        {"a": [4]},
    ),
    "the largest tag": (varint(0xFFFFFFF8) + b"\x00", {}),
    # refusals
    "a name that is not UTF-8": (ex(entry(b"\xff", FEATURE)), None),
    "a surrogate in a name": (ex(entry(b"\xed\xa0\x80", FEATURE)), None),
    "a tag of 6 bytes": (b"\x88\x80\x80\x80\x80\x00\x01", None),
    "a tag over 32 bits": (b"\xf8\xff\xff\xff\x1f\x01", None),
    "field number 0": (b"\x00\x01", None),
    "a varint of 11 bytes": (b"\x08" + b"\xff" * 10 + b"\x01", None),
    "a packed varint of 11 bytes": (ex(entry(b"a", ints(field(1, 2, b"\xff" * 10 + b"\x01")))), None),
    "a packed list ending inside a varint": (ex(entry(b"a", ints(field(1, 2, b"\x01\xff")))), None),
    "a packed float list of 5 bytes": (ex(entry(b"a", field(2, 2, field(1, 2, b"12345")))), None),
    "an end group at the top": (varint(2 << 3 | 4), None),
    "an end group in a message": (field(1, 2, varint(2 << 3 | 4)), None),
    "a group ended by another": (varint(2 << 3 | 3) + varint(3 << 3 | 4), None),
    "a group left open": (varint(2 << 3 | 3) + field(3, 0, 1), None),
    "groups deeper than protobuf's limit at the top": (nested_groups(101), None),
    "groups deeper than protobuf's limit in a list": (ex(entry(b"a", ints(nested_groups(97)))), None),
    "a field longer than its message": (field(1, 2, field(1, 2, b"\x0a\x05ab")), None),
    "wire type 6": (b"\x0e", None),
}


@pytest.mark.parametrize("case", SPELT_OUT)
def test_what_protobuf_gives_spelt_out(case):
    record, want = SPELT_OUT[case]
    assert check(record) == ("refused" if want is None else "read")
    if want is not None:
        parsed = parse_example(record)
        assert {k: v if isinstance(v, list) else v.tolist() for k, v in parsed.items()} == want
