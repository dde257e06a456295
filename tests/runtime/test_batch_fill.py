"""The batch reader (framing.batch_fill): the compiled reader against the Python framers on the same
streams, from files and real FIFOs, and in bounded memory on streams that claim more than they hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from helpers.batch_fills import drain

from sagemaker_dist.contract.record_formats import encode_recordio, encode_tfrecord, masked_crc32c
from sagemaker_dist.runtime.fifo import FifoReader
from sagemaker_dist.runtime.framing import LARGE_RECORD_BYTES, make_framer
from sagemaker_dist.runtime.framing import batch_fill as bf

if bf._native is None:  # pragma: no cover - setup.py builds it wherever a C compiler is
    pytest.fail("framing._record_reader is not built: pip install -e . needs a C compiler")

PATHS = ["compiled", "python"]
ENCODE = {"TFRecord": encode_tfrecord, "RecordIO": lambda r: encode_recordio(r, max_part=3000)}


def encode(record_format: str, records: list[bytes]) -> bytes:
    if record_format == "TextLine":
        return b"".join(r + b"\n" for r in records)
    return b"".join(ENCODE[record_format](r) for r in records)


def fill_all(path, data: bytes, record_format: str, batch: int = 3, record_bytes: int = 0, **framer):
    """(batches as lists of records, the error or None) of the whole stream, read from a file."""
    with open(path, "wb") as f:
        f.write(data)
    with open(path, "rb", buffering=0) as f:
        return fill_reader(f, record_format, batch, record_bytes, **framer)


def fill_reader(reader, record_format, batch=3, record_bytes=0, compiled=True, **framer):
    fill = bf.StreamFill(reader, make_framer(record_format, "ch_0", 3, **framer), record_bytes, compiled)
    return drain(fill, batch)


SIZES = (0, 1, 7, 100, 1000, LARGE_RECORD_BYTES, 3 * LARGE_RECORD_BYTES + 5)


def records_of(n: int, seed: int = 0, sizes=SIZES):
    rng = np.random.default_rng(seed)
    out = [rng.integers(0, 256, int(rng.choice(sizes)), dtype=np.uint8).tobytes() for _ in range(n)]
    return [r.replace(b"\n", b"-").replace(b"\r", b"-") for r in out]


@pytest.mark.parametrize("record_format", ["TFRecord", "RecordIO", "TextLine"])
def test_both_paths_read_the_same_batches_of_records_of_any_size(tmp_path, record_format):
    records = records_of(40)
    data = encode(record_format, records)
    got = {p: fill_all(tmp_path / p, data, record_format, batch=7, compiled=p == "compiled") for p in PATHS}
    batches, error = got["compiled"]
    assert error is None and got["python"] == got["compiled"]
    assert [len(b) for b in batches] == [7] * 5 + [5]
    assert [r for b in batches for r in b] == records


@pytest.mark.parametrize("record_format", ["TFRecord", "RecordIO", "TextLine"])
@pytest.mark.parametrize("path", PATHS)
def test_records_of_one_size_fill_the_batch_exactly_and_another_size_is_named(tmp_path, record_format, path):
    records = [bytes([i]) * 1000 for i in range(10)]
    data = encode(record_format, records)
    batches, error = fill_all(tmp_path / "s", data, record_format, 4, 1000, compiled=path == "compiled")
    assert error is None and batches == [records[:4], records[4:8], records[8:]]
    bad = encode(record_format, [*records[:5], b"z" * 999, *records])
    batches, error = fill_all(tmp_path / "s", bad, record_format, 4, 1000, compiled=path == "compiled")
    assert batches == [records[:4]] and error is not None  # the batch with the short record never comes
    assert str(error) == (
        f"channel 'ch_0', epoch 3, byte offset {len(encode(record_format, records[:5]))}: {record_format}: "
        "a record of 999 bytes where every record is to be record_bytes=1000 long (leave record_bytes out "
        "for records of varying length)"
    )


def corrupt_data(data: bytes, at: int) -> bytes:
    out = bytearray(data)
    out[at] ^= 0x40
    return bytes(out)


@pytest.mark.parametrize("size", [10, 3 * LARGE_RECORD_BYTES])  # from the buffer; read into the batch
def test_a_data_crc_mismatch_fails_or_is_skipped_as_the_python_framer_does(tmp_path, size):
    records = [bytes([i]) * size for i in range(6)]
    frame = size + 16
    data = corrupt_data(encode_tfrecord_all(records), 2 * frame + 12 + size // 2)  # record 2's data
    got = {p: fill_all(tmp_path / p, data, "TFRecord", 2, compiled=p == "compiled") for p in PATHS}
    assert got["compiled"][0] == got["python"][0] == [records[:2]]
    assert (
        str(got["compiled"][1])
        == str(got["python"][1])
        == (
            f"channel 'ch_0', epoch 3, byte offset {2 * frame}: TFRecord: data CRC mismatch in a {size}-byte "
            "record; pass max_corrupted_records_to_skip=N to skip up to N corrupted records in a row"
        )
    )
    for p in PATHS:  # skipped: the others come, in batches that close over the gap
        batches, error = fill_all(tmp_path / p, data, "TFRecord", 2, compiled=p == "compiled",
                                  max_corrupted_records_to_skip=1)  # fmt: skip
        assert error is None and batches == [records[:2], [records[3], records[4]], [records[5]]]
    twice = corrupt_data(data, 3 * frame + 12)  # two in a row, over a limit of one
    batches, error = fill_all(tmp_path / "c", twice, "TFRecord", 2, max_corrupted_records_to_skip=1)
    assert "(2 corrupted records in a row, over max_corrupted_records_to_skip=1)" in str(error)


def encode_tfrecord_all(records):
    return b"".join(encode_tfrecord(r) for r in records)


def test_a_bad_length_crc_bad_magic_and_flags_fail_with_the_framers_words(tmp_path):
    good = encode_tfrecord(b"first")
    header = bytearray(encode_tfrecord(b"x" * 50))
    header[8] ^= 1
    cases = [
        ("TFRecord", good + bytes(header), "length CRC mismatch (length field 50)"),
        ("RecordIO", encode_recordio(b"first") + b"\x01" * 16, "bad magic number 0x01010101"),
        ("RecordIO", encode_recordio(b"first") + encode_recordio(b"y" * 100, max_part=40)[48:],
         "multipart flag 2 out of sequence (a record must start with flag 0 or 1)"),
    ]  # fmt: skip
    for record_format, data, words in cases:
        got = {p: fill_all(tmp_path / p, data, record_format, 1, compiled=p == "compiled") for p in PATHS}
        assert got["compiled"][0] == got["python"][0] == [[b"first"]]
        assert str(got["compiled"][1]) == str(got["python"][1])
        first = len(encode(record_format, [b"first"]))
        assert f"byte offset {first}: {record_format}: {words}" in str(got["compiled"][1])


@pytest.mark.parametrize("record_format", ["TFRecord", "RecordIO"])
@pytest.mark.parametrize("size", [100, 3 * LARGE_RECORD_BYTES])
def test_a_truncated_stream_names_the_cut_record_as_the_python_framer_does(tmp_path, record_format, size):
    records = [b"a" * 10, b"b" * size]
    data = encode(record_format, records)
    for cut in (1, 5, 13, size // 2):
        got = {p: fill_all(tmp_path / p, data[:-cut], record_format, compiled=p == "compiled") for p in PATHS}
        assert got["compiled"][0] == got["python"][0] == []  # the one batch was not full: the error
        assert str(got["compiled"][1]) == str(got["python"][1])
        assert "stream ended inside a record" in str(got["compiled"][1])
        assert "1 complete record(s) were read" in str(got["compiled"][1])


@pytest.mark.parametrize("path", PATHS)
def test_an_empty_stream_is_no_batch_and_a_last_line_without_newline_is_a_record(tmp_path, path):
    for record_format in ("TFRecord", "RecordIO", "TextLine"):
        assert fill_all(tmp_path / "e", b"", record_format, compiled=path == "compiled") == ([], None)
    text = b"a\r\nbb\n\nlast\r"
    batches, error = fill_all(tmp_path / "t", text, "TextLine", 2, compiled=path == "compiled")
    assert error is None and batches == [[b"a", b"bb"], [b"", b"last"]]


@pytest.mark.parametrize("path", PATHS)
def test_records_over_the_limit_are_refused_with_their_length(tmp_path, path):
    compiled = path == "compiled"
    long_record = encode_tfrecord(b"first") + encode_tfrecord(b"z" * 5000)
    _, error = fill_all(tmp_path / "a", long_record, "TFRecord", 1, compiled=compiled, max_record_bytes=4096)
    assert (
        "byte offset 21: TFRecord: a record of 5000 bytes is longer than max_record_bytes=4096" in f"{error}"
    )
    parts = encode_recordio(b"first") + encode_recordio(b"y" * 5000, max_part=1000)
    _, error = fill_all(tmp_path / "b", parts, "RecordIO", 1, compiled=compiled, max_record_bytes=4096)
    assert "byte offset 16: RecordIO: a record of at least 5000 bytes is longer" in str(error)
    _, error = fill_all(tmp_path / "c", b"first\n" + b"x" * (3 << 20), "TextLine", 1, compiled=compiled,
                        max_record_bytes=1 << 20)  # fmt: skip
    assert "byte offset 6: TextLine: a record of at least" in str(error)


# Through real FIFOs: a writer process, short writes, records larger than the pipe's buffer.

WRITER = """
import os, sys
out = os.open(sys.argv[1], os.O_WRONLY)
data = open(sys.argv[2], "rb").read()
step = int(sys.argv[3])
for i in range(0, len(data), step):
    os.write(out, data[i : i + step])
