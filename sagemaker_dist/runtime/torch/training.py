"""``PipeTraining``: the epochs of a DDP loop over Pipe channels, with resume, stop, checkpoints and metrics.

The script keeps its own step (forward, backward, optimizer); this object owns what is around it::

    training = PipeTraining(job, model, optimizer, scheduler, epochs=10)
    for epoch in training.epochs():                    # starts where the newest checkpoint left off
        for x, y in training.batches(train_batches):   # ends on the same step on every rank
            ...                                        # the script's step
        training.end_epoch(loss=mean_loss)             # metric line, TensorBoard, rank-0 checkpoint

- ``epochs()`` restores the newest checkpoint on rank 0 and broadcasts it (``checkpointing.py``), then
  yields the epochs left; the first one skips the batches trained before a stop.
- ``batches()`` agrees every step on "every rank has a batch, none wants to stop" (``epochs.py``). A
  SIGTERM on any rank stops every rank before the same step: rank 0 checkpoints the epoch and the
  steps trained, every rank waits for it and ``TrainingStopped`` (exit code 0) ends the process.
- ``evaluate()`` is the same agreement for validation on every rank, without stop or skip.
- ``end_epoch(**metrics)`` averages the metrics over the ranks, prints the metric line SageMaker's
  metric definitions and the tuners read (``contract.metric_line``, rank 0), writes them to
  TensorBoard (rank 0; synced to S3 with ``tensorboard_s3_uri``) and checkpoints the epoch.

The model says which checkpoints: a DDP (or plain) model is whole on every rank, so rank 0 saves it
(``checkpointing.py``); an FSDP2 model (``fully_shard``) is saved by every rank, its shard each, through
DCP (``sharded.py``), in the background (``async_save``) except at a stop, and resumes on any number of
ranks. The stop request, the step-checkpoint schedule, the resume, stop and metric lines and TensorBoard's
sync to S3 are the framework-neutral ``training_session.TrainingSession``'s, as for the Keras helpers.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.runtime.torch.checkpointing import restore_torch_checkpoint, save_torch_checkpoint
from sagemaker_dist.runtime.torch.epochs import AgreedEpoch, agreed_batches
from sagemaker_dist.runtime.torch.resume import begin_epoch, reader_checkpoint, resume_point
from sagemaker_dist.runtime.torch.sharded import ShardedCheckpoints, is_sharded
from sagemaker_dist.runtime.torch.stop import TrainingStopped, stop_grace
from sagemaker_dist.runtime.training_session import TrainingSession

log = logging.getLogger(__name__)


class PipeTraining:
    """The epochs of one training loop on every rank; see the module's docstring.

    ``checkpoint_dir``: default ``<root>/checkpoints`` (SageMaker syncs it with ``checkpoint_s3_uri``);
    False: no checkpoints. ``keep``: checkpoints kept. ``stop``: take SIGTERM as an agreed stop
    (``grace``: seconds before the watchdog ends a rank that cannot get there). ``join``: train every
    record of uneven shards through ``Join`` instead of ending at the shortest rank. ``tensorboard_dir``
    / ``tensorboard_s3_uri``: rank 0 writes the epoch metrics with ``torch.utils.tensorboard`` and
    mirrors the directory to S3 every ``tensorboard_interval`` seconds (default 30, as the Keras
    helpers). ``state`` (a dict) is saved in each checkpoint and restored into (plain JSON values for
    a sharded model). ``checkpoint_every_steps``: also checkpoint every that many steps inside an
    epoch. ``async_save``: a sharded model's epoch and step checkpoints are written while training
    goes on (the stop's is always written before the ranks exit). ``checkpoint_s3_uri``: a sharded
    model's checkpoints go straight to this ``s3://`` prefix from every rank (s3torchconnector, the
    ``s3torchconnector`` extra) instead of ``checkpoint_dir``.
    """

    def __init__(
        self,
        job,
        model,
        optimizer=None,
        scheduler=None,
        *,
        epochs: int,
        checkpoint_dir: str | os.PathLike | bool | None = None,
        keep: int | None = 3,
        stop: bool = True,
        grace: float | None = None,
        join: bool = False,
        tensorboard_dir: str | os.PathLike | None = None,
        tensorboard_s3_uri: str | None = None,
        tensorboard_interval: float | None = None,
        state: dict | None = None,
        checkpoint_every_steps: int | None = None,
        async_save: bool = True,
        checkpoint_s3_uri: str | None = None,
    ):
        if int(epochs) < 1:
            raise ConfigurationError(f"epochs={epochs!r}: give a whole number >= 1")
        if checkpoint_every_steps is not None and int(checkpoint_every_steps) < 1:
            raise ConfigurationError(
                f"checkpoint_every_steps={checkpoint_every_steps!r}: give a whole number >= 1 (or None)"
            )
        self.sharded = is_sharded(model)
        if self.sharded and join:
            raise ConfigurationError(
                "join=True trains uneven shards through torch's Join, which FSDP2 models do not "
                "support; leave join off (each epoch then ends at the shortest rank's last batch)"
            )
        if tensorboard_interval is not None and not float(tensorboard_interval) > 0:
            raise ConfigurationError(
                f"tensorboard_interval={tensorboard_interval!r}: give a number of seconds > 0"
            )
        if checkpoint_s3_uri is not None:
            _check_s3_checkpoints(checkpoint_s3_uri, self.sharded, checkpoint_dir)
        self.tensorboard_interval = tensorboard_interval
        self.job, self.model, self.optimizer, self.scheduler = job, model, optimizer, scheduler
        self.total_epochs = int(epochs)
        if checkpoint_dir is False:
            self.checkpoint_dir = None
        else:
            self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else Path(job.config.checkpoint_dir)
        self.keep = keep
        self.join = join
        self.state = state if state is not None else {}
        self.checkpoint_every_steps = int(checkpoint_every_steps) if checkpoint_every_steps else None
        self.sharded_checkpoints = None
        if self.sharded and self.checkpoint_dir is not None:
            self.sharded_checkpoints = ShardedCheckpoints(
                checkpoint_s3_uri or self.checkpoint_dir,
                model=model,
                optimizer=optimizer,
                scheduler=scheduler,
                rank=job.rank,
                local_rank=job.local_rank,
                world_size=job.world_size,
                group=job.agreement_group,
                async_group=_save_group(job.timeout_s) if async_save else None,
                keep=keep,
                timeout_s=job.timeout_s,
            )
        # the stop, the step-checkpoint schedule, the chief's lines and TensorBoard's sync
        self.session = TrainingSession.begin(
            job.rank,
            chief=job.is_chief,
            stop_on_sigterm=stop,
            grace=stop_grace(grace) if stop else None,
            every_steps=self.checkpoint_every_steps,
        )
        self.stop = self.session.stop
        self.epoch = 0  # the epoch being trained (0-based)
        self.step = 0  # steps of it trained so far, on every rank
        self.resumed_at: tuple[int, int] | None = None  # (epoch, step) of the checkpoint restored
        self.last: AgreedEpoch | None = None  # the last epoch of batches(): steps, ran_out, ...
        self.metrics: dict[str, float] = {}
        self._skip = 0
        self._reader = None  # the reader of the epoch under way, and its part of the checkpoint resumed
        self._saved_reader: dict | None = None
        self.writer = None
        if job.is_chief and (tensorboard_dir or tensorboard_s3_uri):
            self._start_tensorboard(tensorboard_dir, tensorboard_s3_uri)

    def _start_tensorboard(self, log_dir, s3_uri) -> None:
        from torch.utils.tensorboard import SummaryWriter

        log_dir = Path(log_dir or Path(self.job.config.output_data_dir) / "tensorboard")
        self.writer = SummaryWriter(log_dir=str(log_dir))
        self.session.start_tensorboard(log_dir, s3_uri, self.tensorboard_interval)

    def epochs(self):
        """The epochs left to train (0-based), from the newest checkpoint's; call on every rank."""
        start, step, extra = 0, 0, {}
        if self.sharded_checkpoints is not None:
            start, step, found, meta = self.sharded_checkpoints.restore()
            extra = meta.get("extra") or {}
            self.state.update((meta.get("extra") or {}).get("state") or {})
            if (start, step) != (0, 0):
                self.resumed_at = (start, step)
                self.session.announce_resume(found, start, step)
        elif self.checkpoint_dir is not None:
            start, step, found, extra = restore_torch_checkpoint(
                self.checkpoint_dir,
                model=self.model,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                rank=self.job.rank,
                group=self.job.agreement_group,
            )
            self.state.update(extra.get("state") or {})
            if (start, step) != (0, 0):
                self.resumed_at = (start, step)
                self.session.announce_resume(found, start, step)
        start, step, moved = resume_point(self.job, start, step, extra)  # another world size: next epoch
        self.session.announce(moved)
        self._saved_reader = extra.get("reader")
        try:
            for epoch in range(start, self.total_epochs):
                self.epoch = epoch
                self._skip = step if epoch == start else 0
                self.step = self._skip
                yield epoch
        finally:
            self._finish()

    def batches(self, batches, records=None):
        """This epoch's batches of ``batches`` (a ``PipeBatches``), ended by agreement on every rank.
        ``records``: a batch's record count for the epoch's line, where ``records_in`` cannot tell it."""
        # our readers take the epoch (its shuffle) and drop the records trained before a stop themselves
        skip = begin_epoch(batches, self.epoch, self._skip, self._saved_reader)
        self._reader = batches
        agreed = agreed_batches(
            batches,
            group=self.job.agreement_group,
            stop=self.stop,
            skip=skip,
            join=[self.model] if self.join else None,
            records=records,
        )
        self._skip = 0
        self.last = agreed
        schedule, start = self.session.schedule, self.step
        for batch in agreed:
            # a step checkpoint is written once the ranks agreed on a next step: at the epoch's end
            # end_epoch's checkpoint holds the same state
            if schedule.due_at(self.step, start):
                self._checkpoint(self.epoch, self.step)
            yield batch
            self.step += 1  # the script asked for the next batch: this one is trained
        if agreed.stopped:
            self._stopped(agreed)

    def evaluate(self, batches, records=None):
        """Validation batches, ended by agreement on every rank (no stop, no skip)."""
        return agreed_batches(batches, group=self.job.agreement_group, what="validation", records=records)

    def _position(self, agreed: AgreedEpoch) -> tuple[int, int]:
        """Where the stopped job resumes: inside this epoch, or at the next when it was done (a stop that
        came with the epoch's end, or under Join, where ranks trained different numbers of steps)."""
        return (self.epoch + 1, 0) if agreed.exhausted else (self.epoch, self.step)

    def _stopped(self, agreed: AgreedEpoch) -> None:
        epoch, step = self._position(agreed)
        checkpoint = None
        if self.sharded_checkpoints is not None:  # every rank writes its shard, now
            checkpoint = self.sharded_checkpoints.save(epoch, step, extra=self._extra(), blocking=True)
        elif self.job.is_chief and self.checkpoint_dir is not None:
            checkpoint = self._save(epoch, step)
        self.job.barrier()  # every rank waits for the checkpoint: nobody exits before it is there
        why = "none asked"
        if self.sharded_checkpoints is not None:
            why = "it could not be written: the previous one stays in force"
        self.session.report_stop(self.epoch + 1, self.step, agreed.exhausted, checkpoint, no_checkpoint=why)
        self._finish()
        self.job.close()  # the job ends here: every rank leaves the process group together, as at its end
        raise TrainingStopped(epoch, step, checkpoint)

    def _save(self, epoch: int, step: int):
        return save_torch_checkpoint(
            self.checkpoint_dir,
            epoch,
            step,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            extra=self._extra(),
            keep=self.keep,
        )

    def _extra(self) -> dict:
        extra = {"state": self.state, "world_size": self.job.world_size}
        reader = reader_checkpoint(self._reader)  # where the reader is: the FIFO its epoch reads
        return {**extra, "reader": reader} if reader else extra

    def _checkpoint(self, epoch: int, step: int) -> None:
        """An epoch's or a periodic step's checkpoint: a sharded model's on every rank (in the background
        with ``async_save``), a whole model's on rank 0."""
        if self.sharded_checkpoints is not None:
            self.sharded_checkpoints.save(epoch, step, extra=self._extra(), blocking=False)
        elif self.job.is_chief and self.checkpoint_dir is not None:
            self._save(epoch, step)

    def end_epoch(self, **metrics: float) -> dict[str, float]:
        """Average ``metrics`` over the ranks; on rank 0 print the metric line, write TensorBoard and
        checkpoint the epoch. Call on every rank after the epoch's batches (and validation)."""
        means = self.job.mean(metrics)
        self.metrics = means
        self.session.metric_line(self.epoch + 1, means)
        if self.writer is not None:  # the chief's
            for name, value in means.items():
                self.writer.add_scalar(name, value, self.epoch + 1)
            self.writer.flush()
            self.session.sync_tensorboard()
        self._checkpoint(self.epoch + 1, 0)
        return means

    def _finish(self) -> None:
        if self.sharded_checkpoints is not None:  # the save in flight, before the process group goes
            try:
                self.sharded_checkpoints.close()
            except Exception as exc:  # noqa: BLE001 - training is over: the previous checkpoint stands
                log.warning("the last checkpoint was not completed: %s", exc)
        try:
            if self.writer is not None:
                self.writer.close()
                self.writer = None
        finally:  # the stop's end (its handler and watchdog removed), the syncer's final flush
            self.session.finish()


def _check_s3_checkpoints(uri, sharded: bool, checkpoint_dir) -> None:
    """``checkpoint_s3_uri`` serves a sharded model, whose every rank writes its own shard."""
    if not (isinstance(uri, str) and uri.startswith("s3://") and uri[5:].split("/", 1)[0]):
        raise ConfigurationError(f"checkpoint_s3_uri={uri!r}: give s3://bucket/prefix")
    if not sharded:
        raise ConfigurationError(
            "checkpoint_s3_uri= writes a sharded (FSDP2) model's checkpoints straight to S3 from every "
            "rank; this model is whole on every rank, so rank 0 writes it to checkpoint_dir, which "
            "SageMaker syncs with the estimator's checkpoint_s3_uri. Leave checkpoint_s3_uri out"
        )
    if checkpoint_dir is False or checkpoint_dir:
        raise ConfigurationError(
            f"checkpoint_s3_uri={uri!r} and checkpoint_dir={checkpoint_dir!r}: a sharded model's "
            "checkpoints go to one of them; give one"
        )


def _save_group(timeout_s: float):
    """A Gloo group for background saves only (call on every rank), or None in a one-process job."""
    import datetime

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return None
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
