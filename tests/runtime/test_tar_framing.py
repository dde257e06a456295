"""WebDataset tar shards framed as samples (``framing.tar``), against the references: shards written by the
``webdataset`` library and by GNU tar (``--format=gnu`` and ``--format=pax``, long and non-ASCII names,
folders, files of no sample) and read back sample by sample by ``webdataset`` itself, concatenated as a
Pipe stream carries them (end-of-archive blocks between) and read in chunks of every size. Then bad
bytes: each crafted header is a ``RecordFormatError`` naming its stream offset, with the samples before
it handed out first; sizes a header claims are refused before memory is set aside; a fuzz of headers
(hypothesis) never crashes and never holds more memory than the stream's bytes warrant."""

from __future__ import annotations

import io
import os
import random
import subprocess
import tracemalloc

import pytest
from helpers.crafted_tar import EDITS, crafted_stream
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sagemaker_dist.contract.record_formats import encode_tfrecord
from sagemaker_dist.contract.tar_format import (
    BLOCK,
    CHKSUM,
    END_OF_ARCHIVE,
    checksum,
    key_and_extension,
    tar_header,
    tar_member,
)
from sagemaker_dist.launch.tar_shards import WebDatasetWriter
from sagemaker_dist.runtime.framing import TarError, iter_records, make_framer
from sagemaker_dist.runtime.framing.base import RecordFormatError
from sagemaker_dist.runtime.framing.tar import parse_sample

wds = pytest.importorskip("webdataset")

CHUNKS = [BLOCK, 1000, 4096, 4 << 20]  # a header per read, cuts anywhere, a few samples, the default


@pytest.fixture(autouse=True, params=["compiled", "python"])
def walk(request, monkeypatch):
    """Every test through both walks: the C one (``_tar_scan``, which leaves the unusual to Python) and
    the Python one alone."""
    from sagemaker_dist.runtime.framing import tar

    if request.param == "compiled":
        if tar._native is None:
            pytest.fail("framing._tar_scan is not built: pip install -e . needs a C compiler")
    else:
        monkeypatch.setattr(tar, "_native", None)
    return request.param


def read(stream: bytes, chunk: int = 4 << 20, **kwargs) -> list[dict]:
    """Every sample of ``stream`` as the runtime frames and parses it."""
    return [
        parse_sample(r)
        for r in iter_records(io.BytesIO(stream).readinto, "WebDataset", chunk_size=chunk, **kwargs)
    ]


