"""The old import path of PipeModeDataset, kept so existing imports work: the code is in
``sagemaker_dist.runtime.pipe`` (``from sagemaker_dist.runtime import PipeModeDataset`` is the usual one)."""

from __future__ import annotations

from sagemaker_dist.runtime.pipe.dataset import (  # noqa: F401 - re-exported for old imports
    PipeModeDataset,
    PipeModeDatasetError,
    rank_dataset,
)
