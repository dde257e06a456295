"""``PipeModeDataset`` (the drop-in for ``sagemaker_tensorflow.PipeModeDataset``) and ``rank_dataset``.

Checks the arguments and the channel's input mode, then builds the dataset on the compiled reader
(``compiled_dataset``, where ``native_build`` can build it) or on the core's Python reader
(``runtime.epoch_reader.reader``) and the TensorFlow bridge ``tf_bridge``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sagemaker_dist.contract.paths import opt_ml_root
from sagemaker_dist.contract.record_formats import check_corrupted_skip, check_record_format
from sagemaker_dist.contract.record_formats import max_record_bytes as record_limit
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.runtime import environment
from sagemaker_dist.runtime.fifo import DEFAULT_FIFO_TIMEOUT
from sagemaker_dist.runtime.malloc_tuning import tune_malloc
from sagemaker_dist.runtime.tensorflow.data.compiled_dataset import compiled_dataset
from sagemaker_dist.runtime.tensorflow.data.native_build import compiled_op

if TYPE_CHECKING:
    import tensorflow as tf

    from sagemaker_dist.runtime.ranks import RankInfo


class PipeModeDatasetError(ConfigurationError):
    """A PipeModeDataset that cannot read its channel."""


# AWS's name for it (``sagemaker_tensorflow.PipeModeDatasetException``): scripts that catch it keep working.
PipeModeDatasetException = PipeModeDatasetError


def _check_channel(config_dir: Path, channel: str) -> None:
    """Fail at once, naming the file, when ``channel`` is missing or not in Pipe mode (else the
    dataset would wait ``fifo_timeout`` for a FIFO that never comes)."""
    path = config_dir / "inputdataconfig.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise PipeModeDatasetError(
            f"{path} does not exist; set config_dir= (or $SAGEMAKER_DIST_OPT_ML) to the job's /opt/ml tree"
        ) from exc
    if channel not in config:
        raise PipeModeDatasetError(
            f"channel {channel!r} is not in {path} (channels: {', '.join(sorted(config)) or 'none'})"
        )
    mode = config[channel].get("TrainingInputMode", "File")
    if mode.lower() != "pipe":
        raise PipeModeDatasetError(f"channel {channel!r} is in {mode!r} mode, not Pipe ({path})")


class PipeModeDataset:
    """A ``tf.data.Dataset`` of scalar ``tf.string`` records from SageMaker Pipe-mode channel ``channel``.

    Same arguments as ``sagemaker_tensorflow.PipeModeDataset``; directories default to the /opt/ml
    tree named by ``$SAGEMAKER_DIST_OPT_ML`` (else /opt/ml). Calling the class returns a plain
    ``tf.data.Dataset``, so ``.map``, ``.batch``, ``.repeat`` and Keras ``fit`` work as usual.
    ``fifo_timeout`` is how long to wait for each epoch's FIFO to appear. ``batch_size=N`` returns
    batches (1-D ``tf.string``) instead, the same as ``.batch(N, drop_remainder)`` but built without
    per-record work in tf.data (``Dataset.rebatch``): faster for small records. The records are read by
    the compiled op where it builds here, else in Python (``native_build``; one log line says
    which, ``$SAGEMAKER_DIST_READER`` forces one): the same records, errors and epochs either way.
    ``max_record_bytes`` is the longest record either reader accepts (default
    ``$SAGEMAKER_DIST_MAX_RECORD_BYTES``, else 2 GiB - 1): a longer one, or a length field that claims
    one, is a ``RecordFormatError`` (``DataLossError`` from the compiled reader) naming the channel,
    epoch and byte offset, raised before anything is allocated for it. As from AWS's reader, a stream
    that is not RecordIO is ``tf.errors.InternalError`` and ``benchmark_records_interval=N`` prints an
    ``Iterator records`` line every N records (docs/tasks/migrating.md).
    ``shuffle``: a seed, or a ``ShuffleWindow(seed, records, bytes)``: each epoch's records come out of
    a seeded shuffle window, in the order ``PipeBatches`` gives the same stream (a function of the seed,
    the epoch, ``rank`` and the channel); None (the default, as AWS's reader) reads them as they come.
    ``rank``: whose stream this is, for the shuffle (default: the launcher's variables, else 0).
    """

    def __new__(
        cls,
        channel: str,
        record_format: str = "RecordIO",
        state_dir: str | os.PathLike | None = None,
        pipe_dir: str | os.PathLike | None = None,
        config_dir: str | os.PathLike | None = None,
        benchmark: bool = False,
        benchmark_records_interval: int = 0,
        max_corrupted_records_to_skip: int = 0,
        *,
        fifo_timeout: float = DEFAULT_FIFO_TIMEOUT,
        chunk_size: int | None = None,
        batch_size: int | None = None,
        drop_remainder: bool = False,
        max_record_bytes: int | None = None,
        shuffle=None,
        rank: int | None = None,
    ) -> tf.data.Dataset:
        from sagemaker_dist.runtime.framing.shuffle import ShuffleWindow

        check_record_format(record_format)
        try:
            shuffle = ShuffleWindow.of(shuffle)
        except ValueError as exc:
            raise PipeModeDatasetError(str(exc)) from None
        stream_key = shuffle.stream_key(_rank(rank), channel) if shuffle is not None else 0
        max_record_bytes = record_limit(max_record_bytes)  # a bad value fails here, naming itself
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise PipeModeDatasetError(f"batch_size is {batch_size!r}; use a whole number >= 1 or None")
        try:
            check_corrupted_skip(record_format, max_corrupted_records_to_skip)
        except ConfigurationError as exc:  # AWS's reader raises its own exception type
            raise PipeModeDatasetError(str(exc)) from None
        root = opt_ml_root()
        state_dir = Path(state_dir) if state_dir is not None else root / "pipe_state"
        pipe_dir = Path(pipe_dir) if pipe_dir is not None else root / "input" / "data"
        config_dir = Path(config_dir) if config_dir is not None else root / "input" / "config"
        _check_channel(config_dir, channel)
        # what both readers take, in their order: the channel, where its FIFOs are, how to read them
        source = (channel, record_format, state_dir, pipe_dir, benchmark, benchmark_records_interval,
                  max_corrupted_records_to_skip, fifo_timeout)  # fmt: skip
        op = compiled_op()
        if op is not None:
            tune_malloc()
            return compiled_dataset(
                op, *source, batch_size, drop_remainder, max_record_bytes, shuffle, stream_key
            )
        # The Python reader's modules (its framers, crc32c) are imported only where it runs: about
        # 6 ms of every fresh process's start-up on the compiled reader (docs/benchmarks.md).
        from sagemaker_dist.runtime.epoch_reader.reader import EpochReader
        from sagemaker_dist.runtime.framing import DEFAULT_CHUNK
        from sagemaker_dist.runtime.tensorflow.data.tf_bridge import records_dataset

        chunk = DEFAULT_CHUNK if chunk_size is None else chunk_size
        reader = EpochReader(*source, chunk, max_record_bytes, shuffle, stream_key)
        return records_dataset(reader, batch_size, drop_remainder)


def _rank(rank: int | None) -> int:
    """``rank``, else the launcher's (mpirun, horovodrun, torchrun), else 0."""
    if rank is not None:
        return int(rank)
    for name in ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK", "RANK", "PMIX_RANK"):
        value = environment.variable(name)
        if value not in (None, ""):
            return int(value)
    return 0


def rank_dataset(
    role: str = "train",
    record_format: str = "TFRecord",
    *,
    root: str | os.PathLike | None = None,
    rank_info: RankInfo | None = None,
    **kwargs,
) -> tf.data.Dataset:
    """This Horovod rank's own channel for ``role`` as a dataset, after the fail-fast start-up check.

    Call it before ``hvd.init()``'s first collective op (e.g. before broadcasting variables) so a
    channel/rank mismatch is an immediate error instead of a stall. ``kwargs`` go to PipeModeDataset.
    A File-mode channel (a shared validation or eval set) is read from its files instead.
    """
    # Imported here: a plain PipeModeDataset does not need them, and its start-up is timed.
    from sagemaker_dist.runtime.config import ContainerConfig
    from sagemaker_dist.runtime.ranks import check_rank_channels
    from sagemaker_dist.runtime.tensorflow.keras.horovod_world import HorovodRankInfo as RankInfo

    config = ContainerConfig.load(root)
    info = rank_info or RankInfo.detect()
    channel = check_rank_channels(config, info, role, input_modes=("Pipe", "File"))
    kwargs.setdefault("state_dir", config.pipe_state_dir)  # where a resumed job's epoch base is
    if config.input_mode(channel) == "File":
        from sagemaker_dist.runtime.tensorflow.data.file_dataset import file_channel_dataset

        return file_channel_dataset(config.data_dir / channel, record_format, channel, **kwargs)
    wrapper = config.record_wrapper(channel)
    if wrapper == "RecordIO" and record_format != "RecordIO":
        raise PipeModeDatasetError(
            f"channel {channel!r} has RecordWrapperType RecordIO, so its stream is RecordIO frames; "
            f"pass record_format='RecordIO' (got {record_format!r})"
        )
    kwargs.setdefault("rank", info.rank)
    kwargs.setdefault("pipe_dir", config.data_dir)
    kwargs.setdefault("config_dir", config.config_dir)
    return PipeModeDataset(channel, record_format, **kwargs)