os.close(out)
"""


@pytest.mark.parametrize("record_format", ["TFRecord", "RecordIO", "TextLine"])
@pytest.mark.parametrize("step", [7000, 1 << 20])
def test_both_paths_read_a_fifo_a_writer_process_fills(tmp_path, record_format, step):
    records = records_of(60, seed=1, sizes=(0, 5, 900, 70_000, 2_000_000))
    (tmp_path / "src").write_bytes(encode(record_format, records))
    for path in PATHS:
        fifo = tmp_path / f"train_{path}"
        os.mkfifo(fifo)
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(fifo), str(tmp_path / "src"), str(step)])
        with FifoReader(fifo) as reader:
            batches, error = fill_reader(reader, record_format, 8, compiled=path == "compiled")
        assert writer.wait(30) == 0
        assert error is None and [r for b in batches for r in b] == records
        assert [len(b) for b in batches] == [8] * 7 + [4]


def test_a_writer_that_stops_mid_record_fails_the_read_and_a_thread_can_wait_on_it(tmp_path):
    fifo = tmp_path / "train_0"
    os.mkfifo(fifo)
    data = encode_tfrecord_all([b"a" * 100, b"b" * 200_000])[:-50_000]
    go = threading.Event()

    def write():
        with open(fifo, "wb") as f:
            f.write(data[:1000])
            f.flush()
            go.wait(10)  # the reader blocks in C meanwhile, without the GIL
            f.write(data[1000:])

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    with FifoReader(fifo) as reader:
        result = {}
        reading = threading.Thread(target=lambda: result.update(out=fill_reader(reader, "TFRecord", 2)))
        reading.start()
        reading.join(0.3)
        assert reading.is_alive()  # waiting for bytes, and this thread runs Python meanwhile
        go.set()
        reading.join(10)
    batches, error = result["out"]
    assert batches == []
    assert "stream ended inside a record: 150016 byte(s) of a 200016-byte frame" in str(error)


# Streams that claim far more than they hold, in a child with an address-space limit: no claimed length
# is allocated (a reader that tried would fail with MemoryError, or be killed).

CHILD = r"""
import json, os, resource, sys
from sagemaker_dist.runtime.framing import make_framer
from sagemaker_dist.runtime.framing.batch_fill import Batch, StreamFill
from sagemaker_dist.runtime.framing.base import RecordFormatError

