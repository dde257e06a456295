"""Which rank this process is, which channel it reads, and a start-up check that fails fast.

Reading the wrong number of channels does not crash a collective: ranks that find no data (or share a
FIFO) fall out of step and the job waits (Horovod's "Stalled ranks") for hours. ``check_rank_channels``
runs before any collective op and turns that into an immediate error naming the rank, the channel it
expected and the channels the job actually has. Framework-neutral: ranks come from the launcher's
variables; the TensorFlow side asks an initialised Horovod first (``tensorflow/keras/horovod_world.py``, which
also catches a Horovod whose world is not the one mpirun started).
"""

from __future__ import annotations

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
from sagemaker_dist.runtime import environment
from sagemaker_dist.runtime.config import ContainerConfig


class RankChannelError(ConfigurationError):
    """This rank has no usable channel of its own, or the job's channels do not match its ranks."""


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    size: int
    local_size: int
    source: str = "default"  # the variable family used, a framework's world ("horovod"), or "default"

    def __post_init__(self):
        if not (0 <= self.rank < self.size and 0 <= self.local_rank < self.local_size <= self.size):
            raise RankChannelError(
                f"inconsistent rank information from {self.source}: rank {self.rank} of {self.size}, "
                f"local rank {self.local_rank} of {self.local_size}"
            )

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None) -> RankInfo:
        """From the launcher's variables (``OMPI_COMM_WORLD_*``, ``HOROVOD_*``, torchrun's), else 0 of 1.

        Starts nothing. A framework whose initialised world can differ from the launcher's asks it
        first (the TensorFlow side's ``tensorflow.keras.horovod_world.HorovodRankInfo``).
        """
        try:
            found = rank_from_environment(environment.environ(environ))
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
