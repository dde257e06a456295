"""What a platform's nodes need, as pure data: the ranks and GPUs per node of an instance type, its EFA
interfaces, which platform forms run a job's distribution, and a node's ranks as a command line gives
them. A node's own plan (its ranks and the channels it feeds) is ``host.job_spec.plan_node``'s.
"""

from __future__ import annotations

from sagemaker_dist.aws.instances import (
    ProcessesPerHostError,
    UnknownInstanceTypeError,
    gpus_per_instance,
    normalize_instance_type,
)
from sagemaker_dist.contract.distributions import KUBERNETES_KINDS, distribution, names_where
from sagemaker_dist.host.job_spec import JobSpec, NodePlanError

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
