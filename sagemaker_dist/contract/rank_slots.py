"""Ranks as pure data: where each rank sits (host, local and cross rank) and the variables that say so.

``rank_slots`` computes every rank's slot once, as horovod's ``get_host_assignments`` does, for
ranks that fill hosts of ``processes_per_host`` in order (how mpirun and horovodrun place them).
``slot_environment`` and ``mpi_local_environment`` render a slot into Horovod's and Open MPI's
variables; ``rank_from_environment`` reads them back, with one precedence everywhere: Open MPI's
(the toolkit launches mpirun) first, then Horovod's (horovodrun with Gloo), then ``TF_CONFIG``
(MultiWorkerMirroredStrategy: one worker per host, its task index the rank).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# (rank, local rank, size, local size) variables, in order of preference.
RANK_VARIABLES = (
    (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    ("HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_SIZE"),
)

# torchrun's (rank, local rank, size, local size), which init_process_group("env://") reads
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


@dataclass(frozen=True)
class RankSlot:
    """One rank's place in the job: world, local (within its host) and cross (across hosts) ranks."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    host: str


def host_names(count: int) -> list[str]:
    """SageMaker's names of a job's ``count`` hosts: ``algo-1`` .. ``algo-<count>``."""
    return [f"algo-{i + 1}" for i in range(count)]


def rank_slots(hosts: Sequence[str], processes_per_host: int) -> list[RankSlot]:
    """Every rank's slot when ranks fill ``hosts`` in order, ``processes_per_host`` each."""
    size = len(hosts) * processes_per_host
    return [
        RankSlot(
            rank=r,
            size=size,
            local_rank=r % processes_per_host,
            local_size=processes_per_host,
            cross_rank=r // processes_per_host,
            cross_size=len(hosts),
            host=hosts[r // processes_per_host],
        )
        for r in range(size)
    ]


def slot_environment(slot: RankSlot) -> dict[str, str]:
    """Horovod's local and cross variables of ``slot``."""
    return {
        "HOROVOD_HOSTNAME": slot.host,
        "HOROVOD_LOCAL_RANK": str(slot.local_rank),
        "HOROVOD_LOCAL_SIZE": str(slot.local_size),
        "HOROVOD_CROSS_RANK": str(slot.cross_rank),
        "HOROVOD_CROSS_SIZE": str(slot.cross_size),
    }


def mpi_local_environment(slot: RankSlot) -> dict[str, str]:
    """Open MPI's local variables of ``slot``, which a rank mpirun starts gets from it."""
    return {
        "OMPI_COMM_WORLD_LOCAL_RANK": str(slot.local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(slot.local_size),
    }


class RankVariablesError(ValueError):
    """Rank variables that are set but incomplete or not numbers (the caller wraps it in its error)."""


TF_CONFIG = "TF_CONFIG"


def rank_from_tf_config(text: str) -> tuple[int, int, int, int]:
    """(task index, 0, workers, 1) from a ``TF_CONFIG`` of workers only (as the TF toolkit writes it)."""
    try:
        doc = json.loads(text)
        workers = doc["cluster"]["worker"]
        task = doc["task"]
        index = int(task["index"])
    except (ValueError, KeyError, TypeError) as exc:
        raise RankVariablesError(
            f"TF_CONFIG is not a cluster of workers with a task ({exc}): {text[:200]}"
        ) from exc
    if task.get("type") != "worker" or set(doc["cluster"]) != {"worker"}:
        raise RankVariablesError(
            f"TF_CONFIG has task type {task.get('type')!r} and jobs {sorted(doc['cluster'])}; sagemaker-dist "
            "runs MultiWorkerMirroredStrategy with workers only (as SageMaker's TF toolkit writes it)"
        )
    if not 0 <= index < len(workers):
        raise RankVariablesError(f"TF_CONFIG task index {index} is not one of the {len(workers)} worker(s)")
    return index, 0, len(workers), 1


def rank_from_environment(environ: Mapping[str, str]) -> tuple[tuple[int, int, int, int], str] | None:
    """((rank, local rank, size, local size), family) from the first family set, else None."""
    for names in RANK_VARIABLES:
        if names[0] in environ:
            try:
                values = tuple(int(environ[n]) for n in names)
            except KeyError as exc:
                raise RankVariablesError(f"{names[0]} is set but {exc.args[0]} is not") from exc
            except ValueError as exc:
                raise RankVariablesError(f"rank variables {names} are not whole numbers: {exc}") from exc
            return values, names[0].rsplit("_", 1)[0] + "_*"
    if environ.get(TF_CONFIG):
        return rank_from_tf_config(environ[TF_CONFIG]), TF_CONFIG
    return None
