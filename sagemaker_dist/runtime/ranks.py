"""Which Horovod rank this process is, which channel it reads, and a start-up check that fails fast.

Reading the wrong number of channels does not crash Horovod: ranks that find no data (or share a
FIFO) fall out of step and the job loops on "Stalled ranks" for hours. ``check_rank_channels`` runs
before any collective op and turns that into an immediate error naming the rank, the channel it
expected and the channels the job actually has. ``check_horovod_world`` catches the other way ranks
end up alone: a Horovod without MPI under mpirun, where every process is a world of one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from sagemaker_dist.contract.layout import (
    LAYOUT_HYPERPARAMETER,
    PER_RANK,
    SINGLE,
    LayoutError,
    fifo_would_be_shared,
)
from sagemaker_dist.contract.rank_slots import RankVariablesError, rank_from_environment
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.runtime.config import ContainerConfig

_HOROVOD_MODULES = ("horovod.tensorflow", "horovod.tensorflow.keras", "horovod.keras")


class RankChannelError(ConfigurationError):
    """This rank has no usable channel of its own, or the job's channels do not match its ranks."""


class HorovodWorldError(ConfigurationError):
    """Horovod's world is not the one mpirun started: a Horovod without MPI, each process alone."""


MPI_WORLD_SIZE = "OMPI_COMM_WORLD_SIZE"
_GLOO_VARIABLES = ("HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS")
_REBUILD = (
    "rebuild Horovod with Open MPI's headers present (Debian: apt-get install libopenmpi-dev), e.g. "
    "HOROVOD_WITH_MPI=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 pip install --no-build-isolation "
    "--no-cache-dir --force-reinstall --no-deps horovod==0.28.1, or run scripts/setup.sh, which rebuilds "
    "a Horovod that lacks MPI; or launch with horovodrun (Gloo) instead of mpirun"
)


def check_horovod_world(
    environ: Mapping[str, str], size: int, *, mpi_built: bool | None = None, mpi_enabled: bool | None = None
) -> None:
    """Raise ``HorovodWorldError`` when mpirun started more (or fewer) processes than Horovod's world
    holds and Horovod is not running on MPI. A Horovod built without MPI ignores mpirun: every process
    initialises as rank 0 of 1 and trains alone, and the first check to notice would blame the
    channel layout. ``mpi_built``/``mpi_enabled`` are Horovod's answers (None: unknown); an MPI
    Horovod given a smaller communicator on purpose (``mpi_enabled``) passes."""
    launched = environ.get(MPI_WORLD_SIZE, "").strip()
    if not launched.isdigit() or int(launched) == size or mpi_enabled:
        return
    start = (
        f"mpirun started {launched} processes ({MPI_WORLD_SIZE}={launched}), but Horovod initialised a "
        f"world of {size}"
    )
    alone = "so under mpirun each process starts a world of its own and trains alone"
    if mpi_built:  # MPI is there, but Horovod was told to run on Gloo
        told = [f"{name}={environ[name]}" for name in _GLOO_VARIABLES if name in environ]
        raise HorovodWorldError(
            f"{start}: this Horovod has MPI but runs on Gloo ({', '.join(told) or 'MPI not enabled'}), "
            f"{alone}. Unset {' and '.join(_GLOO_VARIABLES)} to run on MPI, or launch with horovodrun --gloo"
        )
    known = " (horovod.tensorflow.mpi_built() is False)" if mpi_built is False else ""
    raise HorovodWorldError(
        f"{start}: this Horovod was built without MPI{known}, {alone}. To fix it, {_REBUILD}"
    )


def check_initialised_horovod(hvd, environ: Mapping[str, str] | None = None) -> None:
    """``check_horovod_world`` for an initialised Horovod module (``horovod.tensorflow`` or the like)."""
    check_horovod_world(
        os.environ if environ is None else environ,
        hvd.size(),
        mpi_built=_ask(hvd, "mpi_built"),
        mpi_enabled=_ask(hvd, "mpi_enabled"),
    )


def _ask(hvd, question: str) -> bool | None:
    try:
        return bool(getattr(hvd, question)())
    except Exception:  # an older or partial Horovod: unknown
        return None


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    size: int
    local_size: int
    source: str = "default"  # "horovod", the variable family used, or "default" (one process)

    def __post_init__(self):
        if not (0 <= self.rank < self.size and 0 <= self.local_rank < self.local_size <= self.size):
            raise RankChannelError(
                f"inconsistent rank information from {self.source}: rank {self.rank} of {self.size}, "
                f"local rank {self.local_rank} of {self.local_size}"
            )

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None) -> RankInfo:
        """From Horovod if it is imported and initialised, else OMPI_COMM_WORLD_* / HOROVOD_*, else 0 of 1.

        Never imports Horovod itself (and so never initialises it). An initialised Horovod whose world
        is not mpirun's raises ``HorovodWorldError`` (``check_horovod_world``).
        """
        for name in _HOROVOD_MODULES:
            hvd = sys.modules.get(name)
            if hvd is None:
                continue
            try:
                if not hvd.is_initialized():
                    continue
                info = cls(hvd.rank(), hvd.local_rank(), hvd.size(), hvd.local_size(), "horovod")
            except (AttributeError, ValueError):
                continue
            check_initialised_horovod(hvd, environ)  # mpirun's world, not Horovod's, when they differ
            return info
        try:
            found = rank_from_environment(os.environ if environ is None else environ)
        except RankVariablesError as exc:
            raise RankChannelError(str(exc)) from exc
        if found is None:
            return cls(0, 0, 1, 1)
        values, family = found
        return cls(*values, source=family)


