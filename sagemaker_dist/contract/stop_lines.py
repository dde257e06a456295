"""The lines rank 0 prints when every rank stopped (SIGTERM, spot) and when a job resumes from a
checkpoint, and the regexes that read them back: the Keras helpers and the PyTorch helpers print them,
``sagemaker-dist local --interrupt-at`` reads them to say where each attempt stopped and resumed.
Stdlib only.

Every line names a place in the job the same way: the epoch counted from 1, as the metric line's
``epoch=`` (``contract/metric_line.py``) and Keras' "Epoch 3/10" count it, and the steps of that epoch
trained. A job stopped "in epoch 3 after step 11" resumes "in epoch 3 after step 11"; one stopped after
its epoch's last step resumes "at the start of epoch 4".
"""

from __future__ import annotations

import re
import time

PREFIX = "sagemaker-dist:"
STOPPED = re.compile(re.escape(PREFIX) + r" stopped in epoch (\d+) after step (\d+)")
# the epoch (from 1), and the steps of it trained (absent: none, "at the start of epoch E")
RESUMED = re.compile(
    re.escape(PREFIX)
    + r" resuming from checkpoint \S+ (?:in|at the start of) epoch (\d+)(?: after step (\d+))?"
)


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
    """The resume line: the job starts after ``epochs_done`` whole epochs and ``steps`` steps of the
    next (a checkpoint's position), named as the stop line names it: the epoch counted from 1."""
    epoch = epochs_done + 1
    where = f"in epoch {epoch} after step {steps}" if steps else f"at the start of epoch {epoch}"
    return f"{PREFIX} resuming from checkpoint {checkpoint} {where} ({epochs_done} epoch(s) done)"


def resumed_position(match: re.Match) -> tuple[int, int]:
    """(epoch from 1, steps of it trained) of a ``RESUMED`` match."""
    return int(match.group(1)), int(match.group(2) or 0)
