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


def read_into_batches(fifo: str, batch_bytes: int, buffers: int = 4, chunk: int = 1 << 20):
    """``read_to_end``, but into ``buffers`` batch-sized buffers of fresh plain pages in turn (reads of at
    most ``chunk``, none past a buffer's end): what any reader that hands out batches of ``batch_bytes``
    pays for its memory, and no framing. ``RecordBatches``' pool holds about 4 unpinned batches in flight."""
    views = [memoryview(mmap.mmap(-1, batch_bytes)) for _ in range(buffers)]
    fd = os.open(fifo, os.O_RDONLY)
    n, first, at, which = 0, 0.0, 0, 0
    try:
        fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BUFFER_BYTES)
        while got := os.readv(fd, [views[which][at : at + chunk]]):
            first = first or time.perf_counter()
            n, at = n + got, at + got
            if at == batch_bytes:
                at, which = 0, (which + 1) % buffers
    finally:
        os.close(fd)
    return n, first
