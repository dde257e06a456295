"""The public record writers (``launch/records.py``): ``encode_example``, ``TFRecordWriter``,
``RecordIOWriter``, ``write_tfrecords``, ``write_recordio``.

What they write is read back by the runtime's own framers and Example parser and by TensorFlow's
``tf.data.TFRecordDataset`` and ``tf.train.Example`` (marked ``tensorflow``), with the same values; a
path is written atomically; a value that cannot be encoded fails naming its feature; and the module
loads neither TensorFlow nor PyTorch.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import sagemaker_dist
from sagemaker_dist.contract.record_formats import encode_recordio, encode_tfrecord
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.launch import records
from sagemaker_dist.launch.records import (
    RecordEncodeError,
    RecordIOWriter,
    RecordsWritten,
    RecordTypeError,
    TFRecordWriter,
    encode_example,
    write_recordio,
    write_tfrecords,
)
from sagemaker_dist.runtime.framing import iter_records
from sagemaker_dist.runtime.torch.records import parse_example

WRITERS = [(TFRecordWriter, write_tfrecords, "TFRecord"), (RecordIOWriter, write_recordio, "RecordIO")]

# ---------------------------------------------------------------------------------------------------
# Features and what each must read back as: (value, kind, values), kind "bytes" / "int64" / "float" or
# None (an empty list: a Feature with no kind set).

I64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
F32 = st.floats(width=32, allow_nan=False)  # exactly representable as float32; infinities included
BLOB = st.binary(max_size=40)
# no lone surrogates (UTF-8 text), no NUL (numpy drops trailing NULs from a U array's items)
TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=6)
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


def _utf8(value) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value


def _int_arrays():
    dtypes = st.sampled_from(
        [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.bool_]
    )
    return dtypes.flatmap(lambda dtype: hnp.arrays(dtype, SHAPES)).map(
        lambda a: (a, "int64", a.ravel().astype(np.int64).tolist())
    )


def _float_arrays():
    arrays = st.one_of(
        hnp.arrays(np.float32, SHAPES, elements=F32),
        hnp.arrays(np.float64, SHAPES, elements=F32),  # float64 values float32 can hold exactly
        hnp.arrays(np.float16, SHAPES, elements=st.floats(width=16, allow_nan=False)),
    )
    return arrays.map(lambda a: (a, "float", a.ravel().astype(np.float32).tolist()))


def _text_arrays():
    arrays = st.one_of(hnp.arrays("S6", SHAPES), hnp.arrays("U6", SHAPES, elements=TEXT))
    return arrays.map(lambda a: (a, "bytes", [_utf8(v) for v in a.ravel().tolist()]))


def _ints_among_floats():
    items = st.lists(st.one_of(F32, st.integers(-(2**24), 2**24)), min_size=1, max_size=8)
    return items.filter(lambda v: any(isinstance(x, float) for x in v)).map(lambda v: (v, "float", v))


VALUES = st.one_of(
    BLOB.map(lambda b: (b, "bytes", [b])),
    TEXT.map(lambda s: (s, "bytes", [s.encode()])),
    st.lists(st.one_of(BLOB, TEXT), min_size=1, max_size=5).map(
        lambda v: (v, "bytes", [_utf8(x) for x in v])
    ),
    I64.map(lambda i: (i, "int64", [i])),
    st.booleans().map(lambda b: (b, "int64", [int(b)])),
    st.lists(I64, min_size=1, max_size=8).map(lambda v: (v, "int64", v)),
    st.lists(I64, min_size=1, max_size=3).map(lambda v: (tuple(v), "int64", v)),
    F32.map(lambda f: (f, "float", [f])),
    st.lists(F32, min_size=1, max_size=8).map(lambda v: (v, "float", v)),
    _ints_among_floats(),
    I64.map(lambda i: (np.int64(i), "int64", [i])),
    F32.map(lambda f: (np.float32(f), "float", [f])),
    _int_arrays(),
    _float_arrays(),
    _text_arrays(),
    st.just(([], None, [])),
)
FEATURES = st.dictionaries(st.text(max_size=10), VALUES, max_size=6)


def _split(features):
    """(the dict encode_example takes, name -> (kind, values) it must read back as)."""
    return {k: v for k, (v, _, _) in features.items()}, {
        k: (kind, vs) for k, (_, kind, vs) in features.items()
    }


def _same(kind, got, expected) -> bool:
    if kind == "float":
        return np.array_equal(np.asarray(got, np.float32), np.asarray(expected, np.float32))
    return list(got) == list(expected)


def _ours(parsed) -> dict:
    """parse_example's result as name -> (kind, values); an empty list of any kind reads as kind None."""
    out = {}
    for name, value in parsed.items():
        if isinstance(value, list):
            kind = "bytes"
        else:
            kind = "float" if value.dtype == np.float32 else "int64"
        out[name] = (kind if len(value) else None, list(value))
    return out


