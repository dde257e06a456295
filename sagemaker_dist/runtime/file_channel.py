"""A File-mode (or FastFile) channel's files, in a stable order: what every framework's reader of it lists.

SageMaker downloads (or, for FastFile, mounts) a File-mode channel's objects under
``<root>/input/data/<channel>/``. The TensorFlow side reads them as a tf.data.Dataset
(``tensorflow/data/file_dataset.py``), the PyTorch side as batches (``torch/batches.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

from sagemaker_dist.errors import DataError


class FileChannelError(DataError):
    """A File-mode channel that has no files to read."""


def channel_files(channel_dir: str | os.PathLike) -> list[str]:
    """Every regular file under ``channel_dir``, sorted by relative path (hidden files skipped)."""
    root = Path(channel_dir)
    if not root.is_dir():
        raise FileChannelError(
            f"File-mode channel directory {str(root)!r} does not exist; the job's InputDataConfig must "
            "have this channel (SageMaker downloads its objects there before the script starts)"
        )
    files = sorted(
        str(p)
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    if not files:
        raise FileChannelError(
            f"File-mode channel directory {str(root)!r} holds no files; check the channel's S3 prefix "
            "or manifest"
        )
    return files
