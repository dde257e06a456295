"""WebDataset samples framed by the compiled batch reader (``_record_reader``, native/tar_core.h's walk)
against the Python framer (``framing.tar``) on the same streams: shards written by the ``webdataset``
library and by GNU tar (pax headers, long names) from a file and from a real FIFO a writer process fills,
an unusual entry the walk leaves to the framer mid-stream (the rest read alike), and crafted headers: the
same samples before the same named error, in bounded memory."""

from __future__ import annotations

import os
import random
import resource
import subprocess
import sys
import tarfile

import pytest
from helpers.batch_fills import drain
from helpers.crafted_tar import EDITS, crafted_stream
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sagemaker_dist.contract.tar_format import BLOCK, CHKSUM, END_OF_ARCHIVE, checksum, tar_header, tar_member
from sagemaker_dist.runtime.fifo import FifoReader
from sagemaker_dist.runtime.framing import batch_fill as bf
from sagemaker_dist.runtime.framing import make_framer

wds = pytest.importorskip("webdataset")

if bf._native is None or "WebDataset" not in bf.COMPILED_FORMATS:  # pragma: no cover - setup.py builds it
    pytest.fail("framing._record_reader is not built with the tar walk: pip install -e . needs a C compiler")


def fill_reader(reader, compiled: bool, batch: int = 5, record_bytes: int = 0, **framer):
    """(batches as lists of records, the error or None, whether the compiled reader read to the end)."""
    fill = bf.StreamFill(reader, make_framer("WebDataset", "ch_0", 2, **framer), record_bytes, compiled)
    assert fill.compiled == compiled
    batches, error = drain(fill, batch)
    return batches, error, fill.compiled


def fill_file(path, data: bytes, compiled: bool, **kwargs):
    path.write_bytes(data)
    with open(path, "rb", buffering=0) as f:
        return fill_reader(f, compiled, **kwargs)


def same_as_the_framer(tmp_path, data: bytes, batch: int = 5, **kwargs):
    """Both paths over ``data``: the same samples in the same batches, the same error; returns the
    compiled path's (records, error, whether it stayed compiled)."""
    got, error, stayed = fill_file(tmp_path / "c", data, True, batch=batch, **kwargs)
    expected, expected_error, _ = fill_file(tmp_path / "p", data, False, batch=batch, **kwargs)
    assert got == expected
    assert str(error) == str(expected_error)
    if error is not None:
        assert error.offset == expected_error.offset
    return [r for b in got for r in b], error, stayed


@pytest.fixture(scope="module")
def stream(tmp_path_factory) -> bytes:
    """Shards by webdataset's TarWriter and by GNU tar (--format=pax and gnu: names over 100 and 255
    bytes, non-ASCII, folders, a file of no sample), one after another as a Pipe stream carries them."""
    tmp = tmp_path_factory.mktemp("tar-batch")
    rng = random.Random(7)
    with wds.TarWriter(str(tmp / "w.tar")) as w:
        for i in range(50):
            size = rng.choice([0, 1, 511, 512, 513, 3000, 70_000])
            w.write({"__key__": f"s{i:05d}", "jpg": rng.randbytes(size), "cls": str(i % 5).encode()})
    tree = tmp / "tree"
    deep = tree / ("d" * 120) / "sub"
    deep.mkdir(parents=True)
    (tree / "plain").mkdir()
    for i in range(8):
        folder = deep if i % 2 else tree / "plain"
        stem = ("k" * (140 + i)) if i % 3 == 0 else f"é-{i}"
        for ext in ("bin", "cls"):
            (folder / f"{stem}.{ext}").write_bytes(rng.randbytes(rng.randint(1, 2000)))
    (tree / "plain" / "README").write_bytes(b"no dot: no sample")
    parts = [(tmp / "w.tar").read_bytes()]
    for fmt in ("pax", "gnu"):
        command = ["tar", f"--format={fmt}", "--sort=name", "-cf", str(tmp / f"{fmt}.tar"), "."]
        subprocess.run(command, cwd=tree, check=True)
        parts.append((tmp / f"{fmt}.tar").read_bytes())
    return b"".join(parts)


