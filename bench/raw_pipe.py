"""The reference arm of the pipe benchmarks: a FIFO read to its end with ``os.readv`` into one buffer,
with the pipe buffer the project's readers ask for, and nothing done with the bytes (no reader can be
faster). The benchmarks' child processes import it."""

from __future__ import annotations

import fcntl
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
