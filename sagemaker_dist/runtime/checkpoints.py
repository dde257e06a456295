"""Rank-0 checkpoints in ``<root>/checkpoints`` (which SageMaker syncs to S3) and resume from the newest.

Each checkpoint is a directory ``epoch-NNNNN`` (NNNNN = epochs completed), or ``epoch-NNNNN-step-SSSSSS``
for one written inside epoch NNNNN after SSSSSS of its steps (a stop, or a periodic step checkpoint),
holding a TensorFlow checkpoint of the model and optimizer plus ``meta.json`` listing every file and
its size. It is written under a ``.tmp-*`` name and renamed into place, so a crash or a half-synced
S3 copy never looks complete: a checkpoint counts only if its ``meta.json`` parses and every listed
file has the listed size. The files, the temporary directory and, after the rename, the checkpoint
directory are fsynced, so after a crash
of the host the rename is either there with its files or not there at all. Only rank 0 writes; at
start-up rank 0 picks the newest complete checkpoint and broadcasts its epoch so every rank passes
the same ``initial_epoch`` to ``fit`` (the weights follow through the usual Horovod broadcast).

A restore must match the model and optimizer it is loaded into: a checkpoint of another model (an old
job's, in a reused checkpoint location) would otherwise load in part and train on silently.
``restore_checkpoint`` fails when an existing variable has no value in the checkpoint (or another
shape), and ``Restored.assert_complete`` once the first step has made the optimizer's slots, when
every value in the checkpoint must have found its variable.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from sagemaker_dist.contract.paths import OptMl, opt_ml_root
from sagemaker_dist.errors import ConfigurationError

log = logging.getLogger(__name__)

META_FILE = "meta.json"
TF_PREFIX = "ckpt"
FORMAT_VERSION = 1
_NAME_RE = re.compile(r"^epoch-(\d{5,})(?:-step-(\d{6,}))?$")


class CheckpointMismatchError(ConfigurationError):
    """A checkpoint that does not match the model and optimizer it is restored into."""


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: ``epoch`` epochs and ``step`` steps of the next one were done when it was
    written; ``meta`` is its ``meta.json`` (a stop's adds ``records_consumed``, per rank)."""

    epoch: int
    path: Path
    step: int = 0
    meta: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def position(self) -> tuple[int, int]:
        """``(epoch, step)``: what orders checkpoints, newest last."""
        return self.epoch, self.step

    @property
    def tf_prefix(self) -> str:
        """The prefix ``tf.train.Checkpoint.restore`` takes."""
        return str(self.path / TF_PREFIX)


def checkpoint_dir(root: str | os.PathLike | None = None) -> Path:
    """``<root>/checkpoints``; root is the argument, else ``$SAGEMAKER_DIST_OPT_ML``, else ``/opt/ml``."""
    return OptMl(opt_ml_root(root)).checkpoint_dir


def _complete(path: Path) -> Checkpoint | None:
    match = _NAME_RE.match(path.name)
    if not match or not path.is_dir():
        return None
    try:
        meta = json.loads((path / META_FILE).read_text())
        files = meta["files"]
        epoch = int(meta["epoch"])
        step = int(meta.get("step", 0))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if epoch != int(match.group(1)) or step != int(match.group(2) or 0) or not files:
        return None
    for name, size in files.items():
        try:
            if (path / name).stat().st_size != size:
                return None
        except OSError:
            return None
    return Checkpoint(epoch=epoch, path=path, step=step, meta=meta)


def checkpoint_name(epoch: int, step: int = 0) -> str:
    """``epoch-NNNNN`` after whole epochs, ``epoch-NNNNN-step-SSSSSS`` inside one."""
    return f"epoch-{epoch:05d}" + (f"-step-{step:06d}" if step else "")


def list_checkpoints(directory: str | os.PathLike) -> list[Checkpoint]:
    """Complete checkpoints under ``directory``, oldest first (incomplete ones are skipped)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [c for c in (_complete(p) for p in directory.iterdir()) if c is not None]
    return sorted(found, key=lambda c: c.position)


def latest_checkpoint(directory: str | os.PathLike) -> Checkpoint | None:
    """The newest complete checkpoint, or None."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


