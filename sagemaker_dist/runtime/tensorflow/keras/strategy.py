"""``setup()`` for TensorFlow's MultiWorkerMirroredStrategy: the twin of the Horovod helper, with the
same surface, so a script switches with one line (``horovod_keras`` -> ``mwms_keras``).

One worker per host (SageMaker's TF toolkit writes ``TF_CONFIG`` and runs the script once per host),
driving every GPU of its host. Each worker reads its own channel (``rank_dataset`` takes the task
index from ``TF_CONFIG``), so tf.data auto-sharding is off. Epochs end together by tf.distribute's
own rule for uneven input: while any worker still has a batch, the others contribute empty ones, so
no record is dropped and every FIFO is read to its end. Every worker saves checkpoints (the
multi-worker pattern); only the chief's copy is kept. Works with Keras 2 (TF <= 2.15) and Keras 3.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from sagemaker_dist.contract.layout import TF_MWMS
from sagemaker_dist.runtime.checkpoint_format import Checkpoint, checkpoint_dir
from sagemaker_dist.runtime.stop import ResumeSkip, StopRequest
from sagemaker_dist.runtime.tensorboard_sync import TensorBoardSyncer
from sagemaker_dist.runtime.tensorflow.keras.agreement import AGREED
from sagemaker_dist.runtime.tensorflow.keras.arguments import SetupArguments, check_arguments
from sagemaker_dist.runtime.tensorflow.keras.errors import TrainingSetupError
from sagemaker_dist.runtime.tensorflow.keras.optimizer import build_scaled_optimizer
from sagemaker_dist.runtime.tensorflow.keras.patches import FitWindow
from sagemaker_dist.runtime.tensorflow.keras.preflight import (
    check_channels_before_collectives,
    check_job_distribution,
    check_tf_keras_release,
)
from sagemaker_dist.runtime.tensorflow.keras.steps import skip_first_batches
from sagemaker_dist.runtime.tensorflow.keras.surface import FitSurface, start_session
from sagemaker_dist.runtime.training_session import agreed_position

log = logging.getLogger(__name__)


@dataclass
class StrategyKeras(FitSurface):
    """What a script needs after ``setup()``; the same names as ``HorovodKeras``. Build and compile the
    model inside ``with hv.scope():``, then ``model.fit(hv.train_epoch(ds), ..., **hv.fit_kwargs())``."""

    strategy: Any
    rank: int  # the worker's task index
    size: int  # workers (hosts)
    replicas: int  # replicas in sync: every GPU of every worker (one per CPU worker)
    optimizer: Any
    learning_rate: float
    batch_size: int | None = None
    callbacks: list = field(default_factory=list)
    initial_epoch: int = 0
    checkpoint_dir: Any = None
    resume_from: Checkpoint | None = None
    tensorboard_syncer: TensorBoardSyncer | None = None
    local_rank: int = 0
    local_size: int = 1
    fit_window: FitWindow = field(default_factory=FitWindow, repr=False)  # Keras patched only in our fits
    stop: StopRequest | None = None  # SIGTERM -> a stop every worker agrees on after a step
    resume_step: int = 0  # steps of initial_epoch trained before the checkpoint resumed from
    resume_skip: ResumeSkip | None = field(default=None, repr=False)

    saves_on_every_worker = True

    def scope(self):
        """The strategy's scope: create and compile the model (and its optimizer) inside it."""
        return self.strategy.scope()

    def train_epoch(self, batches):
        """This worker's batches (of ``batch_size`` records per replica) for ``fit``: merged into the
        worker's share of the global batch, which tf.distribute splits over its replicas again.

        Pass it as is (no ``.repeat()``): Keras makes a new iterator each epoch, which opens the next
        FIFO. The epoch ends when every worker has run out; workers that ran out first take empty
        steps meanwhile, so the collectives stay in step. After a resume from a step checkpoint the
        first epoch skips the steps already trained."""
        self.check_order(batches)
        return self._epoch(batches, self.resume_skip)

    def validation_epoch(self, batches):
        """This worker's validation batches, ending together on every worker like ``train_epoch``."""
        return self._epoch(batches)

    def _epoch(self, batches, skip=None):
        import tensorflow as tf

        per_replica = _batch_size(batches, self.batch_size)
        # tf.distribute splits each batch of a worker's dataset over all the replicas in sync and hands
        # the slices to the worker's own replicas in turn, so a merged batch of replicas x per-replica
        # records lasts (workers) steps. Its size is dynamic and its length unknown: tf.distribute then
        # agrees every step across workers whether any still has data (its get_next_as_optional), which
        # is what keeps uneven shards in step.
        if skip is not None:  # per-replica batches: a step takes one for each of the worker's replicas
            batches = skip_first_batches(batches, skip)
        merged = batches.rebatch(per_replica * self.replicas)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        epoch = merged.with_options(options)
        setattr(epoch, AGREED, True)
        # Keras would hold every epoch to the first one's length, and Keras 3 reads a batch of it to
        # build the model before any callback runs: the patches are taken now, released at train end
        self.fit_window.handed_out()
        return epoch


