"""Rank-0 TensorFlow checkpoints of model and optimizer, and resume from the newest.

A checkpoint is a directory of the framework-neutral format (``runtime/checkpoint_format.py``: names,
``meta.json``, the atomic write) holding a TensorFlow checkpoint of the model and optimizer. Only rank 0
writes; at start-up rank 0 picks the newest complete checkpoint and broadcasts its epoch so every rank
passes the same ``initial_epoch`` to ``fit`` (the weights follow through the usual Horovod broadcast).

A restore must match the model and optimizer it is loaded into: a checkpoint of another model (an old
job's, in a reused checkpoint location) would otherwise load in part and train on silently.
``restore_checkpoint`` fails when an existing variable has no value in the checkpoint (or another
shape), and ``Restored.assert_complete`` once the first step has made the optimizer's slots, when
every value in the checkpoint must have found its variable. TensorFlow and Horovod load when a
function here runs, not when it is imported.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from sagemaker_dist.runtime.checkpoint_format import (
    TF_PREFIX,
    Checkpoint,
    CheckpointMismatchError,
    write_checkpoint,
)
from sagemaker_dist.runtime.training_session import newest_position

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


def _trackables(model, optimizer) -> dict:
    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    return {"model": model} if optimizer is None else {"model": model, "optimizer": optimizer}


def save_checkpoint(
    model,
    directory: str | os.PathLike,
    epoch: int,
    *,
    optimizer=None,
    keep: int | None = 3,
    rank: int = 0,
    step: int = 0,
    extra: dict | None = None,
) -> Checkpoint:
    """Write model (and optimizer) state for ``epoch`` completed epochs (and ``step`` steps of the next)
    atomically; prune to ``keep``. ``rank`` is recorded in ``meta.json`` so a run can be audited for
    rank-0-only writes; ``extra`` goes into it as well (a stop's records consumed per rank)."""
    import tensorflow as tf

    checkpoint = tf.train.Checkpoint(**_trackables(model, optimizer))
    meta = {
        **(extra or {}),
        "format": FORMAT_VERSION,
        "host": socket.gethostname(),
        "rank": rank,
        "pid": os.getpid(),
    }
    return write_checkpoint(
        directory, epoch, step, lambda tmp: checkpoint.write(str(tmp / TF_PREFIX)), meta, keep=keep
    )


def restore_checkpoint(model, checkpoint: Checkpoint, *, optimizer=None) -> Restored:
    """Load ``checkpoint`` into ``model`` and its optimizer, or raise ``CheckpointMismatchError`` naming
    the checkpoint when a variable that exists has no value there or another shape. Values whose
    variables do not exist yet (the optimizer's slots) load when they are made; call
    ``assert_complete()`` on the result once they are (after the first training step)."""
    import tensorflow as tf

    restored = Restored(checkpoint)
    with restored.checking():
        # read(), not restore(): save_checkpoint writes with write(), which keeps no save counter
        restored.status = tf.train.Checkpoint(**_trackables(model, optimizer)).read(checkpoint.tf_prefix)
        restored.status.assert_existing_objects_matched()
    log.info("resumed from %s (epoch %d, step %d)", checkpoint.path, checkpoint.epoch, checkpoint.step)
    return restored


@dataclass
class Restored:
    """A restore in progress: ``assert_complete()`` checks that every value in the checkpoint found its
    variable, once the model and optimizer have made them all (after the first training step)."""

    checkpoint: Checkpoint
    status: object = None

    def assert_complete(self) -> None:
        with self.checking():
            self.status.assert_consumed()

    @contextmanager
    def checking(self):
        """TensorFlow's mismatch errors (AssertionError, ValueError) as one that names the checkpoint."""
        try:
            yield
        except (AssertionError, ValueError) as exc:
            detail = " ".join(str(exc).split())
            detail = detail if len(detail) <= 400 else detail[:400] + " ..."
            raise CheckpointMismatchError(
                f"checkpoint {self.checkpoint.path} (epoch {self.checkpoint.epoch}) does not match this "
                f"model and optimizer: {detail}. It was written by another model or optimizer (e.g. an "
                "earlier job's, in a reused checkpoint location). Resume from checkpoints of this model: "
                "give the job a fresh checkpoint location (checkpoint_s3_uri), or delete the epoch-* "
                f"directories in {self.checkpoint.path.parent} to start at epoch 0; or build the model "
                "and optimizer as the job that wrote it did"
            ) from exc


def writing_dir(chief: bool, directory: str | os.PathLike):
    """Where a worker writes its checkpoint: ``directory`` on the chief, a temporary one elsewhere
    (removed on exit): TensorFlow's multi-worker pattern, where every worker saves, one copy is kept."""
    if chief:
        return nullcontext(directory)
    return tempfile.TemporaryDirectory(prefix="sagemaker-dist-worker-ckpt-")


def _broadcast_from_rank0(value):
    """Rank 0's ``value`` on every rank when Horovod runs with more than one process; else ``value``."""
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return value
    if not hvd.is_initialized() or hvd.size() == 1:
        return value
    return hvd.broadcast_object(value, root_rank=0, name="sagemaker_dist_resume_epoch")


def resume_point(directory: str | os.PathLike, *, rank: int) -> tuple[int, Checkpoint | None]:
    """``(initial_epoch, checkpoint)``: rank 0 picks the newest complete checkpoint and every rank gets
    its epoch (a collective when Horovod is initialised, so call it on all ranks). Other ranks get no
    checkpoint: they receive rank 0's weights by broadcast. ``resume_position`` adds the step."""
    (epoch, _), found = resume_position(directory, rank=rank)
    return epoch, found


def resume_position(directory: str | os.PathLike, *, rank: int) -> tuple[tuple[int, int], Checkpoint | None]:
    """``((epoch, step), checkpoint)``: as ``resume_point``, with the steps of that epoch already done
    (every rank skips that many batches of its first epoch); one broadcast."""
    return newest_position(directory, rank=rank, broadcast=_broadcast_from_rank0)
