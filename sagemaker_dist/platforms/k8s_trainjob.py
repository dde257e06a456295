"""A torchrun job as a Kubeflow Trainer v2 ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``, Trainer v2.3),
with the ``TrainingRuntime`` it runs on, as plain data.

The Trainer's Torch plugin starts one pod per node (a JobSet's ``node`` job, indexed) and gives its
``node`` container torchrun's options as ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``,
``PET_MASTER_ADDR`` (``<job>-node-0-0.<job>``) and ``PET_MASTER_PORT`` (29500); the TrainJob's command
runs ``torchrun <entry script> <arguments>`` there, with the arguments the sagemaker-training toolkit
would pass, as AWS's toolkit runs ``torchrun --nnodes H --node_rank R ...`` on each SageMaker host.

A TrainJob cannot add a container (its ``runtimePatches`` only patch the runtime's own, and set no image),
so the pod's shape lives in a runtime of the job's own, a copy of the Trainer's ``torch-distributed``
with what a Pipe-mode node needs: the pipe agent as a native sidecar (an init container with
``restartPolicy: Always``: the ranks start once its startup probe sees the FIFOs in place, and the pod
completes when they end), ``/opt/ml`` as an ``emptyDir`` both mount, ``shareProcessNamespace`` (the agent
outlives the ranks on a stop), SageMaker's 120 s stop window, and no retries (a restarted node cannot
rejoin a DDP job that has started). Pure: no I/O, no Kubernetes client.
"""

from __future__ import annotations

from sagemaker_dist.contract import toolkit
from sagemaker_dist.contract.distributions import TRAINJOB
from sagemaker_dist.contract.paths import DEFAULT_ROOT
from sagemaker_dist.contract.stop_window import STOP_WINDOW_S
from sagemaker_dist.host.job_spec import JobSpec
from sagemaker_dist.platforms.k8s_pods import (
    FORWARD_STOPS,
    K8sJobError,
    K8sJobOptions,
    agent_container,
    check_pod_name,
    endpoint_env,
    job_labels,
    node_shape,
    pod_volumes,
    rank_mounts,
    ready_probe,
)
from sagemaker_dist.platforms.node_plan import check_kubernetes_job

API_VERSION = "trainer.kubeflow.org/v1alpha1"
TRAINER_VERSION = "v2.3.0"
NODE = "node"  # the Trainer's name for the node job and its container, which TrainJob.trainer fills in
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"  # marks the job the trainer runs in
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"  # the node's index
# the variables the Torch plugin sets on the node container; a TrainJob may not set them
RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
MASTER_PORT = 29500  # the Trainer's ContainerTrainerPort
AGENT_READY_S = 300  # the startup probe's bound: the agent lists S3 and makes the FIFOs


class TrainJobError(K8sJobError):
    """A job that cannot run as a TrainJob as asked; the message says what to change."""


def pod_name(job_name: str, node: int) -> str:
    """A node's pod host name, as JobSet names it: ``<jobset>-<job>-<job index>-<pod index>``."""
    return f"{job_name}-{NODE}-0-{node}"


def master_address(job_name: str) -> str:
    """``PET_MASTER_ADDR``: the first node's pod, in the JobSet's headless service (its subdomain)."""
    return f"{pod_name(job_name, 0)}.{job_name}"


def runtime_name(job_name: str) -> str:
    return f"{job_name}-pipes"


def node_command(job: JobSpec, toolkit_version: str) -> list[str]:
    """torchrun (its options from the Torch plugin's ``PET_*``) starting the entry script with the
    toolkit's arguments, under the image's stop-forwarding entry point (SIGTERM to the ranks)."""
    argv = toolkit.container_argv(job.hyperparameters, toolkit_version)
    return [*FORWARD_STOPS, "torchrun", job.entry_point, *argv]


