"""Watch the ranks of a local job: the first failure (rank and host named, its last output shown), a
failed feed, or the time limit stops the job; SIGTERM cleans up like Ctrl-C.
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager

from sagemaker_dist.local.launchers.base import RankGroup, describe_exit

LAUNCHER_GRACE_S = 3.0  # after a rank fails: time the launcher gets to stop the others and relay output


def _sigterm_as_interrupt():
    """Inside the main thread, SIGTERM cleans up like Ctrl-C does; returns the handler to restore."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    return signal.signal(signal.SIGTERM, handler)


def _hold_signals() -> dict:
    """Ignore SIGINT and SIGTERM (main thread only); returns the handlers to put back ({} elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}


@contextmanager
def interrupt_guard():
    """SIGTERM raises KeyboardInterrupt inside the block; ``hold()`` (at the start of clean-up) ignores
    both signals so a second Ctrl-C cannot cut the clean-up short; leaving puts the handlers back."""
    previous = _sigterm_as_interrupt()
    held: dict = {}

    class Guard:
        @staticmethod
        def hold() -> None:
            held.update(_hold_signals())

    try:
        yield Guard()
    finally:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, held.get(signal.SIGINT, signal.getsignal(signal.SIGINT)))
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def supervise(
    group: RankGroup, feed_errors: list[str], trees, started: float, timeout: float | None
) -> str | None:
    """Wait for the ranks; return an error message (rank or S3 object named) or None when all succeeded."""
    while True:
        code = group.poll()
        if code is not None:
            if code == 0:
                return None
            group.finish_output()
            failed = group.first_failure()
            if failed:
                return rank_failure(group, *failed, trees)
            reported = group.failed_rank()
            if reported:
                rank, rank_code = reported
                return rank_failure(group, rank, f"exited with {describe_exit(rank_code)}", trees)
            return f"the launcher exited with {describe_exit(code)}; last output:\n" + "\n".join(
                group.output[-15:]
            )
        if feed_errors:
            group.kill()
            return f"input failed, the job was stopped: {feed_errors[0]}"
        failed = group.first_failure()
        if failed is not None:
            # let the launcher stop the other ranks and relay the last output (the traceback) itself
            deadline = time.monotonic() + LAUNCHER_GRACE_S
            while group.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            failed = group.first_failure() or failed  # an earlier event may have shown up meanwhile
            group.kill()
            group.finish_output()
            return rank_failure(group, *failed, trees)
        if timeout is not None and time.monotonic() - started > timeout:
            unfinished = group.unfinished_ranks()  # before the kill, which has each rank record its stop
            group.kill()
            group.finish_output()
            return time_limit_reached(timeout) + still_running(group, unfinished, trees)
        time.sleep(0.05)


def time_limit_reached(timeout: float) -> str:
    return (
        f"the job ran past its {timeout:.0f} s limit (StoppingCondition.MaxRuntimeInSeconds or "
        "timeout=) and was stopped"
    )


def still_running(group: RankGroup, unfinished: list[int], trees) -> str:
    """Which ranks had not ended at the time limit, with the first one's last output: a rank that
    trained to the end and hangs on its way out is told from a job that is just slow."""
    if not unfinished or len(unfinished) == group.world_size:
        return ""
    named = ", ".join(f"rank {rank} (host {trees.host_of(rank)})" for rank in unfinished)
    first = unfinished[0]
    shown = rank_output(group, first)
    return f"; the other ranks had ended, {named} had not. Last output of rank {first}:\n{shown}"


TRACEBACK = "Traceback (most recent call last):"
SHOWN_LINES = 12  # a rank's last lines in a failure message
TRACEBACK_REACH = 200  # how far back from a rank's last line its last traceback is looked for


def _traceback_block(lines: list[str], start: int) -> list[str]:
    """Python's traceback from its header: the indented frames, then the exception's line."""
    end = start + 1
    while end < len(lines) and lines[end][:1].isspace():
        end += 1
    return lines[start : end + 1]


def last_output(lines: list[str]) -> list[str]:
    """A rank's last lines, led by its last traceback when that lies further back: what a framework
    prints after the exception (Horovod's shutdown, MPI's signal backtrace) must not hide where it raised."""
    tail_start = max(len(lines) - SHOWN_LINES, 0)
    for index in range(len(lines) - 1, max(len(lines) - TRACEBACK_REACH, 0) - 1, -1):
        if lines[index].startswith(TRACEBACK):
            if index >= tail_start:
                break
            block = _traceback_block(lines, index)
            skipped = tail_start - (index + len(block))
            gap = [f"... ({skipped} lines)"] if skipped > 0 else []
            return block + gap + lines[max(tail_start, index + len(block)) :]
    return lines[tail_start:]


def rank_output(group: RankGroup, rank: int) -> str:
    """``rank``'s last output (``last_output``), indented for a message."""
    return "\n".join(f"  {line}" for line in last_output(group.rank_lines.get(rank, []))) or "  (no output)"


def rank_failure(group: RankGroup, rank: int, what: str, trees) -> str:
    """The failure of ``rank`` (on its host of ``trees``, a ``JobHosts``), with its last output."""
    host = trees.host_of(rank)
    shown = rank_output(group, rank)
    stopped = [r for r in group.terminated_ranks() if r != rank]
    others = (
        f"rank(s) {', '.join(map(str, stopped))} were then stopped by the launcher"
        if stopped
        else "the other ranks were stopped"
    )
    return (
        f"rank {rank} (host {host}) {what}; {others}. Last output of rank {rank}:\n"
        f"{shown}\nCheckpoints synced so far stay in S3; rerun to resume from the newest."
    )