def _check(got: dict, expected: dict, empty_has_no_kind: bool) -> None:
    assert sorted(got) == sorted(expected)
    for name, (kind, values) in expected.items():
        if empty_has_no_kind and not values:
            kind = None
        got_kind, got_values = got[name]
        assert got_kind == kind, (name, got_kind, kind)
        assert _same(kind, got_values, values), (name, got_values, values)


def _read(data: bytes, record_format: str) -> list[bytes]:
    return list(iter_records(io.BytesIO(data).readinto, record_format, chunk_size=97))


@settings(max_examples=150, deadline=None)
@given(features=FEATURES)
def test_examples_read_back_through_the_runtimes_parser_with_equal_values(features):
    given_, expected = _split(features)
    _check(_ours(parse_example(encode_example(given_))), expected, empty_has_no_kind=True)


@pytest.mark.usefixtures("tfrecord_scan")
@pytest.mark.parametrize("writer, write_all, record_format", WRITERS)
@settings(max_examples=40, deadline=None)
@given(examples=st.lists(FEATURES, max_size=8), blobs=st.lists(st.binary(max_size=300), max_size=20))
def test_written_files_read_back_through_the_runtimes_framers(
    writer, write_all, record_format, examples, blobs
):
    payloads = [encode_example(_split(f)[0]) for f in examples] + blobs
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "part-0"
        with writer(path) as out:
            for payload in payloads:
                out.write(payload)
        data = path.read_bytes()
        assert os.listdir(folder) == ["part-0"]
        assert (out.records, out.bytes) == (len(payloads), len(data))
        assert _read(data, record_format) == payloads
        for raw, features in zip(_read(data, record_format), examples):
            _check(_ours(parse_example(raw)), _split(features)[1], empty_has_no_kind=True)
        # the convenience writes the same bytes and says so
        assert write_all(path, payloads) == RecordsWritten(len(payloads), len(data))
        assert path.read_bytes() == data


@pytest.mark.parametrize("writer, write_all, record_format", WRITERS)
def test_the_frames_are_the_contracts_encoders(writer, write_all, record_format):
    """One home for the framing rules: the writers frame with ``contract.record_formats``."""
    frame = encode_tfrecord if record_format == "TFRecord" else encode_recordio
    payloads = [b"", b"a", b"abcde", bytearray(b"xyz"), memoryview(b"0123456789")]
    buffer = io.BytesIO()
    assert write_all(buffer, payloads) == RecordsWritten(5, len(buffer.getvalue()))
    assert buffer.getvalue() == b"".join(frame(bytes(p)) for p in payloads)
    assert not buffer.closed  # a caller's file object stays open


@pytest.mark.tensorflow
@settings(max_examples=30, deadline=None)
@given(examples=st.lists(FEATURES, min_size=1, max_size=6))
def test_tensorflow_reads_the_tfrecords_and_examples_with_equal_values(examples):
    tf = pytest.importorskip("tensorflow")
    kinds = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64", None: None}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "train.tfrecord"
        written = write_tfrecords(path, (encode_example(_split(f)[0]) for f in examples))
        assert written == RecordsWritten(len(examples), path.stat().st_size)
        raws = [r.numpy() for r in tf.data.TFRecordDataset(str(path))]  # checks both CRCs of every record
    assert len(raws) == len(examples)
    for raw, features in zip(raws, examples):
        example = tf.train.Example.FromString(raw)
        got = {}
        for name, feature in example.features.feature.items():
            kind = feature.WhichOneof("kind")
            got[name] = (kinds[kind], list(getattr(feature, kind).value) if kind else [])
        _check(got, _split(features)[1], empty_has_no_kind=False)


