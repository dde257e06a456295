"""The TensorFlow side's rank detection: an initialised Horovod's world first, checked against mpirun's.

A Horovod built without MPI (or told to run on Gloo) ignores mpirun: every process initialises as rank
0 of 1 and trains alone, and the first check to notice would blame the channel layout.
``check_horovod_world`` names the cause instead; ``HorovodRankInfo.detect`` runs it whenever it reads
the ranks of an initialised Horovod. Never imports Horovod (so never initialises it): it looks for the
Horovod module a script has loaded.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.runtime import environment
from sagemaker_dist.runtime.ranks import RankInfo

_HOROVOD_MODULES = ("horovod.tensorflow", "horovod.tensorflow.keras", "horovod.keras")


class HorovodWorldError(ConfigurationError):
    """Horovod's world is not the one mpirun started: a Horovod without MPI, each process alone."""


MPI_WORLD_SIZE = environment.MPI_WORLD_SIZE
_GLOO_VARIABLES = environment.HOROVOD_GLOO_VARIABLES
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
        environment.environ(environ),
        hvd.size(),
        mpi_built=_ask(hvd, "mpi_built"),
        mpi_enabled=_ask(hvd, "mpi_enabled"),
    )


def _ask(hvd, question: str) -> bool | None:
    try:
        return bool(getattr(hvd, question)())
    except Exception:  # an older or partial Horovod: unknown
        return None


class HorovodRankInfo(RankInfo):
    """``RankInfo`` whose ``detect`` asks an initialised Horovod first (TensorFlow's callers use it)."""

    @classmethod
    def detect(cls, environ: Mapping[str, str] | None = None) -> RankInfo:
        """From Horovod if it is imported and initialised, else the launcher's variables (``RankInfo``).

        An initialised Horovod whose world is not mpirun's raises ``HorovodWorldError``.
        """
        for name in _HOROVOD_MODULES:
            hvd = sys.modules.get(name)
            if hvd is None:
                continue
            try:
                if not hvd.is_initialized():
                    continue
                info = RankInfo(hvd.rank(), hvd.local_rank(), hvd.size(), hvd.local_size(), "horovod")
            except (AttributeError, ValueError):
                continue
            check_initialised_horovod(hvd, environ)  # mpirun's world, not Horovod's, when they differ
            return info
        return RankInfo.detect(environ)
