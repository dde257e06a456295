"""The cases of AWS's own PipeModeDataset suite (sagemaker-tensorflow-extensions v1.20.0, ``test/unit`` and
``test/functional``), written anew: the same inputs and expectations, on both of our readers.

AWS's suite is on no package registry, so CI cannot run it; ``bench/aws_suite.sh`` runs the original
against ours where a copy is at hand. Its two estimator tests train a ``tf.estimator.LinearClassifier`` on
the parsed records; here the same pipelines are read to their end and their batches checked instead
(``tf.estimator`` is gone from TensorFlow 2.16).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.runtime_helpers import FifoFeeder

from sagemaker_dist.contract.record_formats import encode_recordio, encode_tfrecord

tf = pytest.importorskip("tensorflow")

from sagemaker_dist.runtime import PipeModeDataset, PipeModeDatasetException  # noqa: E402

DIMENSION = 100  # floats per example in the functional cases' records


@pytest.fixture
def dirs(tmp_path, pipe_reader):
    """One directory for the channel files, the state and the config, as AWS's unit cases use."""
    return tmp_path


def write_config(directory, *channels) -> None:
    config = {channel: {"TrainingInputMode": "Pipe"} for channel in channels}
    (directory / "inputdataconfig.json").write_text(json.dumps(config))


def write_channel(directory, channel: str, records: list[bytes], epoch: int = 0) -> None:
    """``<channel>_<epoch>`` as a regular file of RecordIO records, and the config naming the channel."""
    write_config(directory, channel)
    (directory / f"{channel}_{epoch}").write_bytes(b"".join(encode_recordio(r) for r in records))


def dataset(directory, channel: str, **kwargs):
    return PipeModeDataset(channel, pipe_dir=directory, state_dir=directory, config_dir=directory, **kwargs)


# --- test/unit: regular files standing in for the FIFOs --------------------------------------------


def test_single_record(dirs):
    write_channel(dirs, "A", [b"bear"])
    assert iter(dataset(dirs, "A")).get_next() == b"bear"


def test_multiple_records(dirs):
    write_channel(dirs, "B", [b"bunny", b"caterpillar"])
    it = iter(dataset(dirs, "B"))
    assert it.get_next() == b"bunny"
    assert it.get_next() == b"caterpillar"


def test_large_record(dirs):
    write_channel(dirs, "C", [b"a" * 1_000_000])
    assert iter(dataset(dirs, "C")).get_next() == b"a" * 1_000_000


def test_a_stream_that_is_not_recordio_is_an_internal_error(dirs):
    """AWS's reader raises InternalError here; so do both of ours, naming where (the Python reader
    through the dataset as returned: ``py_function`` cannot raise that class itself)."""
    write_config(dirs, "X")
    (dirs / "X_0").write_bytes(b"adfsafasfd")
    named = "channel 'X', epoch 0, byte offset 0: RecordIO: bad magic number"
    with pytest.raises(tf.errors.InternalError, match=named):
        iter(dataset(dirs, "X")).get_next()


def test_out_of_range_after_the_last_record(dirs):
    write_channel(dirs, "A", [b"bear", b"bunny", b"truck"])
    it = iter(dataset(dirs, "A"))
    for _ in range(3):
        it.get_next()
    with pytest.raises(tf.errors.OutOfRangeError):
        it.get_next()


def test_missing_channel(dirs):
    write_channel(dirs, "A", [b"bear", b"bunny", b"truck"])
    with pytest.raises(PipeModeDatasetException):
        dataset(dirs, "Not A Channel")


def test_each_iterator_reads_the_next_file(dirs):
    write_channel(dirs, "A", [b"bear"])
    ds = dataset(dirs, "A")
    it = iter(ds)
    assert it.get_next() == b"bear"
    with pytest.raises(tf.errors.OutOfRangeError):
        it.get_next()
    write_channel(dirs, "A", [b"bunny", b"piano", b"caterpillar"], epoch=1)
    it = iter(ds)
    assert [it.get_next() for _ in range(3)] == [b"bunny", b"piano", b"caterpillar"]
    with pytest.raises(tf.errors.OutOfRangeError):
        it.get_next()


def test_benchmark_records_interval_prints_iterator_records(dirs, capfd):
    write_channel(dirs, "A", [b"bear"])
    assert iter(dataset(dirs, "A", benchmark_records_interval=1)).get_next() == b"bear"
    assert "Iterator records" in capfd.readouterr().out  # printed before the record is handed over


def test_no_benchmark_records_interval_prints_nothing(dirs, capfd):
    write_channel(dirs, "A", [b"bear"])
    assert iter(dataset(dirs, "A", benchmark_records_interval=0)).get_next() == b"bear"
    assert "Iterator records" not in capfd.readouterr().out


