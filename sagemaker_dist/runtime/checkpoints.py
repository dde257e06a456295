"""Deprecated: checkpoints are split by what they need. Import from their homes:

- ``sagemaker_dist.runtime.checkpoint_format`` (framework-neutral): ``Checkpoint``, ``checkpoint_dir``,
  ``checkpoint_name``, ``list_checkpoints``, ``latest_checkpoint``, ``remove_stale_temporaries``,
  ``CheckpointMismatchError``, ``META_FILE``, ``TF_PREFIX``;
- ``sagemaker_dist.runtime.keras.checkpoints`` (TensorFlow): ``save_checkpoint``, ``restore_checkpoint``,
  ``Restored``, ``resume_point``, ``resume_position``, ``writing_dir``, ``FORMAT_VERSION``;
- ``sagemaker_dist.runtime.keras.callbacks``: ``checkpoint_callback`` (loads TensorFlow's Keras when used).

This module re-exports those names and warns once when imported.
"""

from __future__ import annotations

import warnings

from sagemaker_dist.runtime.checkpoint_format import (
    META_FILE,
    TF_PREFIX,
    Checkpoint,
    CheckpointMismatchError,
    checkpoint_dir,
    checkpoint_name,
    latest_checkpoint,
    list_checkpoints,
    remove_stale_temporaries,
)
from sagemaker_dist.runtime.keras.checkpoints import (
    FORMAT_VERSION,
    Restored,
    restore_checkpoint,
    resume_point,
    resume_position,
    save_checkpoint,
    writing_dir,
)

warnings.warn(
    "sagemaker_dist.runtime.checkpoints is deprecated; import from sagemaker_dist.runtime.checkpoint_format "
    "(the format), sagemaker_dist.runtime.keras.checkpoints (TensorFlow) or "
    "sagemaker_dist.runtime.keras.callbacks (checkpoint_callback)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [  # and checkpoint_callback, resolved when asked for (below)
    "FORMAT_VERSION",
    "META_FILE",
    "TF_PREFIX",
    "Checkpoint",
    "CheckpointMismatchError",
    "Restored",
    "checkpoint_dir",
    "checkpoint_name",
    "latest_checkpoint",
    "list_checkpoints",
    "remove_stale_temporaries",
    "restore_checkpoint",
    "resume_point",
    "resume_position",
    "save_checkpoint",
    "writing_dir",
]


def __getattr__(name: str):
    if name == "checkpoint_callback":  # its module loads TensorFlow's Keras: only when it is asked for
        from sagemaker_dist.runtime.keras.callbacks import checkpoint_callback

        return checkpoint_callback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
