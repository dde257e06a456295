"""The job as the Kubernetes objects that run its distribution (the registry's ``kubernetes``): an
MPIJob for Horovod, a TrainJob and its runtime for torchrun. Pure."""

from __future__ import annotations

from sagemaker_dist.contract.distributions import MPIJOB, TRAINJOB, distribution, names_where
from sagemaker_dist.host.job_spec import JobSpec
from sagemaker_dist.platforms.k8s_mpijob import plan_mpijob
from sagemaker_dist.platforms.k8s_pods import K8sJobError, K8sJobOptions
from sagemaker_dist.platforms.k8s_trainjob import plan_trainjob_documents

PLANNERS = {
    MPIJOB: lambda job, options: [plan_mpijob(job, options)],
    TRAINJOB: plan_trainjob_documents,
}


def plan_kubernetes(request: dict | JobSpec, options: K8sJobOptions) -> list[dict]:
    """The manifests that run ``request`` (a CreateTrainingJob request), in the order to apply them."""
    job = JobSpec.of(request, options.toolkit_version)
    entry = distribution(job.distribution)
    if entry.kubernetes is None:
        raise K8sJobError(
            f"job {job.name} is a {entry.name!r} job ({entry.runs}), which sagemaker-dist does not write for "
            f"Kubernetes: plan it with {names_where(lambda d: d.kubernetes is not None)}, or run it with "
            "'sagemaker-dist local' or on SageMaker"
        )
    return PLANNERS[entry.kubernetes](job, options)