def webdataset_keys(stream: bytes, tmp_path) -> list[str]:
    keys = []
    for i, part in enumerate(stream.split(b"\0" * 10240)):  # each shard alone: webdataset reads one archive
        if part.strip(b"\0"):
            (tmp_path / f"{i}.tar").write_bytes(part + bytes(10240))
            keys += [s["__key__"] for s in wds.WebDataset(str(tmp_path / f"{i}.tar"), shardshuffle=False)]
    return keys


@pytest.mark.parametrize("batch", [1, 7, 256])
def test_shards_of_webdataset_and_gnu_tar_come_as_the_framer_frames_them(tmp_path, stream, batch):
    from sagemaker_dist.runtime.framing.tar import parse_sample

    records, error, stayed = same_as_the_framer(tmp_path, stream, batch)
    assert error is None and stayed  # every entry of these shards is the walk's
    assert len(records) == 50 + 8 + 8
    assert [parse_sample(r)["__key__"] for r in records[:50]] == [f"s{i:05d}" for i in range(50)]


WRITER = """
import os, sys
out = os.open(sys.argv[1], os.O_WRONLY)
data, step = open(sys.argv[2], "rb").read(), int(sys.argv[3])
for i in range(0, len(data), step):
    os.write(out, data[i : i + step])
os.close(out)
"""


@pytest.mark.parametrize("step", [700, 1 << 20])
def test_a_fifo_a_writer_process_fills_reads_as_the_framer_reads_it(tmp_path, stream, step):
    (tmp_path / "src").write_bytes(stream)
    got = {}
    for compiled in (True, False):
        fifo = tmp_path / f"train_{compiled}"
        os.mkfifo(fifo)
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(fifo), str(tmp_path / "src"), str(step)])
        with FifoReader(fifo) as reader:
            got[compiled] = fill_reader(reader, compiled, batch=9)
        assert writer.wait(30) == 0
    assert got[True][:2] == got[False][:2] and got[True][1] is None and got[True][2]


def base256_stream() -> bytes:
    """Samples, one whose size is GNU's base-256 (valid tar the walk does not take), more samples."""
    member = bytearray(tar_member("b256.bin", b"z" * 700))
    member[124:136] = b"\x80" + (700).to_bytes(11, "big")
    start, n = CHKSUM
    member[start : start + n] = b"%06o\x00 " % checksum(member[:BLOCK])
    first = b"".join(tar_member(f"{i:04d}.bin", os.urandom(300)) for i in range(40))
    rest = b"".join(tar_member(f"{i:04d}.bin", os.urandom(900)) for i in range(40, 90))
    return first + bytes(member) + rest + END_OF_ARCHIVE


def test_an_entry_the_walk_leaves_to_the_framer_mid_stream_and_the_rest_read_alike(tmp_path):
    records, error, stayed = same_as_the_framer(tmp_path, base256_stream(), 8)
    assert error is None and not stayed and len(records) == 91
    # from a FIFO: the bytes the reader holds go to the framer first, then the rest of the pipe
    stream = base256_stream()
    (tmp_path / "src").write_bytes(stream)
    got = {}
    for compiled in (True, False):
        fifo = tmp_path / f"train_{compiled}"
        os.mkfifo(fifo)
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(fifo), str(tmp_path / "src"), "1000"])
        with FifoReader(fifo) as reader:
            got[compiled] = fill_reader(reader, compiled, batch=8)
        assert writer.wait(30) == 0
    assert got[True] == got[False] and got[True][1] is None and len(sum(got[True][0], [])) == 91


def test_a_bad_checksum_a_repeated_extension_and_a_cut_stream_are_the_framers_errors(tmp_path):
    good = b"".join(tar_member(f"{i:03d}.bin", bytes([i]) * 700) for i in range(12))
    bad = bytearray(good)
    bad[6 * 3 * BLOCK + 10] ^= 0x40
    records, error, _ = same_as_the_framer(tmp_path, bytes(bad), 4)
    assert len(records) == 4 and error.offset == 6 * 3 * BLOCK and "header checksum mismatch" in str(error)
    twice = good + tar_member("z.jpg", b"1") + tar_member("z.jpg", b"2")
    _, error, _ = same_as_the_framer(tmp_path, twice, 4)
    assert "sample 'z' has two files with extension 'jpg'" in str(error)
    _, error, _ = same_as_the_framer(tmp_path, good[:-100], 4)
    assert "stream ended inside a tar entry" in str(error)
    _, error, _ = same_as_the_framer(tmp_path, good, 4, record_bytes=3 * BLOCK + 1)
    assert "record_bytes=1537" in str(error) and error.offset == 0


