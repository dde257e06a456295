"""The Keras callback that has rank 0's TensorBoard logs synced to S3 at each epoch end.

``TensorBoardSyncer.keras_callback`` (``runtime/tensorboard_sync.py``, framework-neutral) returns one,
and ``callbacks.tensorboard_callbacks`` adds one behind Keras's TensorBoard callback. This module
imports TensorFlow when loaded and nothing of the runtime: the syncer is whatever has ``sync_now()``
and ``stop()``.
"""

from __future__ import annotations

import logging

import tensorflow as tf

log = logging.getLogger(__name__)


class TensorBoardSyncCallback(tf.keras.callbacks.Callback):
    """Ask ``syncer`` for an upload at each epoch end and stop it (final flush) at train end. Flushes
    ``tensorboard``'s summary writers first: Keras flushes them only at train end, so without this the
    epoch scalars would reach S3 only then."""

    def __init__(self, syncer, tensorboard=None):
        super().__init__()
        self.syncer = syncer
        self.tensorboard = tensorboard

    def on_epoch_end(self, epoch, logs=None):
        self._flush_writers()
        self.syncer.sync_now()

    def on_train_end(self, logs=None):
        self._flush_writers()
        self.syncer.stop()

    def _flush_writers(self) -> None:
        writers = getattr(self.tensorboard, "_writers", None) or {}
        for writer in list(writers.values()):
            try:
                writer.flush()
            except Exception as exc:  # a flush problem must not stop training
                log.debug("could not flush TensorBoard writer: %s", exc)


def stop_flushes(tensorboard: list) -> list:
    """What a stop calls before the fit ends, of ``tensorboard`` (the callbacks ``tensorboard_callbacks``
    returned): the sync callback's train end (writers flushed, the syncer's final upload), else each
    TensorBoard callback's writers flushed."""
    sync = [c for c in tensorboard if isinstance(c, TensorBoardSyncCallback)]
    if sync:
        return [sync[0].on_train_end]
    return [TensorBoardSyncCallback(None, t)._flush_writers for t in tensorboard]
