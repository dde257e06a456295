"""glibc malloc thresholds for a streaming input pipeline, set once per process by the first PipeModeDataset.

A fresh process's first epoch page-faults on most of its bytes: glibc maps every block above its
mmap threshold (128 KiB at start, adapting only as such blocks are freed) anew from the kernel, and
gives freed heap back above its trim threshold. Measured at 1 KB TFRecords: about 25,600 minor
faults in the first 100 MB epoch against 2,200 in the next, and the first epoch 0.67x the file
reader with glibc's defaults against 1.07x with fixed thresholds (docs/benchmarks.md, reader).
Setting them here gives every launcher (the training image, local mode, Slurm, Kubernetes, a
user's own image) the same first epoch. Cost: up to ``TRIM_THRESHOLD_BYTES`` of free heap per
malloc arena stays mapped. A ``MALLOC_*_`` variable in the environment wins (glibc read it at
start), and ``SAGEMAKER_DIST_MALLOC_TUNING=0`` leaves malloc alone.
"""

from __future__ import annotations

import ctypes
import os

MMAP_THRESHOLD_BYTES = 8 << 20  # chunks (up to 2 MiB) and their tensors come from the heap, reused
TRIM_THRESHOLD_BYTES = 64 << 20  # freed chunks stay mapped for the next ones
OFF_VARIABLE = "SAGEMAKER_DIST_MALLOC_TUNING"

# mallopt(3) parameters: (number, environment variable glibc reads at start, value set here)
_PARAMETERS = (
    (-3, "MALLOC_MMAP_THRESHOLD_", MMAP_THRESHOLD_BYTES),  # M_MMAP_THRESHOLD
    (-1, "MALLOC_TRIM_THRESHOLD_", TRIM_THRESHOLD_BYTES),  # M_TRIM_THRESHOLD
)
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
    """Set the thresholds the environment does not set; once per process. Returns what was set."""
    global _applied
    if _applied is None:
        _applied = {}
        mallopt = _glibc_mallopt() if os.environ.get(OFF_VARIABLE, "1") != "0" else None
        for number, variable, value in _PARAMETERS if mallopt is not None else ():
            if variable not in os.environ and mallopt(number, value) == 1:
                _applied[variable] = value
    return dict(_applied)
