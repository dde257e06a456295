"""What ``PipeTraining`` saves of its reader with a checkpoint, and how its reader resumes from it.

- Each epoch ``PipeTraining`` tells its reader which epoch it is (``set_epoch``: the shuffle's order is
  that epoch's, whatever FIFO carries it).
- On the resumed epoch (a stop or a step checkpoint inside it) the reader itself drops the records of
  the batches already trained, read and not decoded: the stream replays the same records and the
  window's order is a function of the seed, the epoch, the rank and the stream, so they are exactly
  the records trained. Where the channel's objects come in another order each epoch (ShuffleConfig),
  the reader first replays the FIFOs up to the one the stopped epoch read (``epoch_reader.order``).
- A checkpoint of another world size (a relaunch with another instance count) resumes at the next
  epoch's start, with one line saying which records of the stopped epoch are not trained: each rank's
  stream is another then, so a count of batches trained names no records of it.
"""

from __future__ import annotations

from sagemaker_dist.runtime.torch.batches import PipeBatches
from sagemaker_dist.runtime.training_session import other_world_move


def reader_checkpoint(reader) -> dict | None:
    """The reader's part of a checkpoint (plain values): the FIFO its current epoch reads, and that
    stream's head (whose rank)."""
    if not isinstance(reader, PipeBatches):
        return None
    position = reader.position
    return {"epoch": position.epoch, "fifo": position.fifo, "head": position.head, "rank": reader.rank}


def begin_epoch(reader, epoch: int, skip_batches: int, saved: dict | None) -> int:
    """Before ``PipeTraining``'s epoch ``epoch`` over ``reader``: our readers take the epoch, and on the
    resumed epoch drop the ``skip_batches`` batches trained themselves (``saved``: the checkpoint's
    ``reader_checkpoint``, for the FIFO to replay to). Returns the batches the agreement must still
    read and drop: 0 for our readers, ``skip_batches`` for any other iterable."""
    if not isinstance(reader, PipeBatches):
        return skip_batches
    if not skip_batches:
        reader.set_epoch(epoch)
        return 0
    saved = saved if (saved or {}).get("epoch") == epoch else {}
    state = reader.state_dict()
    state.update(epoch=epoch, records=skip_batches * reader.batch_size, fifo=saved.get("fifo"))
    # the saving rank's stream head: that rank's reader checks the stream it replays against it
    state.update(head=saved.get("head"), rank=saved.get("rank"))
    reader.load_state_dict(state)
    return 0


def resume_point(job, epoch: int, step: int, extra: dict) -> tuple[int, int, str | None]:
    """Where a job resumes from a checkpoint at (``epoch``, ``step``) written with ``extra``: there, or,
    inside an epoch written by another number of ranks, at the next epoch's start, with the line that
    says so (None when nothing changes)."""
    return other_world_move(epoch, step, (extra or {}).get("world_size"), job.world_size)
