"""The lines rank 0 prints when every rank stopped (SIGTERM, spot) and when a job resumes from a
checkpoint, and the regexes that read them back: the Keras helpers and the PyTorch helpers print them,
``sagemaker-dist local --interrupt-at`` reads them to say where each attempt stopped and resumed.
Stdlib only.
"""

from __future__ import annotations

import re
import time

PREFIX = "sagemaker-dist:"
STOPPED = re.compile(re.escape(PREFIX) + r" stopped in epoch (\d+) after step (\d+)")
RESUMED = re.compile(re.escape(PREFIX) + r" resuming from checkpoint \S+ (\d+) epoch\(s\) done, (\d+) step")


def stopped_line(epoch: int, step: int, last: bool = False) -> str:
    """The start of the stop line: every rank stopped after ``step`` of ``epoch`` (counted from 1);
    ``last`` says the step was the epoch's last (its checkpoint is of the whole epoch). Callers add
    what they know (records, the checkpoint) after it."""
    its_last = " (its last)" if last else ""
    return f"{PREFIX} stopped in epoch {epoch} after step {step}{its_last} on every rank"


def since_request(received_at: float | None) -> str:
    """The stop line's last clause: how long after the stop request (``time.monotonic()`` of the first
    SIGTERM; None: none came) every rank had stopped."""
    if received_at is None:
        return ""
    return f"; {time.monotonic() - received_at:.1f} s after the stop request"


def resumed_line(checkpoint: str, epochs_done: int, steps: int) -> str:
    """The resume line: the job starts after ``epochs_done`` epochs and ``steps`` steps of the next."""
    done = f"{epochs_done} epoch(s) done, {steps} step(s) of the next"
    return f"{PREFIX} resuming from checkpoint {checkpoint}: {done}"
