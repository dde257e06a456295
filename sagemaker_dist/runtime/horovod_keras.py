"""The usual Horovod + Keras script changes in one call, arranged so no rank can wait forever on another.

``setup()`` runs ``hvd.init``, pins one GPU per local rank (memory growth on), scales the learning rate by
the number of workers (optionally warmed up over the first epochs), wraps the optimizer in
``hvd.DistributedOptimizer``, agrees on steps per epoch from every rank's shard size (the smallest
shard decides, so all ranks run the same number of steps and the same collectives), finds the resume
epoch from rank 0's newest checkpoint, and returns the callbacks in the order that matters: restore and
save checkpoints (rank 0), broadcast rank 0's state, average metrics (train and validation, horovod#600),
warm-up, then rank 0's TensorBoard logging and its sync to S3.

Horovod and TensorFlow are imported inside the functions, so importing this module needs neither.
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.runtime import checkpoints as ckpt
from sagemaker_dist.runtime.tensorboard_sync import TensorBoardSyncer

log = logging.getLogger(__name__)


class HorovodSetupError(ConfigurationError):
    """A Horovod/Keras setting that cannot work (names the setting and what to change)."""


@dataclass
class HorovodKeras:
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
    resume_from: ckpt.Checkpoint | None = None
    tensorboard_syncer: TensorBoardSyncer | None = None
    gpu: str | None = None

    @property
    def is_chief(self) -> bool:
        """True on rank 0, the only rank that writes checkpoints, logs and the model."""
        return self.rank == 0

    @property
    def verbose(self) -> int:
        """Keras ``verbose`` for this rank: one line per epoch on rank 0, silent elsewhere."""
        return 2 if self.is_chief else 0

    def train_epoch(self, batches):
        """One epoch of this rank's train batches: exactly ``steps_per_epoch`` of them.

        Pass it to ``fit`` as is (no ``.repeat()``, no ``steps_per_epoch``): its cardinality is known,
        so Keras makes a new iterator each epoch, which opens the channel's next FIFO, counts its steps
        up front (warm-up and progress are exact) and every rank runs the same steps. A shard shorter
        than that fails with a clear error naming the rank and the counts instead of stalling the
        other ranks. (A ``.repeat()``-ed Pipe dataset would read ahead into the next epoch's FIFO.)
        """
        return self._exactly(batches, self.steps_per_epoch, self.train_counts, "train")

    def validation_epoch(self, batches):
        """One validation pass over this rank's own shard: exactly ``validation_steps`` batches."""
        return self._exactly(batches, self.validation_steps, self.validation_counts, "validation")

    def _exactly(self, batches, steps: int | None, counts: list[int] | None, what: str):
        if steps is None:
            if self.size > 1:
                raise HorovodSetupError(
                    f"{what}: no steps per epoch, so ranks would run out of data at different steps "
                    f"and stall; pass {what}_records= (records in this rank's shard) and batch_size= "
                    "to setup()"
                )
            return batches
        message = (
            f"rank {self.rank}: its {what} shard ran out before the {steps} batches of "
            f"{self.batch_size} agreed per epoch (records per rank given to setup(): {counts}); "
            f"{what}_records must be the records in this rank's shard. Batches delivered:"
        )
        return _exactly(batches, steps, message)

    def fit_kwargs(self, **extra) -> dict:
        """Keyword arguments for ``model.fit``: callbacks (plus ``callbacks=`` given here, run after
        ours), initial epoch and verbosity; anything else given is passed through."""
        kwargs = {
            "callbacks": list(self.callbacks),
            "initial_epoch": self.initial_epoch,
            "verbose": self.verbose,
        }
        kwargs["callbacks"].extend(extra.pop("callbacks", None) or [])
        kwargs.update(extra)
        return kwargs


def _exactly(batches, steps: int, message: str | None = None):
    """``batches`` cut to ``steps`` with that cardinality; ending early raises ``message`` (plus the
    count), checked by an end marker appended after the batches, before TensorFlow's own check."""
    import tensorflow as tf

    cut = batches.take(steps)
    specs = tf.nest.flatten(batches.element_spec)
    if message is None or not all(
        isinstance(spec, tf.TensorSpec) and spec.shape.rank is not None for spec in specs
    ):
        return cut.apply(tf.data.experimental.assert_cardinality(steps))
    blank = tf.nest.pack_sequence_as(
        batches.element_spec,
        [tf.zeros([d if d is not None else 0 for d in spec.shape], spec.dtype) for spec in specs],
    )
    marked = cut.map(lambda *b: (False, b if len(b) > 1 else b[0])).concatenate(
        tf.data.Dataset.from_tensors((True, blank))
    )

    def count(seen, item):
        is_end, batch = item
        check = tf.debugging.Assert(tf.logical_or(tf.logical_not(is_end), seen >= steps), [message, seen])
        with tf.control_dependencies([check]):
            return seen + 1, item

    checked = marked.scan(tf.constant(0, tf.int64), count)
    checked = checked.filter(lambda is_end, batch: tf.logical_not(is_end))
    return checked.map(lambda is_end, batch: batch).apply(tf.data.experimental.assert_cardinality(steps))


def pin_gpu(local_rank: int, local_size: int) -> str | None:
    """Make only GPU ``local_rank`` visible to this process, with memory growth; None on CPU hosts."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    if local_size > len(gpus):
        raise HorovodSetupError(
            f"{local_size} processes run on this host but it has {len(gpus)} GPU(s); set "
            f"sagemaker_mpi_num_of_processes_per_host (processes_per_host) to at most {len(gpus)}"
        )
    try:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpus[local_rank], "GPU")
    except RuntimeError as exc:
        raise HorovodSetupError(
            "TensorFlow had already initialised its GPUs, so one GPU per rank cannot be pinned; call "
            "horovod_keras.setup() before building the model, the optimizer or any tensor"
        ) from exc
    return gpus[local_rank].name


def _is_optimizer_instance(obj) -> bool:
    return hasattr(obj, "get_config") and not isinstance(obj, type)


def build_scaled_optimizer(optimizer, size: int, learning_rate: float | None = None):
    """``(optimizer, base_lr, scaled_lr)`` with the rate multiplied by ``size``.

    ``optimizer`` is a Keras optimizer instance (its rate is the single-worker rate) or a callable
    taking the learning rate (a class such as ``tf.keras.optimizers.legacy.SGD``, or a lambda); a
    callable is called after GPU pinning, which new-style Keras optimizers need (they create variables).
    """
    if _is_optimizer_instance(optimizer):
        config = optimizer.get_config()
        base = config.get("learning_rate") if learning_rate is None else learning_rate
        if isinstance(base, bool) or not isinstance(base, int | float):
            raise HorovodSetupError(
                f"the optimizer's learning rate is {base!r}, not a number; pass learning_rate= (the "
                "single-worker rate) or an optimizer factory taking the rate"
            )
        scaled = float(base) * size
        return type(optimizer).from_config({**config, "learning_rate": scaled}), float(base), scaled
    if callable(optimizer):
        if learning_rate is None:
            raise HorovodSetupError(
                "an optimizer factory needs learning_rate= (the single-worker rate); setup() passes "
                "learning_rate x number of workers to it"
            )
        scaled = float(learning_rate) * size
        return optimizer(scaled), float(learning_rate), scaled
    raise HorovodSetupError(
        f"optimizer={optimizer!r} is neither a Keras optimizer nor a callable returning one"
    )


def agreed_steps(records: int | None, batch_size: int | None, what: str, hvd) -> int | None:
    """Steps per epoch every rank can run: the smallest shard's ``records // batch_size``.

    All ranks call this (an allgather); a rank with fewer records than one batch is named in the error.
    """
    return _agree(records, batch_size, what, hvd)[0]


def _agree(records, batch_size, what, hvd) -> tuple[int | None, list[int] | None]:
    if records is None:
        return None, None
    if not batch_size or batch_size < 1:
        raise HorovodSetupError(f"batch_size={batch_size!r}; give the per-rank batch size (>= 1)")
    if records < 0:
        raise HorovodSetupError(f"{what} records={records!r}; give this rank's record count (>= 0)")
    counts = [int(c) for c in hvd.allgather_object(int(records), name=f"sagemaker_dist_{what}_records")]
    smallest = min(counts)
    steps = smallest // batch_size
    if steps < 1:
        poor = counts.index(smallest)
        raise HorovodSetupError(
            f"rank {poor} has {smallest} {what} record(s), fewer than one batch of {batch_size}; "
            f"records per rank: {counts}. Use a smaller batch size or more data per shard"
        )
    if max(counts) // batch_size > steps:
        log.info(
            "%s shards differ (%d..%d records per rank); every rank runs %d steps per epoch",
            what,
            smallest,
            max(counts),
            steps,
        )
    return steps, counts


def _per_rank(records: int | None, total: int | None, size: int, what: str) -> int | None:
    """This rank's record count. A total only works on one rank: shards are balanced by bytes, not
    records (8 equal files over 3 ranks are 3, 3 and 2 files), so total // size is not any rank's shard."""
    if records is not None and total is not None:
        raise HorovodSetupError(f"give either {what}_records or total_{what}_records, not both")
    if total is not None:
        if size > 1:
            raise HorovodSetupError(
                f"total_{what}_records={total} cannot give this rank's steps on {size} ranks: shards are "
                f"balanced by bytes, so their record counts differ (e.g. 8 equal files over 3 ranks are "
                f"3, 3 and 2 files). Pass {what}_records= the records in this rank's own shard"
            )
        return int(total)
    return records


def _start_state_callback(hvd):
    """Broadcast rank 0's model weights at train begin (after a resume restore), so every rank's
    first step starts from the same weights; Horovod's own callback then syncs optimizer slots."""
    import tensorflow as tf

    class BroadcastInitialWeights(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            variables = list(self.model.variables)
            if variables:
                hvd.broadcast_variables(variables, root_rank=0)

    return BroadcastInitialWeights()


def check_keras_2(keras_version: str) -> None:
    """Horovod 0.28 wraps Keras 2 optimizers only; TF >= 2.16 brings Keras 3 unless told otherwise."""
    major = keras_version.split(".", 1)[0]
    if major.isdigit() and int(major) >= 3:
        raise HorovodSetupError(
            f"tf.keras is Keras {keras_version}; Horovod supports Keras 2 only. On TensorFlow 2.16 or "
            "newer, pip install tf_keras (the same minor version as TensorFlow) and set "
            "TF_USE_LEGACY_KERAS=1 before TensorFlow is imported"
        )


def _tf_keras_version(tf) -> str:
    """The version of the package behind ``tf.keras``: keras (2 or 3) or tf_keras (Keras 2)."""
    package = importlib.import_module(tf.keras.__name__.split(".", 1)[0])
    return str(getattr(package, "__version__", "2"))


def check_channels_before_collectives(root=None, *, validation: bool = False) -> None:
    """Fail fast, before any collective op, if this rank has no channel of its own (rank/channel
    mismatch, missing channel) or would share a Pipe FIFO with another rank of its host (e.g. one
    validation channel for several ranks: horovod#600). Skipped for jobs without a sagemaker-dist
    layout."""
    from sagemaker_dist.runtime.config import ContainerConfig
    from sagemaker_dist.runtime.ranks import RankInfo, check_rank_channels

    config = ContainerConfig.load(root)
    if config.layout is None:
        return
    info = RankInfo.detect()
    modes = ("Pipe", "File")  # File mode: every rank reads the channel's files itself
    check_rank_channels(config, info, role="train", input_modes=modes)
    if validation:
        check_rank_channels(config, info, role="validation", input_modes=modes)


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
) -> HorovodKeras:
    """Initialise Horovod and return the optimizer, callbacks and step counts for ``model.fit``.

    ``train_records`` is the number of records in this rank's own shard (required with more than one
    rank; ``total_train_records`` is accepted on one rank only, since shards are balanced by bytes);
    ``steps_per_epoch`` is the smallest shard's ``records // batch_size`` so no rank runs out first.
    The same for validation: every rank validates its own shard for ``validation_steps`` steps
    and ``MetricAverageCallback`` averages ``val_*`` (horovod#600). ``check_channels`` verifies this
    rank's channels before the first collective when the job carries a sagemaker-dist layout.
    """
    if check_channels:  # before Horovod and TensorFlow load: a mismatch fails in well under 10 s
        check_channels_before_collectives(
            root, validation=validation_records is not None or total_validation_records is not None
        )

    import tensorflow as tf

    check_keras_2(_tf_keras_version(tf))
    import horovod.tensorflow as hvd  # collectives (allgather_object, broadcast_variables)
    import horovod.tensorflow.keras as hvd_keras  # optimizer wrapper and Keras callbacks

    hvd.init()
    rank, local_rank, size, local_size = hvd.rank(), hvd.local_rank(), hvd.size(), hvd.local_size()
    records = _per_rank(train_records, total_train_records, size, "train")
    val_records = _per_rank(validation_records, total_validation_records, size, "validation")
    if size > 1 and records is None:  # before any collective: every rank fails the same way
        raise HorovodSetupError(
            f"rank {rank} of {size}: pass train_records= (the records in this rank's own shard) and "
            "batch_size=; without them no rank knows when to stop an epoch, a rank with a shorter shard "
            "runs out first and the others wait for it forever"
        )
    gpu = pin_gpu(local_rank, local_size) if pin_gpus else None

    opt, base_lr, scaled_lr = build_scaled_optimizer(optimizer, size, learning_rate)
    opt = hvd_keras.DistributedOptimizer(opt)

    steps, train_counts = _agree(records, batch_size, "train", hvd)
    val_steps, val_counts = _agree(val_records, batch_size, "validation", hvd)

    callbacks: list = []
    ckpt_dir = resume_from = None
    initial_epoch = 0
    if checkpoints:
        ckpt_dir = ckpt.checkpoint_dir(root)
        initial_epoch, resume_from = ckpt.resume_point(ckpt_dir, rank=rank)
        callbacks.append(
            ckpt.checkpoint_callback(
                ckpt_dir, rank=rank, resume_from=resume_from, keep=keep_checkpoints, every=checkpoint_every
            )
        )
    callbacks.append(_start_state_callback(hvd))
    callbacks.append(hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0))
    callbacks.append(hvd_keras.callbacks.MetricAverageCallback())
    if warmup_epochs and warmup_epochs > 0:
        if steps is None:
            raise HorovodSetupError(
                "warmup_epochs needs the steps per epoch: pass batch_size and train_records"
            )
        callbacks.append(
            hvd_keras.callbacks.LearningRateWarmupCallback(
                initial_lr=scaled_lr,
                warmup_epochs=warmup_epochs,
                steps_per_epoch=steps,
                verbose=1 if rank == 0 else 0,
            )
        )
    syncer = None
    if tensorboard_dir is not None and rank == 0:
        import tensorflow as tf

        tensorboard = tf.keras.callbacks.TensorBoard(log_dir=str(tensorboard_dir), profile_batch=0)
        callbacks.append(tensorboard)
        if tensorboard_s3_uri:
            syncer = TensorBoardSyncer(tensorboard_dir, tensorboard_s3_uri, interval=tensorboard_interval)
            syncer.start()
            callbacks.append(syncer.keras_callback(tensorboard))
    elif tensorboard_s3_uri and tensorboard_dir is None:
        raise HorovodSetupError("tensorboard_s3_uri needs tensorboard_dir (the local log directory to sync)")

    if rank == 0:
        log.info(
            "Horovod: %d rank(s), %d per host; learning rate %g x %d = %g%s; steps per epoch %s; "
            "validation steps %s; starting at epoch %d%s",
            size,
            local_size,
            base_lr,
            size,
            scaled_lr,
            f" (warm-up over {warmup_epochs} epochs)" if warmup_epochs else "",
            steps,
            val_steps,
            initial_epoch,
            f" from {resume_from.path}" if resume_from else "",
        )
    return HorovodKeras(
        rank=rank,
        local_rank=local_rank,
        size=size,
        local_size=local_size,
        optimizer=opt,
        learning_rate=scaled_lr,
        callbacks=callbacks,
        initial_epoch=initial_epoch,
        steps_per_epoch=steps,
        validation_steps=val_steps,
        batch_size=batch_size,
        train_counts=train_counts,
        validation_counts=val_counts,
        checkpoint_dir=ckpt_dir,
        resume_from=resume_from,
        tensorboard_syncer=syncer,
        gpu=gpu,
    )
