"""Where a TensorFlow script with its own training loop is in its train channel, for its checkpoints.

The Keras helpers keep the train channel's position themselves (``keras/reader_resume.py``). A script that
writes its own loop over ``rank_dataset`` (a ``tf.function`` step, a ``GradientTape``) keeps it with a
``ReaderPosition``: ``state_dict(epoch, step)`` goes into its checkpoint; on a restart,
``load_state_dict(saved)`` before the dataset's first iteration replays and bases the channel (each FIFO
is shuffled as the epoch it carries, and under a ShuffleConfig the resumed epoch streams the same
objects again), so skipping the ``step`` batches trained skips exactly those records.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from sagemaker_dist.runtime.epoch_reader.order import ReaderStateError
from sagemaker_dist.runtime.ranks import RankInfo


class ReaderPosition:
    """This rank's place in its ``role`` channel (the one ``rank_dataset(role)`` reads), for a loop of
    the script's own; make it where the script makes the dataset, before the dataset's first iteration."""

    def __init__(self, role: str = "train", *, root: str | os.PathLike | None = None, rank_info=None):
        from sagemaker_dist.runtime.config import ContainerConfig
        from sagemaker_dist.runtime.ranks import check_rank_channels
        from sagemaker_dist.runtime.tensorflow.keras.horovod_world import HorovodRankInfo
        from sagemaker_dist.runtime.tensorflow.keras.reader_resume import TrainReader

        config = ContainerConfig.load(root)
        info: RankInfo = rank_info or HorovodRankInfo.detect()
        channel = check_rank_channels(config, info, role, input_modes=("Pipe", "File"))
        self.rank, self.size, self.channel = info.rank, info.size, channel
        self.reader = TrainReader(config, channel, info.size)  # in File mode: no FIFO, a base all the same

    def state_dict(self, epoch: int, step: int) -> dict:
        """What a checkpoint written after ``step`` batches of epoch ``epoch`` (counted from 0) keeps:
        those two, the FIFO the epoch reads, its stream's head and the world size. (On a resumed job's
        chief it also says, in one line, where the resumed stream began with other records.)"""
        self.reader.check_head()
        return {"epoch": int(epoch), "step": int(step), **self.reader.checkpoint()["reader"]}

    def load_state_dict(self, state: Mapping) -> tuple[int, int]:
        """On every rank, with the state the checkpoint holds (rank 0's where only it saves), before the
        dataset's first iteration: ``(epoch, step)`` to resume at. Start the loop at ``epoch`` and skip
        ``step`` batches of its dataset (``dataset.skip(step)``). A checkpoint written inside an epoch by
        another number of ranks resumes at the next epoch's start, as rank 0 says in one line."""
        epoch, step = _position(state)
        return self.reader.resume(epoch, step, dict(state), chief=self.rank == 0)


def _position(state) -> tuple[int, int]:
    """``state``'s (epoch, step), or a ``ReaderStateError`` naming what to pass."""
    try:
        epoch, step = int(state["epoch"]), int(state["step"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ReaderStateError(
            f"not a reader position: {state!r:.200}; pass what ReaderPosition.state_dict(epoch, step) "
            "returned, as the checkpoint kept it"
        ) from exc
    if epoch < 0 or step < 0:
        raise ReaderStateError(f"a reader position of epoch {epoch}, step {step}: both must be >= 0")
    return epoch, step
