"""PipeModeDataset and rank_dataset on real FIFOs with real TensorFlow."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers.runtime_helpers import FifoFeeder, write_opt_ml

from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.contract.record_formats import encode_recordio, encode_tfrecord
from sagemaker_dist.runtime.config import ROOT_ENV
from sagemaker_dist.runtime.ranks import RankChannelError, RankInfo

tf = pytest.importorskip("tensorflow")

from sagemaker_dist.runtime import (  # noqa: E402
    PipeModeDataset,
    PipeModeDatasetError,  # noqa: E402
    rank_dataset,
)


@pytest.fixture
def opt_ml(tmp_path, monkeypatch, pipe_reader):
    """An /opt/ml tree; the test runs through both readers (``pipe_reader``, tests/runtime/conftest.py)."""
    write_opt_ml(tmp_path, ["train_0", "train_1", "text", "rio"])
    monkeypatch.setenv(ROOT_ENV, str(tmp_path))
    return tmp_path


def feed(root, channel, epochs) -> FifoFeeder:
    feeder = FifoFeeder(root / "input" / "data", channel, epochs)
    feeder.start()
    return feeder


def records_of(ds) -> list[bytes]:
    return [x.numpy() for x in ds]


def tf_written_records(path, records) -> bytes:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for r in records:
            writer.write(r)
    return path.read_bytes()


def test_reads_what_tensorflow_wrote_through_a_fifo(opt_ml):
    records = [os.urandom(n) for n in (0, 1, 100, 5000, 200_000)] + [b"x" * 100] * 300
    feeder = feed(opt_ml, "train_0", [tf_written_records(opt_ml / "w.tfrecord", records)])
    ds = PipeModeDataset("train_0", record_format="TFRecord", chunk_size=4096)
    assert ds.element_spec == tf.TensorSpec(shape=(), dtype=tf.string)
    assert records_of(ds) == records
    feeder.join(10)
    assert feeder.served == 1 and feeder.error is None


def test_each_iteration_opens_the_next_fifo(opt_ml):
    epochs = [b"".join(encode_tfrecord(f"e{e}r{i}".encode()) for i in range(50)) for e in range(3)]
    feeder = feed(opt_ml, "train_1", epochs)
    ds = PipeModeDataset("train_1", "TFRecord")
    first = records_of(ds)
    second = records_of(ds)
    assert first == [f"e0r{i}".encode() for i in range(50)]
    assert second == [f"e1r{i}".encode() for i in range(50)]
    # A new dataset object on the same channel continues the count (state is kept in state_dir).
    third = records_of(PipeModeDataset("train_1", "TFRecord").take(5))
    assert third == [f"e2r{i}".encode() for i in range(5)]
    feeder.join(10)
    assert feeder.served == 3
    assert (opt_ml / "pipe_state" / "train_1").read_text() == "3"


def test_repeat_batch_and_map_read_epoch_after_epoch(opt_ml):
    epochs = [
        b"".join(encode_tfrecord(np.int64(e * 1000 + i).tobytes()) for i in range(10)) for e in range(3)
    ]
    feeder = feed(opt_ml, "train_0", epochs)
    ds = (
        PipeModeDataset("train_0", "TFRecord")
        .map(lambda r: tf.io.decode_raw(r, tf.int64)[0])
        .repeat(3)
        .batch(4)
    )
    values = np.concatenate([b.numpy() for b in ds]).tolist()
    assert values == [e * 1000 + i for e in range(3) for i in range(10)]
    feeder.join(10)
    assert feeder.served == 3


def test_keras_fit_epochs_each_read_their_own_fifo(opt_ml):
    rng = np.random.default_rng(0)

    def epoch_bytes():
        out = []
        for _ in range(32):
            x = rng.normal(size=4).astype(np.float32)
            out.append(encode_tfrecord(np.append(x, x.sum()).astype(np.float32).tobytes()))
        return b"".join(out)

    feeder = feed(opt_ml, "train_0", [epoch_bytes() for _ in range(3)])

    def parse(record):
        v = tf.io.decode_raw(record, tf.float32)
        return v[:4], v[4:]

    ds = PipeModeDataset("train_0", "TFRecord").map(parse).batch(8)
    model = tf.keras.Sequential([tf.keras.layers.Input(shape=(4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    history = model.fit(ds, epochs=3, verbose=0)
    assert len(history.history["loss"]) == 3
    feeder.join(10)
    assert feeder.served == 3


def test_batch_size_rebatches_across_chunks(opt_ml):
    records = [f"record {i}".encode() for i in range(10)]
    data = b"".join(encode_tfrecord(r) for r in records)
    feeder = feed(opt_ml, "train_0", [data, data])
    ds = PipeModeDataset("train_0", "TFRecord", chunk_size=64, batch_size=4)
    assert ds.element_spec == tf.TensorSpec(shape=(None,), dtype=tf.string)
    assert [b.numpy().tolist() for b in ds] == [records[0:4], records[4:8], records[8:10]]
    exact = PipeModeDataset("train_0", "TFRecord", chunk_size=64, batch_size=4, drop_remainder=True)
    assert [b.numpy().tolist() for b in exact] == [records[0:4], records[4:8]]
    feeder.join(10)
    with pytest.raises(PipeModeDatasetError, match="batch_size is 0"):
        PipeModeDataset("train_0", "TFRecord", batch_size=0)


def test_batch_on_the_dataset_batches_straight_from_the_chunks(opt_ml, pipe_reader):
    records = [f"record {i}".encode() for i in range(10)]
    data = b"".join(encode_tfrecord(r) for r in records)
    feeder = feed(opt_ml, "train_0", [data, data, data])
    ds = PipeModeDataset("train_0", "TFRecord", chunk_size=64)
    # The fast path: rebatched record chunks (Python reader) or batches made in the op (compiled), not
    # unbatch + batch (no per-record step in tf.data).
    fast = ds.batch(4)
    if pipe_reader == "python":
        assert "Rebatch" in type(fast).__name__
    else:
        graph = fast._as_serialized_graph().numpy()
        assert b"SagemakerDistPipeDataset" in graph and b"BatchDataset" not in graph
    assert fast.element_spec == tf.TensorSpec(shape=(None,), dtype=tf.string)
    assert [b.numpy().tolist() for b in fast] == [records[0:4], records[4:8], records[8:10]]
    exact = ds.batch(4, drop_remainder=True)
    assert exact.element_spec == tf.TensorSpec(shape=(4,), dtype=tf.string)
    assert [b.numpy().tolist() for b in exact] == [records[0:4], records[4:8]]
    # Parallel batching takes tf.data's own batch, with the same result.
    parallel = ds.batch(4, num_parallel_calls=2, deterministic=True)
    assert "Rebatch" not in type(parallel).__name__
    assert [b.numpy().tolist() for b in parallel] == [records[0:4], records[4:8], records[8:10]]
    feeder.join(10)
    assert feeder.served == 3


def test_large_records_cross_one_by_one_and_small_ones_as_a_blob(opt_ml):
    from sagemaker_dist.runtime.epoch_reader.reader import PER_RECORD_MIN_BYTES, EpochReader

    big = [os.urandom(PER_RECORD_MIN_BYTES + i) for i in range(6)]
    small = [os.urandom(i) for i in range(50)]
    records = big[:3] + small + big[3:] + small
    data = b"".join(encode_tfrecord(r) for r in records)
    replay = opt_ml / "input" / "data" / "train_0_0"  # a regular file stands in for the FIFO
    replay.write_bytes(data)
    reader = EpochReader(
        "train_0",
        "TFRecord",
        opt_ml / "pipe_state",
        opt_ml / "input" / "data",
        False,
        0,
        0,
        5,
        3 * PER_RECORD_MIN_BYTES,
    )
    chunks = list(reader())
    got, kinds = [], set()
    for blob, starts, lengths, one_by_one in chunks:
        if one_by_one:
            assert blob == b"" and len(starts) == len(lengths) == 0
            got += one_by_one
            kinds.add("records")
        else:
            got += [blob[s : s + n] for s, n in zip(starts.tolist(), lengths.tolist())]
            kinds.add("blob")
    assert got == records
    assert kinds == {"records", "blob"}
    # Through TensorFlow (the next epoch), both kinds of chunk give the records in order.
    (opt_ml / "input" / "data" / "train_0_1").write_bytes(data)
    ds = PipeModeDataset("train_0", "TFRecord", chunk_size=3 * PER_RECORD_MIN_BYTES)
    assert records_of(ds) == records


def test_read_ahead_thread_delivers_in_order_then_the_error_and_stops_with_its_consumer():
    import threading

    from sagemaker_dist.runtime.epoch_reader.reader import read_ahead

    def failing():
        yield from range(5)
        raise ValueError("byte offset 42: bad frame")

    got = []
    with pytest.raises(ValueError, match="byte offset 42"):
        for item in read_ahead(failing(), 2, "t"):
            got.append(item)
    assert got == [0, 1, 2, 3, 4]

    closed = threading.Event()

    def endless():
        try:
            n = 0
            while True:
                yield n
                n += 1
        finally:
            closed.set()  # where PipeModeDataset's reader closes its FIFO

    consumer = read_ahead(endless(), 2, "t")
    assert [next(consumer) for _ in range(3)] == [0, 1, 2]
    consumer.close()
    assert closed.wait(5), "the reader thread did not stop after its consumer did"


def test_read_ahead_lets_go_of_each_item_once_the_consumer_has_it():
    """Nothing of the epoch stays held by the read-ahead itself (the first item included): a batch's
    buffer (a row span of a shuffle window's arena) is reused once the loop drops it."""
    import gc
    import weakref

    from sagemaker_dist.runtime.epoch_reader.reader import read_ahead

    class Item:
        pass

    made = []

    def items():
        for _ in range(6):
            made.append(Item())
            yield made[-1]

    consumer = read_ahead(items(), 2, "t")
    first = weakref.ref(next(consumer))
    second = weakref.ref(next(consumer))
    third = next(consumer)
    made.clear()  # only the read-ahead (and its queue) may hold them now
    gc.collect()
    assert first() is None and second() is None
    assert len(list(consumer)) == 3 and third is not None


def test_read_ahead_makes_the_first_item_in_the_consumers_call_and_the_rest_in_its_thread():
    import threading

    from sagemaker_dist.runtime.epoch_reader.reader import read_ahead

    makers = []
    closed = threading.Event()

    def items():
        try:
            for n in range(4):
                makers.append(threading.current_thread())
                yield n
        finally:
            closed.set()

    assert list(read_ahead(items(), 2, "t")) == [0, 1, 2, 3]
    assert makers[0] is threading.current_thread()
    assert all(maker is not threading.current_thread() for maker in makers[1:])
    assert closed.is_set()

    # Stopped right after the first item, the thread stops too and closes the items.
    makers.clear()
    closed.clear()
    consumer = read_ahead(items(), 2, "t")
    assert next(consumer) == 0
    consumer.close()
    assert closed.wait(5), "the reader thread did not stop after its consumer did"

    def failing_at_once():
        raise ValueError("byte offset 0: bad frame")
        yield  # a generator

    with pytest.raises(ValueError, match="byte offset 0"):
        next(read_ahead(failing_at_once(), 2, "t"))
    assert list(read_ahead(iter(()), 2, "t")) == []


def test_recordio_and_text_lines(opt_ml):
    rio = [b"a" * 3, os.urandom(1000), b""]
    feeder1 = feed(opt_ml, "rio", [b"".join(encode_recordio(r, max_part=256) for r in rio)])
    assert records_of(PipeModeDataset("rio")) == rio  # RecordIO is the default, as in AWS's
    feeder2 = feed(opt_ml, "text", [b"one\ntwo\r\n\nlast"])
    assert records_of(PipeModeDataset("text", "TextLine")) == [b"one", b"two", b"", b"last"]
    feeder1.join(10)
    feeder2.join(10)


WRITER_DIES = """
import os, sys
out = os.open(sys.argv[1], os.O_WRONLY)
os.write(out, open(sys.argv[2], "rb").read())
os._exit(3)
"""


def test_writer_dying_mid_record_fails_the_iteration_with_the_offset(opt_ml):
    data = b"".join(encode_tfrecord(b"r" * 100) for _ in range(20))
    (opt_ml / "partial").write_bytes(data[: 12 * 116 + 60])
    fifo = opt_ml / "input" / "data" / "train_0_0"
    os.mkfifo(fifo)
    writer = subprocess.Popen([sys.executable, "-c", WRITER_DIES, str(fifo), str(opt_ml / "partial")])
    ds = PipeModeDataset("train_0", "TFRecord")
    got = 0
    with pytest.raises(
        tf.errors.OpError, match="channel 'train_0', epoch 0, byte offset 1392.*ended inside a record"
    ):
        for _ in ds:
            got += 1
    assert writer.wait(30) == 3
    assert got == 12


def test_corrupt_crc_fails_or_is_skipped_and_counted(opt_ml, caplog, capfd):
    records = [bytes([i]) * 64 for i in range(8)]
    data = bytearray(b"".join(encode_tfrecord(r) for r in records))
    data[3 * 80 + 30] ^= 0x01  # flip one bit in record 3's data
    feeder = feed(opt_ml, "train_0", [bytes(data), bytes(data)])
    with pytest.raises(tf.errors.OpError, match="epoch 0, byte offset 240: TFRecord: data CRC mismatch"):
        records_of(PipeModeDataset("train_0", "TFRecord"))
    with caplog.at_level(logging.WARNING):
        got = records_of(PipeModeDataset("train_0", "TFRecord", max_corrupted_records_to_skip=1))
    assert got == records[:3] + records[4:]
    logged = caplog.text + capfd.readouterr().err  # the compiled reader writes its warnings to stderr
    assert "epoch 1, byte offset 240: skipped corrupted TFRecord record" in logged
    assert "channel 'train_0', epoch 1: skipped 1 corrupted record(s), read 7" in logged
    feeder.join(10)


def test_missing_fifo_times_out_with_a_clear_error(opt_ml):
    ds = PipeModeDataset("train_0", "TFRecord", fifo_timeout=0.3)
    with pytest.raises(tf.errors.OpError, match=r"train_0_0 did not appear within 0.3 s .*Pipe mode"):
        records_of(ds)
    # The epoch was given back: once the FIFO appears, the next iteration reads train_0_0.
    feeder = feed(opt_ml, "train_0", [encode_tfrecord(b"late")])
    assert records_of(ds) == [b"late"]
    feeder.join(10)


def test_benchmark_prints_throughput(opt_ml, capfd):
    feeder = feed(opt_ml, "train_0", [b"".join(encode_tfrecord(b"z" * 10) for _ in range(100))])
    records_of(PipeModeDataset("train_0", "TFRecord", benchmark=True, benchmark_records_interval=50))
    feeder.join(10)
    out = capfd.readouterr().out
    assert "PipeModeDataset train_0_0 epoch end: 100 records, 2600 bytes" in out


def test_benchmark_records_interval_reports_without_benchmark(opt_ml, capfd):
    """As AWS's reader: the interval's lines with or without ``benchmark``; the epoch's end only with it."""
    feeder = feed(opt_ml, "train_0", [b"".join(encode_tfrecord(b"z" * 10) for _ in range(100))])
    assert len(records_of(PipeModeDataset("train_0", "TFRecord", benchmark_records_interval=40))) == 100
    feeder.join(10)
    out = capfd.readouterr().out
    assert "PipeModeDataset train_0_0 Iterator records: " in out and "epoch end" not in out, out


def test_constructor_checks_like_aws(opt_ml):
    with pytest.raises(ValueError, match="'CSV' is not one of"):
        PipeModeDataset("train_0", "CSV")
    with pytest.raises(PipeModeDatasetError, match="channel 'nope' is not in .*inputdataconfig.json"):
        PipeModeDataset("nope")
    with pytest.raises(PipeModeDatasetError, match="can only be set for record_format='TFRecord'"):
        PipeModeDataset("train_0", "RecordIO", max_corrupted_records_to_skip=2)
    write_opt_ml(opt_ml, {"train_0": "File"})
    with pytest.raises(PipeModeDatasetError, match="channel 'train_0' is in 'File' mode, not Pipe"):
        PipeModeDataset("train_0", "TFRecord")


def test_rank_dataset_reads_this_ranks_channel(tmp_path, pipe_reader):
    layout = plan_layout(1, 2)
    write_opt_ml(tmp_path, layout.channel_names, layout=layout)
    feeder = feed(tmp_path, "train_1", [b"".join(encode_tfrecord(b"rank-1 data") for _ in range(3))])
    ds = rank_dataset(root=tmp_path, rank_info=RankInfo(1, 1, 2, 2))
    assert records_of(ds) == [b"rank-1 data"] * 3
    feeder.join(10)
    with pytest.raises(RankChannelError, match="expected channel 'train_2'"):
        rank_dataset(root=tmp_path, rank_info=RankInfo(2, 2, 3, 3))


def test_rank_dataset_insists_on_recordio_for_wrapped_channels(tmp_path):
    layout = plan_layout(1, 1, record_wrapper="RecordIO")
    write_opt_ml(tmp_path, layout.channel_names, layout=layout, wrapper="RecordIO")
    with pytest.raises(PipeModeDatasetError, match="RecordWrapperType RecordIO.*record_format='RecordIO'"):
        rank_dataset(root=tmp_path, rank_info=RankInfo(0, 0, 1, 1))
    assert rank_dataset("train", "RecordIO", root=tmp_path, rank_info=RankInfo(0, 0, 1, 1)) is not None


def test_a_slow_writer_does_not_hold_back_the_records_already_sent(opt_ml):
    """Records that arrived are handed over when the writer goes quiet, not after a whole chunk."""
    import threading

    path = opt_ml / "input" / "data" / "train_1_0"
    os.mkfifo(path)
    first, rest = [b"a" * 100] * 3, [b"b" * 100] * 2
    pause = 3.0

    def writer():
        with open(path, "wb", buffering=0) as f:
            f.write(b"".join(encode_tfrecord(r) for r in first))
            time.sleep(pause)
            f.write(b"".join(encode_tfrecord(r) for r in rest))

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    iterator = iter(PipeModeDataset("train_1", record_format="TFRecord"))  # 4 MiB chunks
    started = time.monotonic()
    got = [next(iterator).numpy()]
    waited = time.monotonic() - started
    got += [x.numpy() for x in iterator]
    thread.join(10)
    assert got == first + rest
    assert waited < pause / 2, f"the first record took {waited:.2f} s: it waited for the writer's pause"


def test_large_records_batch_exactly_and_stopping_early_closes_the_fifo(opt_ml):
    """Large records come in whole batches; an iterator dropped mid-epoch has its FIFO closed when
    the next iteration starts.

    SageMaker (like the feeder here) creates the next epoch's FIFO only once the last one is
    closed, so a reader that kept it open would stall the next epoch.
    """
    from sagemaker_dist.runtime.framing import LARGE_RECORD_BYTES

    records = [os.urandom(LARGE_RECORD_BYTES + i) for i in range(150)]  # about 5 MB: more than a pipe holds
    data = b"".join(encode_tfrecord(r) for r in records)
    feeder = feed(opt_ml, "train_0", [data, data])
    ds = PipeModeDataset("train_0", "TFRecord").batch(4)
    iterator = iter(ds)
    assert next(iterator).numpy().tolist() == records[:4]
    del iterator  # dropped mid-epoch: the next iteration closes train_0_0 before it waits for train_0_1
    batches = [b.numpy().tolist() for b in ds]  # epoch 1: train_0_1, which needs train_0_0 closed
    assert batches == [records[i : i + 4] for i in range(0, len(records), 4)]
    feeder.join(10)
    assert feeder.served == 2 and feeder.error is None


GRAPH_MODE_READER = """
import os, sys
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
from sagemaker_dist.runtime import PipeModeDataset
ds = PipeModeDataset("train_0", "TFRecord").batch(3)
batch = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
got = []
with tf.compat.v1.Session() as sess:
    try:
        while True:
            got += sess.run(batch).tolist()
    except tf.errors.OutOfRangeError:
        pass
print(len(got), sum(len(r) for r in got))
"""


def test_tf1_graph_mode_reads_too(opt_ml):
    """With eager execution off (TF1-style scripts) the tensors are made by py_function instead."""
    from sagemaker_dist.runtime.framing import LARGE_RECORD_BYTES

    records = [b"s" * 10] * 4 + [b"L" * LARGE_RECORD_BYTES] * 5 + [b"t" * 20]
    replay = opt_ml / "input" / "data" / "train_0_0"  # a regular file stands in for the FIFO
    replay.write_bytes(b"".join(encode_tfrecord(r) for r in records))
    env = {**os.environ, ROOT_ENV: str(opt_ml), "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = subprocess.run(
        [sys.executable, "-c", GRAPH_MODE_READER], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == [str(len(records)), str(sum(len(r) for r in records))]


def test_handover_starts_an_iteration_at_chunk_0_and_refuses_an_older_iterator():
    from sagemaker_dist.runtime.tensorflow.data.tf_bridge import Handover, TwoIterationsError

    no_offsets = np.empty(0, dtype=np.int64)
    closed = []

    class Reader:
        channel = "train_0"
        epochs = 0

        def __call__(self, group, convert):
            epoch, Reader.epochs = Reader.epochs, Reader.epochs + 1
            try:
                for i in range(3):
                    yield convert(b"", no_offsets, no_offsets, [b"e%d-r%d" % (epoch, i)])
            finally:
                closed.append(epoch)

    handover = Handover(Reader())
    assert handover.take(0).numpy().tolist() == [b"e0-r0"]
    assert handover.take(1).numpy().tolist() == [b"e0-r1"]
    # A new iterator (chunk 0 again) while epoch 0 is open: epoch 0's reader stops, its FIFO closes.
    assert handover.take(0).numpy().tolist() == [b"e1-r0"]
    assert closed == [0]
    with pytest.raises(TwoIterationsError, match="asked for chunk 2 out of turn.*one at a time"):
        handover.take(2)  # the dropped iterator was still being read
    for i in (1, 2):
        handover.take(i)
    with pytest.raises(StopIteration):  # py_function makes it the end of the iteration
        handover.take(3)
    assert closed == [0, 1]


def test_an_iterator_read_after_a_newer_one_began_fails_clearly(opt_ml):
    """Two live iterators of one dataset: the newer reads the next epoch whole, the older fails, named.

    (Read in turns, whichever iterator asks out of turn fails: never records of the wrong epoch.)
    """
    data = [
        b"".join(encode_tfrecord(b"e%d-%06d" % (e, i) + b"x" * 90) for i in range(1000)) for e in range(2)
    ]
    feeder = feed(opt_ml, "train_0", data)
    ds = PipeModeDataset("train_0", "TFRecord", chunk_size=8192)  # 4 KiB chunks: more than tf.data prefetches
    older = iter(ds)
    assert next(older).numpy() == b"e0-000000" + b"x" * 90
    time.sleep(1)  # tf.data's prefetch settles: no call of the older iterator is in flight
    newer = [x.numpy() for x in ds]  # closes epoch 0's FIFO, then reads epoch 1
    assert newer == [b"e1-%06d" % i + b"x" * 90 for i in range(1000)]
    with pytest.raises(tf.errors.OpError, match="asked for chunk .* out of turn.*iterate one at a"):
        for _ in older:
            pass
    feeder.join(10)
    assert feeder.served == 2


def test_benchmark_reports_progress_for_large_records_too(opt_ml, capfd):
    from sagemaker_dist.runtime.framing import LARGE_RECORD_BYTES

    data = b"".join(encode_tfrecord(b"L" * LARGE_RECORD_BYTES) for _ in range(120))
    feeder = feed(opt_ml, "train_0", [data])
    ds = PipeModeDataset("train_0", "TFRecord", benchmark=True, benchmark_records_interval=50)
    assert sum(int(b.shape[0]) for b in ds.batch(10)) == 120
    feeder.join(10)
    out = capfd.readouterr().out
    import re

    progress = [int(n) for n in re.findall(r"train_0_0 Iterator records: (\d+), ", out)]
    assert len(progress) >= 2 and progress[-1] >= 100, out  # reports at >= 50 and >= 100 records
    assert "PipeModeDataset train_0_0 epoch end: 120 records" in out
