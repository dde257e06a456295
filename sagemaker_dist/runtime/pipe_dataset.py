"""PipeModeDataset: a tf.data.Dataset over a SageMaker Pipe-mode channel, for any TF 2.x.

Drop-in for ``sagemaker_tensorflow.PipeModeDataset`` (same constructor), built only on stable
tf.data APIs. A Python thread per iteration reads the FIFO ahead of TensorFlow, frames the records
(crc32c in C) and makes them into tensors itself: small records as one string per chunk plus
offsets (records cut out in C++), large TFRecords read one by one straight into their own
``bytes`` and grouped in whole batches, so ``.batch(n)`` (a rebatch) passes them through without a
copy. TensorFlow takes each chunk by a key through ``py_function``, without a copy. Every new
iteration (epoch, ``.repeat()``, Keras ``fit(epochs=...)``) opens the next FIFO
``<channel>_<n>``; ``n`` is kept in ``<state_dir>/<channel>`` under flock, as AWS does.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sagemaker_dist.contract.paths import fifo_name, opt_ml_root
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.runtime.config import ContainerConfig
from sagemaker_dist.runtime.fifo import DEFAULT_FIFO_TIMEOUT, FifoReader, fifo_path, wait_for_fifo
from sagemaker_dist.runtime.ranks import RankInfo, check_rank_channels
from sagemaker_dist.runtime.records import DEFAULT_CHUNK, check_record_format, frame_views, make_framer

if TYPE_CHECKING:
    import tensorflow as tf

log = logging.getLogger(__name__)
PREFETCH_CHUNKS = 2  # measured: 0 or 1 is slower; Python frames chunk n+1 while C++ unbatches chunk n
# Chunks whose records average at least this many bytes cross as one bytes object per record (one
# copy less than a chunk blob cut up by tf.strings.substr); smaller records cross as a blob.
PER_RECORD_MIN_BYTES = 4096
_NO_OFFSETS = np.empty(0, dtype=np.int64)
READ_AHEAD_CHUNKS = 2  # chunks a reader thread frames ahead of TensorFlow (0: frame in TensorFlow's call)


class PipeModeDatasetError(ConfigurationError):
    """A PipeModeDataset that cannot read its channel."""


def _update_epoch(state_dir: Path, channel: str, undo: int | None = None) -> int:
    """Take the next epoch number of ``channel`` (shared by every process on the host, under flock).

    With ``undo=n``, give epoch ``n`` back if it is still the last one taken (its FIFO never came).
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / channel, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.seek(0)
            text = f.read().strip()
            current = int(text) if text else 0
            if undo is None:
                new = current + 1
            else:
                new = undo if current == undo + 1 else current
            f.seek(0)
            f.truncate()
            f.write(str(new))
            f.flush()
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
    return current


def _check_channel(config_dir: Path, channel: str) -> None:
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


def _read_ahead(items, depth: int, name: str):
    """Yield ``items``, produced by a thread up to ``depth`` items ahead; its errors are raised here.

    The thread reads the FIFO while TensorFlow converts and batches the chunks before: readv and
    crc32c release the GIL. When the consumer stops early, the thread stops at its next item.
    """
    done = object()
    ahead: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                ahead.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def produce():
        try:
            for item in items:
                if not put((item, None)):
                    break
            else:
                put((done, None))
        except BaseException as exc:  # handed to the consumer, after the chunks ahead of it
            put((None, exc))
        finally:
            items.close()

    thread = threading.Thread(target=produce, name=f"PipeModeDataset-{name}", daemon=True)
    thread.start()
    try:
        while True:
            item, exc = ahead.get()
            if exc is not None:
                raise exc
            if item is done:
                break
            yield item
        thread.join()
    finally:
        stop.set()