def _batch_size(batches, given: int | None) -> int:
    """Records per batch of the script's dataset: its static batch dimension, else ``batch_size=``."""
    import tensorflow as tf

    first = tf.nest.flatten(batches.element_spec)[0]
    static = first.shape[0] if first.shape.rank else None
    if static is None and given is None:
        raise TrainingSetupError(
            "the dataset's batch size is not fixed (batch with drop_remainder=True) and setup() got no "
            "batch_size=; give one so each replica gets that many records per step"
        )
    return int(static if static is not None else given)


_HOROVOD_ONLY = (
    "train_records",
    "total_train_records",
    "validation_records",
    "total_validation_records",
    "warmup_epochs",
    "pin_gpus",
)


def setup(
    optimizer,
    *,
    learning_rate: float | None = None,
    batch_size: int | None = None,
    checkpoints: bool = True,
    keep_checkpoints: int | None = 3,
    checkpoint_every: int = 1,
    tensorboard_dir=None,
    tensorboard_s3_uri: str | None = None,
    tensorboard_interval: float = 30.0,
    root=None,
    check_channels: bool = True,
    **horovod_only,
) -> StrategyKeras:
    """Create the strategy (before any other TensorFlow op, as it requires), scale the learning rate by
    the replicas in sync, and return the optimizer (built in the strategy's scope), callbacks and the
    resume epoch. Arguments as ``horovod_keras.setup``; record counts are not needed (epochs end by
    tf.distribute's agreement), and Horovod-only ones are refused by name."""
    unknown = sorted(set(horovod_only) - set(_HOROVOD_ONLY))
    if unknown:
        raise TypeError(f"mwms_keras.setup() got unexpected keyword argument(s) {', '.join(unknown)}")
    # a Horovod script's calls pass as they are while they ask for nothing the strategy cannot do:
    # no record counts, no warm-up (pin_gpus has no meaning here: each worker drives all its GPUs)
    given = sorted(
        k
        for k, v in horovod_only.items()
        if k != "pin_gpus" and v is not None and not (k == "warmup_epochs" and v == 0)
    )
    if given:
        raise TrainingSetupError(
            f"{', '.join(given)}: not an argument of mwms_keras.setup() (record counts and warm-up are "
            "Horovod's); drop it"
        )
    args = SetupArguments(
        optimizer=optimizer,
        learning_rate=learning_rate,
        batch_size=batch_size,
        checkpoints=checkpoints,
        keep_checkpoints=keep_checkpoints,
        checkpoint_every=checkpoint_every,
        tensorboard_dir=tensorboard_dir,
        tensorboard_s3_uri=tensorboard_s3_uri,
        tensorboard_interval=tensorboard_interval,
        root=root,
        check_channels=check_channels,
    )
    check_arguments(args)
    check_job_distribution(TF_MWMS, root)
    if check_channels:
        check_channels_before_collectives(root)
    return _start(args)


