"""The framework-neutral training session the three front ends share (``runtime/training_session.py``):
its resume points, lines, step-checkpoint schedule, stop request and TensorBoard syncer, without a
framework."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import threading

from sagemaker_dist.contract.stop_lines import resumed_line
from sagemaker_dist.runtime.checkpoint_format import write_checkpoint
from sagemaker_dist.runtime.stop import StepSchedule
from sagemaker_dist.runtime.training_session import (
    StepClock,
    TrainingSession,
    agreed_position,
    newest_position,
    other_world_move,
    stop_line,
    write_metric_line,
)


def _checkpoint(directory, epoch, step=0):
    return write_checkpoint(
        directory, epoch, step, lambda tmp: (tmp / "state").write_text("x"), {}, keep=None
    )


def test_rank_0_picks_the_newest_and_the_broadcast_gives_it_to_every_rank(tmp_path):
    _checkpoint(tmp_path, 1)
    newest = _checkpoint(tmp_path, 1, 7)
    sent = []

    def broadcast(position):
        sent.append(position)
        return position

    assert newest_position(tmp_path, rank=0, broadcast=broadcast) == ((1, 7), newest)
    assert newest_position(tmp_path, rank=1, broadcast=lambda _: (1, 7)) == ((1, 7), None)
    assert newest_position(tmp_path, rank=1) == ((0, 0), None)  # a world of one has no other rank
    assert sent == [(1, 7)]


def test_workers_resume_from_the_newest_checkpoint_every_one_holds(tmp_path):
    older = _checkpoint(tmp_path, 1)
    newest = _checkpoint(tmp_path, 2, 3)
    (tmp_path / ".tmp-epoch-00003-crashed").mkdir()  # a crashed writer's leftover
    assert agreed_position(tmp_path) == ((2, 3), newest)
    assert agreed_position(tmp_path, smallest=lambda mine: min(mine, 1 * 10**9)) == ((1, 0), older)
    assert agreed_position(tmp_path, smallest=lambda mine: 0) == ((0, 0), None)  # a worker holds none
    assert not (tmp_path / ".tmp-epoch-00003-crashed").exists()


def test_the_workers_agree_on_the_newest_checkpoint_that_every_one_of_them_holds(tmp_path):
    """Worker 0 holds epochs 1 and 3, worker 1 epochs 1, 2 and 4 (their pruning kept others): the
    smallest newest, 3, is not worker 1's, so both go down to 1, the newest both hold."""
    directories = [tmp_path / "w0", tmp_path / "w1"]
    for directory, epochs in zip(directories, [(1, 3), (1, 2, 4)]):
        for epoch in epochs:
            _checkpoint(directory, epoch)
    barrier, offers, results = threading.Barrier(2), {}, {}

    def smallest_for(worker):
        def smallest(value: int) -> int:  # the min over the two workers, as a collective
            offers[worker] = value
            barrier.wait(10)
            least = min(offers.values())
            barrier.wait(10)
            return least

        return smallest

    def worker(index):
        results[index] = agreed_position(directories[index], smallest_for(index))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert [results[i][0] for i in range(2)] == [(1, 0), (1, 0)]
    assert [results[i][1].path.parent for i in range(2)] == directories


def test_a_checkpoint_inside_an_epoch_of_another_world_size_resumes_at_the_next_epoch():
    assert other_world_move(2, 5, 4, 4) == (2, 5, None)
    assert other_world_move(2, 0, 8, 4) == (2, 0, None)  # an epoch's end: nothing to move
    assert other_world_move(2, 5, None, 4) == (2, 5, None)
    epoch, step, line = other_world_move(2, 5, 8, 4)
    assert (epoch, step) == (3, 0) and "by 8 rank(s) and this job runs 4" in line


def test_the_stop_line_names_the_records_the_checkpoint_and_why_none():
    keras = stop_line(1, 5, False, None, None, records=[6, 7])
    assert keras.endswith(
        " (records of this epoch trained per rank: [6, 7]); no checkpoint (checkpoints off)"
    )
    torch = stop_line(2, 3, True, None, None, no_checkpoint="none asked")
    assert torch.endswith("; no checkpoint (none asked)") and "records" not in torch


