"""Both readers (compiled op and Python) on the same streams; and how the compiled one is built and chosen.

Streams come through real FIFOs from a separate writer process in small writes (so readers see short
reads) or from regular files standing in for the FIFO (replays).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import subprocess
import threading
import time

import pytest
from helpers.runtime_helpers import write_in_short_writes, write_opt_ml

from sagemaker_dist.contract.record_formats import RECORDIO_MAGIC, encode_recordio, encode_tfrecord
from sagemaker_dist.runtime.config import ROOT_ENV
from sagemaker_dist.runtime.framing import LARGE_RECORD_BYTES
from sagemaker_dist.runtime.tensorflow.data import native_build

tf = pytest.importorskip("tensorflow")

from sagemaker_dist.runtime import PipeModeDataset  # noqa: E402

LARGE = LARGE_RECORD_BYTES


@pytest.fixture
def opt_ml(tmp_path, monkeypatch, pipe_reader):
    write_opt_ml(tmp_path, ["train_0", "rio", "text"])
    monkeypatch.setenv(ROOT_ENV, str(tmp_path))
    return tmp_path


def through_fifo(root, name: str, data: bytes) -> subprocess.Popen:
    """A writer process that sends ``data`` to <data dir>/<name> in 7000-byte writes."""
    src = root / f"{name}.src"
    src.write_bytes(data)
    fifo = root / "input" / "data" / name
    os.mkfifo(fifo)
    return write_in_short_writes(fifo, src)


def replay(root, name: str, data: bytes) -> None:
    (root / "input" / "data" / name).write_bytes(data)


def records_of(ds) -> list[bytes]:
    return [x.numpy() for x in ds]


def test_mixed_sizes_through_a_fifo_in_short_writes_every_format(opt_ml):
    rng = random.Random(0)
    sizes = [rng.choice([0, 1, 50, 300, LARGE - 1, LARGE, LARGE + 3000, 3 * LARGE]) for _ in range(60)]
    records = [os.urandom(n) for n in sizes]
    writer = through_fifo(opt_ml, "train_0_0", b"".join(encode_tfrecord(r) for r in records))
    assert records_of(PipeModeDataset("train_0", "TFRecord")) == records
    assert writer.wait(30) == 0
    writer = through_fifo(opt_ml, "rio_0", b"".join(encode_recordio(r, max_part=5000) for r in records))
    batches = PipeModeDataset("rio", "RecordIO", batch_size=7)
    assert [r for b in batches for r in b.numpy().tolist()] == records
    assert writer.wait(30) == 0
    lines = [os.urandom(n).replace(b"\n", b"-").replace(b"\r", b"-") for n in sizes]
    writer = through_fifo(opt_ml, "text_0", b"\r\n".join(lines))  # the last line without a newline
    assert records_of(PipeModeDataset("text", "TextLine")) == lines
    assert writer.wait(30) == 0


def test_batches_of_large_records_with_and_without_drop_remainder(opt_ml):
    records = [os.urandom(LARGE + i) for i in range(10)] + [b"small"] * 3
    data = b"".join(encode_tfrecord(r) for r in records)
    replay(opt_ml, "train_0_0", data)
    replay(opt_ml, "train_0_1", data)
    batches = [b.numpy().tolist() for b in PipeModeDataset("train_0", "TFRecord").batch(4)]
    assert batches == [records[i : i + 4] for i in range(0, 13, 4)]
    exact = PipeModeDataset("train_0", "TFRecord").batch(4, drop_remainder=True)
    assert exact.element_spec.shape == (4,)
    assert [b.numpy().tolist() for b in exact] == [records[i : i + 4] for i in range(0, 12, 4)]


def test_truncated_large_record_names_its_offset_after_the_records_before_it(opt_ml):
    records = [os.urandom(LARGE + 100) for _ in range(4)]
    frame = LARGE + 116
    replay(opt_ml, "train_0_0", b"".join(encode_tfrecord(r) for r in records)[: 3 * frame + 5000])
    got = []
    with pytest.raises(tf.errors.OpError) as info:
        for r in PipeModeDataset("train_0", "TFRecord"):
            got.append(r.numpy())
    assert got == records[:3]
    assert (
        f"channel 'train_0', epoch 0, byte offset {3 * frame}: TFRecord: stream ended inside a record"
        in str(info.value)
    )
    assert f"5000 byte(s) of a {frame}-byte frame" in str(info.value)


def test_batched_records_before_an_error_come_first(opt_ml):
    records = [bytes([i]) * 64 for i in range(10)]
    data = bytearray(b"".join(encode_tfrecord(r) for r in records))
    data[6 * 80 + 20] ^= 0x01  # record 6's data
    replay(opt_ml, "train_0_0", bytes(data))
    got = []
    with pytest.raises(tf.errors.OpError, match="epoch 0, byte offset 480: TFRecord: data CRC mismatch"):
        for batch in PipeModeDataset("train_0", "TFRecord", batch_size=4):
            got += batch.numpy().tolist()
    assert got == records[:4] or got == records[:6]  # Python: whole batches; compiled: the partial one too


def test_corrupt_large_record_fails_or_is_skipped(opt_ml, caplog, capfd):
    records = [bytes([i]) * (LARGE + 10) for i in range(6)]
    frame = LARGE + 26
    data = bytearray(b"".join(encode_tfrecord(r) for r in records))
    data[4 * frame + 12 + 7] ^= 0x01  # a bit of record 4's data
    replay(opt_ml, "train_0_0", bytes(data))
    replay(opt_ml, "train_0_1", bytes(data))
    with pytest.raises(tf.errors.OpError, match=f"byte offset {4 * frame}: TFRecord: data CRC mismatch"):
        records_of(PipeModeDataset("train_0", "TFRecord"))
    with caplog.at_level(logging.WARNING):
        got = records_of(PipeModeDataset("train_0", "TFRecord", max_corrupted_records_to_skip=1))
    assert got == records[:4] + records[5:]
    logged = caplog.text + capfd.readouterr().err
    assert f"epoch 1, byte offset {4 * frame}: skipped corrupted TFRecord record" in logged


def test_crcs_of_every_length_and_a_flipped_bit_in_each_lane(opt_ml):
    # The compiled reader's CRC32C folds 256 bytes a step in four registers (from 256 bytes), then runs
    # three lanes of 4096- and 256-byte blocks and joins them: every length around those blocks reads
    # back, and a flipped bit in any register or lane is a mismatch.
    sizes = [*range(0, 1100), 3 * 4096 - 1, 3 * 4096, 3 * 4096 + 769, 6 * 4096 + 8, 100_003]
    records = [os.urandom(n) for n in sizes]
    replay(opt_ml, "train_0_0", b"".join(encode_tfrecord(r) for r in records))
    assert [r for b in PipeModeDataset("train_0", "TFRecord", batch_size=64) for r in b.numpy()] == records
    for epoch, at in enumerate(
        (100, 200, 4096 + 5, 2 * 4096 + 4000, 3 * 4096 + 300, 3 * 4096 + 600), start=1
    ):
        data = bytearray(encode_tfrecord(os.urandom(3 * 4096 + 769)))
        data[12 + at] ^= 0x10
        replay(opt_ml, f"train_0_{epoch}", bytes(data))
        mismatch = f"epoch {epoch}, byte offset 0: TFRecord: data CRC mismatch"
        with pytest.raises(tf.errors.OpError, match=mismatch):
            records_of(PipeModeDataset("train_0", "TFRecord"))


def test_corrupt_length_is_never_skipped_and_too_many_in_a_row_fail(opt_ml):
    records = [b"x" * 100 for _ in range(6)]
    data = bytearray(b"".join(encode_tfrecord(r) for r in records))
    data[2 * 116 + 9] ^= 0x01  # record 2's length CRC
    replay(opt_ml, "train_0_0", bytes(data))
    with pytest.raises(tf.errors.OpError, match="byte offset 232: TFRecord: length CRC mismatch"):
        records_of(PipeModeDataset("train_0", "TFRecord", max_corrupted_records_to_skip=5))
    data = bytearray(b"".join(encode_tfrecord(r) for r in records))
    for i in (1, 2):
        data[i * 116 + 20] ^= 0x01
    replay(opt_ml, "train_0_1", bytes(data))
    with pytest.raises(
        tf.errors.OpError, match="2 corrupted records in a row, over max_corrupted_records_to_skip=1"
    ):
        records_of(PipeModeDataset("train_0", "TFRecord", max_corrupted_records_to_skip=1))


def test_recordio_bad_magic_and_flag_name_their_offset(opt_ml):
    good = encode_recordio(b"a" * 10)  # 8 + 12 bytes
    bad = good + (RECORDIO_MAGIC ^ 1).to_bytes(4, "little") + good[4:]
    replay(opt_ml, "rio_0", bad)
    # A frame without the magic number: the stream is not RecordIO, InternalError as from AWS's reader.
    with pytest.raises(tf.errors.InternalError, match="epoch 0, byte offset 20: RecordIO: bad magic number"):
        records_of(PipeModeDataset("rio"))
    middle = good[:4] + ((2 << 29) | 10).to_bytes(4, "little") + good[8:]  # a middle part first
    replay(opt_ml, "rio_1", good + middle)
    out_of_sequence = "byte offset 20: RecordIO: multipart flag 2 out of sequence"
    with pytest.raises(tf.errors.OpError, match=out_of_sequence) as info:
        records_of(PipeModeDataset("rio"))
    assert not isinstance(info.value, tf.errors.InternalError)


def test_a_newer_iterator_closes_the_older_ones_fifo_for_the_next_epoch(opt_ml):
    """An iterator left open mid-epoch (still alive): the next one closes its FIFO (SageMaker creates the
    next epoch's only then) and reads the next epoch; the older one then fails, named."""
    records = [b"r%06d" % i + b"x" * 200 for i in range(20000)]  # 4 MB: more than the pipe holds
    data = b"".join(encode_tfrecord(r) for r in records)
    first = through_fifo(opt_ml, "train_0_0", data)
    ds = PipeModeDataset("train_0", "TFRecord", fifo_timeout=20)
    older = iter(ds)
    assert next(older).numpy() == records[0]
    time.sleep(1)  # tf.data's prefetch settles: no call of the older iterator is in flight

    def second_epoch():  # appears only once epoch 0's FIFO is closed, as SageMaker does
        first.wait(30)
        through_fifo(opt_ml, "train_0_1", data).wait(30)

    feeder = threading.Thread(target=second_epoch, daemon=True)
    feeder.start()
    assert records_of(ds) == records  # epoch 1, whole
    with pytest.raises(tf.errors.OpError, match="out of turn.*iterate one at a time"):
        for _ in older:
            pass
    feeder.join(30)


@pytest.mark.parametrize("pipe_reader", ["compiled"], indirect=True)
def test_the_compiled_datasets_graph_serialises_and_survives_tf_data_rewrites(opt_ml):
    records = [b"r%d" % i for i in range(100)]
    replay(opt_ml, "train_0_0", b"".join(encode_tfrecord(r) for r in records))
    ds = PipeModeDataset("train_0", "TFRecord")
    assert b"SagemakerDistPipeDataset" in ds._as_serialized_graph().numpy()
    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = True
    options.experimental_optimization.map_parallelization = True
    options.autotune.enabled = True
    rewritten = ds.map(lambda r: tf.strings.length(r)).batch(10).with_options(options)
    assert sum(int(b.numpy().sum()) for b in rewritten) == sum(len(r) for r in records)


# How the compiled reader is chosen and built (a stand-in compiler where the real one is not needed).


@pytest.fixture
def fresh_choice(tmp_path, monkeypatch):
    """No reader chosen yet in this process, and an empty build cache."""
    monkeypatch.setattr(native_build, "_loaded", {})
    monkeypatch.setenv(native_build.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path


def test_the_python_reader_runs_where_no_compiler_is_and_says_why(fresh_choice, monkeypatch, caplog):
    monkeypatch.setenv("CXX", str(fresh_choice / "no-such-g++"))
    monkeypatch.setenv(native_build.READER_ENV, "auto")
    with caplog.at_level(logging.INFO, logger=native_build.__name__):
        assert native_build.compiled_op() is None
        assert native_build.compiled_op() is None  # decided once per process
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "the Python reader runs: the compiled reader cannot" in lines[0]
    assert "no-such-g++ did not run" in lines[0]
    monkeypatch.setenv(native_build.READER_ENV, "compiled")
    with pytest.raises(native_build.NativeReaderError, match="SAGEMAKER_DIST_READER=compiled.*did not run"):
        native_build.compiled_op()
    monkeypatch.setenv(native_build.READER_ENV, "fast")
    with pytest.raises(ValueError, match="SAGEMAKER_DIST_READER='fast'; use one of auto, compiled, python"):
        native_build.compiled_op()


def test_a_failed_build_is_kept_so_auto_does_not_retry_but_compiled_does(fresh_choice, monkeypatch):
    compiler = fresh_choice / "failing-g++"
    compiler.write_text("#!/bin/sh\necho 'pipe_dataset_op.cc:1: error: no TensorFlow here' >&2\nexit 1\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    command, library = native_build.build_plan(tf)
    with pytest.raises(
        native_build._Unavailable, match="exited 1: pipe_dataset_op.cc:1: error: no TensorFlow"
    ):
        native_build._build(command, library, force=False)
    assert (library.parent / native_build.FAILED).is_file() and not library.exists()
    compiler.write_text("#!/bin/sh\nexit 99\n")  # auto does not run it again
    with pytest.raises(native_build._Unavailable, match="failed to build before"):
        native_build._build(command, library, force=False)
    with pytest.raises(native_build._Unavailable, match="exited 99"):
        native_build._build(command, library, force=True)
    assert list(library.parent.glob(".build-*")) == []  # no temporary file left behind


def test_concurrent_builds_compile_once_and_the_library_appears_whole(fresh_choice, monkeypatch):
    count = fresh_choice / "runs"
    compiler = fresh_choice / "slow-g++"
    # a stand-in compiler: counts its runs, takes a while, writes its output (the last argument)
    compiler.write_text(
        f'#!/bin/sh\necho run >> {count}\nsleep 1\nfor a; do out=$a; done\necho so > "$out"\n'
    )
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    command, library = native_build.build_plan(tf)
    errors = []

    def build():
        try:
            native_build._build(command, library, force=False)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert count.read_text().split() == ["run"] and library.read_text() == "so\n"
    # The key changes with TensorFlow's flags (its ABI) and our version.
    monkeypatch.setattr(native_build, "__version__", "9.9.9")
    assert native_build.build_plan(tf)[1] != library


PLANTED_SO = """
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void planted() {
  int fd = open("%s", O_CREAT | O_WRONLY, 0644);
  if (fd >= 0) close(fd);
}
"""


def test_a_library_another_user_planted_in_the_cache_is_never_loaded(fresh_choice, monkeypatch, caplog):
    """A .so of another user's at the path this TensorFlow's key names would run its code
    in this process when loaded (here: its constructor makes a file). auto runs the Python reader,
    saying why; compiled is an error naming why; the planted code never runs."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to make the library another user's (chown)")
    compiler = shutil.which("g++") or shutil.which("c++")
    if not compiler:
        pytest.skip("no C++ compiler to build the planted library")
    ran = fresh_choice / "planted-code-ran"
    source = fresh_choice / "planted.cc"
    source.write_text(PLANTED_SO % ran)
    _, library = native_build.build_plan(tf)
    library.parent.mkdir(parents=True, mode=0o700)
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True, timeout=120)
    library.chmod(0o755)
    os.chown(library, 65534, 65534)  # nobody's
    monkeypatch.setenv(native_build.READER_ENV, "auto")
    with caplog.at_level(logging.INFO, logger=native_build.__name__):
        assert native_build.compiled_op() is None
    assert not ran.exists()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "the Python reader runs" in lines[0] and str(library) in lines[0]
    assert "belongs to another user" in lines[0] and "SAGEMAKER_DIST_CACHE" in lines[0]
    monkeypatch.setenv(native_build.READER_ENV, "compiled")
    with pytest.raises(native_build.NativeReaderError, match="compiled.*belongs to another user"):
        native_build.compiled_op()
    assert not ran.exists()
