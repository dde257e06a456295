"""The reference arm of the pipe benchmarks: a FIFO read to its end with ``os.readv`` into one buffer,
with the pipe buffer the project's readers ask for, and nothing done with the bytes (no reader can be
faster). The benchmarks' child processes import it."""

from __future__ import annotations

import fcntl
import mmap
import os
import time

from sagemaker_dist.runtime.fifo import F_SETPIPE_SZ, PIPE_BUFFER_BYTES


def read_to_end(fifo: str, chunk: int = 1 << 20) -> tuple[int, float]:
    """The bytes read from ``fifo`` in reads of ``chunk``, and ``time.perf_counter()`` after the first."""
    buf = bytearray(chunk)
    fd = os.open(fifo, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BUFFER_BYTES)
        n = os.readv(fd, [buf])
        first = time.perf_counter()
        while got := os.readv(fd, [buf]):
            n += got
    finally:
        os.close(fd)
    return n, first


def batch_buffers(batch_bytes: int, buffers: int = 4, populated: bool = False) -> list[memoryview]:
    """``buffers`` batch-sized buffers of fresh plain pages; ``populated``: faulted in and zeroed now
    (``MAP_POPULATE``), so that reads into them later pay for no fresh memory."""
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (getattr(mmap, "MAP_POPULATE", 0) if populated else 0)
    return [memoryview(mmap.mmap(-1, batch_bytes, flags=flags)) for _ in range(buffers)]


def read_into_batches(fifo: str, views: list[memoryview], chunk: int = 1 << 20):
    """``read_to_end``, but into ``views`` (``batch_buffers``) in turn, reads of at most ``chunk``, none
    past a buffer's end: with fresh buffers, what any reader that hands out batches of their size pays
    for its memory, and no framing. ``RecordBatches``' pool holds about 4 unpinned batches in flight."""
    batch_bytes = len(views[0])
    fd = os.open(fifo, os.O_RDONLY)
    n, first, at, which = 0, 0.0, 0, 0
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BUFFER_BYTES)
        while got := os.readv(fd, [views[which][at : at + chunk]]):
            first = first or time.perf_counter()
            n, at = n + got, at + got
            if at == batch_bytes:
                at, which = 0, (which + 1) % len(views)
    finally:
        os.close(fd)
    return n, first
