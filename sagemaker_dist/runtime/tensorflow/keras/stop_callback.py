"""The Keras side of stops (``stop.py``): at the step the ranks agreed on, rank 0 checkpoints that step,
TensorBoard is flushed and ``fit`` raises ``TrainingStopped`` on every rank; in between, rank 0 writes
the periodic step checkpoints (``training_session.StepClock`` says when). Imports TensorFlow when loaded
(``setup()`` loads it)."""

from __future__ import annotations

import logging

import tensorflow as tf

from sagemaker_dist.runtime.stop import StepSchedule, StopRequest, TrainingStopped
from sagemaker_dist.runtime.tensorflow.keras.checkpoints import save_checkpoint, writing_dir
from sagemaker_dist.runtime.tensorflow.keras.tensorboard_callback import stop_flushes
from sagemaker_dist.runtime.training_session import StepClock, TrainingSession

log = logging.getLogger(__name__)


class StopAtAgreedStep(tf.keras.callbacks.Callback):
    """Ends the fit after the step the ranks agreed to stop at, and writes rank 0's step checkpoints.

    ``resume_step`` batches of the first epoch (``initial_epoch``) were trained before this fit (the
    dataset skips them), so this fit's batch ``b`` of that epoch is its step ``resume_step + b + 1``;
    ``resume_records`` are the records each rank had trained of it then. ``on_stop`` are called, in
    order, before the fit ends (TensorBoard's final flush). ``session`` (the front end's
    ``TrainingSession``) prints the chief's stop line and ends the stop."""

    def __init__(
        self,
        stop: StopRequest,
        *,
        session: TrainingSession,
        rank: int,
        directory=None,
        keep: int | None = 3,
        schedule: StepSchedule | None = None,
        resume_step: int = 0,
        resume_records: tuple[int, ...] | None = None,
        on_stop=(),
        reader=None,
    ):
        super().__init__()
        self.stop, self.session, self.rank = stop, session, rank
        self.directory, self.keep = directory, keep
        self.reader = reader  # the train channel's TrainReader (reader_resume.py): in each step checkpoint
        self.clock = StepClock(schedule)  # steps and time since the last checkpoint
        self.schedule, self.on_stop = self.clock.schedule, list(on_stop)
        self._offset, self._resume_records = int(resume_step), resume_records
        self._epoch = 0
        self.saved: list[tuple[int, int]] = []  # (epoch, step) of the step checkpoints written
        self._supports_tf_logs = True  # reads no logs: Keras need not convert them

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        self._offset, self._resume_records = 0, None
        self.clock.saved()  # the epoch's own checkpoint just went out

    def on_train_batch_end(self, batch, logs=None):
        self.clock.tick()
        step = self._offset + batch + 1
        if self.reader is not None and self.reader.expected is not None:
            self.reader.check_head()  # the resumed epoch's stream against the stopped one's
        if self.stop.stopping_at(batch):
            self._stop_here(step)
        if self.rank == 0 and self.directory is not None and self.schedule.active and self.clock.due():
            self._save_step(step)

    def _save_step(self, step: int) -> None:
        self._write(step)
        self.saved.append((self._epoch, step))
        self.clock.saved()

    def _write(self, step: int, extra: dict | None = None):
        """Rank 0's checkpoint of this step (Horovod: the others get its weights by broadcast)."""
        if self.rank != 0 or self.directory is None:
            return None
        return save_checkpoint(
            self.model, self.directory, self._epoch, keep=self.keep, step=step, extra=self._with_reader(extra)
        )

    def _with_reader(self, extra: dict | None) -> dict | None:
        if self.reader is None:
            return extra
        return {**(extra or {}), **self.reader.checkpoint()}

    def on_train_end(self, logs=None):
        self.stop.uninstall()

    def _epoch_over(self) -> bool:
        return self.stop.epoch_ended_at_stop()

    def _stop_here(self, step: int) -> None:
        agreed = self.stop.agreed
        records = list(agreed.records)
        if self._resume_records and len(self._resume_records) == len(records):
            records = [a + b for a, b in zip(self._resume_records, records)]
        epoch, last = self._epoch, step
        over = self._epoch_over()
        if over:  # the stopped step was the epoch's last: the checkpoint is of the whole epoch
            self._epoch, step = self._epoch + 1, 0
        written = self._write(step, {"stopped": True, "records_consumed": records or None})
        for flush in self.on_stop:
            try:
                flush()
            except Exception as exc:  # a flush that fails must not keep the rank from stopping
                log.warning("on stop: %s failed: %s", getattr(flush, "__qualname__", flush), exc)
        self.session.report_stop(epoch + 1, last, over, written, records=records)
        self.session.end_stop()
        raise TrainingStopped(self._epoch, step, written)