class _EpochReader:
    """The Python half: one call per iteration yields (blob, starts, lengths, records) from the next FIFO.

    A chunk of records is either a blob with offsets (records cut out in C++) or, for large
    records, a list of the records themselves.
    """

    def __init__(
        self, channel, record_format, state_dir, pipe_dir, benchmark, interval, max_skip, timeout, chunk_size
    ):
        self.channel = channel
        self.record_format = record_format
        self.state_dir = Path(state_dir)
        self.pipe_dir = Path(pipe_dir)
        self.benchmark = benchmark
        self.interval = interval
        self.max_skip = max_skip
        self.timeout = timeout
        self.chunk_size = chunk_size

    def __call__(self, group: int = 0, convert=None):
        """Chunks of the next epoch's FIFO; ``group`` and ``convert`` as in :meth:`_chunks`."""
        epoch = _update_epoch(self.state_dir, self.channel)
        try:
            path = wait_for_fifo(fifo_path(self.pipe_dir, self.channel, epoch), self.timeout)
        except Exception:
            _update_epoch(self.state_dir, self.channel, undo=epoch)  # a retry waits for the same FIFO
            raise
        chunks = self._chunks(epoch, path, group, convert)
        if READ_AHEAD_CHUNKS:
            yield from _read_ahead(chunks, READ_AHEAD_CHUNKS, fifo_name(self.channel, epoch))
        else:
            yield from chunks

    def _chunks(self, epoch, path, group=0, convert=None):
        """``(blob, starts, lengths, records)`` per chunk, passed through ``convert`` (in the reader thread).

        Large records come in lists of a multiple of ``group`` records where they can (the batch
        size: TensorFlow's rebatch then passes them through without a copy).
        """
        framer = make_framer(self.record_format, self.channel, epoch, self.max_skip)
        started = time.perf_counter()
        next_report = self.interval
        convert = convert or _as_is
        with FifoReader(path) as reader:
            chunks = frame_views(
                reader.readinto, framer, self.chunk_size, ready=reader.ready, read=reader.read, group=group
            )
            for chunk in chunks:
                yield convert(*_as_blob_or_records(chunk))
                if self.benchmark and self.interval and framer.records >= next_report:
                    self._report(framer, reader, started, "progress")
                    next_report = framer.records - framer.records % self.interval + self.interval
            if framer.skipped:
                log.warning(
                    "channel %r, epoch %d: skipped %d corrupted record(s), read %d",
                    self.channel,
                    epoch,
                    framer.skipped,
                    framer.records,
                )
            if self.benchmark:
                self._report(framer, reader, started, "epoch end")

    def _report(self, framer, reader, started, what):
        seconds = max(time.perf_counter() - started, 1e-9)
        print(
            f"PipeModeDataset {self.channel}_{framer.epoch} {what}: {framer.records} records, "
            f"{reader.bytes_read} bytes in {seconds:.3f} s ({framer.records / seconds:.0f} records/s, "
            f"{reader.bytes_read / seconds / 1e6:.1f} MB/s)",
            flush=True,
        )


def _as_is(*chunk):
    return chunk


def _as_blob_or_records(chunk) -> tuple:
    """``(blob, starts, lengths, records)`` of an item of ``frame_views``: large records as they
    came (a list), records averaging PER_RECORD_MIN_BYTES as one ``bytes`` each, others as a blob."""
    if isinstance(chunk, list):  # large records, read one by one
        return b"", _NO_OFFSETS, _NO_OFFSETS, chunk
    view, starts, lengths, extra = chunk
    if not extra and int(lengths.sum()) >= PER_RECORD_MIN_BYTES * len(lengths):
        records = [view[s : s + n].tobytes() for s, n in zip(starts.tolist(), lengths.tolist())]
        view.release()
        return b"", _NO_OFFSETS, _NO_OFFSETS, records
    blob = view.tobytes()
    view.release()
    if extra:
        blob += b"".join(extra)
    return blob, starts, lengths, []


