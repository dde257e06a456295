"""The pure parts of stops (runtime/stop.py): SIGTERM becomes a request, the watchdog, the
one-time resume skip and the step-checkpoint schedule. One process, a real SIGTERM to itself."""

from __future__ import annotations

import os
import signal
import time

from sagemaker_dist.runtime.stop import ResumeSkip, StepSchedule, StopRequest, TrainingStopped


def test_sigterm_becomes_a_request_and_the_handler_goes_back():
    before = signal.getsignal(signal.SIGTERM)
    stop = StopRequest(rank=3, grace=60).install()
    try:
        assert stop.wanted() == 0
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not stop.requested.is_set() and time.monotonic() < deadline:  # delivered between bytecodes
            time.sleep(0.01)
        assert stop.wanted() == 1 and stop.received_at is not None
        stop.note_agreed(4, [20, 20])
        assert stop.stopping_at(4) and not stop.stopping_at(3)
    finally:
        stop.done()
        stop.uninstall()
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_stop_that_takes_too_long_exits_after_the_grace():
    exits = []
    stop = StopRequest(rank=0, grace=0.2, exit=exits.append)
    stop.request("test")
    deadline = time.monotonic() + 5
    while not exits and time.monotonic() < deadline:
        time.sleep(0.02)
    assert exits == [128 + signal.SIGTERM]
    done = StopRequest(rank=0, grace=0.2, exit=exits.append)
    done.request("test")
    done.done()  # stopped in time: no forced exit
    time.sleep(0.4)
    assert exits == [128 + signal.SIGTERM]


def test_resume_skip_is_taken_once_and_schedule_and_exit_code():
    skip = ResumeSkip(9)
    assert (skip.take(), skip.take()) == (9, 0)
    assert not StepSchedule().active
    assert StepSchedule(steps=5).due(5, 0.0) and not StepSchedule(steps=5).due(4, 1e9)
    assert StepSchedule(seconds=60).due(1, 61.0) and not StepSchedule(seconds=60).due(100, 59.0)
    stopped = TrainingStopped(2, 7)
    assert isinstance(stopped, SystemExit) and stopped.code == 0 and (stopped.epoch, stopped.step) == (2, 7)
