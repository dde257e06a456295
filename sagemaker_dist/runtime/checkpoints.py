"""Deprecated: checkpoints are split by what they need. Import from their homes:

- ``sagemaker_dist.runtime.checkpoint_format`` (framework-neutral): ``Checkpoint``, ``checkpoint_dir``,
  ``checkpoint_name``, ``list_checkpoints``, ``latest_checkpoint``, ``remove_stale_temporaries``,
  ``CheckpointMismatchError``, ``META_FILE``, ``TF_PREFIX``;
- ``sagemaker_dist.runtime.tensorflow.keras.checkpoints`` (TensorFlow): ``save_checkpoint``,
  ``restore_checkpoint``, ``Restored``, ``resume_point``, ``resume_position``, ``writing_dir``,
  ``FORMAT_VERSION``;
- ``sagemaker_dist.runtime.tensorflow.keras.callbacks``: ``checkpoint_callback`` (loads TensorFlow's Keras).

This module re-exports those names and warns once when imported. The TensorFlow side's names are
resolved when first asked for, so the core imports the TensorFlow side only inside a function.
"""

from __future__ import annotations

import importlib
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

TENSORFLOW_CHECKPOINTS = "sagemaker_dist.runtime.tensorflow.keras.checkpoints"
KERAS_CALLBACKS = "sagemaker_dist.runtime.tensorflow.keras.callbacks"
# name -> the TensorFlow side's module that defines it
_TENSORFLOW_NAMES = {
    "FORMAT_VERSION": TENSORFLOW_CHECKPOINTS,
    "Restored": TENSORFLOW_CHECKPOINTS,
    "restore_checkpoint": TENSORFLOW_CHECKPOINTS,
    "resume_point": TENSORFLOW_CHECKPOINTS,
    "resume_position": TENSORFLOW_CHECKPOINTS,
    "save_checkpoint": TENSORFLOW_CHECKPOINTS,
    "writing_dir": TENSORFLOW_CHECKPOINTS,
    "checkpoint_callback": KERAS_CALLBACKS,
}

warnings.warn(
    "sagemaker_dist.runtime.checkpoints is deprecated; import from sagemaker_dist.runtime.checkpoint_format "
    f"(the format), {TENSORFLOW_CHECKPOINTS} (TensorFlow) or {KERAS_CALLBACKS} (checkpoint_callback)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [
    "META_FILE",
    "TF_PREFIX",
    "Checkpoint",
    "CheckpointMismatchError",
    "checkpoint_dir",
    "checkpoint_name",
    "latest_checkpoint",
    "list_checkpoints",
    "remove_stale_temporaries",
    *(name for name in _TENSORFLOW_NAMES if name != "checkpoint_callback"),  # it loads Keras: asked for only
]


def __getattr__(name: str):
    module = _TENSORFLOW_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
