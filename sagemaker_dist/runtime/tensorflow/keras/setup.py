"""``setup()``: the usual Horovod + Keras script changes in one call, in the order that keeps every rank
running the same collectives, and ``HorovodKeras``, what it returns.

Order: check every argument, this rank's channels and what depends on the number of ranks (no
TensorFlow, no Horovod yet: a mistake fails every rank at once); refuse Keras 3 and a Keras release
the patches were not written for (``patches.KERAS_RELEASES``); ``hvd.init()``; pin
one GPU per local rank; scale the learning rate and wrap the optimizer; agree on steps per epoch
(allgather); find the resume epoch (broadcast); build the callbacks.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sagemaker_dist.contract.layout import HOROVOD
from sagemaker_dist.runtime.checkpoint_format import Checkpoint, checkpoint_dir
from sagemaker_dist.runtime.stop import ResumeSkip, StopRequest
from sagemaker_dist.runtime.tensorboard_sync import TensorBoardSyncer
from sagemaker_dist.runtime.tensorflow.keras.agreement import AGREED, EpochReports, agreed_epoch
from sagemaker_dist.runtime.tensorflow.keras.arguments import SetupArguments, check_arguments, check_world
from sagemaker_dist.runtime.tensorflow.keras.checkpoints import resume_position
from sagemaker_dist.runtime.tensorflow.keras.gpu import pin_gpu
from sagemaker_dist.runtime.tensorflow.keras.horovod_world import check_initialised_horovod
from sagemaker_dist.runtime.tensorflow.keras.optimizer import build_scaled_optimizer
from sagemaker_dist.runtime.tensorflow.keras.patches import FitWindow
from sagemaker_dist.runtime.tensorflow.keras.preflight import (
    check_channels_before_collectives,
    check_job_distribution,
    check_tf_keras,
    launched_world,
)
from sagemaker_dist.runtime.tensorflow.keras.steps import agree_on_steps, exact_epoch, skip_first_batches
from sagemaker_dist.runtime.tensorflow.keras.surface import FitSurface, start_session

log = logging.getLogger(__name__)


@dataclass
class HorovodKeras(FitSurface):
    """What a training script needs after ``setup()``: rank info, the wrapped optimizer, callbacks and
    the agreed step counts. ``model.fit(hv.train_epoch(ds), validation_data=hv.validation_epoch(v),
    epochs=n, **hv.fit_kwargs())``."""

    rank: int
    local_rank: int
    size: int
    local_size: int
    optimizer: Any
    learning_rate: float
    callbacks: list = field(default_factory=list)
    initial_epoch: int = 0
    steps_per_epoch: int | None = None
    validation_steps: int | None = None
    batch_size: int | None = None
    train_counts: list[int] | None = None  # records in each rank's train shard (allgathered)
    validation_counts: list[int] | None = None
    checkpoint_dir: Path | None = None
    resume_from: Checkpoint | None = None
    tensorboard_syncer: TensorBoardSyncer | None = None
    gpu: str | None = None
    hvd: Any = field(default=None, repr=False)  # horovod.tensorflow, for the per-step agreement
    train_reports: EpochReports | None = None  # how each epoch ended, without counts
    validation_reports: EpochReports | None = None
    fit_window: FitWindow = field(default_factory=FitWindow, repr=False)  # Keras patched only in our fits
    stop: StopRequest | None = None  # SIGTERM -> a stop every rank agrees on (agreed epochs only)
    resume_step: int = 0  # steps of initial_epoch trained before the checkpoint resumed from
    resume_skip: ResumeSkip | None = field(default=None, repr=False)

    def train_epoch(self, batches):
        """One epoch of this rank's train batches, ending at the same step on every rank.

        Pass it to ``fit`` as is (no ``.repeat()``, no ``steps_per_epoch``): Keras makes a new iterator
        each epoch, which opens the channel's next FIFO. Without counts, the ranks agree every step
        (a min-allreduce of "I have a batch") and the epoch ends when the first rank runs out; the
        records the others still hold are reported (``train_reports``). With ``train_records`` given,
        each epoch is exactly ``steps_per_epoch`` batches and needs no per-step agreement; a shard
        shorter than promised fails naming the rank. (A ``.repeat()``-ed Pipe dataset would read
        ahead into the next epoch's FIFO.)
        """
        self.check_order(batches)
        skip = self.resume_skip  # the steps trained before the stop
        if skip is not None and self.steps_per_epoch is None:
            batches, skip = skip_first_batches(batches, skip), None
        return self._epoch(batches, self.steps_per_epoch, self.train_counts, "train", skip)

    def validation_epoch(self, batches):
        """One validation pass over this rank's own shard, ending at the same step on every rank."""
        return self._epoch(batches, self.validation_steps, self.validation_counts, "validation")

    def _epoch(self, batches, steps: int | None, counts: list[int] | None, what: str, skip=None):
        """``skip``: counted epochs only (the agreed ones skip before their agreement)."""
        if steps is None:  # one rank too: its steps carry a stop
            self.fit_window.handed_out()  # Keras would hold every epoch to the first one's length
            stop = self.stop if what == "train" else None
            return agreed_epoch(batches, what, self.hvd, getattr(self, f"{what}_reports"), stop)
        epoch = exact_epoch(
            batches,
            steps=steps,
            counts=counts,
            what=what,
            rank=self.rank,
            size=self.size,
            batch_size=self.batch_size,
            skip=skip,
        )
        if skip is not None:  # the resumed epoch is shorter than the others
            self.fit_window.handed_out()
            setattr(epoch, AGREED, True)
        return epoch


def setup(
    optimizer,
    *,
    learning_rate: float | None = None,
    batch_size: int | None = None,
    train_records: int | None = None,
    total_train_records: int | None = None,
    validation_records: int | None = None,
    total_validation_records: int | None = None,
    warmup_epochs: float = 0,
    checkpoints: bool = True,
    keep_checkpoints: int | None = 3,
    checkpoint_every: int = 1,
    tensorboard_dir: str | os.PathLike | None = None,
    tensorboard_s3_uri: str | None = None,
    tensorboard_interval: float = 30.0,
    root: str | os.PathLike | None = None,
    pin_gpus: bool = True,
    check_channels: bool = True,
    stop_on_sigterm: bool = True,
    checkpoint_every_steps: int | None = None,
    checkpoint_every_seconds: float | None = None,
    stop_grace: float = 100.0,
) -> HorovodKeras:
    """Initialise Horovod and return the optimizer, callbacks and step counts for ``model.fit``.

    Record counts are optional: without them the ranks agree at every step whether each still has a
    batch, and every epoch ends on every rank when the first runs out (``HorovodKeras.train_epoch``).
    ``train_records`` (this rank's own shard; ``total_train_records`` on one rank only, since shards
    are balanced by bytes) fixes ``steps_per_epoch`` to the smallest shard's ``records // batch_size``
    instead, with no per-step agreement. The same for validation; ``MetricAverageCallback`` averages
    ``val_*`` (horovod#600). ``check_channels`` verifies this
    rank's channels before the first collective when the job carries a sagemaker-dist layout.
    Every argument is checked before Horovod starts; a bad one raises ``TrainingSetupError`` naming it.

    Stops (``stop.py``): SIGTERM on any rank stops every rank after the same step (epochs without record
    counts carry it in their per-step agreement; with counts the ranks add a small allreduce after each
    step, which ``stop_on_sigterm=False`` and no step checkpoints leave out), rank 0 checkpoints that
    step and ``fit`` raises ``TrainingStopped``; ``stop_grace`` seconds after the signal a rank that
    could not stop exits anyway. Rank 0 also writes a step checkpoint every ``checkpoint_every_steps``
    steps and/or ``checkpoint_every_seconds``; a resume from a step checkpoint skips the batches of that
    epoch every rank already trained.
    """
    args = SetupArguments(**locals())  # every parameter above, by name
    check_arguments(args)
    check_job_distribution(HOROVOD, args.root)
    if args.check_channels:  # before Horovod and TensorFlow load: a mismatch fails in well under 10 s
        check_channels_before_collectives(args.root, validation=args.validates)
    launched = launched_world()
    if launched is not None:  # the launcher's rank and size: world checks before hvd.init()
        check_world(args, launched.rank, launched.size)
    return _start(args)


def _start(args: SetupArguments) -> HorovodKeras:
    """Everything from ``hvd.init()`` on, for arguments ``setup()`` has checked."""
    import tensorflow as tf

    check_tf_keras(tf)
    import horovod.tensorflow as hvd  # collectives (allgather_object, broadcast_variables)
    import horovod.tensorflow.keras as hvd_keras  # optimizer wrapper

    from sagemaker_dist.runtime.tensorflow.keras import (
        callbacks as keras_callbacks,  # loads TensorFlow's Keras
    )

    hvd.init()
    check_initialised_horovod(hvd)  # a Horovod without MPI under mpirun: every process a world of one
    rank, local_rank, size, local_size = hvd.rank(), hvd.local_rank(), hvd.size(), hvd.local_size()
    records, val_records = check_world(args, rank, size)  # Horovod's numbers: any launcher, no collective
    gpu = pin_gpu(local_rank, local_size) if args.pin_gpus else None

    opt, base_lr, scaled_lr = build_scaled_optimizer(args.optimizer, size, args.learning_rate)
    opt = hvd_keras.DistributedOptimizer(opt)

    steps, train_counts = agree_on_steps(records, args.batch_size, "train", hvd)
    val_steps, val_counts = agree_on_steps(val_records, args.batch_size, "validation", hvd)

    ckpt_dir = checkpoint_dir(args.root) if args.checkpoints else None
    position, resume_from = resume_position(ckpt_dir, rank=rank) if ckpt_dir is not None else ((0, 0), None)
    # the position is the same on every rank (broadcast): so is the reader state's broadcast
    share = (
        (lambda saved: hvd.broadcast_object(saved, root_rank=0, name="sagemaker_dist_reader_position"))
        if size > 1
        else None
    )
    session, reader, (initial_epoch, resume_step) = start_session(
        args, rank, local_rank, size, position, resume_from, share
    )
    window = FitWindow()
    callbacks = [keras_callbacks.KerasPatchesWhileFitting(window)] + keras_callbacks.horovod_callbacks(
        rank=rank,
        checkpoint_dir=ckpt_dir,
        resume_from=resume_from,
        keep=args.keep_checkpoints,
        every=args.checkpoint_every,
        warmup_epochs=args.warmup_epochs,
        scaled_lr=scaled_lr,
        steps=steps,
    )
    tensorboard, syncer = keras_callbacks.tensorboard_callbacks(
        session, args.tensorboard_dir, args.tensorboard_s3_uri, args.tensorboard_interval
    )
    if steps is None or session.stop is not None or session.schedule.active:  # counted: else no step work
        callbacks.append(
            _stop_callback(
                args, session, ckpt_dir, resume_step, resume_from, tensorboard, steps, size, reader
            )
        )
    hv = HorovodKeras(
        rank=rank,
        local_rank=local_rank,
        size=size,
        local_size=local_size,
        optimizer=opt,
        learning_rate=scaled_lr,
        callbacks=callbacks + tensorboard,
        initial_epoch=initial_epoch,
        steps_per_epoch=steps,
        validation_steps=val_steps,
        batch_size=args.batch_size,
        train_counts=train_counts,
        validation_counts=val_counts,
        checkpoint_dir=ckpt_dir,
        resume_from=resume_from,
        tensorboard_syncer=syncer,
        gpu=gpu,
        hvd=hvd,
        train_reports=EpochReports("train", rank),
        validation_reports=EpochReports("validation", rank),
        fit_window=window,
        stop=session.stop,
        resume_step=resume_step,
        resume_skip=ResumeSkip(resume_step) if resume_step else None,
    )
    if hv.is_chief:
        _log_start(hv, base_lr, args.warmup_epochs)
    session.announce_resume(resume_from, initial_epoch, resume_step)  # whatever the logging set-up
    return hv


def _stop_callback(args, session, ckpt_dir, resume_step, resume_from, tensorboard, steps, size, reader=None):
    """The stop's and step checkpoints' callback; without a stop request it only writes step checkpoints
    (``stop_on_sigterm=False``). TensorBoard's final flush is its last act on a stop. Epochs without
    record counts carry the stop in their per-step agreement; counted epochs (``steps``) have none,
    so the ranks agree after each step in an allreduce of the callback's own."""
    from sagemaker_dist.runtime.tensorflow.keras.stop_callback import (
        StopAtAgreedStep,
        StopAtCountedStep,
        step_callback,
    )

    records = (resume_from.meta.get("records_consumed") if resume_from and resume_step else None) or None
    counted = {"steps": steps, "agree": _any_rank if size > 1 else None} if steps is not None else {}
    return step_callback(
        StopAtCountedStep if steps is not None else StopAtAgreedStep,
        session,
        tensorboard,
        **counted,
        rank=session.rank,
        directory=ckpt_dir,
        keep=args.keep_checkpoints,
        resume_step=resume_step,
        resume_records=tuple(records) if records else None,
        reader=reader,
    )


def _any_rank(flags: list[int]) -> list[bool]:
    """For each flag, whether any rank's is set: one allreduce (a sum), eager, after a step."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    total = hvd.allreduce(tf.constant(flags, tf.int64), op=hvd.Sum, name="sagemaker_dist_stop_flags")
    return [int(v) > 0 for v in total.numpy()]


def _log_start(hv: HorovodKeras, base_lr: float, warmup_epochs: float) -> None:
    """One line on rank 0 with what every rank agreed on, for the job's log."""
    log.info(
        "Horovod: %d rank(s), %d per host; learning rate %g x %d = %g%s; steps per epoch %s; "
        "validation steps %s; starting at epoch %d%s%s",
        hv.size,
        hv.local_size,
        base_lr,
        hv.size,
        hv.learning_rate,
        f" (warm-up over {warmup_epochs} epochs)" if warmup_epochs else "",
        hv.steps_per_epoch,
        hv.validation_steps,
        hv.initial_epoch,
        f" after its step {hv.resume_step}" if hv.resume_step else "",
        f" from {hv.resume_from.path}" if hv.resume_from else "",
    )