def _start(args: SetupArguments) -> StrategyKeras:
    import tensorflow as tf

    check_tf_keras_release(tf)  # before the strategy starts its server: every worker fails alike
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    resolver = strategy.cluster_resolver
    rank = int(resolver.task_id) if resolver is not None and resolver.task_id is not None else 0
    size = max(1, len((resolver.cluster_spec().as_dict() if resolver else {}).get("worker", [])))
    replicas = int(strategy.num_replicas_in_sync)
    with strategy.scope():
        opt, base_lr, scaled_lr = build_scaled_optimizer(args.optimizer, replicas, args.learning_rate)
    ckpt_dir = checkpoint_dir(args.root) if args.checkpoints else None
    # the newest (epoch, step) every worker holds a complete checkpoint of (SageMaker restores the
    # checkpoint prefix onto every host), so every worker holds the checkpoint and its reader state
    smallest = _min_over_workers(strategy) if replicas > 1 else None
    position, resume_from = agreed_position(ckpt_dir, smallest) if ckpt_dir else ((0, 0), None)
    session, reader, (initial_epoch, resume_step) = start_session(args, rank, 0, size, position, resume_from)
    from sagemaker_dist.runtime.tensorflow.keras import (
        callbacks as keras_callbacks,  # loads TensorFlow's Keras
    )

    window = FitWindow()
    callbacks = [keras_callbacks.KerasPatchesWhileFitting(window)]
    if ckpt_dir is not None:
        callbacks.append(
            keras_callbacks.WorkerCheckpoint(
                ckpt_dir, chief=rank == 0, resume_from=resume_from, keep=args.keep_checkpoints,
                every=args.checkpoint_every,
            )
        )  # fmt: skip
    callbacks.append(keras_callbacks.MetricLine(chief=rank == 0))  # the strategy's metrics are global
    tensorboard, syncer = keras_callbacks.tensorboard_callbacks(
        session, args.tensorboard_dir, args.tensorboard_s3_uri, args.tensorboard_interval
    )
    if session.stop is not None or session.schedule.active:
        callbacks.append(
            _stop_callback(args, session, strategy, size, ckpt_dir, resume_step, tensorboard, reader)
        )
    hv = StrategyKeras(
        strategy=strategy,
        rank=rank,
        size=size,
        replicas=replicas,
        optimizer=opt,
        learning_rate=scaled_lr,
        batch_size=args.batch_size,
        callbacks=callbacks + tensorboard,
        initial_epoch=initial_epoch,
        checkpoint_dir=ckpt_dir,
        resume_from=resume_from,
        tensorboard_syncer=syncer,
        fit_window=window,
        stop=session.stop,
        resume_step=resume_step,
        # a step trains one per-replica batch on each of this worker's replicas
        resume_skip=ResumeSkip(resume_step * (replicas // size)) if resume_step else None,
    )
    session.announce_resume(resume_from, initial_epoch, resume_step)  # the job's log says where it resumed
    if hv.is_chief:
        log.info(
            "MultiWorkerMirroredStrategy: %d worker(s), %d replica(s) in sync; learning rate %g x %d = %g; "
            "starting at epoch %d%s",
            size, replicas, base_lr, replicas, scaled_lr, initial_epoch,
            f" from {resume_from.path}" if resume_from else "",
        )  # fmt: skip
    return hv


def _stop_callback(args, session, strategy, size, ckpt_dir, resume_step, tensorboard, reader=None):
    """The workers' per-step agreement on a stop and on step checkpoints (``stop_callback.py``)."""
    from sagemaker_dist.runtime.tensorflow.keras.stop_callback import StopOnEveryWorker, step_callback

    return step_callback(
        StopOnEveryWorker,
        session,
        tensorboard,
        agree=_any_worker(strategy) if size > 1 else None,
        chief=session.chief,
        directory=ckpt_dir,
        keep=args.keep_checkpoints,
        resume_step=resume_step,
        reader=reader,
    )


def _any_worker(strategy):
    """``agree(flags)``: for each flag, whether any worker's is set (one all-reduce, a sum)."""
    import tensorflow as tf

    def agree(flags):
        mine = strategy.experimental_distribute_values_from_function(
            lambda _ctx: tf.constant(flags, tf.int64)
        )
        total = strategy.reduce(tf.distribute.ReduceOp.SUM, mine, axis=None)
        return [int(v) > 0 for v in total.numpy()]

    return agree


def _min_over_workers(strategy):
    """``smallest(value)``: the smallest of every worker's int (gathered; a collective)."""
    import tensorflow as tf

    def smallest(value: int) -> int:
        mine = strategy.experimental_distribute_values_from_function(
            lambda _ctx: tf.constant([value], tf.int64)
        )
        return int(tf.reduce_min(strategy.gather(mine, axis=0)).numpy())

    return smallest