class _Handover:
    """Chunks that a reader thread made into tensors, handed to TensorFlow by ``py_function``.

    ``from_generator`` converts what its generator yields through numpy in TensorFlow's thread,
    under the GIL; measured, that cost a quarter of the speed at 100 KB records. Here the reader
    thread makes the tensors itself (``tf.constant``, one copy) and the generator yields only a key
    per chunk, which ``take`` turns into the chunk without a copy. ``from_generator`` still gives
    each iteration its own generator (the next FIFO) and closes it when TensorFlow drops the
    iterator, which stops the reader thread and closes the FIFO.
    """

    def __init__(self, reader: _EpochReader):
        import tensorflow as tf

        self._tf = tf
        self._reader = reader
        self.group = 0  # records per chunk the reader aims at: the batch size, once known
        self._ready: dict[int, tuple] = {}  # key -> (iteration, chunk)
        self._keys = itertools.count(1)
        self._empty = None  # (b"", no offsets, no records) as eager tensors, made in a reader thread

    def iteration(self):
        """from_generator's generator: reads the next FIFO; yields a key per chunk ready in ``take``.

        Every chunk has its own key, so tf.data may pull keys ahead of ``take`` (a prefetch it
        injects); chunks of an iteration TensorFlow dropped are let go with it.
        """
        me = object()
        chunks = self._reader(self.group, self._to_tensors)
        try:
            for chunk in chunks:
                key = next(self._keys)
                self._ready[key] = (me, chunk)
                yield key
        except GeneratorExit:
            for key, (owner, _) in list(self._ready.items()):
                if owner is me:
                    self._ready.pop(key, None)
            raise
        finally:
            chunks.close()

    def take(self, key):
        return self._ready.pop(int(key))[1]

    def _to_tensors(self, blob, starts, lengths, records):
        tf = self._tf
        if not tf.executing_eagerly():  # TF1-style graph mode: py_function converts them
            return blob, starts, lengths, records
        if self._empty is None:
            self._empty = (tf.constant(b""), tf.constant(_NO_OFFSETS), tf.constant([], dtype=tf.string))
        no_blob, no_offsets, no_records = self._empty
        if records:
            return no_blob, no_offsets, no_offsets, tf.constant(records, dtype=tf.string)
        # A bytes object goes to TensorFlow through numpy's fixed-width "S" type (about 1 GB/s,
        # measured); wrapped in an object array it is a plain copy (about 12 GB/s).
        boxed = np.empty((), dtype=object)
        boxed[()] = blob
        return (
            tf.constant(boxed, dtype=tf.string),
            tf.constant(starts, dtype=tf.int64),
            tf.constant(lengths, dtype=tf.int64),
            no_records,
        )


def _chunk_dataset(handover: _Handover):
    """Record chunks (1-D tf.string), each iteration from the next FIFO (imports TensorFlow on first use)."""
    import tensorflow as tf

    types = [tf.string, tf.int64, tf.int64, tf.string]
    shapes = [(), (None,), (None,), (None,)]

    @tf.autograph.experimental.do_not_convert
    def take(key):
        chunk = tf.py_function(handover.take, [key], types)
        for tensor, shape in zip(chunk, shapes):
            tensor.set_shape(shape)
        blob, starts, lengths, records = chunk
        return tf.cond(
            tf.size(records) > 0, lambda: records, lambda: tf.strings.substr(blob, starts, lengths)
        )

    keys = tf.data.Dataset.from_generator(
        handover.iteration, output_signature=tf.TensorSpec(shape=(), dtype=tf.int64)
    )
    return keys.map(take).prefetch(PREFETCH_CHUNKS)


def _records_dataset(reader: _EpochReader, batch_size: int | None, drop_remainder: bool):
    """Chunks from Python, records cut out and (re)batched in C++."""
    handover = _Handover(reader)
    chunks = _chunk_dataset(handover)
    if batch_size is not None:
        handover.group = batch_size
        return _rebatch(chunks, batch_size, drop_remainder)
    unbatched = chunks.unbatch()
    unbatched.batch = _batch_from_chunks(unbatched, chunks, handover)
    return unbatched


def _rebatch(chunks, batch_size, drop_remainder: bool, name=None):
    """``chunks.unbatch().batch(...)``, with one copy per record and no per-record tf.data step.

    Chunks of exactly ``batch_size`` records (large records come so) pass through without a copy.
    """
    if hasattr(chunks, "rebatch"):
        return chunks.rebatch(batch_size, drop_remainder=drop_remainder, name=name)
    return chunks.unbatch().batch(batch_size, drop_remainder=drop_remainder, name=name)