def reference(path) -> list[dict]:
    """The samples of one tar file as the ``webdataset`` library reads them."""
    out = []
    for sample in wds.WebDataset(str(path), shardshuffle=False):
        out.append({k: v for k, v in sample.items() if k not in ("__url__", "__local_path__")})
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Three shards by three writers: webdataset's TarWriter, GNU tar --format=gnu and --format=pax over a
    tree with long (> 100 and > 255 bytes) and non-ASCII names, folders, a file without a dot, a
    WebDataset metadata file and an upper-case extension."""
    tmp = tmp_path_factory.mktemp("shards")
    rng = random.Random(3)
    with wds.TarWriter(str(tmp / "wds.tar")) as w:
        for i in range(40):
            w.write(
                {
                    "__key__": f"s{i:05d}",
                    "jpg": rng.randbytes(rng.choice([0, 1, 511, 512, 513, 3000])),
                    "cls": str(i % 5).encode(),
                    "json": b'{"i": %d}' % i,
                }
            )
    tree = tmp / "tree"
    deep = tree / ("d" * 120) / "sub"
    deep.mkdir(parents=True)
    (tree / "plain").mkdir()
    names = []
    for i in range(6):
        folder = deep if i % 2 else tree / "plain"
        stem = ("k" * (140 + i)) if i % 3 == 0 else f"é-{i}"
        for ext in ("jpg", "cls", "TXT"):
            data = rng.randbytes(rng.randint(1, 2000))
            (folder / f"{stem}.{ext}").write_bytes(data)
        names.append(stem)
    (tree / "plain" / "README").write_bytes(b"no dot: no sample")
    (tree / "__meta__").write_bytes(b"webdataset skips this")
    for fmt in ("gnu", "pax"):
        command = ["tar", f"--format={fmt}", "--sort=name", "-cf", str(tmp / f"{fmt}.tar"), "."]
        subprocess.run(command, cwd=tree, check=True)  # sorted: a sample's files one after another
    return [tmp / "wds.tar", tmp / "gnu.tar", tmp / "pax.tar"]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_shards_of_webdataset_and_gnu_tar_read_back_sample_by_sample_as_webdataset_reads_them(shards, chunk):
    stream = b"".join(p.read_bytes() for p in shards)  # a Pipe stream: the objects one after another
    expected = [s for p in shards for s in reference(p)]
    got = read(stream, chunk)
    assert [s["__key__"] for s in got] == [s["__key__"] for s in expected]
    assert got == expected
    assert len(got) == 40 + 6 + 6
    assert any(len(s["__key__"]) > 255 for s in got) and any("é" in s["__key__"] for s in got)
    assert all("txt" in s for s in got[40:])  # upper-case extensions lower-cased, as webdataset does


def test_gnu_tar_pads_its_archives_to_10_kib_and_the_zero_blocks_between_shards_end_each_sample(shards):
    gnu = shards[1].read_bytes()
    assert len(gnu) % 10240 == 0 and gnu.endswith(END_OF_ARCHIVE * 2)
    # the same key on both sides of an archive's end is two samples, as webdataset yields them
    one = tar_member("a/x.jpg", b"1") + END_OF_ARCHIVE
    two = tar_member("a/x.cls", b"2") + END_OF_ARCHIVE
    assert read(one + two) == [{"__key__": "a/x", "jpg": b"1"}, {"__key__": "a/x", "cls": b"2"}]
    # and a stream whose last archive has no end blocks still hands out its last sample
    assert read(one + tar_member("b.cls", b"3")) == [
        {"__key__": "a/x", "jpg": b"1"},
        {"__key__": "b", "cls": b"3"},
    ]


def test_the_writer_makes_shards_that_webdataset_gnu_tar_and_the_reader_read_alike(tmp_path):
    import numpy as np

    samples = [
        {"__key__": f"{i:06d}", "jpg": os.urandom(i * 97), "cls": i % 3, "json": {"n": i}, "txt": f"no {i}"}
        for i in range(12)
    ]
    samples.append({"__key__": "p" * 60 + "/" + "q" * 80, "cls": 1})  # ustar's prefix and name fields
    samples.append({"__key__": "f/" + "é" * 90 + "x" * 60, "npy": np.arange(6, dtype=np.int16)})  # pax path
    path = tmp_path / "shard.tar"
    with WebDatasetWriter(path) as out:
        for sample in samples:
            out.write(sample)
    assert out.records == 14 and out.bytes == path.stat().st_size
    ours = read(path.read_bytes())
    assert ours == reference(path)
    assert ours[5] == {
        "__key__": "000005",
        "jpg": samples[5]["jpg"],
        "cls": b"2",
        "json": b'{"n":5}',
        "txt": b"no 5",
    }
    assert np.array_equal(np.load(io.BytesIO(ours[-1]["npy"])), samples[-1]["npy"])
    listed = subprocess.run(["tar", "-tf", str(path)], capture_output=True, check=True).stdout.decode()
    assert listed.splitlines()[-1] == samples[-1]["__key__"] + ".npy"  # the pax path GNU tar reads


def test_a_sample_record_is_its_members_bytes_as_they_are_in_the_stream():
    stream = tar_member("k.jpg", b"abc") + tar_member("k.cls", b"1") + END_OF_ARCHIVE
    (record,) = iter_records(io.BytesIO(stream).readinto, "WebDataset")
    assert record == stream[: 4 * BLOCK]
    assert parse_sample(record) == {"__key__": "k", "jpg": b"abc", "cls": b"1"}
    assert parse_sample(memoryview(record), keep_key=False) == {"jpg": b"abc", "cls": b"1"}
    assert key_and_extension("a.b/c.tar.gz") == ("a.b/c", "tar.gz") and key_and_extension("a.b/c") is None


# --- bad bytes: named errors at their offsets --------------------------------------------------------


def _members(n: int) -> bytes:
    return b"".join(tar_member(f"{i:03d}.bin", bytes([i]) * 700) for i in range(n))


def _with_header(stream: bytes, at: int, **fields) -> bytes:
    """``stream`` with the header at ``at`` changed (fields: offset -> bytes) and its checksum made right."""
    header = bytearray(stream[at : at + BLOCK])
    for offset, value in fields.values():
        header[offset : offset + len(value)] = value
    start, length = CHKSUM
    header[start : start + length] = b"%06o\x00 " % checksum(header)
    return stream[:at] + bytes(header) + stream[at + BLOCK :]


def frame_all(stream: bytes, chunk: int = 4 << 20, **kwargs) -> tuple[list[bytes], Exception | None]:
    """The records handed out before the error (if any), and the error."""
    got: list[bytes] = []
    try:
        for record in iter_records(io.BytesIO(stream).readinto, "WebDataset", chunk_size=chunk, **kwargs):
            got.append(record)
    except RecordFormatError as exc:
        return got, exc
    return got, None


@pytest.mark.parametrize("chunk", [BLOCK, 4 << 20])
def test_a_bad_checksum_is_named_at_its_offset_after_the_samples_before_it(chunk):
    stream = bytearray(_members(5) + END_OF_ARCHIVE)
    third = 2 * 3 * BLOCK  # each member: a header and 2 blocks of data
    stream[third + 10] ^= 0x40
    got, error = frame_all(bytes(stream), chunk)
    # "001" is not handed out: the bad header after it could have been one of its files
    assert [parse_sample(r)["__key__"] for r in got] == ["000"]
    assert error is not None and error.offset == third
    assert "WebDataset: header checksum mismatch" in str(error) and f"byte offset {third}" in str(error)


def test_a_stream_that_is_not_tar_fails_at_its_first_byte():
    got, error = frame_all(b"".join(encode_tfrecord(os.urandom(600)) for _ in range(3)))
    assert got == [] and error.offset == 0 and "not tar (check record_format)" in str(error)


@pytest.mark.parametrize(
    "size_field, claimed",
    [(b"77777777777\x00", 8**11 - 1), (b"\x80" + (2**70).to_bytes(11, "big"), 2**70)],
    ids=["octal", "base-256"],
)
def test_a_huge_size_is_refused_before_memory_is_set_aside(size_field, claimed):
    stream = _members(2) + _with_header(_members(1), 0, size=(124, size_field)) + os.urandom(4096)
    tracemalloc.start()
    try:
        got, error = frame_all(stream, max_record_bytes=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(got) == 1 and error.offset == 2 * 3 * BLOCK
    assert f"a record of {claimed} bytes is longer than max_record_bytes=1048576" in str(error)
    assert peak < 4 << 20


def test_a_size_the_stream_does_not_hold_is_a_truncated_entry_not_a_large_buffer():
    stream = _members(1) + _with_header(_members(1), 0, size=(124, b"%011o\x00" % (1 << 30))) + b"\0" * 5000
    tracemalloc.start()
    try:
        got, error = frame_all(stream)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [parse_sample(r)["__key__"] for r in got] == []  # the first sample waits for the next header
    assert "stream ended inside a tar entry" in str(error) and error.offset == 3 * BLOCK
    assert peak < 4 << 20


def test_a_sample_over_the_record_limit_and_a_repeated_extension_are_named():
    big = tar_member("a.x", b"1" * 3000) + tar_member("a.y", b"2" * 3000) + END_OF_ARCHIVE
    _, error = frame_all(big, max_record_bytes=5000)
    assert "a record of 7168 bytes is longer than max_record_bytes=5000" in str(error) and error.offset == 0
    twice = tar_member("b.cls", b"0") + tar_member("a.jpg", b"1") + tar_member("a.jpg", b"2")
    got, error = frame_all(twice)
    assert [parse_sample(r) for r in got] == [{"__key__": "b", "cls": b"0"}]
    assert "sample 'a' has two files with extension 'jpg'" in str(error) and error.offset == 4 * BLOCK


@pytest.mark.parametrize("message", ["sparse file", "wrong length", "metadata member of"])
def test_metadata_headers_that_cannot_be_read_are_named(message):
    good = tar_member("a.jpg", b"1")  # not handed out: the bad header could have been a file of it
    if message == "sparse file":
        bad = _with_header(tar_member("s.jpg", b"1"), 0, flag=(156, b"S"))
    elif message == "wrong length":
        pax = b"99 path=x.jpg\n"
        bad = _with_header(tar_member("PaxHeaders/x", pax), 0, flag=(156, b"x")) + tar_member("y.jpg", b"2")
    else:
        bad = _with_header(tar_header("L", 2 << 20), 0, flag=(156, b"L")) + bytes(8 * BLOCK)
    got, error = frame_all(good + bad)
    assert got == [] and message in str(error) and error.offset == 2 * BLOCK


def test_parse_sample_names_what_is_wrong_with_a_record():
    with pytest.raises(TarError, match="files of two samples"):
        parse_sample(tar_member("a.x", b"1") + tar_member("b.x", b"2"))
    with pytest.raises(TarError, match="byte offset 1024: the record ends inside a tar header"):
        parse_sample(tar_member("a.x", b"1") + b"\0" * 100)
    with pytest.raises(TarError, match="byte offset 0: the record ends inside a member of 1 bytes"):
        parse_sample(tar_member("a.x", b"1")[: BLOCK + 1])
    with pytest.raises(TarError, match="ends inside a member of 3000 bytes"):
        parse_sample(tar_member("a.x", b"1" * 3000)[:2000])
    with pytest.raises(TarError, match="end-of-archive block"):
        parse_sample(END_OF_ARCHIVE)
    with pytest.raises(TarError, match="holds no file of a sample"):
        parse_sample(tar_member("README", b"x"))


# --- fuzz: crafted headers, each a named error or samples; never a crash, never unbounded memory -------


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    edits=EDITS,
    chunk=st.sampled_from([BLOCK, 1500, 1 << 20]),
)
def test_crafted_headers_are_named_errors_with_bounded_memory(walk, edits, chunk):
    stream = crafted_stream(edits)
    tracemalloc.start()
    try:
        records, error = frame_all(stream, chunk, max_record_bytes=1 << 20)
        for record in records:
            parse_sample(record)  # what the framer handed out parses
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    if error is not None:
        assert error.channel == "?" and 0 <= error.offset <= len(stream) and "WebDataset: " in str(error)
    assert peak < 8 << 20
    if walk == "compiled":  # the C walk hands out what the Python walk does, and fails with its words
        from sagemaker_dist.runtime.framing import tar

        native, tar._native = tar._native, None
        try:
            alone, alone_error = frame_all(stream, chunk, max_record_bytes=1 << 20)
        finally:
            tar._native = native
        assert alone == records and str(alone_error) == str(error)


def test_the_framer_is_what_make_framer_gives_and_refuses_a_skip_count():
    from sagemaker_dist.errors import ConfigurationError

    assert make_framer("WebDataset").format_name == "WebDataset"
    with pytest.raises(ConfigurationError, match="only be set for record_format='TFRecord'"):
        make_framer("WebDataset", max_corrupted_records_to_skip=1)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    edits=st.lists(st.tuples(st.integers(0, 4 * BLOCK - 1), st.integers(0, 255)), max_size=3),
    names=st.sampled_from(
        [("a.jpg", "a.cls"), ("d/" + "n" * 150 + ".jpg", "d/" + "n" * 150 + ".CLS"), ("a.x", "b.x")]
    ),
    cut=st.one_of(st.none(), st.integers(0, 4 * BLOCK)),
)
def test_a_sample_record_parses_alike_in_c_and_in_python(walk, edits, names, cut):
    from sagemaker_dist.runtime.framing import tar

    record = bytearray(b"".join(tar_member(name, bytes([i]) * (300 + i)) for i, name in enumerate(names)))
    for at, value in edits:
        record[at % len(record)] = value
    if cut is not None:  # a record cut anywhere: inside a header, a pax member's data or its padding
        del record[cut:]

    def parsed(native):
        saved, tar._native = tar._native, native
        try:
            return parse_sample(bytes(record))
        except TarError as exc:
            return str(exc)
        finally:
            tar._native = saved

    python = parsed(None)
    if walk == "compiled":
        assert parsed(tar._native) == python
        assert tar._native.sample(bytes(record)) is None or isinstance(python, dict)


def test_tar_records_frames_a_shard_in_memory_or_an_open_file(tmp_path, shards):
    from sagemaker_dist.runtime import tar_records

    expected = reference(shards[0])
    assert [parse_sample(r) for r in tar_records(shards[0].read_bytes())] == expected
    with open(shards[0], "rb") as f:
        assert [parse_sample(r) for r in tar_records(f)] == expected
    with pytest.raises(RecordFormatError, match="channel 'tar', epoch 0, byte offset 0: WebDataset"):
        list(tar_records(b"\x01" * 600))
