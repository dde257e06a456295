"""The TensorFlow half of PipeModeDataset: chunks from the reader thread into tf.data, then records.

TensorFlow takes each chunk by a key through ``py_function``, without a copy; records are cut out
of a chunk (``tf.strings.substr``) and (re)batched in C++, so tf.data does no per-record work in
Python. TensorFlow is imported only when a dataset is built.
"""

from __future__ import annotations

import itertools

import numpy as np

from sagemaker_dist.runtime.pipe.reader import NO_OFFSETS, EpochReader

PREFETCH_CHUNKS = 2  # measured: 0 or 1 is slower; Python frames chunk n+1 while C++ unbatches chunk n


class Handover:
    """Chunks that a reader thread made into tensors, handed to TensorFlow by ``py_function``.

    ``from_generator`` converts what its generator yields through numpy in TensorFlow's thread,
    under the GIL; measured, that cost a quarter of the speed at 100 KB records. Here the reader
    thread makes the tensors itself (``tf.constant``, one copy) and the generator yields only a key
    per chunk, which ``take`` turns into the chunk without a copy. ``from_generator`` still gives
    each iteration its own generator (the next FIFO) and closes it when TensorFlow drops the
    iterator, which stops the reader thread and closes the FIFO.
    """

    def __init__(self, reader: EpochReader):
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
            self._empty = (tf.constant(b""), tf.constant(NO_OFFSETS), tf.constant([], dtype=tf.string))
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


def _chunk_dataset(handover: Handover):
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


def records_dataset(reader: EpochReader, batch_size: int | None, drop_remainder: bool):
    """Chunks from Python, records cut out and (re)batched in C++."""
    handover = Handover(reader)
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
