"""The checkpoint directory every framework writes: names, ``meta.json``, completeness, the atomic write.

Checkpoints live in ``<root>/checkpoints`` (which SageMaker syncs to S3). Each is a directory
``epoch-NNNNN`` (NNNNN = epochs completed), or ``epoch-NNNNN-step-SSSSSS`` for one written inside epoch
NNNNN after SSSSSS of its steps (a stop, or a periodic step checkpoint), holding the framework's files
plus ``meta.json`` listing every file and its size. ``write_checkpoint`` writes it under a ``.tmp-*``
name and renames it into place, so a crash or a half-synced S3 copy never looks complete: a checkpoint
counts only if its ``meta.json`` parses and every listed file has the listed size. The files, the
temporary directory and, after the rename, the checkpoint directory are fsynced, so after a crash of
the host the rename is either there with its files or not there at all.

What goes into the directory is the framework side's: ``tensorflow/keras/checkpoints.py`` (a TensorFlow
checkpoint of model and optimizer) and ``torch/checkpointing.py`` (``state.pt``). Nothing here imports a
framework.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sagemaker_dist.contract.paths import OptMl, opt_ml_root
from sagemaker_dist.errors import ConfigurationError

log = logging.getLogger(__name__)

META_FILE = "meta.json"
TF_PREFIX = "ckpt"  # the TensorFlow side's files in a checkpoint: ckpt.index, ckpt.data-*
CHECKPOINT_NAME_RE = re.compile(r"^epoch-(\d{5,})(?:-step-(\d{6,}))?$")


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
        """The prefix ``tf.train.Checkpoint.restore`` takes (a TensorFlow side's checkpoint)."""
        return str(self.path / TF_PREFIX)


def checkpoint_dir(root: str | os.PathLike | None = None) -> Path:
    """``<root>/checkpoints``; root is the argument, else ``$SAGEMAKER_DIST_OPT_ML``, else ``/opt/ml``."""
    return OptMl(opt_ml_root(root)).checkpoint_dir


def complete_checkpoint(
    name: str, location, read_meta: Callable[[], bytes | str], size_of: Callable[[str], int | None]
) -> Checkpoint | None:
    """The checkpoint ``name`` at ``location`` if it is complete, else None: its ``meta.json`` parses,
    names the epoch and step its name says and lists files, each found at the listed size. The one rule
    for a checkpoint directory and for a checkpoint's prefix in S3."""
    match = CHECKPOINT_NAME_RE.match(name)
    if not match:
        return None
    try:
        meta = json.loads(read_meta())
        files = meta["files"]
        epoch = int(meta["epoch"])
        step = int(meta.get("step", 0))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (epoch, step) != (int(match.group(1)), int(match.group(2) or 0)) or not isinstance(files, dict):
        return None
    if not files or any(size_of(file) != size for file, size in files.items()):
        return None
    return Checkpoint(epoch=epoch, path=location, step=step, meta=meta)


def _complete(path: Path) -> Checkpoint | None:
    if not path.is_dir():
        return None

    def size_of(name: str) -> int | None:
        try:
            return (path / name).stat().st_size
        except OSError:
            return None

    return complete_checkpoint(path.name, path, (path / META_FILE).read_bytes, size_of)


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
    fsync_dir(path)  # the files' names in it


def fsync_dir(path: Path) -> None:
    """Make a directory's entries durable (a rename is an entry of the directory it lands in)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(
    directory: str | os.PathLike,
    epoch: int,
    step: int,
    write_files: Callable[[Path], None],
    meta: dict,
    *,
    keep: int | None = 3,
) -> Checkpoint:
    """Write the checkpoint of ``epoch`` whole epochs and ``step`` steps of the next atomically: the
    framework's ``write_files(tmp)`` fills a temporary directory, ``meta.json`` (``meta`` with the
    position, every file's size and the time) goes beside its files, everything is fsynced and renamed
    into place (a checkpoint of the same position is swapped). Then prune to the newest ``keep``."""
    epoch, step = int(epoch), int(step)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / checkpoint_name(epoch, step)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=directory))
    try:
        write_files(tmp)
        files = {p.name: p.stat().st_size for p in tmp.iterdir()}
        meta = {**meta, "epoch": epoch, "step": step, "files": files, "written_at": time.time()}
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1, sort_keys=True))
        _fsync_tree(tmp)
        install_directory(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune_checkpoints(directory, keep)
    log.info("checkpoint for epoch %d%s written to %s", epoch, f" step {step}" if step else "", final)
    return Checkpoint(epoch=epoch, path=final, step=step, meta=meta)


def install_directory(tmp: Path, final: Path) -> None:
    """Rename the filled (and fsynced) ``tmp`` to ``final``, durably; a ``final`` already there (the same
    position written again, e.g. after a resume) is moved aside first and dropped after the swap."""
    directory = final.parent
    if final.exists():
        old = Path(tempfile.mkdtemp(prefix=f".old-{final.name}-", dir=directory))
        os.rename(final, old / final.name)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    fsync_dir(directory)  # the rename itself: without it a host crash may lose epoch-N


def prune_checkpoints(directory: str | os.PathLike, keep: int | None) -> list[Checkpoint]:
    """Delete all but the newest ``keep`` complete checkpoints (None or 0: keep all); returns the kept."""
    found = list_checkpoints(directory)
    if keep is None or keep <= 0:
        return found
    for old_ckpt in found[:-keep]:
        shutil.rmtree(old_ckpt.path, ignore_errors=True)
    return found[-keep:]


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
