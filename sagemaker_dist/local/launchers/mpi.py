"""Start the ranks (``horovodrun --gloo`` or ``mpirun``) in their own process group, relay their
output line by line with the rank in front, notice a dead rank at once, and kill everything.

Local mode starts every launcher in a network namespace of the job's own (``RankGroup.network``,
``private_net``): horovodrun's Gloo rendezvous server binds every address, and there every address is
loopback.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.host.processes import descendants
from sagemaker_dist.local.exit_files import TERMINATED
from sagemaker_dist.local.launchers import HOROVODRUN, MPIRUN, TF_CONFIG, TORCHRUN
from sagemaker_dist.local.launchers.private_net import PrivateNet
from sagemaker_dist.local.launchers.torchrun import host_group_command, tee_tagged
from sagemaker_dist.local.rank_entry import JOB_ENV

_PREFIX = re.compile(r"^\[(\d+)\]<(stdout|stderr)>:(.*)$")
# mpirun --tag-output: [1,0]<stdout>: and, under the toolkit's options, [1,mpirank:0,algo-1]<stdout>:
_MPI_TAG = re.compile(r"^\[\d+,(?:mpirank:)?(\d+)(?:,[^\]]*)?\]<(stdout|stderr)>:(.*)$")
# Under load mpirun tags each chunk of a rank's output, not each line, so a tag can stand inside a
# line: the same rank's (a line written in parts: "RuntimeError[1,1]<stderr>:: ...") or another
# rank's (two lines run together)
_MPI_INNER_TAG = re.compile(r"\[\d+,(?:mpirank:)?(\d+)(?:,[^\]]*)?\]<std(?:out|err)>:")
# the first failed process as horovodrun reports it ("Process name: 1") and as mpirun does
# ("Process name: [[27860,1],1]")
_FAILED_PROCESS = re.compile(r"Process name: (?:\[\[\d+,\d+\],)?(\d+)\]?\s*\n\s*Exit code:\s*(-?\d+)")


HOROVOD_PIN = "horovod==0.28.1"  # as setup.py's horovod extra and scripts/setup.sh build it


class LaunchError(ConfigurationError):
    """The ranks could not be started as asked."""


def _tool(name: str) -> str | None:
    here = str(Path(sys.executable).parent)
    return shutil.which(name, path=here + os.pathsep + os.environ.get("PATH", ""))


def check_hostname_resolves(hostname: str | None = None) -> None:
    """Gloo (horovodrun) finds its own address by this machine's host name; one that does not resolve
    makes every rank crash in ``hvd.init()`` with a segmentation fault, so say so before launching."""
    name = hostname or socket.gethostname()
    try:
        socket.getaddrinfo(name, None)
    except (socket.gaierror, UnicodeError) as exc:
        raise LaunchError(
            f"this machine's host name {name!r} does not resolve ({exc}); Horovod's Gloo needs it to find "
            f"its own address and would crash every rank. Add '127.0.1.1 {name}' to /etc/hosts (or set a "
            "host name that resolves), then run again"
        ) from None


def rank_command(launcher: str, world_size: int, python: str = sys.executable) -> list[str]:
    """The command that starts ``world_size`` ranks of the local rank entry on this machine."""
    entry = [python, "-u", "-m", "sagemaker_dist.local.rank_entry"]
    if launcher == TF_CONFIG:
        return [
            python,
            "-u",
            "-m",
            "sagemaker_dist.local.launchers.tf_config",
            "--workers",
            str(world_size),
            *entry,
        ]
    if launcher == TORCHRUN:  # torchrun once per simulated host; each starts its host's ranks
        return host_group_command(python, python, rank_cmd=entry)
    if launcher == HOROVODRUN:
        tool = _tool("horovodrun")
        if not tool:
            raise LaunchError(f"horovodrun is not installed; run scripts/setup.sh (it builds {HOROVOD_PIN})")
        return [tool, "--gloo", "-np", str(world_size), "-H", f"localhost:{world_size}", *entry]
    if launcher == MPIRUN:
        tool = _tool("mpirun")
        if not tool:
            raise LaunchError(
                "mpirun is not installed; install Open MPI (apt-get install openmpi-bin) and a Horovod "
                "built with MPI, or use launcher='horovodrun'"
            )
        check_horovod_mpi(python, MPIRUN)
        return [
            tool,
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            str(world_size),
            "--host",
            f"localhost:{world_size}",
            "-bind-to",
            "none",
            "-map-by",
            "slot",
            "--tag-output",
            "-x",
            JOB_ENV,
            "-x",
            "PATH",
            "-x",
            "PYTHONPATH",
            *entry,
        ]
    raise LaunchError(f"launcher {launcher!r} is not one of {HOROVODRUN}, {MPIRUN}, {TF_CONFIG}, {TORCHRUN}")


def split_inner_tags(rank: int, text: str) -> list[tuple[int, str]]:
    """``rank``'s tagged ``text`` as (rank, line) pairs: a tag of the same rank inside it is dropped
    (its line was written in parts), one of another rank starts that rank's line; empty parts go."""
    lines: list[tuple[int, str]] = []
    current, start = rank, 0
    for tag in [*_MPI_INNER_TAG.finditer(text), None]:
        part = text[start : tag.start() if tag else len(text)]
        if lines and lines[-1][0] == current:
            lines[-1] = (current, lines[-1][1] + part)  # the same rank's line, written in parts
        else:
            lines.append((current, part))
        if tag:
            current, start = int(tag.group(1)), tag.end()
    kept = [(who, line) for who, line in lines if line]
    return kept or [(rank, "")]


