"""The Keras helpers' reader resume (``tensorflow/keras/reader_resume.py``) on a real /opt/ml tree and
FIFOs: the FIFO a step checkpoint keeps, the replay to it where the layout has a ShuffleConfig, the epoch
base the readers shuffle by, and another world size resuming at the next epoch with its line."""

from __future__ import annotations

from helpers.runtime_helpers import FifoFeeder, write_opt_ml

from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.runtime.epoch_reader.epochs import next_epoch_fifo
from sagemaker_dist.runtime.epoch_reader.order import epoch_base, write_head
from sagemaker_dist.runtime.tensorflow.keras.reader_resume import TrainReader


def test_a_step_checkpoint_keeps_the_fifo_and_a_resume_replays_to_it_and_bases_the_epoch(tmp_path):
    root = write_opt_ml(tmp_path / "one", ["train_0", "train_1"], plan_layout(1, 2, shuffle_seed=3))
    reader = TrainReader.of(root, 1, 1, 2)
    assert reader is not None and reader.channel == "train_1"
    assert reader.checkpoint() == {"reader": {"fifo": None, "head": None, "world_size": 2}}  # none read yet
    feeder = FifoFeeder(root / "input" / "data", "train_1", [b"a", b"b", b"c"])
    feeder.start()
    for _ in range(2):  # epochs 0 and 1 read: the epoch under way reads FIFO 1
        number, path = next_epoch_fifo(root / "pipe_state", root / "input" / "data", "train_1", 10)
        path.read_bytes()
    feeder.join(10)
    write_head(root / "pipe_state", "train_1", 1, 0xABC)  # as the reader of FIFO 1 noted it
    saved = reader.checkpoint()["reader"]
    assert saved == {"fifo": 1, "head": 0xABC, "world_size": 2}
    # the restarted job: a fresh tree, FIFOs from _0 again
    again = write_opt_ml(tmp_path / "two", ["train_0", "train_1"], plan_layout(1, 2, shuffle_seed=3))
    feeder = FifoFeeder(again / "input" / "data", "train_1", [b"a", b"b", b"c"])
    feeder.start()
    resumed = TrainReader.of(again, 1, 1, 2)
    assert resumed.resume(1, 7, saved, chief=True) == (1, 7)
    assert feeder.wait_served(1) >= 1  # FIFO 0 opened and closed unread
    number, path = next_epoch_fifo(again / "pipe_state", again / "input" / "data", "train_1", 10)
    assert number == 1 and path.read_bytes() == b"b"
    assert epoch_base(again / "pipe_state", "train_1") == 0  # FIFO 1 is epoch 1
    feeder.join(10)
    assert not resumed.check_head()  # the resumed stream's head not noted yet
    write_head(again / "pipe_state", "train_1", 1, 0xABC)  # the same records again: nothing said
    assert resumed.check_head() and resumed.expected is None


def test_a_resumed_stream_that_begins_with_other_records_is_said_in_a_line(tmp_path, capsys):
    root = write_opt_ml(tmp_path, ["train_0"], plan_layout(1, 1))
    reader = TrainReader.of(root, 0, 0, 1)
    assert reader.resume(2, 5, {"fifo": 2, "head": 7, "world_size": 1}, chief=True) == (2, 5)
    write_head(root / "pipe_state", "train_0", 0, 8)  # FIFO 0, read for epoch 3, began otherwise
    assert reader.check_head()
    line = capsys.readouterr().out
    assert "train_0_0, read for epoch 3 after a restart, does not start with the records" in line
    assert "stopped attempt's train_0_2" in line and "5 step(s) of batches" in line


def test_without_a_shuffle_config_the_first_fifo_is_read_as_the_resumed_epoch(tmp_path):
    root = write_opt_ml(tmp_path, ["train_0"], plan_layout(1, 1))
    reader = TrainReader.of(root, 0, 0, 1)
    assert reader.resume(4, 3, {"fifo": 2, "world_size": 1}, chief=True) == (4, 3)
    assert epoch_base(root / "pipe_state", "train_0") == 4  # FIFO 0 shuffled as epoch 4, none replayed


def test_another_world_size_resumes_at_the_next_epoch_with_one_line(tmp_path, capsys):
    root = write_opt_ml(tmp_path, ["train_0", "train_1", "train_2"], plan_layout(1, 3))
    reader = TrainReader.of(root, 0, 0, 3)
    assert reader.resume(2, 9, {"fifo": 0, "world_size": 2}, chief=True) == (3, 0)
    line = capsys.readouterr().out
    assert "written inside epoch 3 (after step 9) by 2 rank(s) and this job runs 3" in line
    assert "resuming at the start of epoch 4" in line
    assert epoch_base(root / "pipe_state", "train_0") == 3
    assert reader.resume(2, 0, {"fifo": 0, "world_size": 2}, chief=True) == (2, 0)  # an epoch's start


def test_no_train_reader_without_a_layout_and_in_file_mode_a_base_without_fifos(tmp_path):
    assert TrainReader.of(write_opt_ml(tmp_path / "a", ["train_0"]), 0, 0, 1) is None
    file_mode = write_opt_ml(tmp_path / "b", {"train_0": "File"}, plan_layout(1, 1, input_mode="File"))
    reader = TrainReader.of(file_mode, 0, 0, 1)
    assert reader.checkpoint() == {"reader": {"fifo": None, "head": None, "world_size": 1}}
    assert reader.resume(3, 5, reader.checkpoint()["reader"], chief=True) == (3, 5)
    assert epoch_base(file_mode / "pipe_state", "train_0") == 3  # its first read is shuffled as epoch 3


def test_a_shuffle_after_the_reader_is_named_once_on_the_chief(capsys):
    """A tf.data .shuffle after the reader makes a resume inside an epoch train records twice: the
    helpers' train_epoch says so on the chief, once, instead of the job ending 0 silently."""
    import tensorflow as tf

    from sagemaker_dist.runtime.tensorflow.keras.reader_resume import shuffled_after_the_reader
    from sagemaker_dist.runtime.tensorflow.keras.surface import FitSurface

    records = tf.data.Dataset.range(16)
    assert not shuffled_after_the_reader(records.map(tf.identity).batch(4).prefetch(1))
    shuffled = records.shuffle(8).map(tf.identity).batch(4).prefetch(1)
    assert shuffled_after_the_reader(shuffled)
    assert shuffled_after_the_reader(tf.data.Dataset.zip((records, records.shuffle(4))))

    class Helper(FitSurface):
        def __init__(self, rank):
            self.rank = rank

    chief, other = Helper(0), Helper(1)
    for _ in range(2):  # every epoch's train_epoch asks; the line comes once
        chief.check_order(shuffled)
        other.check_order(shuffled)
    out = capsys.readouterr().out
    assert out.count("shuffles after the reader (a tf.data .shuffle)") == 1, out
    assert "rank_dataset(..., shuffle=ShuffleWindow(seed))" in out
