"""Deprecated: a File-mode channel as a tf.data.Dataset is ``sagemaker_dist.runtime.keras.file_dataset``
(``file_channel_dataset``, also ``sagemaker_dist.runtime.file_channel_dataset``), its files
``sagemaker_dist.runtime.file_channel`` (``channel_files``, ``FileChannelError``). This module
re-exports those names and warns once when imported.
"""

from __future__ import annotations

import warnings

from sagemaker_dist.runtime.file_channel import FileChannelError, channel_files
from sagemaker_dist.runtime.keras.file_dataset import PIPE_ONLY_OPTIONS, file_channel_dataset

warnings.warn(
    "sagemaker_dist.runtime.file_dataset is deprecated; import from sagemaker_dist.runtime.file_channel "
    "(the files) or sagemaker_dist.runtime.keras.file_dataset (the tf.data dataset)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["PIPE_ONLY_OPTIONS", "FileChannelError", "channel_files", "file_channel_dataset"]
