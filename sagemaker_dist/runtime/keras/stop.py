"""Deprecated: the stop agreement's logic is ``sagemaker_dist.runtime.stop`` (framework-neutral, shared by
the Keras and PyTorch sides). This module re-exports its names and warns once when imported."""

from __future__ import annotations

import warnings

from sagemaker_dist.runtime.stop import (
    DEFAULT_GRACE_S,
    REST_WAIT_S,
    STOPPED_EXIT_CODE,
    AgreedStop,
    ResumeSkip,
    StepSchedule,
    StopRequest,
    TrainingStopped,
)

warnings.warn(
    "sagemaker_dist.runtime.keras.stop is deprecated; import from sagemaker_dist.runtime.stop",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [
    "DEFAULT_GRACE_S",
    "REST_WAIT_S",
    "STOPPED_EXIT_CODE",
    "AgreedStop",
    "ResumeSkip",
    "StepSchedule",
    "StopRequest",
    "TrainingStopped",
]