# --- test/functional: FIFOs written as SageMaker does, parsed examples ------------------------------

FEATURES = {
    "data": tf.io.FixedLenFeature([], tf.string),
    "labels": tf.io.FixedLenFeature([], tf.int64),
}


def examples(n: int = 100) -> list[bytes]:
    """Serialized ``tf.train.Example``s: ``data`` DIMENSION float64s, ``labels`` alternating 0 and 1."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        label = i % 2
        feature = {
            "labels": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            "data": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[rng.normal(label - 1, size=DIMENSION).tobytes()])
            ),
        }
        out.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return out


def parse(record):
    parsed = tf.io.parse_single_example(record, FEATURES)
    return {"data": tf.io.decode_raw(parsed["data"], tf.float64)}, parsed["labels"]


@pytest.fixture
def fifos(tmp_path, pipe_reader):
    """Starts a FifoFeeder per channel in <tmp>/data (config there too); joins them after the test."""
    data = tmp_path / "data"
    data.mkdir()
    feeders = []

    def feed(epochs_by_channel: dict[str, list[bytes]]):
        write_config(data, *epochs_by_channel)
        for channel, epochs in epochs_by_channel.items():
            feeders.append(FifoFeeder(data, channel, epochs))
            feeders[-1].start()
        return data, tmp_path / "state"

    yield feed
    for feeder in feeders:
        feeder.join(10)
        assert feeder.error is None


def fifo_dataset(data, state, channel: str, **kwargs):
    return PipeModeDataset(channel, pipe_dir=data, state_dir=state, config_dir=data, **kwargs)


def test_multi_epoch_pipeline(fifos):
    stream = b"".join(encode_recordio(r) for r in examples())
    data, state = fifos({"testchannel": [stream, stream]})
    ds = fifo_dataset(data, state, "testchannel").map(parse, num_parallel_calls=12)
    batches = list(ds.repeat(count=2).prefetch(3).batch(3))
    assert sum(len(labels) for _, labels in batches) == 200
    assert all(features["data"].shape[1:] == (DIMENSION,) for features, _ in batches)


def test_multi_channels(fifos):
    stream = b"".join(encode_recordio(r) for r in examples())
    data, state = fifos({"channel_a": [stream, stream], "channel_b": [stream, stream]})

    def channel(name):
        ds = fifo_dataset(data, state, name).map(parse, num_parallel_calls=12)
        return ds.repeat(count=2).prefetch(3).batch(10)

    it = iter(tf.data.Dataset.zip((channel("channel_a"), channel("channel_b"))))
    for _ in range(20):
        a, b = it.get_next()
        assert a[0]["data"].shape == (10, DIMENSION) and len(a[1]) == 10
        assert b[0]["data"].shape == (10, DIMENSION) and len(b[1]) == 10
    with pytest.raises(tf.errors.OutOfRangeError):
        it.get_next()


def test_multipart_recordio(fifos):
    records = examples()
    # each record in three parts (flags 1, 2, 3), as AWS's writer splits them
    stream = b"".join(encode_recordio(r, max_part=-(-len(r) // 3)) for r in records)
    data, state = fifos({"testchannel": [stream]})
    ds = fifo_dataset(data, state, "testchannel").map(parse, num_parallel_calls=12)
    parsed = list(ds.prefetch(3).batch(3))
    assert sum(len(labels) for _, labels in parsed) == 100
    assert [int(x) for _, labels in parsed for x in labels] == [i % 2 for i in range(100)]


def test_tf_record(fifos):
    data, state = fifos({"testchannel": [b"".join(encode_tfrecord(b"hello world") for _ in range(100))]})
    it = iter(fifo_dataset(data, state, "testchannel", record_format="TFRecord"))
    for _ in range(100):
        assert it.get_next() == b"hello world"


def test_csv(fifos):
    line = ",".join(str(j) for j in range(100)) + "\n"
    data, state = fifos({"testchannel": [(line * 100).encode()]})
    columns = [str(i) for i in range(100)]

    def parse_line(text):
        return dict(zip(columns, tf.io.decode_csv(text, [[0]] * 100)))

    it = iter(fifo_dataset(data, state, "testchannel", record_format="TextLine").map(parse_line))
    for _ in range(100):
        assert it.get_next() == {str(i): i for i in range(100)}


def test_input_config_validation_failure(tmp_path, pipe_reader):
    write_config(tmp_path, "testchannel")
    with pytest.raises(PipeModeDatasetException):
        PipeModeDataset("Not a Channel", pipe_dir=tmp_path, state_dir=tmp_path / "state", config_dir=tmp_path)