def _describe(channels) -> str:
    return ", ".join(channels) if channels else "none"


def check_rank_channels(
    config: ContainerConfig,
    rank_info: RankInfo | None = None,
    role: str = "train",
    input_modes: tuple[str, ...] = ("Pipe",),
) -> str:
    """Return this rank's channel for ``role`` after checking the job can feed every rank; else raise.

    Checks, all local (no collective op, no waiting): the layout hyperparameter is there; the number
    of ``role`` channels matches the world size (per-rank) or the local size (per-local-rank); this
    rank's channel is in inputdataconfig.json with one of ``input_modes``; and a Pipe channel that
    several ranks of one host would read (a shared role) is refused: a FIFO has one reader only.
    """
    check = _ChannelCheck(config, rank_info or RankInfo.detect(config.environ or None), role)
    layout, role_layout = check.role_layout()
    expected = role_layout.base if role_layout.spread == SINGLE else check.worker_channel(layout, role_layout)
    check.mode(expected, role_layout, input_modes)
    return expected


class _ChannelCheck:
    """The start-up check of one rank for one role; every error names the rank and what is present."""

    def __init__(self, config: ContainerConfig, info: RankInfo, role: str):
        self.config, self.info, self.role = config, info, role
        self.who = (
            f"rank {info.rank} (local rank {info.local_rank}; {info.size} rank(s), "
            f"{info.local_size} per host)"
        )

    def fail(self, expected: str, problem: str, hint: str) -> RankChannelError:
        present = _describe(self.config.channels)
        return RankChannelError(
            f"{self.who}: expected channel {expected!r}: {problem}. Channels present: {present}. {hint}"
        )

    def role_layout(self):
        config, role = self.config, self.role
        try:
            layout = config.layout
        except LayoutError as exc:
            raise RankChannelError(f"{self.who}: {exc}") from exc
        if layout is None:
            raise self.fail(
                f"{role}_{self.info.rank}",
                f"hyperparameter {LAYOUT_HYPERPARAMETER!r} is missing "
                f"(hyperparameters from {config.sources.get('hyperparameters.json', 'missing')})",
                "Launch the job with sagemaker-dist so it records the channel layout, or use "
                "PipeModeDataset(channel) directly.",
            )
        try:
            return layout, layout.role(role)
        except LayoutError as exc:
            raise RankChannelError(f"{self.who}: {exc}") from exc

    def worker_channel(self, layout, role_layout) -> str:
        """This rank's own channel of a per-worker role, after checking the layout fits the job."""
        info, role, data_config = self.info, self.role, self.config.input_data_config
        if layout.strategy == PER_RANK:
            index, workers, kind = info.rank, info.size, "ranks"
        else:
            index, workers, kind = info.local_rank, info.local_size, "ranks per host"
        expected = f"{role_layout.base}_{index}"
        if role_layout.count != workers:
            raise self.fail(
                expected,
                f"the layout ({layout.strategy}) has {role_layout.count} {role} channel(s) "
                f"({_describe(role_layout.channels)}) for {layout.hosts} host(s) x "
                f"{layout.processes_per_host} process(es), but the job runs {workers} {kind}",
                "Launch with as many processes per host as the layout was planned for "
                "(sagemaker_mpi_num_of_processes_per_host), or plan the layout for this cluster.",
            )
        missing = [c for c in role_layout.channels if c not in data_config]
        if missing:
            raise self.fail(
                expected,
                f"{role_layout.count - len(missing)} of the layout's {role_layout.count} {role} channel(s) "
                f"exist (missing: {_describe(missing)})",
                "Create the job with every channel of the layout (sagemaker-dist does).",
            )
        return expected

    def mode(self, expected: str, role_layout, input_modes: tuple[str, ...]) -> None:
        config, info = self.config, self.info
        if expected not in config.input_data_config:
            raise self.fail(
                expected, "it is not in inputdataconfig.json", "Add the channel to the job's InputDataConfig."
            )
        mode = config.input_mode(expected)
        if mode not in input_modes:
            wanted = " or ".join(repr(m) for m in input_modes)
            raise self.fail(
                expected,
                f"its TrainingInputMode is {mode!r}, not {wanted}",
                "Create the channel with InputMode 'Pipe' (or read its files from "
                f"{config.data_dir / expected} instead of a PipeModeDataset).",
            )
        if role_layout.spread == SINGLE and fifo_would_be_shared(mode, info.local_size):
            raise self.fail(
                expected,
                f"it is one Pipe-mode channel that all {info.local_size} ranks of this host would read, "
                "but a FIFO has one reader only (several readers silently split its bytes)",
                f"Give {self.role!r} one channel per worker (validation='per-worker'), or make this shared "
                "channel File mode so every rank reads its files.",
            )
