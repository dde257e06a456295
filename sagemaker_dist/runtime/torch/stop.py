"""Stops and spot interruptions under DDP: SIGTERM becomes a request the ranks agree on at a step.

SageMaker sends SIGTERM on a stop or a spot interruption and kills the container about 120 s later. A
rank that just exited would leave the others waiting in their next allreduce; so SIGTERM only sets a
flag (the framework-neutral ``runtime.stop.StopRequest``, which also starts a watchdog that ends a rank
stuck in a collective before the SIGKILL), and the flag travels in the per-step agreement
(``epochs.py``): every rank stops before the same step. Rank 0 then checkpoints the steps trained so
far, every rank waits for it, and ``TrainingStopped`` (a ``SystemExit`` with code 0) ends each process.
The next attempt resumes inside the epoch, skipping the batches already trained.
"""

from __future__ import annotations

from sagemaker_dist.runtime import environment
from sagemaker_dist.runtime.stop import DEFAULT_GRACE_S, StopRequest, TrainingStopped, positive_seconds

GRACE_ENV = environment.STOP_GRACE  # seconds from SIGTERM to the watchdog's forced exit

__all__ = ["DEFAULT_GRACE_S", "GRACE_ENV", "StopRequest", "TrainingStopped", "install_stop", "stop_grace"]


def install_stop(rank: int, grace: float | None = None) -> StopRequest:
    """A ``StopRequest`` that takes SIGTERM in this process (call it from the main thread: elsewhere it
    warns that SIGTERM will not be caught). ``grace``: seconds from SIGTERM to the watchdog's forced
    exit (default ``$SAGEMAKER_DIST_STOP_GRACE``, else 100)."""
    return StopRequest(rank, stop_grace(grace)).install()


def stop_grace(grace: float | None = None, environ=None) -> float:
    """``grace`` (else ``$SAGEMAKER_DIST_STOP_GRACE``, else 100) as seconds > 0; a ``ConfigurationError``
    names a value that is not one."""
    hint = "give the seconds from SIGTERM to a forced exit, a number > 0"
    if grace is not None:
        return positive_seconds(grace, f"grace={grace!r}", hint)
    raw = environment.stop_grace(environ)
    return positive_seconds(raw, f"{GRACE_ENV}={raw!r}", hint) if raw else DEFAULT_GRACE_S
