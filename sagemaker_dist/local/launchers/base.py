"""The one protocol of local mode's launchers (``Launcher``), what each is given (``LaunchOptions``,
``JobSetup``) and what each returns: the running ranks as a ``RankGroup``.

``run_local`` takes the launcher the job's registry entry names (``table.launcher_for``), then asks it
the same four things whatever it is: ``check()`` before anything starts, ``interface`` (the network
interface each host's resourceconfig.json names), ``group(setup)`` once the hosts' trees and feeds are
ready (the ranks, not started, their network set) and ``supervise(group, ...)`` (the failure that
names the rank, or None).

A ``RankGroup`` is one launcher process in a session of its own (in the job's own network namespace,
``private_net``), its output relayed line by line with the rank in front, a dead rank noticed at once,
and everything killed as a whole.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.host.job_spec import JobHosts, JobSpec
from sagemaker_dist.host.processes import descendants, pid_running
from sagemaker_dist.local.exit_files import TERMINATED, alive_lock_held
from sagemaker_dist.local.launchers.mpi import failed_process, rank_tagged_lines
from sagemaker_dist.local.launchers.private_net import PrivateNet
from sagemaker_dist.local.launchers.torchrun import tee_tagged

# A rank that lets go of its lock (``exit_files``) is ending unless it runs on this long
LOCK_GONE_S = 2.0
# A file's mtime comes from the kernel's coarse clock, up to a tick (10 ms at HZ=100) behind time.time():
# a rank seen alive counts as seen this much earlier, so a peer's exit file written after never looks older
MTIME_LAG_S = 0.01


class LocalJobError(ConfigurationError):
    """A request local mode cannot run as given; the message names what to fix."""


@dataclass(frozen=True)
class LaunchOptions:
    """What the caller of ``run_local`` chose beyond the request."""

    container_python: str | os.PathLike | None = None  # the image's environment (toolkit), the ranks' Python
    image: str | None = None  # the training image (container)
    work_dir: str | os.PathLike | None = None  # where the job's temp dir goes

    @property
    def python(self) -> str:
        """The Python that runs the ranks where local mode starts them itself."""
        return str(self.container_python or sys.executable)


@dataclass(frozen=True)
class JobSetup:
    """What a launcher builds its group from, once every host is ready (trees, checkpoints, feeds)."""

    job: JobSpec
    trees: JobHosts  # every host's tree, and the host of each rank
    code_dir: Path  # the entry script's dir: the one given, or the one downloaded from S3
    given_source: Path | None  # the source dir given to run_local (None: the toolkit downloads it)
    work: Path  # the job's temp dir
    extra_env: dict[str, str] | None
    echo: Callable[[str], object]
    stack: ExitStack  # what a launcher holds beyond its group (a network of its own) is released there


class Launcher(ABC):
    """One way of starting a local job's ranks. ``table.IMPLEMENTATIONS`` maps each launcher name of
    the registry of distributions to its implementation; ``run_local`` makes one per job."""

    name: ClassVar[str]  # the launcher's name in the registry (contract/distributions.py)
    # without --hosts, the CLI simulates one host whose processes are the job's ranks (the toolkit
    # starts them), not one host per rank
    defaults_to_one_host: ClassVar[bool] = False

    def __init__(self, job: JobSpec, options: LaunchOptions):
        self.job, self.options = job, options

    @property
    def interface(self) -> str:
        """The network interface each host's resourceconfig.json names."""
        return "lo"

    @abstractmethod
    def check(self) -> None:
        """Fail before anything starts, naming the fix (ConfigurationError), where this launcher cannot
        run the job here."""

    @abstractmethod
    def group(self, setup: JobSetup) -> RankGroup:
        """The job's ranks, not yet started, with the network they run in."""

    @abstractmethod
    def supervise(
        self, group: RankGroup, feed_errors: list[str], trees: JobHosts, started: float
    ) -> str | None:
        """Wait for the started ``group`` (bounded by the job's timeout) and relay its last output; the
        failure that names the rank (or feed), or None when the job succeeded."""


def rank_echo(trees: JobHosts, echo):
    """Print a launcher line as is and a rank's line with its rank and host in front."""

    def show(rank, text):
        if rank is None:
            if text.strip():
                echo(f"[launcher] {text}")
        else:
            echo(f"[rank {rank} {trees.host_of(rank)}] {text}")

    return show