def test_the_metric_line_goes_out_in_one_write_and_only_with_values():
    writes = []

    class Stream(io.StringIO):
        def write(self, text):
            writes.append(text)
            return len(text)

    line = write_metric_line(3, {"loss": 0.5}, Stream())
    assert writes == [line + "\n"] and line.startswith("sagemaker-dist-metrics: epoch=3")
    assert write_metric_line(3, {}, Stream()) is None and len(writes) == 1


def test_the_step_clock_counts_from_the_last_checkpoint_and_the_epoch_grid_from_its_start():
    clock = StepClock(StepSchedule(steps=2))
    clock.tick()
    assert not clock.due()
    clock.tick()
    assert clock.due()
    clock.saved()
    assert not clock.due()
    assert not StepClock().due()  # no schedule: never
    grid = StepSchedule(steps=3)
    assert [s for s in range(10) if grid.due_at(s, 3)] == [6, 9]  # resumed at step 3: not again there
    assert not StepSchedule().due_at(3, 0)


def test_the_session_takes_sigterm_until_it_finishes_and_speaks_on_the_chief_only(capsys):
    before = signal.getsignal(signal.SIGTERM)
    session = TrainingSession.begin(0, grace=5, every_steps=4)
    try:
        assert signal.getsignal(signal.SIGTERM) == session.stop._on_signal
        assert session.step_stop() is session.stop and session.schedule.active
    finally:
        session.finish()
    assert signal.getsignal(signal.SIGTERM) is before

    found = _Found("epoch-00002-step-000004")
    other = TrainingSession.begin(1, stop_on_sigterm=False)
    other.announce_resume(found, 2, 4)
    other.announce("not on rank 1")
    assert other.stop is None and other.step_stop().rank == 1 and not other.schedule.active
    session.announce_resume(None, 0, 0)
    session.announce_resume(found, 2, 4)
    assert capsys.readouterr().out == resumed_line("epoch-00002-step-000004", 2, 4) + "\n"


def test_a_stop_without_sigterm_is_one_the_session_reports_and_ends(capsys):
    """Without SIGTERM, the per-step callbacks hold one stop of the session's own: asked for, the
    chief's line counts from its request, and ``end_stop`` cancels its watchdog."""
    session = TrainingSession.begin(0, stop_on_sigterm=False)
    stop = session.step_stop()
    assert session.step_stop() is stop and session.stop is None
    stop.grace = 30
    stop.request("a test")
    assert stop._watchdog is not None and stop._watchdog.is_alive()
    session.report_stop(2, 5, False, None, records=[5, 5])
    session.end_stop()
    stop._watchdog.join(5)
    assert not stop._watchdog.is_alive()
    line = capsys.readouterr().out
    assert line.startswith(stop_line(2, 5, False, None, None, records=[5, 5]))
    assert " s after the stop request" in line


def test_the_chief_alone_starts_the_tensorboard_syncer_and_the_finish_stops_it(monkeypatch, tmp_path):
    from sagemaker_dist.runtime import tensorboard_sync

    events = []

    class Syncer:
        def __init__(self, log_dir, s3_uri, **options):
            events.append(("new", s3_uri, options))

        def start(self):
            return self

        def sync_now(self):
            events.append("sync")

        def stop(self):
            events.append("stop")

    monkeypatch.setattr(tensorboard_sync, "TensorBoardSyncer", Syncer)
    assert TrainingSession(1, chief=False).start_tensorboard(tmp_path, "s3://b/tb") is None
    assert TrainingSession(0, chief=True).start_tensorboard(tmp_path, None) is None
    chief = TrainingSession(0, chief=True)
    assert chief.start_tensorboard(tmp_path, "s3://b/tb", 5) is chief.syncer
    chief.sync_tensorboard()
    chief.finish()
    chief.finish()
    assert events == [("new", "s3://b/tb", {"interval": 5.0}), "sync", "stop"]


def test_the_session_loads_no_framework():
    code = (
        "import sys, sagemaker_dist.runtime.training_session\n"
        "print(sorted(m for m in ('tensorflow', 'torch', 'horovod', 'keras') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


class _Found:
    def __init__(self, name):
        from pathlib import Path

        self.path = Path("/checkpoints") / name
