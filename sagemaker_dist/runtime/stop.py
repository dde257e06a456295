"""Stops and spot interruptions: SIGTERM becomes a request the ranks agree on, at a step.

SageMaker sends SIGTERM to the container on a stop or a spot interruption and kills it about 120 s
later. A rank must not just exit: the others would wait for it in the next collective. So SIGTERM only
sets a flag (``StopRequest``); at every train step the ranks exchange it in the same allreduce that ends
epochs without record counts (``agreement.py``: a max over ranks), so a SIGTERM seen by any one rank
stops every rank after the same step. That step is trained; then rank 0 writes a checkpoint of it with
the records each rank consumed of its current FIFO, TensorBoard is flushed, and ``fit`` raises
``TrainingStopped`` (a ``SystemExit`` with code 0) on every rank, so the script's code after ``fit``
does not run and the process ends at once. A rank that cannot get there (stuck in a collective whose
peer died) is ended by the watchdog ``grace`` seconds after the signal, before SageMaker's SIGKILL.

``ResumeSkip`` is the other half: a job restarted from a checkpoint written inside an epoch skips, in
its first epoch, the batches every rank already trained (read and dropped, not trained again), since
its FIFOs start again at the beginning of the channel's data. ``StepSchedule`` says when a periodic
step checkpoint is due. Nothing here imports a framework: ``training_session.py`` holds a rank's stop
with the rest of its session, ``tensorflow/keras/stop_callback.py`` is the Keras side, ``torch/stop.py``
PyTorch's.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
import warnings
from dataclasses import dataclass

from sagemaker_dist.errors import ConfigurationError

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 100.0  # SIGTERM to forced exit: inside SageMaker's 120 s, with room for its SIGKILL
STOPPED_EXIT_CODE = 0  # the process ends cleanly: whether the job was stopped is the platform's word
REST_WAIT_S = 30.0  # the stop's last allreduce (is the epoch over?) runs ahead in tf.data: a bound anyway


def positive_seconds(
    raw, what: str, hint: str = "give a number of seconds > 0", error=ConfigurationError
) -> float:
    """``raw`` (a number, or a variable's text) as a finite number of seconds > 0; else ``error``
    (a ``ConfigurationError``) saying ``what`` was given and ``hint``."""
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if isinstance(raw, bool) or not 0 < value < math.inf:
        raise error(f"{what}: {hint}")
    return value


class TrainingStopped(SystemExit):
    """Raised out of ``fit`` on every rank after an agreed stop (a ``SystemExit``: the script ends there).

    ``epoch`` epochs and ``step`` steps of the next were trained; ``checkpoint`` is where rank 0 wrote
    them (None on other ranks, or without checkpoints)."""

    def __init__(self, epoch: int, step: int, checkpoint=None):
        super().__init__(STOPPED_EXIT_CODE)
        self.epoch, self.step, self.checkpoint = epoch, step, checkpoint


@dataclass
class AgreedStop:
    """What the ranks agreed at the stop: the step's index in this epoch's iteration (0-based, as
    Keras numbers batches) and the records each rank had trained on in that iteration."""

    index: int
    records: tuple[int, ...]


class StopRequest:
    """SIGTERM -> ``requested``; the ranks' agreement -> ``agreed``. One per process (``install``)."""

    def __init__(self, rank: int, grace: float = DEFAULT_GRACE_S, exit=os._exit):
        self.rank, self.grace, self._exit = rank, float(grace), exit
        self.requested = threading.Event()
        self.received_at: float | None = None  # time.monotonic() of the first SIGTERM
        self.agreed: AgreedStop | None = None
        self.epoch_has_more: bool | None = None  # after the stop: whether its epoch had batches left
        self._rest_known = threading.Event()
        self._previous = None
        self._installed = False
        self._watchdog: threading.Timer | None = None

    def install(self) -> StopRequest:
        """Take SIGTERM. Python runs signal handlers in the main thread only, and only it may set them:
        called from another thread (training started in a thread of a notebook or of a framework that
        runs it in one), the training still runs, but SIGTERM is not caught, so a stop or a spot
        interruption gets no agreed stop and no stop checkpoint. That is said once, as a
        ``RuntimeWarning`` naming the thread; ``request`` still stops the ranks (call it from a handler
        the main thread installs)."""
        if self._installed:
            return self
        thread = threading.current_thread()
        if thread is not threading.main_thread():
            warnings.warn(
                f"rank {self.rank}: the stop on SIGTERM was set up in thread {thread.name!r}, not the main "
                "thread, and only the main thread can take a signal: SIGTERM (a stop or a spot "
                "interruption) will not be caught, so the ranks will not stop together and no stop "
                "checkpoint will be written (the job resumes from the last epoch's or periodic step's "
                "checkpoint). Start the training from the main thread, or call request() on this "
                "StopRequest from a SIGTERM handler the main thread installs",
                RuntimeWarning,
                stacklevel=2,
            )
            return self
        self._previous = signal.signal(signal.SIGTERM, self._on_signal)
        self._installed = True
        return self

    def uninstall(self) -> None:
        """Give SIGTERM back to whoever had it (after the fit: a stuck script must still be stoppable)."""
        if self._installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
            self._installed = False

    def _on_signal(self, signum, frame) -> None:
        self.request(f"signal {signal.Signals(signum).name}")

    def request(self, why: str = "asked") -> None:
        """Ask to stop at the next step the ranks agree on; starts the watchdog (once)."""
        if self.requested.is_set():
            return
        self.received_at = time.monotonic()
        self.requested.set()
        os.write(2, f"rank {self.rank}: {why}: stopping after the next step every rank agrees on\n".encode())
        self._watchdog = threading.Timer(self.grace, self._too_late)
        self._watchdog.daemon = True
        self._watchdog.name = "sagemaker-dist-stop-watchdog"
        self._watchdog.start()

    def wanted(self) -> int:
        """1 once a stop is requested (read by the per-step agreement), else 0."""
        return 1 if self.requested.is_set() else 0

    def note_agreed(self, index: int, records) -> None:
        self.agreed = AgreedStop(int(index), tuple(int(r) for r in records))

    def note_rest(self, more: bool) -> None:
        self.epoch_has_more = bool(more)
        self._rest_known.set()

    def epoch_ended_at_stop(self, timeout: float = REST_WAIT_S) -> bool:
        """True when the stopped step was its epoch's last (the ranks' has-only allreduce after it said
        so; waits for it, bounded): the checkpoint is then of the whole epoch, and the resumed job
        starts the next one instead of an epoch with nothing left, which Keras refuses."""
        return self._rest_known.wait(timeout) and self.epoch_has_more is False

    def stopping_at(self, batch: int) -> bool:
        """True at the batch (Keras's index in this epoch) the ranks agreed to stop after."""
        return self.agreed is not None and self.agreed.index == batch

    def done(self) -> None:
        """The stop finished in time: no forced exit."""
        if self._watchdog is not None:
            self._watchdog.cancel()

    def _too_late(self) -> None:
        os.write(
            2,
            f"rank {self.rank}: did not stop within {self.grace:.0f} s of the stop request (a rank "
            "stuck in a collective?); exiting now, before the platform's SIGKILL\n".encode(),
        )
        self._exit(128 + signal.SIGTERM)


class ResumeSkip:
    """The batches of the first epoch after a resume that were trained before the stop: taken once,
    by the first iteration of the train dataset (every later epoch skips nothing)."""

    def __init__(self, steps: int):
        self.steps = int(steps)
        self._lock = threading.Lock()

    def take(self) -> int:
        """How many batches this iteration skips: ``steps`` the first time, 0 after."""
        with self._lock:
            steps, self.steps = self.steps, 0
        return steps


@dataclass(frozen=True)
class StepSchedule:
    """When rank 0 writes a periodic step checkpoint: every ``steps`` steps and/or ``seconds`` seconds
    (None: never by that measure), so a SIGKILL without warning loses at most that much."""

    steps: int | None = None
    seconds: float | None = None

    def due(self, steps_since: int, seconds_since: float) -> bool:
        return bool(
            (self.steps and steps_since >= self.steps) or (self.seconds and seconds_since >= self.seconds)
        )

    def due_at(self, step: int, first: int) -> bool:
        """Whether the epoch's ``step`` (counted from its start) is on the ``steps`` grid, past ``first``,
        the step the epoch began at (``PipeTraining``'s rule: every ``steps``-th step of the epoch)."""
        return bool(self.steps) and step > first and step % self.steps == 0

    @property
    def active(self) -> bool:
        return bool(self.steps or self.seconds)
