"""Two Keras 3 (TF 2.16+) defects under MultiWorkerMirroredStrategy, mended where they are, for the
datasets ``mwms_keras`` hands to ``fit`` (marked ``AGREED``); ``patches.py`` installs both only while
such a fit runs.

- ``fit`` builds the model by reading a first batch of a fresh iterator and all-reducing it; see
  ``build_from_spec``.
- Each step's metric results (scalars) are mean-reduced "along axis 0", which a scalar has not:
  ``Invalid reduction dimension 0 for input with 0 dimensions``; see ``scalar_means``.
"""

from __future__ import annotations

from sagemaker_dist.runtime.tensorflow.keras.agreement import agreed


def build_from_spec(original):
    """Keras 3 builds a model under a strategy by reading the first batch of a fresh iterator, then
    resets it: on a Pipe channel that opens the epoch's FIFO, reads a batch and closes it, so the
    first epoch would start on the next FIFO (and the batch is all-reduced, which fails for the
    dynamic batch sizes tf.distribute needs for uneven input). The shapes are all it needs: take
    them from the dataset's element spec."""

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if iterator is not None and agreed(iterator) and self._distribute_strategy is not None:
            with self.distribute_strategy.scope():
                self._symbolic_build(data_batch=iterator.data_adapter._dataset.element_spec)
            return None
        return original(self, iterator=iterator, data_batch=data_batch)

    return _maybe_symbolic_build


def scalar_means(original):
    """Keras 3 mean-reduces every per-replica output of a multi-worker step with ``axis=0``; for the
    scalar metric results that fails when the step function is traced. Reduce scalars whole."""

    def reduce_per_replica(values, strategy, reduction):
        import tensorflow as tf

        if reduction not in ("auto", "mean") or not isinstance(
            strategy, tf.distribute.MultiWorkerMirroredStrategy
        ):
            return original(values, strategy, reduction)

        def scalar_or_original(value):
            per_replica = isinstance(value, tf.distribute.DistributedValues)
            first = strategy.experimental_local_results(value)[0] if per_replica else value
            if getattr(first, "shape", None) is not None and first.shape.rank == 0:
                return strategy.reduce("MEAN", value, axis=None) if per_replica else value
            return original(value, strategy, reduction)

        return tf.nest.map_structure(scalar_or_original, values)

    return reduce_per_replica
