"""Pipe-mode FIFOs: ``<pipe_dir>/<channel>_<epoch>``; wait for one to appear, then read it in big chunks.

SageMaker creates ``<channel>_<n+1>`` only after ``<channel>_<n>`` was opened and closed, so the
next epoch's FIFO may not exist yet when a reader looks: poll with a timeout and fail clearly.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import stat
import time
from pathlib import Path

from sagemaker_dist.contract.paths import fifo_name
from sagemaker_dist.errors import DataError

DEFAULT_FIFO_TIMEOUT = 120.0  # seconds; what AWS's reader waits too
PIPE_BUFFER_BYTES = 1 << 20  # ask the kernel for a 1 MiB pipe buffer: fewer, larger reads
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


class FifoTimeoutError(DataError):
    """A Pipe-mode FIFO did not appear in time."""


def fifo_path(pipe_dir: str | os.PathLike, channel: str, epoch: int) -> Path:
    return Path(pipe_dir) / fifo_name(channel, epoch)


def wait_for_fifo(
    path: str | os.PathLike, timeout: float = DEFAULT_FIFO_TIMEOUT, poll_interval: float = 0.05
) -> Path:
    """Return ``path`` once it exists (a FIFO, or a regular file for replays); raise after ``timeout`` s."""
    path = Path(path)
    deadline = time.monotonic() + timeout
    while True:
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            mode = None
        if mode is not None:
            if stat.S_ISFIFO(mode) or stat.S_ISREG(mode):
                return path
            raise FifoTimeoutError(f"{path} exists but is not a FIFO or a file; remove it")
        if time.monotonic() >= deadline:
            raise FifoTimeoutError(_missing_message(path, timeout))
        time.sleep(poll_interval)


def _missing_message(path: Path, timeout: float) -> str:
    try:
        present = sorted(p.name for p in path.parent.iterdir())
    except OSError:
        present = None
    where = (
        f"{path.parent} does not exist"
        if present is None
        else f"{path.parent} holds: {', '.join(present) if present else 'nothing'}"
    )
    return (
        f"Pipe-mode FIFO {path} did not appear within {timeout:g} s ({where}). Check that the channel "
        "exists and is in Pipe mode, and that the previous epoch's FIFO was read to its end and closed "
        "(SageMaker creates <channel>_<n+1> only after <channel>_<n> is closed)."
    )


class FifoReader:
    """Blocking reader of one FIFO (or file) with ``readinto``/``read`` for the framers; a context manager.

    Opening blocks until the writer opens its end, like any FIFO.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self.bytes_read = 0
        if stat.S_ISFIFO(os.fstat(self._fd).st_mode):
            with contextlib.suppress(OSError):  # best effort: the limit is /proc/sys/fs/pipe-max-size
                fcntl.fcntl(self._fd, F_SETPIPE_SZ, PIPE_BUFFER_BYTES)

    def fileno(self) -> int:
        return self._fd

    def readinto(self, buffer) -> int:
        n = os.readv(self._fd, [buffer])
        self.bytes_read += n
        return n

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes as a new ``bytes`` (the kernel copies straight into it)."""
        data = os.read(self._fd, n)
        self.bytes_read += len(data)
        return data

    def ready(self, timeout: float) -> bool:
        """True when a read would not block (bytes waiting, or the writer closed) within ``timeout``."""
        return bool(select.select([self._fd], [], [], timeout)[0])

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> FifoReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