def _batch_from_chunks(unbatched, chunks, handover: _Handover):
    """A ``batch`` method for the returned dataset that batches straight from the record chunks.

    Same signature and result as ``tf.data.Dataset.batch``; the parallel-batching options take
    the ordinary path. Datasets derived from the returned one (``.map``, ``.shuffle``, ...) batch
    as usual: this only speeds up ``PipeModeDataset(...).batch(n)`` (batch, then parse a batch).
    """
    ordinary = unbatched.batch

    def batch(batch_size, drop_remainder=False, num_parallel_calls=None, deterministic=None, name=None):
        if num_parallel_calls is not None or deterministic is not None:
            return ordinary(batch_size, drop_remainder, num_parallel_calls, deterministic, name)
        handover.group = batch_size  # large records then come in whole batches: no copy in rebatch
        return _rebatch(chunks, batch_size, drop_remainder, name=name)

    batch.__doc__ = ordinary.__doc__
    return batch


class PipeModeDataset:
    """A ``tf.data.Dataset`` of scalar ``tf.string`` records from SageMaker Pipe-mode channel ``channel``.

    Same arguments as ``sagemaker_tensorflow.PipeModeDataset``; directories default to the /opt/ml
    tree named by ``$SAGEMAKER_DIST_OPT_ML`` (else /opt/ml). Calling the class returns a plain
    ``tf.data.Dataset``, so ``.map``, ``.batch``, ``.repeat`` and Keras ``fit`` work as usual.
    ``fifo_timeout`` is how long to wait for each epoch's FIFO to appear. ``batch_size=N`` returns
    batches (1-D ``tf.string``) instead, the same as ``.batch(N, drop_remainder)`` but built without
    per-record work in tf.data (``Dataset.rebatch``): faster for small records.
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
        chunk_size: int = DEFAULT_CHUNK,
        batch_size: int | None = None,
        drop_remainder: bool = False,
    ) -> tf.data.Dataset:
        check_record_format(record_format)
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise PipeModeDatasetError(f"batch_size is {batch_size!r}; use a whole number >= 1 or None")
        if max_corrupted_records_to_skip < 0:
            raise PipeModeDatasetError(
                f"max_corrupted_records_to_skip is {max_corrupted_records_to_skip}; use 0 or more"
            )
        root = opt_ml_root()
        state_dir = Path(state_dir) if state_dir is not None else root / "pipe_state"
        pipe_dir = Path(pipe_dir) if pipe_dir is not None else root / "input" / "data"
        config_dir = Path(config_dir) if config_dir is not None else root / "input" / "config"
        _check_channel(config_dir, channel)
        reader = _EpochReader(
            channel,
            record_format,
            state_dir,
            pipe_dir,
            benchmark,
            benchmark_records_interval,
            max_corrupted_records_to_skip,
            fifo_timeout,
            chunk_size,
        )
        return _records_dataset(reader, batch_size, drop_remainder)


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
    config = ContainerConfig.load(root)
    info = rank_info or RankInfo.detect()
    channel = check_rank_channels(config, info, role, input_modes=("Pipe", "File"))
    if config.input_mode(channel) == "File":
        from sagemaker_dist.runtime.file_dataset import file_channel_dataset

        return file_channel_dataset(config.data_dir / channel, record_format, channel, **kwargs)
    wrapper = config.record_wrapper(channel)
    if wrapper == "RecordIO" and record_format != "RecordIO":
        raise PipeModeDatasetError(
            f"channel {channel!r} has RecordWrapperType RecordIO, so its stream is RecordIO frames; "
            f"pass record_format='RecordIO' (got {record_format!r})"
        )
    kwargs.setdefault("state_dir", config.pipe_state_dir)
    kwargs.setdefault("pipe_dir", config.data_dir)
    kwargs.setdefault("config_dir", config.config_dir)
    return PipeModeDataset(channel, record_format, **kwargs)
