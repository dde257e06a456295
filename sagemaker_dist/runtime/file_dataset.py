"""A File-mode (or FastFile) channel as a tf.data.Dataset of records, for channels every rank shares.

Shared channels (one validation or eval set read in full by every rank) cannot be Pipe mode: a FIFO
has one reader. SageMaker downloads (or, for FastFile, mounts) their objects under
``<root>/input/data/<channel>/``; this reads them in a stable order with the same record formats as
PipeModeDataset, so a script asks ``rank_dataset(role)`` whatever the channel's mode.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from sagemaker_dist.runtime.records import check_record_format, iter_records

if TYPE_CHECKING:
    import tensorflow as tf


class FileChannelError(ValueError):
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


def _recordio_records(path: bytes, channel: str):
    with open(path, "rb", buffering=0) as f:
        yield from iter_records(f.readinto, "RecordIO", channel=channel)


def file_channel_dataset(
    channel_dir: str | os.PathLike, record_format: str = "TFRecord", channel: str | None = None
) -> tf.data.Dataset:
    """Records of every file in a File-mode channel, file by file: TFRecord, RecordIO or TextLine."""
    import tensorflow as tf

    check_record_format(record_format)
    files = channel_files(channel_dir)
    name = channel or Path(channel_dir).name
    if record_format == "TFRecord":
        return tf.data.TFRecordDataset(files)
    if record_format == "TextLine":
        return tf.data.TextLineDataset(files)
    return tf.data.Dataset.from_tensor_slices(files).flat_map(
        lambda path: tf.data.Dataset.from_generator(
            _recordio_records, args=(path, name), output_signature=tf.TensorSpec((), tf.string)
        )
    )