@pytest.mark.tensorflow
def test_tensorflow_parses_the_examples_in_a_graph():
    tf = pytest.importorskip("tensorflow")
    image = np.arange(12, dtype=np.uint8)
    raw = encode_example({"image": image.tobytes(), "label": -3, "score": [0.5, 2], "tags": []})
    spec = {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([1], tf.int64),
        "score": tf.io.FixedLenFeature([2], tf.float32),
        "tags": tf.io.VarLenFeature(tf.string),  # an empty list has no kind: empty as any dtype
    }
    parsed = tf.io.parse_single_example(raw, spec)
    assert np.frombuffer(parsed["image"].numpy(), np.uint8).tolist() == image.tolist()
    assert parsed["label"].numpy().tolist() == [-3]
    assert parsed["score"].numpy().tolist() == [0.5, 2.0]
    assert parsed["tags"].values.numpy().tolist() == []


def test_a_negative_int64_is_a_ten_byte_varint():
    raw = encode_example({"v": -1})
    # Example.features -> map entry (key "v") -> Feature.int64_list -> packed value: ff x 9, 01
    assert raw == bytes.fromhex("0a150a130a0176120e1a0c0a0a" + "ff" * 9 + "01")
    assert raw == encode_example({"v": [-1]}) == encode_example({"v": np.array([-1], np.int32)})
    assert parse_example(raw)["v"].tolist() == [-1]
    assert parse_example(encode_example({"v": -(2**63)}))["v"].tolist() == [-(2**63)]


def test_equal_features_give_equal_bytes_whatever_their_order():
    assert encode_example({"b": 1, "a": b"x"}) == encode_example({"a": b"x", "b": 1})


# ---------------------------------------------------------------------------------------------------
# Atomic writes


@pytest.mark.parametrize("writer, write_all, record_format", WRITERS)
def test_an_exception_inside_the_with_leaves_no_file_and_no_temporary(
    tmp_path, writer, write_all, record_format
):
    path = tmp_path / "part-0"
    with pytest.raises(RuntimeError, match="stopped"):
        with writer(path) as out:
            out.write(b"record")
            assert not path.exists()  # the records go to a temporary beside it until a clean close
            assert len(list(tmp_path.iterdir())) == 1
            raise RuntimeError("stopped")
    assert list(tmp_path.iterdir()) == []
    assert out.closed

    def records():
        yield b"one"
        raise RuntimeError("the source failed")

    with pytest.raises(RuntimeError, match="the source failed"):
        write_all(path, records())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("writer, write_all, record_format", WRITERS)
def test_a_file_already_there_is_replaced_only_by_a_whole_one(tmp_path, writer, write_all, record_format):
    path = tmp_path / "part-0"
    path.write_bytes(b"old")
    with pytest.raises(RecordTypeError):
        with writer(path) as out:
            out.write(b"new")
            out.write("not bytes")
    assert path.read_bytes() == b"old"
    assert list(tmp_path.iterdir()) == [path]
    assert write_all(path, [b"new"]).records == 1
    assert _read(path.read_bytes(), record_format) == [b"new"]
    assert list(tmp_path.iterdir()) == [path]


def test_close_without_a_with_renames_and_discard_removes(tmp_path):
    path = tmp_path / "a.tfrecord"
    out = TFRecordWriter(str(path))
    out.write(b"x")
    out.close()
    out.close()  # once is enough; again does nothing
    assert _read(path.read_bytes(), "TFRecord") == [b"x"]
    other = TFRecordWriter(tmp_path / "b.tfrecord")
    other.write(b"y")
    other.discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tfrecord"]
    with pytest.raises(ValueError, match="closed TFRecordWriter"):
        other.write(b"z")


def test_the_file_gets_the_mode_open_gives(tmp_path):
    old = os.umask(0o022)
    try:
        write_tfrecords(tmp_path / "part-0", [b"x"])
    finally:
        os.umask(old)
    assert (tmp_path / "part-0").stat().st_mode & 0o777 == 0o644


def test_without_crc32c_a_tfrecord_writer_says_what_to_install_before_writing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "crc32c", None)  # import crc32c raises ImportError
    with pytest.raises(RecordEncodeError, match="pip install crc32c"):
        TFRecordWriter(tmp_path / "part-0")
    assert list(tmp_path.iterdir()) == []
    assert write_recordio(tmp_path / "part-0", [b"x"]).records == 1  # RecordIO has no checksum