class StopAgreedEachStep(StopAtAgreedStep):
    """For epochs with no per-step agreement of ours in the dataset to ride on: after every step the
    ranks agree, in one collective of their own (``agree``: any rank's flags), on a stop and on a step
    checkpoint being due. ``agree`` None: a world of one, whose own flags are the answer."""

    def __init__(self, stop: StopRequest, *, agree=None, **kwargs):
        super().__init__(stop, **kwargs)
        self.agree = agree or (lambda flags: [bool(f) for f in flags])
        self._step_now = 0

    def on_train_batch_end(self, batch, logs=None):
        self.clock.tick()
        step = self._step_now = self._offset + batch + 1
        if self.reader is not None and self.reader.expected is not None:
            self.reader.check_head()
        due = self.directory is not None and self.clock.due()
        stop, due = self.agree([self.stop.wanted(), int(due)])
        if stop:
            self.stop.note_agreed(batch, ())
            self._stop_here(step)
        if due:
            self._save_step(step)


class StopAtCountedStep(StopAgreedEachStep):
    """Horovod epochs of ``steps`` steps (``train_records=``): the stopped step is the epoch's last when
    it is its ``steps``-th; rank 0 writes the checkpoints."""

    def __init__(self, stop: StopRequest, *, steps: int, **kwargs):
        super().__init__(stop, **kwargs)
        self.steps = int(steps)

    def _epoch_over(self) -> bool:
        return self._step_now >= self.steps


class StopOnEveryWorker(StopAgreedEachStep):
    """MultiWorkerMirroredStrategy's stops: every worker saves (the strategy needs all of them), the
    chief's copy kept."""

    def __init__(self, stop: StopRequest, *, chief: bool, **kwargs):
        super().__init__(stop, rank=0 if chief else 1, **kwargs)
        self.chief = chief

    def on_train_begin(self, logs=None):
        from sagemaker_dist.runtime.tensorflow.keras.agreement import EPOCH_ITERATOR

        EPOCH_ITERATOR.current = None  # this fit's first agreed epoch notes its own

    def _epoch_over(self) -> bool:
        """Whether the stopped step was the epoch's last: the strategy's iterator says, every worker
        asking at the same step (a resume would otherwise skip a whole epoch and train no step)."""
        from sagemaker_dist.runtime.tensorflow.keras.agreement import EPOCH_ITERATOR

        return EPOCH_ITERATOR.has_more() is False

    def _write(self, step: int, extra: dict | None = None):
        if self.directory is None:
            return None
        with writing_dir(self.chief, self.directory) as where:
            saved = save_checkpoint(
                self.model,
                where,
                self._epoch,
                keep=self.keep,
                step=step,
                extra=self._with_reader(extra),
                rank=0 if self.chief else -1,
            )
        return saved if self.chief else None


def step_callback(kind, session: TrainingSession, tensorboard: list, **kwargs) -> StopAtAgreedStep:
    """The front end's stop and step-checkpoint callback (``kind``, one of the above) over ``session``'s
    stop (one only ``request`` sets without SIGTERM: the callback then writes the step checkpoints) and
    its step schedule; a stop flushes ``tensorboard`` (``tensorboard_callback.stop_flushes``) last."""
    return kind(
        session.step_stop(),
        session=session,
        schedule=session.schedule,
        on_stop=stop_flushes(tensorboard),
        **kwargs,
    )