def plan_training_runtime(request: dict | JobSpec, options: K8sJobOptions, name: str | None = None) -> dict:
    """The namespaced ``TrainingRuntime`` the job's TrainJob (or a Katib trial's) runs on: the
    ``torch-distributed`` runtime with the pipe-agent sidecar, the shared ``/opt/ml`` and the stop window."""
    job = JobSpec.of(request, options.toolkit_version)
    check_kubernetes_job(job, TRAINJOB)
    name = name or job.name
    agent = agent_container(options, COMPLETION_INDEX)
    agent["restartPolicy"] = "Always"  # a native sidecar: up before the node container, ended after it
    agent["startupProbe"] = {**ready_probe(), "failureThreshold": AGENT_READY_S // 2}
    node = {
        "name": NODE,
        "image": options.image,  # TrainJob.trainer.image replaces it
        "workingDir": f"{DEFAULT_ROOT}/code",  # where the toolkit starts the script
        "volumeMounts": rank_mounts(),
    }
    labels = job_labels(name)
    pod_spec = {
        "serviceAccountName": options.service_account,
        "terminationGracePeriodSeconds": STOP_WINDOW_S,
        "shareProcessNamespace": True,  # the agent sees the ranks (in /proc), to outlive them on a stop
        "restartPolicy": "Never",
        "initContainers": [agent],
        "containers": [node],
        "volumes": pod_volumes(),
    }
    node_job = {
        "name": NODE,
        "replicas": 1,  # the Trainer's rule: the node job's pods are its parallelism (numNodes)
        "template": {
            "metadata": {"labels": {ANCESTOR_LABEL: "trainer", **labels}},
            "spec": {
                "backoffLimit": options.backoff_limit,
                "template": {"metadata": {"labels": labels}, "spec": pod_spec},
            },
        },
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainingRuntime",
        "metadata": {
            "name": runtime_name(name),
            "namespace": options.namespace,
            "labels": {"trainer.kubeflow.org/framework": "torch", **labels},
        },
        "spec": {
            "mlPolicy": {"numNodes": job.hosts, "torch": {}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "failurePolicy": {"maxRestarts": 0},  # a failed node ends the job, as on SageMaker
                    "ttlSecondsAfterFinished": options.ttl_seconds_after_finished,
                    "replicatedJobs": [node_job],
                },
            },
        },
    }


def plan_trainjob(request: dict | JobSpec, options: K8sJobOptions) -> dict:
    """The TrainJob that runs ``request`` (a CreateTrainingJob request, or the job read from one): one
    node pod per instance, torchrun on each, on the runtime of ``plan_training_runtime``."""
    job = JobSpec.of(request, options.toolkit_version)
    check_kubernetes_job(job, TRAINJOB)
    shape = node_shape(job, options)
    name = check_name(job.name, job.hosts)
    env = endpoint_env(options)
    if shape.efa:
        env.append({"name": "FI_PROVIDER", "value": "efa"})  # NCCL over EFA (aws-ofi-nccl)
    trainer = {
        "image": options.image,
        "command": node_command(job, options.toolkit_version),
        "numNodes": job.hosts,
        "numProcPerNode": shape.slots,
    }
    if shape.limits:
        trainer["resourcesPerNode"] = {"limits": shape.limits}
    if env:
        trainer["env"] = env
    runtime = {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime", "name": runtime_name(name)}
    spec = {"runtimeRef": runtime, "trainer": trainer}
    if job.max_runtime:
        spec["activeDeadlineSeconds"] = job.max_runtime  # SageMaker's MaxRuntimeInSeconds
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": options.namespace, "labels": job_labels(name)},
        "spec": spec,
    }


def check_name(name: str, nodes: int) -> str:
    """The job name, if the TrainJob's (RFC 1035, at most 63) and its last node pod's are DNS labels."""
    try:
        check_pod_name(name, name, "a TrainJob")
        return check_pod_name(name, pod_name(name, nodes - 1), "a TrainJob")
    except K8sJobError as exc:
        raise TrainJobError(str(exc)) from None


def plan_trainjob_documents(request: dict | JobSpec, options: K8sJobOptions) -> list[dict]:
    """What ``kubectl apply -f`` takes for the job: its runtime, then its TrainJob."""
    job = JobSpec.of(request, options.toolkit_version)
    return [plan_training_runtime(job, options), plan_trainjob(job, options)]
