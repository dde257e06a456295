"""A File-mode (or FastFile) channel as a tf.data.Dataset of records, for channels every rank shares.

Shared channels (one validation or eval set read in full by every rank) cannot be Pipe mode: a FIFO
has one reader. SageMaker downloads (or, for FastFile, mounts) their objects under
``<root>/input/data/<channel>/``; this reads them in a stable order with the same record formats as
PipeModeDataset, so a script asks ``rank_dataset(role)`` whatever the channel's mode. Which files a
channel has is framework-neutral (``runtime/file_channel.py``).
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sagemaker_dist.contract.record_formats import max_record_bytes
from sagemaker_dist.runtime.epoch_reader.order import epoch_base
from sagemaker_dist.runtime.file_channel import FileChannelError, channel_files
from sagemaker_dist.runtime.framing import check_record_format, iter_records
from sagemaker_dist.runtime.framing.shuffle import EpochOrder, ShuffleWindow, shuffled

if TYPE_CHECKING:
    import tensorflow as tf


# PipeModeDataset options that mean nothing for files (they are about the FIFO and its epochs).
PIPE_ONLY_OPTIONS = (
    "state_dir",
    "pipe_dir",
    "config_dir",
    "benchmark",
    "benchmark_records_interval",
    "fifo_timeout",
    "chunk_size",
    "rank",
)


def _file_records(path: bytes, record_format: bytes, channel: bytes, max_record_bytes: int):
    with open(path, "rb", buffering=0) as f:
        yield from iter_records(
            f.readinto, record_format.decode(), channel=channel.decode(), max_record_bytes=max_record_bytes
        )


def file_channel_dataset(
    channel_dir: str | os.PathLike,
    record_format: str = "TFRecord",
    channel: str | None = None,
    *,
    batch_size: int | None = None,
    drop_remainder: bool = False,
    **pipe_options,
) -> tf.data.Dataset:
    """Records of every file in a File-mode channel, file by file: TFRecord, RecordIO or TextLine.

    ``batch_size`` batches as PipeModeDataset's option does, so a script gets the same elements in
    either mode; options that only make sense for a FIFO are ignored, anything else is an error.
    ``shuffle`` (a seed or a ``ShuffleWindow``) shuffles each iteration's records in the seeded window,
    the n-th iteration (from 0) as epoch n, the stream's key from ``rank`` and the channel; given
    ``state_dir``, as epoch n plus the channel's epoch base there (a resumed job's, ``set_epoch_base``).
    """
    import tensorflow as tf

    check_record_format(record_format)
    name = channel or Path(channel_dir).name
    known = {"max_corrupted_records_to_skip", "max_record_bytes", "shuffle"}
    unknown = sorted(set(pipe_options) - set(PIPE_ONLY_OPTIONS) - known)
    if unknown:
        raise FileChannelError(f"File-mode channel {name!r}: unknown option(s) {', '.join(unknown)}")
    if pipe_options.get("max_corrupted_records_to_skip"):
        raise FileChannelError(
            f"File-mode channel {name!r}: max_corrupted_records_to_skip applies to Pipe mode only "
            "(a corrupted record in a File channel fails the read); drop it or use Pipe mode"
        )
    limit = max_record_bytes(pipe_options.get("max_record_bytes"))
    files = channel_files(channel_dir)
    shuffle = ShuffleWindow.of(pipe_options.get("shuffle"))
    if shuffle is not None:
        key = shuffle.stream_key(int(pipe_options.get("rank") or 0), name)
        epochs = itertools.count()
        state_dir = pipe_options.get("state_dir")

        def shuffled_files():
            base = epoch_base(state_dir, name) if state_dir is not None else 0
            order = EpochOrder(shuffle, key, next(epochs) + base)
            paths = [str(f).encode() for f in files]
            records = (
                r for p in paths for r in _file_records(p, record_format.encode(), name.encode(), limit)
            )
            yield from shuffled(records, order)

        ds = tf.data.Dataset.from_generator(shuffled_files, output_signature=tf.TensorSpec((), tf.string))
        return ds if batch_size is None else ds.batch(batch_size, drop_remainder=drop_remainder)
    # Our framers, not TFRecordDataset: a crafted TFRecord length (2**40) crashes TensorFlow's reader
    # (it allocates the claimed length); ours refuse a record over the limit before allocating it.
    ds = tf.data.Dataset.from_tensor_slices(files).flat_map(
        lambda path: tf.data.Dataset.from_generator(
            _file_records,
            args=(path, record_format, name, limit),
            output_signature=tf.TensorSpec((), tf.string),
        )
    )
    return ds if batch_size is None else ds.batch(batch_size, drop_remainder=drop_remainder)
