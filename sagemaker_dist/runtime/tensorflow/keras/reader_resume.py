"""The Keras helpers' side of the readers' resume: what a step checkpoint keeps of the rank's train
channel, and what a resumed job does with it before ``fit`` opens the channel's first FIFO.

- Every FIFO of the train channel is shuffled (``rank_dataset(..., shuffle=)``) as the epoch it carries:
  a resumed job writes the channel's epoch base (``pipe.order.set_epoch_base``), so its first FIFO is
  read as the epoch it resumes, whatever its number.
- A step checkpoint (a stop's included) keeps the FIFO number the epoch reads. On a resume inside that
  epoch, where the channel's objects come in another order each epoch (ShuffleConfig), the FIFOs before
  it are opened and closed unread first (``pipe.order.replay_fifos``): the resumed epoch reads the same
  records in the same order, and skipping the trained batches skips exactly them.
- A checkpoint inside an epoch written by another number of ranks resumes at the next epoch's start,
  with one line saying so: each rank reads another stream, so no count of batches names its records.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sagemaker_dist.runtime.epoch_reader.epochs import current_epoch
from sagemaker_dist.runtime.epoch_reader.order import (
    head_mismatch_line,
    read_head,
    replay_fifos,
    set_epoch_base,
)
from sagemaker_dist.runtime.fifo import DEFAULT_FIFO_TIMEOUT
from sagemaker_dist.runtime.training_session import other_world_move


@dataclass
class TrainReader:
    """This rank's train channel in Pipe mode (``config``: its ``ContainerConfig``)."""

    config: object
    channel: str
    size: int

    @classmethod
    def of(cls, root, rank: int, local_rank: int, size: int) -> TrainReader | None:
        """The rank's train channel where the job has a layout: in Pipe mode, or in File mode (no FIFO to
        replay; its reads are shuffled as the epochs the base says, ``file_channel_dataset``)."""
        from sagemaker_dist.runtime.config import ContainerConfig

        try:
            config = ContainerConfig.load(root)
            layout = config.layout
            channel = layout.channel_for("train", rank, local_rank) if layout is not None else None
        except Exception:  # no layout, no train role: the start-up check speaks for those
            return None
        if channel is None or config.input_mode(channel) not in ("Pipe", "File"):
            return None
        return cls(config, channel, size)

    expected: tuple | None = None  # (head, its FIFO, epoch, step) of the stopped epoch's stream, to check
    first_fifo: int = 0  # the FIFO the resumed epoch reads

    def checkpoint(self) -> dict:
        """What a step checkpoint keeps: the FIFO the epoch under way reads, its stream's head (the
        readers note it, ``pipe.order.write_head``), and the world size."""
        state = Path(self.config.pipe_state_dir)
        fifo = current_epoch(state, self.channel) - 1
        head = read_head(state, self.channel, fifo) if fifo >= 0 else None
        return {"reader": {"fifo": fifo if fifo >= 0 else None, "head": head, "world_size": self.size}}

    def check_head(self) -> bool:
        """After a resume inside an epoch (on the rank whose checkpoint it is): once the resumed epoch's
        stream head is noted, compare it with the stopped one's and say so in a line where they differ.
        True once checked (or nothing to check)."""
        if self.expected is None:
            return True
        head = read_head(Path(self.config.pipe_state_dir), self.channel, self.first_fifo)
        if head is None:
            return False
        saved, fifo, epoch, step = self.expected
        self.expected = None
        if head != saved:
            print(
                head_mismatch_line(self.channel, self.first_fifo, fifo, epoch, f"{step} step(s) of batches")
            )
        return True

    def resume(self, epoch: int, step: int, saved: dict | None, chief: bool, timeout=DEFAULT_FIFO_TIMEOUT):
        """Before ``fit``: where the job resumes (``epoch``, ``step``), replayed and based as above;
        returns the (epoch, step) to resume at."""
        saved = saved or {}
        epoch, step, moved = other_world_move(epoch, step, saved.get("world_size"), self.size)
        if moved and chief:
            print(moved, flush=True)
        if step and saved.get("fifo") is not None:
            replay_fifos(self.config, self.channel, int(saved["fifo"]), timeout)
        state = Path(self.config.pipe_state_dir)
        self.first_fifo = current_epoch(state, self.channel)
        if step and chief and saved.get("head") is not None:  # the chief's stream is the one it saved
            self.expected = (int(saved["head"]), saved.get("fifo"), epoch, step)
        base = epoch - current_epoch(state, self.channel)  # the next FIFO read is this epoch
        if base:
            set_epoch_base(state, self.channel, base)
        return epoch, step


def resume_reader(root, rank: int, local_rank: int, size: int, position, found, share=None):
    """``(reader, (epoch, step))``: the rank's ``TrainReader`` (None off Pipe mode), and where the job
    resumes once it replayed and based the channel for ``position`` (the checkpoint's, ``found``).
    ``share``: rank 0's reader state on every rank (a collective: called on every rank alike, whenever
    the job resumes), for the ranks that do not hold the checkpoint; None where every rank holds it."""
    reader = TrainReader.of(root, rank, local_rank, size)
    epoch, step = position
    if not (epoch or step):
        return reader, (epoch, step)
    saved = (found.meta.get("reader") if found is not None else None) or None
    if share is not None:
        saved = share(saved)
    if reader is not None:
        epoch, step = reader.resume(epoch, step, saved, chief=rank == 0)
    return reader, (epoch, step)


SHUFFLED_AFTER_THE_READER = (
    "sagemaker-dist: the train dataset shuffles after the reader (a tf.data .shuffle): a resume inside an "
    "epoch skips the batches trained before the stop by their place, so unless that shuffle replays the "
    "same order in a new process, the stopped epoch trains some records twice and others never. Shuffle "
    "in the reader instead, rank_dataset(..., shuffle=ShuffleWindow(seed)), which resumes exactly"
)
SHUFFLES = {"_ShuffleDataset", "_ShuffleAndRepeatDataset"}  # tf.data's classes for .shuffle (TF 2.12-2.21)


def shuffled_after_the_reader(batches) -> bool:
    """Whether the ``tf.data`` pipeline ``batches`` has a ``.shuffle`` anywhere (the readers' own shuffle
    is not one: it happens in the reader, in an order a resume replays); False where its inputs cannot be
    walked (a check must not stop the training)."""
    stack, seen = [batches], set()
    try:
        while stack:
            dataset = stack.pop()
            if id(dataset) in seen:
                continue
            seen.add(id(dataset))
            if type(dataset).__name__ in SHUFFLES:
                return True
            inputs = getattr(dataset, "_inputs", None)
            stack.extend(inputs() if callable(inputs) else ())
    except Exception:  # noqa: BLE001 - a private API of tf.data: whatever it does, train on
        return False
    return False
