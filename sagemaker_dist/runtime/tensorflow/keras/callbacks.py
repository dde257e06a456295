"""The Keras callbacks ``setup()`` returns, and their order, which matters.

0. ``KerasPatchesWhileFitting`` (both helpers): the helper's Keras patches held from train begin to
   train end (``patches.py``);
1. ``RankZeroCheckpoint`` (rank 0 restores at train begin and saves at epoch end);
2. ``BroadcastInitialWeights``: rank 0's (restored) weights to every rank before the first step;
3. Horovod's ``BroadcastGlobalVariablesCallback`` (optimizer slots) and ``MetricAverageCallback``
   (train and ``val_*`` metrics averaged over ranks: horovod#600);
4. learning-rate warm-up;
5. rank 0's TensorBoard logging and its sync to S3 (``tensorboard_callback.TensorBoardSyncCallback``).

``MetricLine`` (after the averaging, so it prints every rank's mean) prints the chief's one
machine-readable line per epoch that tuning jobs read (``contract/metric_line.py``).

This module imports TensorFlow when loaded (its classes subclass ``tf.keras.callbacks.Callback``), so
only ``setup()`` loads it, after the Keras 2 check, and ``checkpoint_callback``, which returns one of
its callbacks; Horovod is imported where it is used.
"""

from __future__ import annotations

import os
from pathlib import Path

import tensorflow as tf

from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.runtime.checkpoint_format import Checkpoint, remove_stale_temporaries
from sagemaker_dist.runtime.tensorflow.keras.checkpoints import (
    Restored,
    restore_checkpoint,
    save_checkpoint,
    writing_dir,
)
from sagemaker_dist.runtime.tensorflow.keras.tensorboard_callback import TensorBoardSyncCallback
from sagemaker_dist.runtime.training_session import TrainingSession, write_metric_line


class KerasPatchesWhileFitting(tf.keras.callbacks.Callback):
    """Holds ``window`` (a ``patches.FitWindow``) for the fit this callback is in, so the private
    Keras methods the helpers replace are Keras's own outside their fits."""

    def __init__(self, window):
        super().__init__()
        self.window = window
        self._supports_tf_logs = True  # no batch hooks: Keras need not convert any logs for it

    def on_train_begin(self, logs=None):
        self.window.fit_begins()

    def on_train_end(self, logs=None):
        self.window.fit_ends()


class RankZeroCheckpoint(tf.keras.callbacks.Callback):
    """Restore ``resume_from`` at train begin (and check after the first step that it matched the model
    and optimizer whole) and save every ``every`` epochs into ``directory``, on rank 0 only: other ranks
    get rank 0's weights by broadcast. ``saved`` lists the epochs it wrote."""

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        rank: int,
        resume_from: Checkpoint | None = None,
        keep: int | None = 3,
        every: int = 1,
    ):
        if every < 1:
            raise ConfigurationError(f"checkpoint every={every!r} epochs; give a whole number >= 1")
        super().__init__()
        self.directory = Path(directory)
        self.rank = rank
        self.resume_from = resume_from
        self.keep = keep
        self.every = every
        self.saved: list[int] = []
        self.restored: Restored | None = None  # until its first step has made every variable
        self._supports_tf_logs = True  # its batch hook reads no logs: Keras need not convert them

    def on_train_begin(self, logs=None):
        if self.rank != 0:
            return
        remove_stale_temporaries(self.directory)
        if self.resume_from is not None:
            self.restored = restore_checkpoint(self.model, self.resume_from)

    def on_train_batch_end(self, batch, logs=None):
        _check_restore_complete(self)

    def on_epoch_end(self, epoch, logs=None):
        if self.rank == 0 and (epoch + 1) % self.every == 0:
            save_checkpoint(self.model, self.directory, epoch + 1, keep=self.keep, rank=self.rank)
            self.saved.append(epoch + 1)


def checkpoint_callback(
    directory: str | os.PathLike,
    *,
    rank: int,
    resume_from: Checkpoint | None = None,
    keep: int | None = 3,
    every: int = 1,
) -> RankZeroCheckpoint:
    """A Keras callback that restores ``resume_from`` at train begin and saves every ``every`` epochs,
    on rank 0 only (on other ranks it does nothing): a ``RankZeroCheckpoint``."""
    return RankZeroCheckpoint(directory, rank=rank, resume_from=resume_from, keep=keep, every=every)


