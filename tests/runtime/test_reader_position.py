"""A TensorFlow script with its own loop resumes a shuffled epoch exactly (``ReaderPosition``): on real
FIFOs through both readers, the records trained before the stop and after the restart are the epoch's
records once each, in the order of the epoch had it not stopped."""

from __future__ import annotations

import pytest
from helpers.runtime_helpers import write_opt_ml
from helpers.shuffled_ids import window_order
from test_pipe_dataset import feed

from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.contract.record_formats import encode_tfrecord
from sagemaker_dist.runtime.config import ROOT_ENV
from sagemaker_dist.runtime.framing.shuffle import ShuffleWindow
from sagemaker_dist.runtime.ranks import RankInfo

tf = pytest.importorskip("tensorflow")

from sagemaker_dist.runtime import ReaderPosition, ReaderStateError, rank_dataset  # noqa: E402

pytestmark = pytest.mark.tensorflow

N, BATCH = 300, 10
WINDOW = ShuffleWindow(4, records=64)
RANK_1 = RankInfo(rank=1, local_rank=1, size=2, local_size=2)
STREAM = b"".join(encode_tfrecord(i.to_bytes(4, "little") * 25) for i in range(N))


def ids(batch) -> list[int]:
    return [int.from_bytes(r[:4], "little") for r in batch.numpy()]


def order(epoch: int) -> list[int]:
    return window_order(list(range(N)), [100] * N, WINDOW, 1, "train_1", epoch)


def attempt(root, monkeypatch, fifos: int):
    write_opt_ml(root, ["train_0", "train_1"], plan_layout(1, 2))
    monkeypatch.setenv(ROOT_ENV, str(root))
    feeder = feed(root, "train_1", [STREAM] * fifos)
    position = ReaderPosition(rank_info=RANK_1)  # before the dataset's first iteration
    return feeder, position, rank_dataset("train", rank_info=RANK_1, shuffle=WINDOW).batch(BATCH)


def test_a_loop_of_its_own_resumes_a_shuffled_epoch_training_each_record_once(
    tmp_path, monkeypatch, pipe_reader
):
    feeder, position, dataset = attempt(tmp_path / "one", monkeypatch, 2)
    first_epoch = [i for batch in dataset for i in ids(batch)]
    steps = iter(dataset)  # epoch 1: three steps, then the stop
    before = [i for _ in range(3) for i in ids(next(steps))]
    saved = position.state_dict(1, 3)
    del steps  # the stopped attempt's FIFO closes unread
    feeder.join(10)
    assert saved == {"epoch": 1, "step": 3, "fifo": 1, "head": saved["head"], "world_size": 2}
    assert isinstance(saved["head"], int)  # the stopped epoch's stream, as the reader noted it
    # the restarted job: a fresh tree, its FIFOs from _0 again
    feeder, position, dataset = attempt(tmp_path / "two", monkeypatch, 1)
    epoch, step = position.load_state_dict(saved)
    assert (epoch, step) == (1, 3)
    after = [i for batch in dataset.skip(step) for i in ids(batch)]
    feeder.join(10)
    assert feeder.error is None
    assert first_epoch == order(0)
    assert before + after == order(1)  # each record of the stopped epoch once, in its own order
    assert position.state_dict(1, 30)["head"] == saved["head"]  # the same stream again


def test_a_shuffled_file_mode_channel_resumes_its_epoch_exactly_too(tmp_path, monkeypatch):
    """File mode has no FIFOs, but a process's n-th read is shuffled as epoch n: the resumed job's first
    read must be shuffled as the epoch it resumes, or skipping the trained batches skips other records."""
    info = RankInfo(rank=0, local_rank=0, size=1, local_size=1)

    def job(name):
        root = write_opt_ml(tmp_path / name, {"train_0": "File"}, plan_layout(1, 1, input_mode="File"))
        (root / "input" / "data" / "train_0").mkdir(parents=True, exist_ok=True)
        (root / "input" / "data" / "train_0" / "part.tfrecord").write_bytes(STREAM)
        monkeypatch.setenv(ROOT_ENV, str(root))
        return ReaderPosition(rank_info=info), rank_dataset("train", rank_info=info, shuffle=WINDOW).batch(
            BATCH
        )

    _, dataset = job("whole")
    epochs = [[i for batch in dataset for i in ids(batch)] for _ in range(3)]
    assert len({tuple(e) for e in epochs}) == 3 and all(sorted(e) == list(range(N)) for e in epochs)
    position, dataset = job("stopped")
    [i for batch in dataset for i in ids(batch)]  # epoch 0
    steps = iter(dataset)
    before = [i for _ in range(4) for i in ids(next(steps))]
    saved = position.state_dict(1, 4)
    assert saved == {"epoch": 1, "step": 4, "fifo": None, "head": None, "world_size": 1}
    position, dataset = job("resumed")
    assert position.load_state_dict(saved) == (1, 4)
    after = [i for batch in dataset.skip(4) for i in ids(batch)]
    assert before + after == epochs[1]  # the stopped epoch's records once each, in its order
    assert [i for batch in dataset for i in ids(batch)] == epochs[2]  # and the next epoch as epoch 2


def test_another_world_size_resumes_at_the_next_epoch_and_a_bad_state_is_refused(
    tmp_path, monkeypatch, capsys
):
    write_opt_ml(tmp_path, ["train_0", "train_1"], plan_layout(1, 2))
    monkeypatch.setenv(ROOT_ENV, str(tmp_path))
    chief = ReaderPosition(rank_info=RankInfo(rank=0, local_rank=0, size=2, local_size=2))
    assert chief.load_state_dict({"epoch": 2, "step": 9, "world_size": 4}) == (3, 0)
    assert "by 4 rank(s) and this job runs 2" in capsys.readouterr().out
    for bad in ({"step": 3}, {"epoch": "x", "step": 1}, None, {"epoch": -1, "step": 0}):
        with pytest.raises(ReaderStateError, match="state_dict|>= 0"):
            chief.load_state_dict(bad)
