"""The TensorFlow half of PipeModeDataset: record chunks from the reader thread into tf.data.

The whole pipeline has one traced function: ``Dataset.range`` feeds chunk indexes to a map whose
``py_function`` hands over the next chunk, a 1-D ``tf.string`` tensor that the reader thread
already made (records cut out of a blob by ``tf.strings.substr``, or large records as they were
read). Index 0 starts an iteration: it opens the next FIFO. The map does not keep the range's
cardinality (TF1's ``map``), so the ``StopIteration`` at the end of the FIFO ends the iteration.

Start-up is what a job's first epoch and every short epoch pay, so it is kept small: measured in
fresh processes, ``from_generator`` plus a mapped ``tf.cond`` traced seven functions at build and
ran three more per iteration; this traces one. TensorFlow is imported only when a dataset is built.
"""

from __future__ import annotations

import threading

import numpy as np

from sagemaker_dist.runtime.epoch_reader.reader import EpochReader
from sagemaker_dist.runtime.malloc_tuning import tune_malloc

PREFETCH_CHUNKS = 2  # measured: 0 or 1 is slower; Python frames chunk n+1 while C++ rebatches chunk n
ITERATION_INDEXES = 1 << 62  # more chunks than any FIFO holds: the FIFO's end ends an iteration


class TwoIterationsError(RuntimeError):
    """One PipeModeDataset iterated by two live iterators: each iteration reads the next FIFO alone."""


class Handover:
    """Chunks that a reader thread made into tensors, handed to TensorFlow by ``py_function``.

    ``take(i)`` is called with 0, 1, 2, ... by each iteration (tf.data's map is sequential). Index
    0 closes the iteration before it (an iterator dropped mid-epoch: SageMaker creates the next
    FIFO only once the last one is closed) and starts the reader on the next FIFO. Every index
    is asked for once per iteration, so an index out of sequence means two iterators are being
    read at once: an error (in whichever asks out of turn), not records of the wrong epoch. Calls
    are serialised: an older iterator's call in flight finishes before a new one closes it.
    """

    def __init__(self, reader: EpochReader):
        import tensorflow as tf

        self._tf = tf
        self._reader = reader
        self.group = 0  # records per chunk the reader aims at: the batch size, once known
        self._chunks = None
        self._next_index = 0
        self._lock = threading.Lock()
        self.error: BaseException | None = None  # what the current iteration's reader raised, if anything
        # The reader thread's first eager ops make their kernels (2-4 ms measured on the first chunk):
        # made here, at build, they are not on the way to the first batch.
        self._to_tensor(b"", np.zeros(1, np.int64), np.zeros(1, np.int64), [], in_thread=False)

    def take(self, index):
        with self._lock:
            return self._take(int(index))

    def _take(self, index: int):
        if index == 0:
            self.close()
            self.error = None
            self._chunks = self._reader(self.group, self._to_tensor)
        elif index != self._next_index or self._chunks is None:
            raise TwoIterationsError(
                f"PipeModeDataset of channel {self._reader.channel!r}: an iterator asked for chunk {index} "
                "out of turn, so two iterators of this dataset are being read at once. Each iteration reads "
                "the next FIFO and SageMaker opens it only after the last one is closed: iterate one at a "
                "time (a new iterator closes the one before it)"
            )
        self._next_index = index + 1
        try:
            chunk = next(self._chunks)
        except StopIteration:
            self._chunks = None
            raise  # py_function turns it into OutOfRange: the end of this iteration
        except BaseException as exc:
            self.error = exc  # py_function turns it into InvalidArgument (a ValueError) or Unknown
            raise
        return chunk if not isinstance(chunk, tuple) else self._to_tensor(*chunk, in_thread=False)

    def close(self) -> None:
        """Stop the current iteration's reader thread and close its FIFO."""
        chunks, self._chunks = self._chunks, None
        if chunks is not None:
            chunks.close()

    def _to_tensor(self, blob, starts, lengths, records, in_thread=True):
        """The chunk's records as a 1-D tf.string tensor, made in the reader thread (eager ops).

        With eager execution off (TF1 scripts) the thread cannot run ops: the chunk goes to
        ``take``, which runs eagerly inside ``py_function``, as it is.
        """
        tf = self._tf
        if in_thread and not tf.executing_eagerly():
            return blob, starts, lengths, records
        if records:
            return tf.constant(records, dtype=tf.string)
        # A bytes object goes to TensorFlow through numpy's fixed-width "S" type (about 1 GB/s,
        # measured); wrapped in an object array it is a plain copy (about 12 GB/s).
        boxed = np.empty((), dtype=object)
        boxed[()] = blob
        return tf.strings.substr(tf.constant(boxed, dtype=tf.string), starts, lengths)