# ---------------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    "features, error, message",
    [
        ({"mixed": [1, b"x"]}, TypeError, "feature 'mixed' mixes bytes or str with numbers"),
        ({"mixed": ["a", 2.5]}, TypeError, "feature 'mixed' mixes"),
        ({"nested": [[1, 2], [3]]}, TypeError, "feature 'nested', value 0: a list inside a list"),
        ({"nested": [np.zeros(2)]}, TypeError, "feature 'nested': a ndarray inside a list"),
        ({"none": None}, TypeError, "feature 'none': NoneType is not supported"),
        ({"set": {1, 2}}, TypeError, "feature 'set': set is not supported"),
        ({"obj": [1, object()]}, TypeError, "feature 'obj', value 1: object is not supported"),
        ({"cplx": np.array([1j])}, TypeError, "feature 'cplx': a numpy array of dtype complex128"),
        ({"when": np.datetime64("2024-01-01")}, TypeError, "feature 'when'.*datetime64"),
        ({1: b"x"}, TypeError, "feature name 1 \\(int\\) is not a str"),
        ({"big": 2**63}, ValueError, "feature 'big': 9223372036854775808 does not fit an int64"),
        ({"small": [0, -(2**63) - 1]}, ValueError, "feature 'small'.*does not fit an int64"),
        ({"u64": np.array([2**64 - 1], np.uint64)}, ValueError, "feature 'u64'.*does not fit an int64"),
        ({"f": 1e39}, ValueError, "feature 'f': 1e\\+39 does not fit a float32"),
        ({"f": [1.0, -1e39]}, ValueError, "feature 'f': -1e\\+39 does not fit a float32"),
        ({"f64": np.array([0.5, 1e39])}, ValueError, "feature 'f64': 1e\\+39 does not fit a float32"),
        ({"text": ["ok", "\ud800"]}, ValueError, "feature 'text': '\\\\ud800' cannot be written as UTF-8"),
        ({"\udc80": 1}, ValueError, "feature '\\\\udc80': '\\\\udc80' cannot be written as UTF-8"),
        ({"u": np.array(["\ud800"])}, ValueError, "feature 'u'.*cannot be written as UTF-8"),
    ],
)
def test_a_value_that_cannot_be_encoded_names_its_feature(features, error, message):
    with pytest.raises(error, match=message) as caught:
        encode_example(features)
    assert isinstance(caught.value, ConfigurationError)  # the family the CLI and callers catch


def test_encode_example_takes_a_mapping():
    with pytest.raises(TypeError, match="mapping of feature name -> value, not a list"):
        encode_example([("a", 1)])


def test_a_record_must_be_bytes_and_a_target_a_path_or_a_file(tmp_path):
    with TFRecordWriter(io.BytesIO()) as out:
        with pytest.raises(TypeError, match="a record is bytes, not a str .*encode_example"):
            out.write("text")
        with pytest.raises(TypeError, match="a record is bytes, not a dict .*encode_example"):
            out.write({"a": 1})
        with pytest.raises(TypeError, match="a record is bytes, not a int$"):
            out.write(3)
    with pytest.raises(TypeError, match="writes to a path or a binary file object, not a int"):
        RecordIOWriter(3)
    with pytest.raises(IsADirectoryError, match="is a directory"):
        TFRecordWriter(tmp_path)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------------
# The public API, and no framework


def test_the_writers_are_public_and_demo_data_uses_the_same_encoder():
    from sagemaker_dist.local import demo_data

    for name in ("encode_example", "TFRecordWriter", "RecordIOWriter", "write_tfrecords", "write_recordio"):
        assert getattr(sagemaker_dist, name) is getattr(records, name)
        assert name in sagemaker_dist.__all__
    assert demo_data.encode_example is records.encode_example


def test_importing_the_writers_loads_neither_tensorflow_nor_torch():
    code = (
        "import sys\n"
        "import sagemaker_dist.launch.records\n"
        "from sagemaker_dist import encode_example, write_tfrecords\n"
        "import io\n"
        "write_tfrecords(io.BytesIO(), [encode_example({'x': [1.5], 'y': b'z'})])\n"
        "loaded = [m for m in ('tensorflow', 'torch', 'keras', 'sagemaker') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
