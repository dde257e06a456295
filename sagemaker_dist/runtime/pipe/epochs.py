"""Which FIFO an iteration reads: the per-channel epoch counter every process on the host shares.

SageMaker creates ``<channel>_<n>`` for the n-th pass over a channel; each new iteration of a
PipeModeDataset (``.repeat()``, Keras epochs, a second dataset on the same channel) must open the
next one. The counter is a file in ``<state_dir>/<channel>`` under flock, as AWS's reader keeps it.
"""

from __future__ import annotations

import fcntl
from pathlib import Path


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
