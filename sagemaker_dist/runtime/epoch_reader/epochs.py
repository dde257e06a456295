"""Which FIFO an iteration reads: the per-channel epoch counter every process on the host shares.

SageMaker creates ``<channel>_<n>`` for the n-th pass over a channel; each new iteration of a
PipeModeDataset (``.repeat()``, Keras epochs, a second dataset on the same channel) must open the
next one. The counter is a file in ``<state_dir>/<channel>`` under flock, as AWS's reader keeps it.
"""

from __future__ import annotations

import fcntl
from pathlib import Path

from sagemaker_dist.runtime.fifo import fifo_path, wait_for_fifo


def update_epoch(state_dir: Path, channel: str, undo: int | None = None) -> int:
    """Take the next epoch number of ``channel`` (shared by every process on the host, under flock).

    With ``undo=n``, give epoch ``n`` back if it is still the last one taken (its FIFO never came).
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / channel, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.seek(0)
            text = f.read().strip()
            current = int(text) if text else 0
            if undo is None:
                new = current + 1
            else:
                new = undo if current == undo + 1 else current
            f.seek(0)
            f.truncate()
            f.write(str(new))
            f.flush()
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
    return current


def current_epoch(state_dir: Path, channel: str) -> int:
    """The epoch number ``channel``'s next iteration will take (0 before any), without taking it."""
    try:
        with open(Path(state_dir) / channel) as f:
            fcntl.flock(f, fcntl.LOCK_SH)
            try:
                text = f.read().strip()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)
    except FileNotFoundError:
        return 0
    return int(text) if text else 0


def next_epoch_fifo(state_dir: Path, pipe_dir, channel: str, timeout: float) -> tuple[int, Path]:
    """This channel's next epoch and its FIFO, once the FIFO is there; the epoch is given back if it
    never comes (a retry waits for the same FIFO)."""
    epoch = update_epoch(state_dir, channel)
    try:
        return epoch, wait_for_fifo(fifo_path(pipe_dir, channel, epoch), timeout)
    except Exception:
        update_epoch(state_dir, channel, undo=epoch)
        raise