class WorkerCheckpoint(tf.keras.callbacks.Callback):
    """MultiWorkerMirroredStrategy's checkpoints: every worker restores ``resume_from`` (the epoch all
    hold; checked whole after the first step) and saves every ``every`` epochs; only the chief's copy
    lands in ``directory``."""

    def __init__(self, directory, *, chief: bool, resume_from=None, keep: int | None = 3, every: int = 1):
        if every < 1:
            raise ConfigurationError(f"checkpoint every={every!r} epochs; give a whole number >= 1")
        super().__init__()
        self.directory, self.chief, self.resume_from = Path(directory), chief, resume_from
        self.keep, self.every = keep, every
        self.saved: list[int] = []
        self.restored: Restored | None = None
        self._supports_tf_logs = True

    def on_train_begin(self, logs=None):
        if self.resume_from is not None:
            self.restored = restore_checkpoint(self.model, self.resume_from)

    def on_train_batch_end(self, batch, logs=None):
        _check_restore_complete(self)

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every:
            return
        with writing_dir(self.chief, self.directory) as where:
            save_checkpoint(self.model, where, epoch + 1, keep=self.keep, rank=0 if self.chief else -1)
        if self.chief:
            self.saved.append(epoch + 1)


def _check_restore_complete(callback) -> None:
    """After the first step of a resumed fit the optimizer has made its slots: every value in the
    checkpoint must now have found its variable (``Restored.assert_complete``), checked once."""
    if callback.restored is not None:
        restored, callback.restored = callback.restored, None
        restored.assert_complete()


class MetricLine(tf.keras.callbacks.Callback):
    """On the chief, print one ``sagemaker-dist-metrics: epoch=N name=value ...`` line per epoch with
    every metric in Keras' logs, for SageMaker's MetricDefinitions, Katib's StdOut collector and
    ``tune --local``, in one ``write`` (``training_session.write_metric_line``)."""

    def __init__(self, chief: bool, stream=None):
        super().__init__()
        self.chief = chief
        self.stream = stream

    def on_epoch_end(self, epoch, logs=None):
        if self.chief:
            write_metric_line(epoch + 1, logs or {}, self.stream)


class BroadcastInitialWeights(tf.keras.callbacks.Callback):
    """Broadcast rank ``root_rank``'s model weights at train begin (after a resume restore), so every
    rank's first step starts from the same weights; Horovod's own callback then syncs optimizer slots."""

    def __init__(self, root_rank: int = 0):
        super().__init__()
        self.root_rank = root_rank

    def on_train_begin(self, logs=None):
        import horovod.tensorflow as hvd  # here: loading this module must not need Horovod

        variables = list(self.model.variables)
        if variables:
            hvd.broadcast_variables(variables, root_rank=self.root_rank)


def horovod_callbacks(
    *,
    rank: int,
    checkpoint_dir,
    resume_from: Checkpoint | None,
    keep: int | None,
    every: int,
    warmup_epochs: float,
    scaled_lr: float,
    steps: int | None,
) -> list:
    """Steps 1 to 4 above: checkpoints (when ``checkpoint_dir`` is given), the broadcasts, metric
    averaging and, with ``warmup_epochs > 0``, the warm-up to ``scaled_lr`` over that many epochs."""
    import horovod.tensorflow.keras as hvd_keras

    callbacks: list = []
    if checkpoint_dir is not None:
        callbacks.append(
            RankZeroCheckpoint(checkpoint_dir, rank=rank, resume_from=resume_from, keep=keep, every=every)
        )
    callbacks.append(BroadcastInitialWeights(0))
    callbacks.append(hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0))
    callbacks.append(hvd_keras.callbacks.MetricAverageCallback())
    callbacks.append(MetricLine(chief=rank == 0))  # after the averaging: every rank's mean
    if warmup_epochs > 0:
        callbacks.append(
            hvd_keras.callbacks.LearningRateWarmupCallback(
                initial_lr=scaled_lr,
                warmup_epochs=warmup_epochs,
                steps_per_epoch=steps,
                verbose=1 if rank == 0 else 0,
            )
        )
    return callbacks


def tensorboard_callbacks(
    session: TrainingSession, tensorboard_dir: str | os.PathLike | None, s3_uri: str | None, interval: float
) -> tuple[list, object | None]:
    """Step 5 above, on the chief only: ``(callbacks, syncer)``, the session's syncer started when
    ``s3_uri`` is set."""
    if tensorboard_dir is None or not session.chief:
        return [], None
    tensorboard = tf.keras.callbacks.TensorBoard(log_dir=str(tensorboard_dir), profile_batch=0)
    syncer = session.start_tensorboard(tensorboard_dir, s3_uri, interval)
    if syncer is None:
        return [tensorboard], None
    return [tensorboard, TensorBoardSyncCallback(syncer, tensorboard)], syncer