def vm_size():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmSize:"))

cases = json.load(sys.stdin)
limit = vm_size() + (256 << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
for record_format, path in cases:
    with open(path, "rb", buffering=0) as f:
        fill = StreamFill(f, make_framer(record_format, "ch_0", 0), compiled=True)
        try:
            b = Batch(4, 8)
            fill.fill(b)
            print(json.dumps({"ok": True, "count": b.count}))
        except RecordFormatError as exc:
            print(json.dumps({"ok": False, "count": b.count, "error": str(exc)}))
"""


def claim(n: int) -> bytes:
    length = n.to_bytes(8, "little")
    return length + masked_crc32c(length).to_bytes(4, "little")


def test_claimed_lengths_are_refused_or_read_as_they_come_in_bounded_memory(tmp_path):
    from sagemaker_dist.contract.record_formats import recordio_header

    first = encode_tfrecord(b"first")
    streams = [
        ("TFRecord", first + claim(2**64 - 8) + b"\0" * 1000, "a record of 18446744073709551608 bytes is"),
        ("TFRecord", first + claim(2**40) + b"\0" * 1000, "a record of 1099511627776 bytes is longer"),
        ("TFRecord", first + claim(2**31 - 1) + b"\0" * 1000, "1012 byte(s) of a 2147483663-byte frame"),
        ("TFRecord", first + claim(1 << 30) + b"\0" * (3 << 20), f"{(3 << 20) + 12} byte(s) of a"),
        ("RecordIO", encode_recordio(b"first") + recordio_header(1, 2**29 - 1) + b"\0" * 1000,
         "1008 byte(s) of a 536870920-byte frame"),
    ]  # fmt: skip
    cases = []
    for i, (record_format, data, _) in enumerate(streams):
        (tmp_path / f"s{i}").write_bytes(data)
        cases.append((record_format, str(tmp_path / f"s{i}")))
    child = subprocess.run(
        [sys.executable, "-c", CHILD], input=json.dumps(cases), capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0, child.stderr[-3000:]
    results = [json.loads(line) for line in child.stdout.splitlines()]
    assert len(results) == len(streams)
    for (record_format, _, words), result in zip(streams, results):
        assert not result["ok"] and result["count"] == 1, result
        offset = len(first) if record_format == "TFRecord" else len(encode_recordio(b"first"))
        assert result["error"].startswith(f"channel 'ch_0', epoch 0, byte offset {offset}: {record_format}: ")
        assert words in result["error"], result


def test_gather_copies_each_named_record_whole_across_the_streamed_copy_size(monkeypatch):
    """The compiled gather streams records from 4 KiB (non-temporal stores, its own head and tail
    bytes); it appends to a batch at any byte, as the Python gather does."""
    rng = np.random.default_rng(5)
    lengths = [0, 1, 63, 4095, 4096, 4097, 5000, 65_537, 150_001, 17, 8191, 70]
    records = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in lengths]
    src = bf.Batch(len(records), sum(lengths))
    for r in records:
        src.data[src.nbytes : src.nbytes + len(r)] = np.frombuffer(r, np.uint8)
        src.nbytes += len(r)
        src.count += 1
        src.offsets[src.count] = src.nbytes
    order = rng.permutation(len(records))
    got = {}
    for path in PATHS:
        if path == "python":
            monkeypatch.setattr(bf, "_native", None)
        dst = bf.Batch(len(records) + 1, 3 + sum(lengths))
        dst.data[:3] = (7, 8, 9)  # a record already there: the gathered ones start at an odd byte
        dst.count, dst.nbytes, dst.offsets[1] = 1, 3, 3
        bf.gather(dst, src, order)
        if path == "compiled":  # streamed records that start off a cache line: their head bytes apart
            base = dst.data.ctypes.data
            places = [(base + int(dst.offsets[k + 1]), lengths[i]) for k, i in enumerate(order)]
            assert sum(1 for at, n in places if at % 64 and n >= 4096) >= 3
        got[path] = [bytes(dst.data[dst.offsets[i] : dst.offsets[i + 1]]) for i in range(dst.count)]
    assert got["compiled"] == got["python"] == [b"\x07\x08\x09"] + [records[i] for i in order]


@pytest.mark.parametrize("call", ["fill", "place"])
@pytest.mark.parametrize("handler", ["returns", "raises"])
def test_a_signal_while_the_compiled_reader_waits_runs_its_handler_then_reads_on_or_raises(
    tmp_path, call, handler
):
    """A read interrupted by a signal (EINTR) runs the signal's Python handler: the read goes on where it
    returns, and stops with its exception where it raises."""
    import signal

    if not bf.compiled_available():
        pytest.fail("the compiled batch reader is not built (pip install -e . needs a C compiler)")
    fifo = tmp_path / "train_0"
    os.mkfifo(fifo)
    data = encode_tfrecord_all([bytes([i]) * 100 for i in range(4)])
    go = threading.Event()

    def write():
        fd = os.open(fifo, os.O_WRONLY)
        try:
            os.write(fd, data[:200])
            go.wait(10)
            os.write(fd, data[200:])
        except BrokenPipeError:  # the reader stopped at the raising handler
            pass
        finally:
            os.close(fd)

    class Alarm(Exception):
        pass

    seen = []

    def on_alarm(signum, frame):
        seen.append(signum)
        go.set()  # the writer goes on once the read was interrupted
        if handler == "raises":
            raise Alarm

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    before = signal.signal(signal.SIGALRM, on_alarm)
    try:
        with FifoReader(fifo) as reader:
            native = bf._native.Reader(reader.fileno(), "TFRecord", 1 << 20)
            signal.setitimer(signal.ITIMER_REAL, 0.3)  # while the reader waits for the third record
            data_ = np.zeros(1000, dtype=np.uint8)
            try:
                if call == "fill":
                    offsets = np.zeros(5, dtype=np.int64)
                    out = native.fill(data_, offsets, 0, 0, 4, 0)
                else:
                    spans, state = np.zeros(8, dtype=np.int64), np.array([0, 0, -1], dtype=np.int64)
                    bounds = np.array([[0, 0, 1000]], dtype=np.int64)
                    out = native.place(data_, None, spans, np.zeros(4, dtype=np.int64), bounds, state, 4, 0)
            except Alarm:
                out = "raised"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        go.set()
        writer.join(10)
    assert seen == [signal.SIGALRM]
    if handler == "raises":
        assert out == "raised"
    else:
        assert out[:3] == (bf._native.FULL, 4, 400)
        assert bytes(data_[300:400]) == bytes([3]) * 100