def large_samples_stream(seed: int) -> bytes:
    """Samples with members of 33 to 300 KB (the reader takes them straight into the batch) among small
    ones, long names (pax), a large file of no sample and directories' entries (read past) and
    end-of-archive blocks between."""
    rng = random.Random(seed)
    parts = []
    for i in range(12):
        key = f"k{i:04d}" if i % 4 else "é" * 70 + str(i)
        for ext in rng.sample(["jpg", "cls", "json"], rng.randint(1, 3)):
            size = rng.choice([0, 1, 5000, 33_000, 150_000, 300_000])
            parts.append(tar_member(f"{key}.{ext}", rng.randbytes(size)))
        if i % 3 == 0:  # a directory's entry (no sample) right after the sample, as GNU tar of a folder has
            folder = tarfile.TarInfo(f"part-{i}/")
            folder.type = tarfile.DIRTYPE
            parts.append(folder.tobuf(format=tarfile.USTAR_FORMAT))
        if i == 5:
            parts.append(tar_member("README", rng.randbytes(40_000)))
        if i == 8:
            parts.append(END_OF_ARCHIVE)
    return b"".join(parts) + END_OF_ARCHIVE


@pytest.mark.parametrize("seed", range(4))
def test_large_samples_read_straight_into_the_batch_come_as_the_framer_frames_them(tmp_path, seed):
    stream = large_samples_stream(seed)
    records, error, stayed = same_as_the_framer(tmp_path, stream, 3)
    assert error is None and stayed and len(records) == 12
    (tmp_path / "src").write_bytes(stream)
    for step in (700, 65536, 1 << 20):  # the FIFO's bytes come in pieces of every size
        fifo = tmp_path / f"train_{step}"
        os.mkfifo(fifo)
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(fifo), str(tmp_path / "src"), str(step)])
        with FifoReader(fifo) as reader:
            got, error, stayed = fill_reader(reader, True, batch=3)
        assert writer.wait(30) == 0
        assert [r for b in got for r in b] == records and error is None and stayed
    # cut inside the last large member, and a bad header of one: the framer's errors, the samples before
    headers = [at for at in range(0, len(stream), BLOCK) if stream[at + 257 : at + 262] == b"ustar"]
    big = [at for at in headers if int(stream[at + 124 : at + 135], 8) >= 33_000]
    _, error, _ = same_as_the_framer(tmp_path, stream[: big[-1] + 20_000], 3)
    assert "stream ended inside a tar entry" in str(error)
    bad = bytearray(stream)
    bad[big[len(big) // 2] + 10] ^= 0x40
    _, error, _ = same_as_the_framer(tmp_path, bytes(bad), 3)
    assert "header checksum mismatch" in str(error) and error.offset == big[len(big) // 2]


def test_a_size_the_stream_does_not_hold_costs_no_more_than_the_bytes_that_came(tmp_path):
    """8 GiB claimed within the limit, 5 MB come: the reader's buffer grows only as bytes come (to at most
    READ_STEP, 64 MiB, past twice what came), then the cut entry is the framer's named error."""
    claim = bytearray(tar_header("x.bin", 1 << 33))
    data = tar_member("a.bin", b"1") + bytes(claim) + os.urandom(5 << 20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    got, error, _ = fill_file(tmp_path / "c", data, True, batch=2, max_record_bytes=1 << 40)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB
    assert got == [] and "stream ended inside a tar entry" in str(error)
    assert grown < 100 << 10
    _, expected_error, _ = fill_file(tmp_path / "p", data, False, batch=2, max_record_bytes=1 << 40)
    assert str(error) == str(expected_error)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    edits=EDITS,
    batch=st.sampled_from([1, 2, 64]),
    cut=st.integers(0, 12 * BLOCK),
)
def test_crafted_headers_are_the_framers_named_errors(tmp_path, edits, batch, cut):
    base = crafted_stream(edits)
    stream = base[: len(base) - cut]
    records, error, _ = same_as_the_framer(tmp_path, stream, batch, max_record_bytes=1 << 20)
    if error is not None:
        assert error.channel == "ch_0" and 0 <= error.offset <= len(stream) and "WebDataset: " in str(error)