def _chunk_dataset(handover: Handover):
    """Record chunks (1-D tf.string), each iteration from the next FIFO (imports TensorFlow on first use)."""
    import tensorflow as tf

    @tf.autograph.experimental.do_not_convert
    def take(index):
        chunk = tf.py_function(handover.take, [index], tf.string)
        chunk.set_shape((None,))
        return chunk

    # TF2's map keeps the input's cardinality and so turns the end (OutOfRange) into an error;
    # TF1's map ends the dataset there, and its cardinality is unknown, as a FIFO's is.
    indexes = tf.compat.v1.data.Dataset.range(ITERATION_INDEXES).map(take)
    indexes = getattr(indexes, "_dataset", indexes)  # the plain tf.data.Dataset inside TF1's adapter
    return indexes.prefetch(PREFETCH_CHUNKS)


def records_dataset(reader: EpochReader, batch_size: int | None, drop_remainder: bool):
    """Chunks from Python, records (re)batched in C++."""
    tune_malloc()  # before the first epoch's chunks are allocated
    handover = Handover(reader)
    chunks = _chunk_dataset(handover)
    if batch_size is not None:
        handover.group = batch_size
        return _records_class()(_rebatch(chunks, batch_size, drop_remainder), handover)
    unbatched = _records_class()(_unbatch(chunks), handover)
    unbatched.batch = _batch_from_chunks(unbatched, chunks, handover)
    return unbatched


_classes: dict = {}


def _records_class():
    """The dataset class returned: the same dataset, whose own iterators raise what AWS's reader does.

    A stream that is not RecordIO (``NotRecordIOError``) is ``tf.errors.InternalError`` from AWS's reader
    and from the compiled one. An exception in ``py_function`` reaches TensorFlow as InvalidArgument (a
    ``ValueError``) or Unknown, never Internal, so the class is set here, where the dataset is iterated
    as returned (``iter(ds)``, ``for`` loops); the message is the reader's. Through a transformation
    (``.map``, ``.batch``, ...) the error stays ``InvalidArgumentError``.
    """
    if "records" not in _classes:
        import tensorflow as tf
        from tensorflow.python.data.ops import dataset_ops, iterator_ops

        from sagemaker_dist.runtime.framing.recordio import NotRecordIOError

        class PipeRecordsIterator(iterator_ops.OwnedIterator):
            def __init__(self, dataset, handover: Handover):
                self._handover = handover
                super().__init__(dataset)

            def _next_internal(self):
                try:
                    return super()._next_internal()
                except tf.errors.InvalidArgumentError as exc:
                    if isinstance(self._handover.error, NotRecordIOError):
                        raise tf.errors.InternalError(exc.node_def, exc.op, exc.message) from None
                    raise

        class PipeRecordsDataset(dataset_ops.UnaryUnchangedStructureDataset):
            def __init__(self, dataset, handover: Handover):
                self._handover = handover
                super().__init__(dataset, dataset._variant_tensor)

            def __iter__(self):
                if tf.executing_eagerly():
                    return PipeRecordsIterator(self, self._handover)
                return super().__iter__()

        _classes["records"] = PipeRecordsDataset
    return _classes["records"]


def _unbatch(chunks):
    """``chunks.unbatch()`` without its ``normalize_to_dense`` map: a traced function (about 5 ms of
    start-up, measured) that is the identity for dense string tensors. Public API where the class moved."""
    try:
        from tensorflow.python.data.ops.unbatch_op import _UnbatchDataset
    except ImportError:  # pragma: no cover - other TensorFlow versions
        return chunks.unbatch()
    return _UnbatchDataset(chunks)


def _rebatch(chunks, batch_size, drop_remainder: bool, name=None):
    """``chunks.unbatch().batch(...)``, with one copy per record and no per-record tf.data step.

    Chunks of exactly ``batch_size`` records (large records come so) pass through without a copy.
    """
    if hasattr(chunks, "rebatch"):
        return chunks.rebatch(batch_size, drop_remainder=drop_remainder, name=name)
    return chunks.unbatch().batch(batch_size, drop_remainder=drop_remainder, name=name)


def _batch_from_chunks(unbatched, chunks, handover: Handover):
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
