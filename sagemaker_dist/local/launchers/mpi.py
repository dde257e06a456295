"""``horovodrun --gloo`` and ``mpirun``: their commands, the tags they put on each rank's output line,
their report of the first failed process, and the checks before either starts (the host name Gloo
needs, Horovod built with MPI).

Their launcher implementations are ``entry_ranks.Horovodrun`` and ``entry_ranks.Mpirun``; the process
group they run in is ``base.RankGroup``.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from sagemaker_dist.contract.environment import inherited, search_path
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.local.launchers import MPIRUN
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
    return shutil.which(name, path=here + os.pathsep + search_path())


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


def horovodrun_command(world_size: int, entry: list[str]) -> list[str]:
    """``horovodrun --gloo`` starting ``world_size`` ranks of ``entry`` on this machine."""
    tool = _tool("horovodrun")
    if not tool:
        raise LaunchError(f"horovodrun is not installed; run scripts/setup.sh (it builds {HOROVOD_PIN})")
    return [tool, "--gloo", "-np", str(world_size), "-H", f"localhost:{world_size}", *entry]


def mpirun_command(world_size: int, entry: list[str], python: str) -> list[str]:
    """Open MPI's ``mpirun`` starting ``world_size`` ranks of ``entry`` on this machine, once ``python``'s
    Horovod is known to be built with MPI."""
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


def rank_tagged_lines(line: str) -> list[tuple[int, str]] | None:
    """A line tagged with its rank, by horovodrun (``[1]<stdout>:``, as our own launchers relay too) or
    by mpirun --tag-output, as (rank, text) pairs (``split_inner_tags``); None when untagged."""
    match = _PREFIX.match(line) or _MPI_TAG.match(line)
    return split_inner_tags(int(match.group(1)), match.group(3)) if match else None


def failed_process(output: str) -> tuple[int, int] | None:
    """(rank, exit code) of the first failed process as horovodrun or mpirun reported it in ``output``."""
    match = _FAILED_PROCESS.search(output)
    return (int(match.group(1)), int(match.group(2))) if match else None


class HorovodProbeError(LaunchError):
    """Whether a Python's Horovod was built with MPI could not be told (no Horovod, a broken build)."""


_PROBE_TIMEOUT_S = 120  # it imports TensorFlow


def horovod_mpi_built(python: str | os.PathLike = sys.executable) -> bool:
    """Whether ``python``'s Horovod (TensorFlow) was built with MPI.

    Asked in a child process: the SDK side never imports Horovod or TensorFlow itself. Raises
    HorovodProbeError, with the probe's own error, when it cannot tell: a launcher must not guess.
    """
    code = "import horovod.tensorflow as h; print('MPI_BUILT', h.mpi_built())"
    env = {**inherited(), "TF_CPP_MIN_LOG_LEVEL": "3"}
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