def mpi_tagged_lines(line: str) -> list[tuple[int, str]] | None:
    """A line of mpirun --tag-output as (rank, text) pairs (``split_inner_tags``); None when untagged."""
    match = _MPI_TAG.match(line)
    return split_inner_tags(int(match.group(1)), match.group(3)) if match else None


class HorovodProbeError(LaunchError):
    """Whether a Python's Horovod was built with MPI could not be told (no Horovod, a broken build)."""


_PROBE_TIMEOUT_S = 120  # it imports TensorFlow


def horovod_mpi_built(python: str | os.PathLike = sys.executable) -> bool:
    """Whether ``python``'s Horovod (TensorFlow) was built with MPI.

    Asked in a child process: the SDK side never imports Horovod or TensorFlow itself. Raises
    HorovodProbeError, with the probe's own error, when it cannot tell: a launcher must not guess.
    """
    code = "import horovod.tensorflow as h; print('MPI_BUILT', h.mpi_built())"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    asked = f"{python} -c {code!r}"
    try:
        proc = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, env=env
        )
    except OSError as exc:
        raise HorovodProbeError(f"could not run {asked}: {exc}") from None
    except subprocess.TimeoutExpired:
        raise HorovodProbeError(f"{asked} did not answer within {_PROBE_TIMEOUT_S} s") from None
    match = re.search(r"^MPI_BUILT (True|False)$", proc.stdout, re.MULTILINE)
    if match is None:
        said = "\n".join((proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-8:])
        raise HorovodProbeError(f"{asked} failed (exit code {proc.returncode}):\n{said}")
    return match.group(1) == "True"


def check_horovod_mpi(python: str | os.PathLike, launcher: str, error: type[Exception] = LaunchError) -> None:
    """Refuse ``launcher`` (one that starts the ranks with mpirun) unless ``python``'s Horovod was built
    with MPI: a Gloo-only Horovod under mpirun initialises every rank as a job of size 1, which then
    trains alone, and the first error would blame something else. Raises ``error``."""
    how = (
        "./scripts/setup.sh does it (it builds each venv's Horovod to match this machine), or by hand with "
        "Open MPI and its headers installed (Debian: apt-get install openmpi-bin libopenmpi-dev): "
        f"HOROVOD_WITH_MPI=1 HOROVOD_WITH_TENSORFLOW=1 {python} -m pip install --no-build-isolation "
        f"--no-cache-dir --no-deps --force-reinstall {HOROVOD_PIN}"
    )
    try:
        built = horovod_mpi_built(python)
    except HorovodProbeError as exc:
        raise error(
            f"launcher {launcher!r} needs a Horovod built with MPI, and whether {python}'s is could not be "
            f"told: {exc}\nGive that Python a Horovod built with MPI: {how}"
        ) from None
    if not built:
        raise error(
            f"launcher {launcher!r} needs a Horovod built with MPI, and {python}'s is not "
            "(horovod.tensorflow.mpi_built() is False): under mpirun every rank would initialise as a job of "
            f"size 1 and train alone. Rebuild it: {how}. Or use launcher 'horovodrun' (Gloo)"
        )


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
        self.last_alive: dict[int, float] = {}  # rank -> time.time() it was last seen running
        self.first_dead: dict[int, float] = {}  # rank -> time.time() it was first seen gone, no exit file
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
            match = _PREFIX.match(line) or _MPI_TAG.match(line)
            tee = tee_tagged(line, self.tee_first_rank) if self.tee_first_rank is not None else None
            if match or tee:
                for rank, text in split_inner_tags(int(match.group(1)), match.group(3)) if match else [tee]:
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

    def _exit_files(self) -> dict[int, tuple[str, float]]:
        """rank -> (exit-file text, its mtime in seconds since the epoch)."""
        found = {}
        for path in self.pid_dir.glob("*.exit"):
            try:
                found[int(path.stem)] = (path.read_text().strip(), path.stat().st_mtime)
            except (OSError, ValueError):
                continue
        return found

    def watch(self) -> None:
        """Note, for every rank without an exit file, when it was last seen alive and first seen dead."""
        self._read_pids()
        now = time.time()
        exits = self._exit_files()
        for rank, pid in self.known_pids.items():
            if rank in exits:
                continue
            if _alive(pid):
                self.last_alive[rank] = now
            else:
                self.first_dead.setdefault(rank, now)

    def terminated_ranks(self) -> list[int]:
        """Ranks stopped by SIGTERM (the launcher stopping them after another rank failed)."""
        return sorted(r for r, (text, _) in self._exit_files().items() if text == TERMINATED)

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
        match = _FAILED_PROCESS.search("\n".join(self.output))
        if match:
            return int(match.group(1)), int(match.group(2))
        return None

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
            targets = [pid for pid in tree if _alive(pid)]
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
                (self.proc and self.proc.poll() is None) or any(_alive(p) for p in tree)
            ):
                time.sleep(0.05)
        if self.proc:
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        if self.network:
            self.network.close()


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
