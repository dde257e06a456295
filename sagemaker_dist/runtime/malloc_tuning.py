"""glibc malloc thresholds for a streaming input pipeline, set once per process by the first PipeModeDataset.

A fresh process's first epoch page-faults on most of its bytes: glibc maps every block above its
mmap threshold (128 KiB at start, adapting only as such blocks are freed) anew from the kernel, and
gives freed heap back above its trim threshold. Measured at 1 KB TFRecords: about 25,600 minor
faults in the first 100 MB epoch against 2,200 in the next, and the first epoch 0.67x the file
reader with glibc's defaults against 1.07x with fixed thresholds (docs/benchmarks.md, reader).
Setting them here gives every launcher (the training image, local mode, Slurm, Kubernetes, a
user's own image) the same first epoch. Cost: up to ``TRIM_THRESHOLD_BYTES`` of free heap per
malloc arena stays mapped. A ``MALLOC_*_`` variable in the environment wins (glibc read it at
start), and ``SAGEMAKER_DIST_MALLOC_TUNING=0`` leaves malloc alone. One log line says which
thresholds were changed, from what to what, and which were left and why: a process-wide change a
library makes should be visible in the job's log.
"""

from __future__ import annotations

import ctypes
import logging
import os

from sagemaker_dist.runtime import environment

log = logging.getLogger(__name__)

MMAP_THRESHOLD_BYTES = 8 << 20  # chunks (up to 2 MiB) and their tensors come from the heap, reused
TRIM_THRESHOLD_BYTES = 64 << 20  # freed chunks stay mapped for the next ones
OFF_VARIABLE = environment.MALLOC_TUNING

# mallopt(3) parameters: (number, environment variable glibc reads at start, value set here, name)
_PARAMETERS = (
    (-3, environment.MALLOC_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES, "mmap threshold"),  # M_MMAP_THRESHOLD
    (-1, environment.MALLOC_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES, "trim threshold"),  # M_TRIM_THRESHOLD
)
# What glibc starts with for both; it raises them itself as large blocks are freed (mallopt(3)), and
# has no call that reads them back.
_GLIBC_DEFAULT = "glibc's dynamic default (128 KiB at start)"
_applied: dict[str, int] | None = None


def _glibc_mallopt():
    """glibc's ``mallopt``, or None where the C library is another (musl, macOS)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
    except (ValueError, OSError):
        return None
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        mallopt.restype = ctypes.c_int
    return mallopt


def tune_malloc() -> dict[str, int]:
    """Set the thresholds the environment does not set; once per process, logged. Returns what was set."""
    global _applied
    if _applied is None:
        _applied, line = _tune(environment.environ(), _glibc_mallopt)
        log.info("%s", line)
    return dict(_applied)


def _tune(environ, find_mallopt) -> tuple[dict[str, int], str]:
    """``(thresholds set, the log line saying what changed and what was left, and why)``."""
    if environ.get(OFF_VARIABLE, "1") == "0":
        return {}, f"malloc tuning: mmap and trim thresholds left as they are ({OFF_VARIABLE}=0)"
    mallopt = find_mallopt()
    if mallopt is None:
        return {}, "malloc tuning: mmap and trim thresholds left as they are (the C library is not glibc)"
    applied: dict[str, int] = {}
    said = []
    for number, variable, value, name in _PARAMETERS:
        if variable in environ:
            said.append(f"{name} left at {environ[variable]} ({variable} in the environment)")
        elif mallopt(number, value) == 1:
            applied[variable] = value
            said.append(f"{name} {_GLIBC_DEFAULT} -> {_mib(value)}")
        else:
            said.append(f"{name} left as it was (glibc refused {_mib(value)})")
    hint = f"{OFF_VARIABLE}=0 turns this off" if applied else "nothing changed"
    return applied, f"malloc tuning for the Pipe-mode reader: {'; '.join(said)} ({hint})"


def _mib(value: int) -> str:
    return f"{value >> 20} MiB" if value % (1 << 20) == 0 else f"{value} bytes"
