"""Spot interruptions in local mode (``sagemaker-dist local --interrupt-at SECONDS``, repeatable).

As a spot interruption does: SECONDS after an attempt's ranks start, every rank gets SIGTERM; the job
has up to ``STOP_WINDOW_S`` (SageMaker's 120 s) to end, then what is left is killed. As managed spot
does: the job is started again, on fresh /opt/ml trees with its checkpoints restored from its
checkpoint S3 URI, until an attempt is not interrupted (the last one never is), or completed anyway
(every rank's script had ended, exit 0, before the signal). Every attempt is reported; the command ends
with the last one's status.

The signal goes to each rank process itself (the pids the rank entry writes, or for launchers that
start the ranks themselves, the Python processes below the launcher with a rank's environment), not to
horovodrun or mpirun: those answer SIGTERM by killing the ranks after a few seconds, whatever the ranks
were doing. That is what the image's entry point must do on SageMaker too (forward SIGTERM to every
rank), and what the runtime's stop (``runtime/stop.py``) needs: time to agree and checkpoint. Before any
rank process has started, the launcher and what it started so far get it. An attempt interrupted before
every rank was up (``reports_pids`` launchers) reads Interrupted: no step can have been trained; so
does one where the ranks ended on the SIGTERM itself, none in an agreed stop (still starting, or a
script without the runtime's stop). Only launchers whose ranks run through the rank entry
(``reports_pids``) tell these apart; under the toolkit and the container the attempt reads Stopped or
Failed, and starts again.
With ``launcher="container"`` the interruption is SageMaker's own, ``podman stop``: SIGTERM to each
container's PID 1, the image's entry point (``host/stop_forwarding.py``), which forwards it to the ranks.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sagemaker_dist.contract.stop_lines import RESUMED, STOPPED, resumed_position
from sagemaker_dist.contract.stop_window import STOP_WINDOW_S
from sagemaker_dist.contract.training_request import TrainingRequest
from sagemaker_dist.errors import ConfigurationError, JobFailedError
from sagemaker_dist.host.processes import descendants
from sagemaker_dist.host.stop_forwarding import rank_processes
from sagemaker_dist.local.exit_files import TERMINATED


def check_interrupts(interrupt_at: list[float], checkpoint_s3_uri: str | None) -> None:
    """Each time a positive number of seconds, and a checkpoint S3 URI (the request's
    CheckpointConfig.S3Uri) to restart from, as managed spot training requires."""
    bad = [t for t in interrupt_at if not (isinstance(t, int | float) and t > 0)]
    if bad:
        raise ConfigurationError(f"--interrupt-at {bad[0]!r}: give seconds after the ranks start, > 0")
    if interrupt_at and not checkpoint_s3_uri:
        raise ConfigurationError(
            "--interrupt-at restarts the job from its checkpoints, as managed spot training does, and this "
            "job has no CheckpointConfig.S3Uri: give --checkpoint-s3-uri (or the estimator's checkpoints)"
        )


def rank_pids(group) -> list[int]:
    """The rank processes of a running ``RankGroup``: the pids its rank entries wrote, else the Python
    processes below the launcher whose environment names a rank (the toolkit's mpirun starts those)."""
    group.watch()
    if group.known_pids:
        return sorted(group.known_pids.values())
    return rank_processes(group.proc.pid) if group.proc else []


class Interruption:
    """One attempt's interruption: ``arm(group)`` when its ranks start; ``at`` seconds later every rank
    gets SIGTERM, and the launcher is killed if the job has not ended ``window`` seconds after that.
    With ``when``, the signal comes as soon as ``when()`` is true (checked every ``POLL_S``), ``at``
    seconds at the latest: an interruption at a point of the training (after its first checkpoint, inside
    its second epoch) whatever the machine's speed."""

    POLL_S = 0.1

    def __init__(
        self,
        at: float | None,
        echo=print,
        window: float = STOP_WINDOW_S,
        when: Callable[[], bool] | None = None,
    ):
        self.at, self.echo, self.window, self.when = at, echo, window, when
        self.armed_at: float | None = None  # time.monotonic() when the ranks started
        self.after: float | None = None  # seconds from the ranks' start to the signal
        self.signalled_at: float | None = None  # time.monotonic()
        self.ended_after: float | None = None  # seconds from SIGTERM to the launcher's exit
        self.killed = False
        # (ranks up, world size) at the signal, where the ranks say when they are up (``reports_pids``)
        self.ranks_up: tuple[int, int] | None = None
        self.ended_first = False  # every rank had ended its script (exit 0) before the signal
        self.group = None
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None

    def arm(self, group) -> None:
        if self.at is None:
            return
        self.armed_at = time.monotonic()
        self.group = group
        self._thread = threading.Thread(
            target=self._run, args=(group,), name="spot-interruption", daemon=True
        )
        self._thread.start()

    def cancel(self) -> None:
        """The attempt is over: no signal after this; waits for the thread (bounded)."""
        self._cancel.set()
        if self._thread is not None:
            self._thread.join(10.0)

    @property
    def in_start_up(self) -> bool:
        """The signal came before every rank was up: no step can have been trained (a step needs every
        rank), so the ranks that were still starting ended on SIGTERM, as they would on SageMaker."""
        return self.ranks_up is not None and self.ranks_up[0] < self.ranks_up[1]

    def ended_on_signal(self) -> list[int]:
        """The ranks that ended on the SIGTERM itself (their rank entry's handler: no stop of the runtime
        had the signal, so none was agreed), where every other rank had ended with 0 already, as the
        ranks' exit files last read say (``reports_pids``); [] otherwise."""
        group = self.group
        if group is None or not group.reports_pids:
            return []
        terminated = group.ranks_ended_with(TERMINATED, read=False)
        ended = terminated + group.ranks_ended_with("0", read=False)
        return terminated if len(ended) == group.world_size else []

    def _due(self, group) -> bool:
        """Wait until the interruption is due (``at`` seconds, or ``when()`` before that); False if the
        attempt ended first."""
        if self.when is None:
            return not self._cancel.wait(self.at) and group.poll() is None
        deadline = self.armed_at + self.at
        while not self.when() and time.monotonic() < deadline:
            if self._cancel.wait(min(self.POLL_S, max(0.0, deadline - time.monotonic()))):
                return False
            if group.poll() is not None:
                return False
        return not self._cancel.is_set() and group.poll() is None

    def _run(self, group) -> None:
        if not self._due(group):
            return  # the attempt ended first
        stopper = None
        if hasattr(group, "stop_like_sagemaker"):  # the image: SIGTERM to PID 1, as SageMaker sends it
            self.signalled_at = time.monotonic()
            self.after = self.signalled_at - self.armed_at
            stopper = group.stop_like_sagemaker(self.window)
            self.echo(
                f"[spot] interruption: podman stop --time {self.window:.0f} (SIGTERM to each container's "
                f"PID 1, SIGKILL {self.window:.0f} s later), {self.after:.1f} s after the ranks started"
            )
        else:
            pids = rank_pids(group)
            if group.reports_pids:  # RankGroup.reports_pids: False where the ranks write no pid
                self.ranks_up = (len(group.known_pids), group.world_size)
                self.ended_first = len(group.ranks_ended_with("0")) == group.world_size
            self.signalled_at = time.monotonic()
            self.after = self.signalled_at - self.armed_at
            after = f"{self.after:.1f} s after the ranks started"
            if pids:
                self.echo(f"[spot] interruption: SIGTERM to rank process(es) {pids}, {after}")
            elif group.proc is not None:  # no rank has started: the launcher and what it started so far,
                # as on SageMaker the container's entry point gets it and the container's end ends the rest
                pids = [group.proc.pid, *sorted(descendants([group.proc.pid]))]
                what = f"the launcher and its processes {pids} (no rank yet)"
                self.echo(f"[spot] interruption: SIGTERM to {what}, {after}")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = self.signalled_at + self.window
        while group.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if group.poll() is None:
            self.killed = True
            self.echo(f"[spot] the job did not end within {self.window:.0f} s of SIGTERM: killing it")
            group.kill()
        self.ended_after = time.monotonic() - self.signalled_at
        if stopper is not None:  # podman stop ends with the containers
            try:
                stopper.wait(timeout=30)
            except subprocess.TimeoutExpired:
                stopper.kill()
                stopper.wait()


@dataclass
class Attempt:
    """One attempt of an interrupted job, as the command reports it."""

    number: int
    interrupted_at: float | None  # seconds after its ranks started; None: not interrupted
    # Completed (not interrupted, or every rank's script had ended before the signal); Stopped
    # (interrupted, ended in time); Interrupted (in the ranks' start-up, or the ranks ended on the SIGTERM
    # itself, none in an agreed stop); Killed (not ended in time); Failed
    status: str
    ended_after_signal: float | None = None
    # (epoch counted from 1, steps of it trained), as rank 0's stop and resume lines name them
    stopped_at: tuple[int, int] | None = None  # where the ranks stopped
    resumed_from: tuple[int, int] | None = None  # where the attempt started: (3, 11) in epoch 3 after step 11
    seconds: float = 0.0
    error: str | None = None
    result: object = None
    ranks_up: tuple[int, int] | None = None  # (ranks up, world size) at the signal, where known
    on_signal: list[int] | None = None  # the ranks that ended on the SIGTERM itself (Interrupted)

    def line(self) -> str:
        text = f"attempt {self.number}: {self.status} after {self.seconds:.1f} s"
        if self.resumed_from and self.resumed_from != (1, 0):
            epoch, step = self.resumed_from
            text += (
                f"; resumed in epoch {epoch} after step {step}"
                if step
                else f"; resumed at the start of epoch {epoch}"
            )
        if self.interrupted_at is not None:
            text += f"; interrupted {self.interrupted_at:.1f} s after the ranks started"
            if self.ended_after_signal is not None:
                text += f", the job ended {self.ended_after_signal:.1f} s after SIGTERM"
        if self.stopped_at:
            text += f"; the ranks stopped in epoch {self.stopped_at[0]} after step {self.stopped_at[1]}"
        if self.status == "Completed" and self.interrupted_at is not None:
            text += "; every rank's script had ended (exit 0) before it: nothing to start again"
        if self.status == "Interrupted":
            up, world = self.ranks_up or (0, 0)
            text += (
                f"; in the ranks' start-up ({up} of {world} up): no step was trained, and the ranks still "
                "starting ended on SIGTERM, as on SageMaker"
                if up < world
                else f"; {self._on_signal_text(world)}, none in a stop the ranks agreed (its script had not "
                "set up the runtime's stop yet, had ended its training, or has none): it starts again from "
                "its last checkpoint"
            )
        if self.error and self.status != "Completed":
            # its first line, less the heading of the output lines after it
            text += "; " + re.sub(r"[;.] [Ll]ast output[^:]*:$", "", self.error.splitlines()[0])
        return text

    def _on_signal_text(self, world: int) -> str:
        ranks = self.on_signal or []
        if not ranks or len(ranks) == world:
            return "every rank ended on SIGTERM itself"
        return f"rank(s) {', '.join(map(str, ranks))} ended on SIGTERM itself, the others had ended (exit 0)"


def stop_positions(lines: list[str]) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """(where rank 0 said the ranks stopped, where it said it started) from rank 0's output."""
    stopped = started = None
    for line in lines:
        if started is None and (m := RESUMED.search(line)):
            started = resumed_position(m)
        if m := STOPPED.search(line):
            stopped = (int(m.group(1)), int(m.group(2)))
    return stopped, started


def run_interrupted(
    request: dict,
    source_dir,
    interrupt_at: list[float],
    *,
    run,
    echo=print,
    when: Callable[[int], bool] | None = None,
    **kwargs,
):
    """Run ``request`` with ``run`` (``run_local``) once per interruption plus once more, as managed
    spot training would; returns ``(attempts, last result)``, or raises the last attempt's failure.
    ``when(attempt number)``: interrupt that attempt as soon as it is true (its ``interrupt_at`` the
    latest), as ``Interruption``'s ``when``."""
    check_interrupts(interrupt_at, TrainingRequest.parse(request).checkpoint_s3_uri)
    attempts: list[Attempt] = []
    for number in range(1, len(interrupt_at) + 2):
        at = interrupt_at[number - 1] if number <= len(interrupt_at) else None
        if number > 1:
            echo(f"[spot] attempt {number}: starting the job again with its checkpoints restored")
        interruption = Interruption(at, echo, when=None if when is None else lambda n=number: when(n))
        started, error, result, lines = time.monotonic(), None, None, []
        try:
            result = run(
                request, source_dir, echo=_collecting(echo, lines), on_started=interruption.arm, **kwargs
            )
        except JobFailedError as exc:
            error = str(exc)
        finally:
            interruption.cancel()
        stopped, resumed = stop_positions(lines)
        signalled = interruption.signalled_at is not None
        status = "Completed" if error is None else "Failed"
        if signalled and not (interruption.ended_first and error is None):
            status = "Killed" if interruption.killed else "Stopped" if error is None else status
            on_signal = interruption.ended_on_signal()
            if status == "Failed" and stopped is None and (interruption.in_start_up or on_signal):
                status = "Interrupted"
        attempts.append(
            Attempt(
                number, interruption.after if signalled else None, status, interruption.ended_after, stopped,
                resumed, time.monotonic() - started, error, result, interruption.ranks_up,
                on_signal if status == "Interrupted" else None,
            )
        )  # fmt: skip
        echo("[spot] " + attempts[-1].line())
        if not signalled or status == "Completed":
            break  # not interrupted (done, or failed on its own), or every rank's script had ended first
    echo(f"[spot] {len(attempts)} attempt(s):")
    for attempt in attempts:
        echo("[spot]   " + attempt.line())
    last = attempts[-1]
    if last.status != "Completed":
        raise JobFailedError(
            f"the last attempt ({last.number}) ended {last.status}: {last.error or ''}".strip()
        )
    return attempts, last.result


def _collecting(echo, lines: list[str]):
    def show(text: str) -> None:
        lines.append(text)
        echo(text)

    return show
