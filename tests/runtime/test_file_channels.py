"""Shared channels: File mode read by every rank; a shared Pipe channel with several readers refused."""

from __future__ import annotations

import pytest
from helpers.runtime_helpers import write_opt_ml

from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.contract.record_formats import encode_recordio, encode_tfrecord
from sagemaker_dist.runtime import RankChannelError, RankInfo, check_rank_channels, rank_dataset
from sagemaker_dist.runtime.config import ContainerConfig
from sagemaker_dist.runtime.file_channel import FileChannelError


def _job(tmp_path, validation_mode: str, processes_per_host: int = 2):
    layout = plan_layout(1, processes_per_host, validation="single")
    channels = {f"train_{i}": "Pipe" for i in range(processes_per_host)}
    channels["validation"] = validation_mode
    return write_opt_ml(tmp_path, channels, layout=layout)


def _records(ds) -> list[bytes]:
    return [bytes(r.numpy()) for r in ds]


def test_file_mode_shared_validation_is_read_in_full_by_every_rank(tmp_path):
    root = _job(tmp_path, "File")
    folder = root / "input" / "data" / "validation"
    (folder / "part").mkdir(parents=True)
    (folder / "a.tfrecord").write_bytes(b"".join(encode_tfrecord(b"a%d" % i) for i in range(3)))
    (folder / "part" / "b.tfrecord").write_bytes(encode_tfrecord(b"b0"))
    (folder / ".hidden").write_bytes(b"not a record")
    expected = [b"a0", b"a1", b"a2", b"b0"]
    for rank in (0, 1):
        info = RankInfo(rank, rank, 2, 2)
        assert _records(rank_dataset("validation", root=root, rank_info=info)) == expected


def test_file_mode_reads_recordio_and_text_lines(tmp_path):
    root = _job(tmp_path, "File")
    folder = root / "input" / "data" / "validation"
    folder.mkdir(parents=True)
    (folder / "x.rec").write_bytes(encode_recordio(b"first") + encode_recordio(b"second" * 100, max_part=64))
    info = RankInfo(0, 0, 2, 2)
    assert _records(rank_dataset("validation", "RecordIO", root=root, rank_info=info)) == [
        b"first",
        b"second" * 100,
    ]
    (folder / "x.rec").unlink()
    (folder / "y.txt").write_text("one\ntwo\n")
    assert _records(rank_dataset("validation", "TextLine", root=root, rank_info=info)) == [b"one", b"two"]


def test_empty_file_channel_names_the_folder(tmp_path):
    root = _job(tmp_path, "File")
    (root / "input" / "data" / "validation").mkdir(parents=True)
    with pytest.raises(FileChannelError, match=r"input/data/validation' holds no files"):
        rank_dataset("validation", root=root, rank_info=RankInfo(0, 0, 2, 2))


def test_shared_pipe_channel_with_two_readers_per_host_is_refused(tmp_path):
    config = ContainerConfig.load(_job(tmp_path, "Pipe"))
    with pytest.raises(RankChannelError) as err:
        check_rank_channels(config, RankInfo(1, 1, 2, 2), "validation", input_modes=("Pipe", "File"))
    message = str(err.value)
    assert "rank 1" in message and "'validation'" in message and "one reader only" in message
    assert "validation='per-worker'" in message


def test_shared_pipe_channel_with_one_reader_per_host_is_allowed(tmp_path):
    config = ContainerConfig.load(_job(tmp_path, "Pipe", processes_per_host=1))
    assert check_rank_channels(config, RankInfo(0, 0, 1, 1), "validation") == "validation"


def test_train_channels_in_file_mode_are_refused_unless_asked_for(tmp_path):
    layout = plan_layout(1, 2)
    root = write_opt_ml(tmp_path, {"train_0": "File", "train_1": "File"}, layout=layout)
    config = ContainerConfig.load(root)
    with pytest.raises(RankChannelError, match="TrainingInputMode is 'File', not 'Pipe'"):
        check_rank_channels(config, RankInfo(0, 0, 2, 2))
    assert check_rank_channels(config, RankInfo(1, 1, 2, 2), input_modes=("Pipe", "File")) == "train_1"


def test_file_mode_batches_like_the_pipe_option_and_refuses_pipe_only_skipping(tmp_path):
    from sagemaker_dist.runtime.tensorflow.data.file_dataset import file_channel_dataset

    folder = tmp_path / "validation"
    folder.mkdir()
    (folder / "a.tfrecord").write_bytes(b"".join(encode_tfrecord(b"r%d" % i) for i in range(5)))
    batches = [b.numpy().tolist() for b in file_channel_dataset(folder, batch_size=2, drop_remainder=True)]
    assert batches == [[b"r0", b"r1"], [b"r2", b"r3"]]
    with pytest.raises(FileChannelError, match="max_corrupted_records_to_skip applies to Pipe mode only"):
        file_channel_dataset(folder, max_corrupted_records_to_skip=3)
    with pytest.raises(FileChannelError, match="unknown option"):
        file_channel_dataset(folder, batchsize=2)


def test_file_mode_recordio_errors_name_the_channel_as_text(tmp_path):
    from sagemaker_dist.runtime.tensorflow.data.file_dataset import file_channel_dataset

    folder = tmp_path / "eval"
    folder.mkdir()
    (folder / "x.rec").write_bytes(encode_recordio(b"whole")[:-3])  # truncated last record
    with pytest.raises(Exception, match=r"channel 'eval'|channel eval") as err:
        list(file_channel_dataset(folder, "RecordIO"))
    assert "b'eval'" not in str(err.value)


@pytest.mark.parametrize("claimed", [2**40, 2**64 - 16, 2**31])
def test_a_crafted_record_length_in_a_file_channel_is_the_named_error(tmp_path, claimed):
    """TensorFlow's TFRecordDataset dies of a 2**40 length (SIGSEGV); the channel's reader refuses it."""
    import struct

    from sagemaker_dist.contract.record_formats import masked_crc32c
    from sagemaker_dist.runtime.tensorflow.data.file_dataset import file_channel_dataset

    folder = tmp_path / "validation"
    folder.mkdir()
    header = struct.pack("<Q", claimed)
    (folder / "evil.tfrecord").write_bytes(
        encode_tfrecord(b"ok") + header + struct.pack("<I", masked_crc32c(header))
    )
    with pytest.raises(Exception, match=r"channel 'validation', epoch 0, byte offset 18") as err:
        list(file_channel_dataset(folder))
    assert "max_record_bytes" in str(err.value) or "stream ended inside a record" in str(err.value)


def test_file_mode_text_lines_and_the_record_limit(tmp_path):
    from sagemaker_dist.runtime.tensorflow.data.file_dataset import file_channel_dataset

    folder = tmp_path / "eval"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"one\r\ntwo\nthree")
    assert _records(file_channel_dataset(folder, "TextLine")) == [b"one", b"two", b"three"]
    (folder / "b.txt").write_bytes(b"x" * 100)
    with pytest.raises(Exception, match="max_record_bytes=50"):
        list(file_channel_dataset(folder, "TextLine", max_record_bytes=50))
