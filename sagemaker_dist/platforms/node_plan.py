"""What one node's Pipe-mode agent does, as pure data: which host of the job it is, which ranks run on
it, and which channels it feeds (those its ranks read, as the channel layout maps them, plus the
channels every rank shares). No I/O: the agent (``pipe_agent``) acts on the plan.

On SageMaker every host gets a FIFO for every channel; an agent feeds only its own ranks' channels,
so a node never waits on a FIFO nobody will open.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sagemaker_dist.aws.instances import (
    ProcessesPerHostError,
    UnknownInstanceTypeError,
    gpus_per_instance,
    normalize_instance_type,
)
from sagemaker_dist.contract.distributions import KUBERNETES_KINDS, distribution, names_where
from sagemaker_dist.contract.rank_slots import RankSlot
from sagemaker_dist.contract.training_request import ChannelSpec
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.host.job_spec import JobSpec

# EFA interfaces per instance type (AWS's EFA "supported instance types"); what the EFA device plugin
# offers as vpc.amazonaws.com/efa. Types missing here get no EFA request.
EFA_INTERFACES = {
    "ml.p3dn.24xlarge": 1,
    "ml.p4d.24xlarge": 4,
    "ml.p4de.24xlarge": 4,
    "ml.p5.48xlarge": 32,
    "ml.p5e.48xlarge": 32,
    "ml.p5en.48xlarge": 16,
    "ml.g5.48xlarge": 1,
    "ml.g6.48xlarge": 1,
    "ml.g6e.48xlarge": 4,
    "ml.trn1.32xlarge": 8,
    "ml.trn1n.32xlarge": 16,
}


class NodePlanError(ConfigurationError):
    """A node index, rank list or option that does not fit the job; the message says what does."""


@dataclass(frozen=True)
class NodePlan:
    """One node of a job: its host name (``algo-<i+1>``), its ranks and the channels it feeds."""

    job: JobSpec
    node_index: int
    slots: tuple[RankSlot, ...]
    channels: tuple[ChannelSpec, ...]
    epochs: int | None

    @property
    def host(self) -> str:
        return self.slots[0].host  # its ranks' (a node runs processes_per_host >= 1 of them)

    @property
    def ranks(self) -> list[int]:
        return [s.rank for s in self.slots]

    def describe(self) -> str:
        names = ", ".join(c.name for c in self.channels) or "none"
        return (
            f"node {self.node_index} ({self.host}) of {self.job.hosts}, job {self.job.name}: "
            f"rank(s) {', '.join(map(str, self.ranks))}; channels {names}"
        )


def ranks_per_node(
    instance_type: str, processes_per_host: int | None, option: str = "--processes-per-host"
) -> tuple[int, int]:
    """(ranks per node, GPUs per node) on ``instance_type``: its GPUs, or fewer; a CPU type needs the
    count, given as ``option`` (the rule of ``launch.instances.processes_per_host``, for a node)."""
    try:
        gpus = gpus_per_instance(instance_type)
    except UnknownInstanceTypeError:
        if processes_per_host is None:
            raise NodePlanError(
                f"{instance_type!r} has no GPUs sagemaker-dist knows of, and a GPU job needs them: "
                f"use a GPU type (ml.p4d.24xlarge, ml.g5.12xlarge, ...), or give {option} N to run N CPU "
                "ranks per node"
            ) from None
        return processes_per_host, 0
    if processes_per_host is not None and processes_per_host > gpus:
        raise ProcessesPerHostError(
            f"{processes_per_host} ranks per node but {normalize_instance_type(instance_type)} has {gpus} "
            f"GPU(s): a job runs one rank per GPU, so use at most {gpus}"
        )
    return (processes_per_host or gpus), gpus


def efa_interfaces(instance_type: str) -> int:
    """EFA interfaces of ``instance_type`` (0 where it has none or is not in the table)."""
    return EFA_INTERFACES.get(normalize_instance_type(instance_type), 0)


def check_kubernetes_job(job: JobSpec, kind: str) -> None:
    """A Kubernetes object of ``kind`` (the registry's ``MPIJOB``, ``TRAINJOB``) runs only the jobs of a
    distribution whose registry entry names it."""
    _check_platform(job, f"a {kind}", KUBERNETES_KINDS[kind], lambda d: d.kubernetes == kind)


def check_slurm_job(job: JobSpec, platform: str) -> None:
    """``platform`` (an sbatch script) starts one task per rank with srun: a job of a distribution
    whose registry entry says how (Horovod, torchrun)."""
    _check_platform(job, platform, "starts one task per rank with srun", lambda d: d.slurm is not None)


def _check_platform(job: JobSpec, platform: str, does: str, can) -> None:
    entry = distribution(job.distribution)
    if not can(entry):
        raise NodePlanError(
            f"job {job.name} is a {entry.name!r} job ({entry.runs}), and {platform} {does}: plan the job "
            f"with {names_where(can)}, or run it with 'sagemaker-dist local' or on SageMaker"
        )


def parse_ranks(text: str) -> list[int]:
    """``"0,1"`` or ``"8-15"`` (or both, comma-separated) -> the ranks, in order."""
    ranks: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, dash, high = part.partition("-")
        try:
            ranks += list(range(int(low), int(high) + 1)) if dash else [int(low)]
        except ValueError:
            raise NodePlanError(f"ranks {text!r}: {part!r} is not a rank or a range such as 0-7") from None
    return ranks


def plan_node(
    request: dict | JobSpec,
    node_index: int,
    ranks: list[int] | None = None,
    epochs: int | None = None,
    shuffle_seed: int | None = None,
) -> NodePlan:
    """The plan of node ``node_index`` of the job ``request`` (a CreateTrainingJob request).

    ``ranks`` are checked against the job: ranks fill nodes in order, processes-per-host each (as
    mpirun's ``-map-by slot``, Slurm's block distribution and mpi-operator's hostfile place them).
    ``shuffle_seed`` turns on a per-epoch shuffle of every channel (overriding the request's).
    """
    job = JobSpec.of(request)
    if not 0 <= node_index < job.hosts:
        raise NodePlanError(
            f"node index {node_index} is not a node of job {job.name}: it has {job.hosts} node(s), "
            f"0..{job.hosts - 1} (ResourceConfig.InstanceCount)"
        )
    if epochs is not None and epochs < 1:
        raise NodePlanError(
            f"epochs {epochs}: give a whole number >= 1, or leave it out to feed until stopped"
        )
    slots = tuple(s for s in job.slots if s.cross_rank == node_index)
    expected = [s.rank for s in slots]
    if ranks is not None and sorted(ranks) != expected:
        raise NodePlanError(
            f"node {node_index} runs rank(s) {', '.join(map(str, expected))} of job {job.name} "
            f"({job.hosts} node(s) x {job.processes_per_host} process(es), filled in order), not "
            f"{', '.join(map(str, ranks)) or 'none'}; start the ranks that way or fix --node-index"
        )
    channels = _node_channels(job, slots)
    if shuffle_seed is not None:
        channels = tuple(dataclasses.replace(c, shuffle_seed=shuffle_seed) for c in channels)
    return NodePlan(job, node_index, slots, channels, epochs)


def _node_channels(job: JobSpec, slots) -> tuple[ChannelSpec, ...]:
    """The channels this node's ranks read; every channel when the request carries no layout."""
    layout = job.layout
    if layout is None:
        return job.channels
    mine = set(layout.shared_channels)
    for slot in slots:
        mine |= {layout.channel_for(role.role, slot.rank, slot.local_rank) for role in layout.roles}
    laid_out = set(layout.channel_names)
    return tuple(s for s in job.channels if s.name in mine or s.name not in laid_out)
