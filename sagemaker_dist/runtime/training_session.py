"""One training session's framework-neutral parts, which the three front ends share: Keras under Horovod
(``tensorflow/keras/setup.py``), Keras under MultiWorkerMirroredStrategy (``tensorflow/keras/strategy.py``)
and PyTorch's ``PipeTraining`` (``torch/training.py``).

- **Resume**: where the job resumes in the checkpoint directory (``newest_position``: rank 0's newest,
  passed to every rank by the front end's ``broadcast``; ``agreed_position``: the newest every worker
  holds, by the front end's ``smallest`` over workers), the move to the next epoch when the checkpoint
  was written inside an epoch by another number of ranks (``other_world_move``), and the chief's
  resume line (``TrainingSession.announce_resume``).
- **Stop**: the ``StopRequest`` taking SIGTERM (``TrainingSession.begin``), the one the per-step
  callbacks hold when SIGTERM is not taken (``step_stop``), the chief's stop line (``stop_line``) and
  its end (``finish``).
- **Checkpoint schedule**: the ``StepSchedule`` of periodic step checkpoints and the ``StepClock``
  that says when one is due.
- **Metric line**: the chief's line per epoch that SageMaker's metric definitions and the tuners read
  (``write_metric_line``), written in one ``write``.
- **Epoch end**: the chief's line at an agreed epoch end (``EpochReport``): which ranks ran out, the
  records each trained, those read ahead and not trained.
- **TensorBoard**: the chief's ``TensorBoardSyncer`` (``start_tensorboard``), asked for an upload at
  each epoch end and stopped (its final flush) at the session's end.

What needs a framework comes in as a callable (a broadcast, a min over workers) or stays in the front
end (loading tensors, the summary writers, the per-step agreement). Imports no framework.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sagemaker_dist.contract.metric_line import metric_line
from sagemaker_dist.contract.stop_lines import resumed_line, since_request, stopped_line
from sagemaker_dist.runtime.checkpoint_format import (
    Checkpoint,
    latest_checkpoint,
    list_checkpoints,
    remove_stale_temporaries,
)
from sagemaker_dist.runtime.epoch_reader.order import other_world_line
from sagemaker_dist.runtime.stop import DEFAULT_GRACE_S, StepSchedule, StopRequest

POSITION = 10**9  # (epoch, step) as one int64, for the workers' min
Position = tuple[int, int]


def newest_position(
    directory: str | os.PathLike, *, rank: int, broadcast: Callable[[Position], Position] | None = None
) -> tuple[Position, Checkpoint | None]:
    """``((epoch, step), checkpoint)``: rank 0 picks the newest complete checkpoint and every rank gets
    its position through ``broadcast`` (rank 0's value on every rank; None: a world of one). Other
    ranks get no checkpoint: they receive rank 0's weights by broadcast."""
    found = latest_checkpoint(directory) if rank == 0 else None
    position = found.position if found else (0, 0)
    epoch, step = broadcast(position) if broadcast is not None else position
    return (int(epoch), int(step)), found


def agreed_position(
    directory: str | os.PathLike, smallest: Callable[[int], int] | None = None
) -> tuple[Position, Checkpoint | None]:
    """The newest (epoch, step) every worker holds a complete checkpoint of (where each worker has a copy
    of the checkpoint directory; ``smallest``: the min over workers of one int, a collective; None: a
    world of one). The smallest of the workers' newest is a candidate; each worker then offers its newest
    at or below it, until all offer the candidate: a worker whose pruning kept other checkpoints than
    another's goes down with the rest, never alone to the start. Every worker runs the same rounds (each
    ends on the same collective value), at most one per checkpoint."""
    remove_stale_temporaries(directory)
    found = list_checkpoints(directory)
    held = [c.epoch * POSITION + c.step for c in found]
    agree = smallest if smallest is not None else int
    candidate = int(agree(held[-1] if held else 0))
    while True:
        offered = int(agree(max((h for h in held if h <= candidate), default=0)))
        if offered == candidate:
            break
        candidate = offered
    position = divmod(candidate, POSITION)
    chosen = next((c for c in found if c.position == position), None)
    return (position, chosen) if chosen else ((0, 0), None)


def other_world_move(epoch: int, step: int, saved_world, world: int) -> tuple[int, int, str | None]:
    """Where a job of ``world`` ranks resumes from a checkpoint at (``epoch``, ``step``) written by
    ``saved_world`` ranks: there, or, inside an epoch written by another number of ranks, at the next
    epoch's start, with the line that says so (each rank reads another stream then, so a count of
    batches names no records of it); None when nothing moves."""
    if not step or saved_world is None or int(saved_world) == world:
        return epoch, step, None
    return epoch + 1, 0, other_world_line(epoch, step, int(saved_world), world)


def write_metric_line(epoch: int, metrics: dict, stream=None) -> str | None:
    """Write the metric line of ``epoch`` (1-based) with ``metrics`` to ``stream`` (default stdout) in
    one ``write`` (a ``print`` writes the newline apart, and under load mpirun may tag the two writes
    apart, splitting the line); the line, or None when no metric has a value to print."""
    line = metric_line(epoch, metrics)
    if line:
        stream = stream or sys.stdout
        stream.write(line + "\n")
        stream.flush()
    return line


@dataclass(frozen=True)
class EpochReport:
    """How one epoch of one role ended by agreement, as every rank saw it (the chief prints ``line``)."""

    what: str
    steps: int
    records_read: tuple[int, ...] | None  # per rank: records in the batches trained on (None: not known)
    records_left: tuple[int, ...]  # per rank: records read ahead and not trained on (at least)
    ran_out: tuple[int, ...]  # ranks that had no batch at the last step

    def line(self) -> str:
        text = (
            f"{self.what} epoch ended for every rank after {self.steps} step(s): rank(s) "
            f"{', '.join(map(str, self.ran_out)) or '-'} ran out of data"
        )
        if self.records_read is None:
            return text
        text += f". Records read per rank: {list(self.records_read)}"
        left = [f"rank {r}: {n}" for r, n in enumerate(self.records_left) if n]
        if left:
            text += f"; read ahead and not trained on (the rest of the FIFO closed unread): {', '.join(left)}"
        return text


def stop_line(
    epoch: int,
    step: int,
    over: bool,
    checkpoint: Checkpoint | None,
    received_at: float | None,
    *,
    records: Sequence[int] | None = None,
    no_checkpoint: str = "checkpoints off",
) -> str:
    """The chief's line at an agreed stop after ``step`` steps of epoch ``epoch`` (1-based; ``over``: the
    step was its last): the records each rank trained of it where known, the checkpoint written (or
    why none: ``no_checkpoint``) and the time since the request."""
    return (
        stopped_line(epoch, step, over)
        + (f" (records of this epoch trained per rank: {list(records)})" if records else "")
        + (f"; checkpoint {checkpoint.path.name}" if checkpoint else f"; no checkpoint ({no_checkpoint})")
        + since_request(received_at)
    )


class StepClock:
    """Steps and seconds since the last checkpoint, against a ``StepSchedule``: ``tick()`` after each
    step, ``due()`` when a periodic step checkpoint is, ``saved()`` once one (or the epoch's) is out."""

    def __init__(self, schedule: StepSchedule | None = None):
        self.schedule = schedule or StepSchedule()
        self.steps = 0  # steps of this fit
        self._last = (0, time.monotonic())  # (steps, when) of the last checkpoint

    def tick(self) -> None:
        self.steps += 1

    def due(self) -> bool:
        return self.schedule.due(self.steps - self._last[0], time.monotonic() - self._last[1])

    def saved(self) -> None:
        self._last = (self.steps, time.monotonic())


@dataclass
class TrainingSession:
    """A rank's stop request, step-checkpoint schedule and TensorBoard syncer, with the chief's lines.

    ``begin`` installs the stop (SIGTERM -> a request the ranks agree on); ``finish`` ends it and the
    syncer. The front end keeps its framework's parts: the per-step agreement, the checkpoints' tensors,
    the summary writers."""

    rank: int
    chief: bool
    stop: StopRequest | None = None
    schedule: StepSchedule = field(default_factory=StepSchedule)
    syncer: object | None = None  # a TensorBoardSyncer, started (the chief's, with an S3 location)
    _own_stop: StopRequest | None = field(default=None, init=False, repr=False)  # step_stop()'s, no SIGTERM

    @classmethod
    def begin(
        cls,
        rank: int,
        *,
        chief: bool | None = None,
        stop_on_sigterm: bool = True,
        grace: float | None = None,
        every_steps: int | None = None,
        every_seconds: float | None = None,
    ) -> TrainingSession:
        """The session of ``rank`` (``chief``: default rank 0), taking SIGTERM unless ``stop_on_sigterm``
        is False (``grace``: seconds from SIGTERM to the watchdog's forced exit)."""
        grace = DEFAULT_GRACE_S if grace is None else grace
        stop = StopRequest(rank, grace).install() if stop_on_sigterm else None
        return cls(
            rank, rank == 0 if chief is None else bool(chief), stop, StepSchedule(every_steps, every_seconds)
        )

    def step_stop(self) -> StopRequest:
        """The stop the per-step callbacks hold: the one taking SIGTERM, else one only ``request`` sets
        (they still write the step checkpoints)."""
        if self.stop is not None:
            return self.stop
        if self._own_stop is None:
            self._own_stop = StopRequest(self.rank)
        return self._own_stop

    def announce_resume(self, checkpoint: Checkpoint | None, epoch: int, step: int) -> None:
        """The chief's resume line (whatever the logging set-up), when a checkpoint was resumed from."""
        if self.chief and checkpoint is not None:
            print(resumed_line(checkpoint.path.name, epoch, step), flush=True)

    def announce(self, line: str | None) -> None:
        """A line of the chief's (a resume moved to the next epoch, ...)."""
        if self.chief and line:
            print(line, flush=True)

    def start_tensorboard(self, log_dir, s3_uri: str | None, interval: float | None = None):
        """On the chief, with an S3 location: start mirroring ``log_dir`` there every ``interval``
        seconds (None: the syncer's default). Returns the syncer, or None."""
        if not (self.chief and s3_uri):
            return None
        from sagemaker_dist.runtime import tensorboard_sync

        every = {} if interval is None else {"interval": float(interval)}
        self.syncer = tensorboard_sync.TensorBoardSyncer(log_dir, s3_uri, **every).start()
        return self.syncer

    def metric_line(self, epoch: int, metrics: dict, stream=None) -> None:
        """After epoch ``epoch`` (1-based), the chief's metric line (``write_metric_line``)."""
        if self.chief:
            write_metric_line(epoch, metrics, stream)

    def sync_tensorboard(self) -> None:
        """Ask the syncer for an upload round (the epoch's summaries flushed), without waiting."""
        if self.syncer is not None:
            self.syncer.sync_now()

    def report_stop(self, epoch: int, step: int, over: bool, checkpoint, **line) -> None:
        """The chief's stop line (``stop_line``), with the time since this rank's request."""
        if self.chief:
            stop = self.stop or self._own_stop
            received_at = stop.received_at if stop is not None else None
            print(stop_line(epoch, step, over, checkpoint, received_at, **line), flush=True)

    def end_stop(self) -> None:
        """The stop's end: no forced exit, SIGTERM given back."""
        for stop in (self.stop, self._own_stop):
            if stop is not None:
                stop.done()
                stop.uninstall()

    def finish(self) -> None:
        """The stop's end (``end_stop``) and the syncer's final flush."""
        self.end_stop()
        if self.syncer is not None:
            self.syncer.stop()
            self.syncer = None