def describe_exit(code: int) -> str:
    if code < 0 or code > 128:
        num = -code if code < 0 else code - 128
        try:
            return f"code {code} (killed by {signal.Signals(num).name})"
        except ValueError:
            pass
    return f"code {code}"


class RankGroup:
    """The running ranks: one launcher process in a new session, plus the rank pids they report."""

    def __init__(self, command: list[str], env: dict[str, str], pid_dir: Path, world_size: int, on_line):
        self.command, self.env, self.pid_dir = command, env, Path(pid_dir)
        self.world_size, self.on_line = world_size, on_line
        self.proc: subprocess.Popen | None = None
        self.output: list[str] = []
        self.rank_lines: dict[int, list[str]] = {}
        self._reader: threading.Thread | None = None
        self.known_pids: dict[int, int] = {}
        # whether each rank writes its pid once it is up (``rank_entry``, after it takes SIGTERM): then a
        # rank without a pid has not started yet; the toolkit's ranks write none
        self.reports_pids = False
        self.last_alive: dict[int, float] = {}  # rank -> time.time() it was last seen running
        self.first_dead: dict[int, float] = {}  # rank -> time.time() it was first seen gone, no exit file
        self.lock_free_since: dict[int, float] = {}  # rank -> when it was first seen running without its lock
        self.lockless: set[int] = set()  # ranks that run on without their lock: /proc alone says
        self.exits_seen: dict[int, tuple[str, float]] = {}  # the exit files as last read
        # where untagged output counts as a rank's (for its metrics and last lines): the one worker
        # the toolkit starts without mpirun (tf-mwms on one host) prints untagged
        self.untagged_rank: int | None = None
        # where the ranks' lines carry torchrun's --tee tags ("[default1]:line", a local rank): the host's
        # first rank (the toolkit's torchrun on one host, in the image); None: no such tags
        self.tee_first_rank: int | None = None
        # where the launcher runs: a network namespace of the job's own (``private_net``), or None
        # for this machine's network
        self.network: PrivateNet | None = None

    def start(self) -> None:
        def popen() -> subprocess.Popen:
            return subprocess.Popen(
                self.command,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                bufsize=1,
                start_new_session=True,
                errors="replace",
            )

        self.proc = self.network.start(popen) if self.network else popen()
        self._reader = threading.Thread(target=self._relay, name="rank-output", daemon=True)
        self._reader.start()

    def _relay(self) -> None:
        for raw in self.proc.stdout:
            line = raw.rstrip("\n")
            self.output.append(line)
            tagged = rank_tagged_lines(line)
            tee = tee_tagged(line, self.tee_first_rank) if self.tee_first_rank is not None else None
            if tagged or tee:
                for rank, text in tagged or [tee]:
                    self.rank_lines.setdefault(rank, []).append(text)
                    self.on_line(rank, text)
            else:
                if self.untagged_rank is not None:
                    self.rank_lines.setdefault(self.untagged_rank, []).append(line)
                self.on_line(None, line)

    def _read_pids(self) -> None:
        for path in self.pid_dir.glob("*.pid"):
            rank = int(path.stem)
            if rank not in self.known_pids:
                try:
                    self.known_pids[rank] = int(path.read_text())
                except ValueError:
                    pass  # being written

    def _exit_files(self, keep: bool = True) -> dict[int, tuple[str, float]]:
        """rank -> (exit-file text, its mtime in seconds since the epoch); kept as ``exits_seen`` (the
        supervisor's reads, the last of them once the launcher has exited) unless ``keep=False``."""
        found = {}
        for path in self.pid_dir.glob("*.exit"):
            try:
                found[int(path.stem)] = (path.read_text().strip(), path.stat().st_mtime)
            except (OSError, ValueError):
                continue
        if keep:
            self.exits_seen = found
        return found

    def ranks_ended_with(self, text: str, read: bool = True) -> list[int]:
        """Ranks whose exit file says ``text`` (``"0"``, ``TERMINATED``), read now (from another thread
        too: it keeps nothing); ``read=False``: as the supervisor last read them (the job's files may be
        gone once it has ended)."""
        return _saying(self._exit_files(keep=False) if read else self.exits_seen, text)

    def watch(self) -> None:
        """Note, for every rank without an exit file, when it was last seen alive and first seen dead:
        /proc says whether it is gone, its lock (``exit_files.hold_alive_lock``) since when."""
        self._read_pids()
        now = time.time()
        exits = self._exit_files()
        for rank, pid in self.known_pids.items():
            if rank in exits:
                continue
            if not pid_running(pid):
                self.first_dead.setdefault(rank, now)
            elif self._holds_lock(rank, now):
                self.last_alive[rank] = now - MTIME_LAG_S

    def _holds_lock(self, rank: int, now: float) -> bool:
        """Whether running ``rank`` still counts as alive. One that let its lock go is ending (its
        sockets close next, so a peer may fail on them while /proc still shows it) unless it runs on
        for ``LOCK_GONE_S``: then it let the lock go itself (closed every descriptor; an exec from a
        process with threads before Linux 5.12) and /proc alone says from then on."""
        if rank in self.lockless:
            return True
        if alive_lock_held(self.pid_dir / f"{rank}.alive") is not False:
            return True
        if now - self.lock_free_since.setdefault(rank, now) > LOCK_GONE_S:
            self.lockless.add(rank)
            return True
        return False

    def unfinished_ranks(self) -> list[int]:
        """Ranks that have not written their exit file (none known where the ranks report no pids)."""
        if not self.reports_pids:
            return []
        return sorted(set(range(self.world_size)) - set(self._exit_files()))

    def terminated_ranks(self) -> list[int]:
        """Ranks stopped by SIGTERM (the launcher stopping them after another rank failed)."""
        return _saying(self._exit_files(), TERMINATED)

    def first_failure(self) -> tuple[int, str] | None:
        """(rank, what happened) of the earliest real failure, or None.

        Real failures are a non-zero exit file (its mtime is when it happened) and a rank gone
        without an exit file (killed, crashed hard: it happened after it was last seen alive).
        Ranks that recorded ``terminated`` were stopped by the launcher and are never blamed. The
        event that can have happened first wins; a tie goes to the rank that died without a trace.
        """
        self.watch()
        events = []
        for rank, (text, mtime) in self._exit_files().items():
            if text in ("0", TERMINATED):
                continue
            try:
                what = f"exited with {describe_exit(int(text))}"
            except ValueError:
                what = f"exited ({text!r})"
            events.append((mtime, 1, rank, what))
        for rank in self.first_dead:
            if (self.pid_dir / f"{rank}.exit").exists():
                continue
            since = self.last_alive.get(rank, self._pid_time(rank))
            events.append((since, 0, rank, "died (killed or crashed without exiting)"))
        if not events:
            return None
        _, _, rank, what = min(events)
        return rank, what

    def _pid_time(self, rank: int) -> float:
        try:
            return (self.pid_dir / f"{rank}.pid").stat().st_mtime
        except OSError:
            return 0.0

    def failed_rank(self) -> tuple[int, int] | None:
        """(rank, exit code) from the launcher's report of the first failed process, if it printed one."""
        return failed_process("\n".join(self.output))

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def finish_output(self, timeout: float = 5.0) -> None:
        if self._reader:
            self._reader.join(timeout)

    def kill(self, grace: float = 3.0) -> None:
        """SIGTERM every process of the job (the launcher, its helpers in their own sessions, the
        ranks), then SIGKILL what is left after ``grace`` seconds."""
        self._read_pids()
        tree: set[int] = set()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            roots = [self.proc.pid] if self.proc else []
            tree |= descendants([*roots, *self.known_pids.values()]) | set(self.known_pids.values())
            targets = [pid for pid in tree if pid_running(pid)]
            if self.proc and self.proc.poll() is None:
                targets.append(self.proc.pid)
            if not targets:
                break
            for pid in targets:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and (
                (self.proc and self.proc.poll() is None) or any(pid_running(p) for p in tree)
            ):
                time.sleep(0.05)
        if self.proc:
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        if self.network:
            self.network.close()


def _saying(exits: dict[int, tuple[str, float]], text: str) -> list[int]:
    """The ranks of ``exits`` (``RankGroup._exit_files``) whose exit file says ``text``."""
    return sorted(rank for rank, (said, _) in exits.items() if said == text)