def _fsync_tree(path: Path) -> None:
    for item in path.iterdir():
        with open(item, "rb") as fh:
            os.fsync(fh.fileno())
    _fsync_dir(path)  # the files' names in it


def _fsync_dir(path: Path) -> None:
    """Make a directory's entries durable (a rename is an entry of the directory it lands in)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / checkpoint_name(epoch, step)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=directory))
    try:
        optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        trackables = {"model": model} if optimizer is None else {"model": model, "optimizer": optimizer}
        tf.train.Checkpoint(**trackables).write(str(tmp / TF_PREFIX))
        files = {p.name: p.stat().st_size for p in tmp.iterdir()}
        meta = {
            **(extra or {}),
            "format": FORMAT_VERSION,
            "epoch": epoch,
            "step": step,
            "files": files,
            "written_at": time.time(),
            "host": socket.gethostname(),
            "rank": rank,
            "pid": os.getpid(),
        }
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True))
        _fsync_tree(tmp)
        if final.exists():  # same epoch written again (e.g. after a resume): swap, then drop the old one
            old = Path(tempfile.mkdtemp(prefix=f".old-{final.name}-", dir=directory))
            os.rename(final, old / final.name)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(directory)  # the rename itself: without it a host crash may lose epoch-N
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep is not None and keep > 0:
        for old_ckpt in list_checkpoints(directory)[:-keep]:
            shutil.rmtree(old_ckpt.path, ignore_errors=True)
    log.info("checkpoint for epoch %d%s written to %s", epoch, f" step {step}" if step else "", final)
    return Checkpoint(epoch=epoch, path=final, step=step, meta=meta)


def restore_checkpoint(model, checkpoint: Checkpoint, *, optimizer=None) -> Restored:
    """Load ``checkpoint`` into ``model`` and its optimizer, or raise ``CheckpointMismatchError`` naming
    the checkpoint when a variable that exists has no value there or another shape. Values whose
    variables do not exist yet (the optimizer's slots) load when they are made; call
    ``assert_complete()`` on the result once they are (after the first training step)."""
    import tensorflow as tf

    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    trackables = {"model": model} if optimizer is None else {"model": model, "optimizer": optimizer}
    restored = Restored(checkpoint)
    with restored.checking():
        # read(), not restore(): save_checkpoint writes with write(), which keeps no save counter
        restored.status = tf.train.Checkpoint(**trackables).read(checkpoint.tf_prefix)
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


def remove_stale_temporaries(directory: str | os.PathLike) -> None:
    """Delete ``.tmp-*``/``.old-*`` leftovers of a crashed writer (call on rank 0 before training).

    A writer that crashed between moving the old copy of an epoch aside and renaming the new one
    into place leaves no ``epoch-N`` but a complete ``.old-epoch-N-*/epoch-N``: that one is put back.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return
    for p in sorted(directory.iterdir()):
        if p.name.startswith(".old-epoch-"):
            for kept in p.iterdir():
                final = directory / kept.name
                if kept.name.startswith("epoch-") and (kept / META_FILE).is_file() and not final.exists():
                    os.rename(kept, final)
                    log.warning("restored %s from %s (its writer stopped mid-swap)", final, p.name)
    for p in directory.iterdir():
        if p.name.startswith((".tmp-epoch-", ".old-epoch-")):
            shutil.rmtree(p, ignore_errors=True)


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
    found = latest_checkpoint(directory) if rank == 0 else None
    epoch, step = _broadcast_from_rank0(found.position if found else (0, 0))
    return (int(epoch), int(step)), found


def checkpoint_callback(
    directory: str | os.PathLike,
    *,
    rank: int,
    resume_from: Checkpoint | None = None,
    keep: int | None = 3,
    every: int = 1,
):
    """A Keras callback that restores ``resume_from`` at train begin and saves every ``every`` epochs,
    on rank 0 only (on other ranks it does nothing): ``runtime.keras.callbacks.RankZeroCheckpoint``."""
    from sagemaker_dist.runtime.keras.callbacks import RankZeroCheckpoint  # loads TensorFlow

    return RankZeroCheckpoint(directory, rank=rank, resume_from=resume_from, keep=keep, every=every)
