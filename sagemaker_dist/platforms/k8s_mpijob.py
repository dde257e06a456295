"""The job as a Kubeflow MPIJob (``kubeflow.org/v2beta1``, mpi-operator v0.8), as plain data.

One worker pod per SageMaker host: the training container runs sshd (mpi-operator's launcher reaches
the workers over SSH with the hostfile it mounts), a pipe-agent sidecar feeds the node's FIFOs into an
``emptyDir`` both containers mount at ``/opt/ml``, and the launcher runs ``mpirun ... python -m mpi4py
<entry script> <arguments>`` with the arguments the sagemaker-training toolkit would pass, so the
script sees what it sees on SageMaker. S3 access comes from the pods' service account (IRSA or EKS
Pod Identity). Pure: no I/O, no Kubernetes client.

Stops (the MPIJob or a pod deleted, a node drained or preempted): the kubelet sends SIGTERM to each
container's PID 1 and SIGKILL after the pod's ``terminationGracePeriodSeconds`` (120 s here, SageMaker's
window). sshd and mpirun would end the ranks at once, so both run under the image's stop-forwarding
entry point (``host/stop_forwarding.py``): on a worker it forwards SIGTERM to the ranks below sshd (they
agree on a step, rank 0 checkpoints it, they end 0), then ends sshd; on the launcher mpirun is left to
end with its ranks. The pipe agent (seeing the ranks: ``shareProcessNamespace``) keeps feeding and
syncing checkpoints until they have ended (``--drain``).
"""

from __future__ import annotations

from sagemaker_dist.contract import hyperparameters as hp
from sagemaker_dist.contract import toolkit
from sagemaker_dist.contract.distributions import MPIJOB
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

API_VERSION = "kubeflow.org/v2beta1"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"  # set by mpi-operator on each worker pod
SSHD = ["/usr/sbin/sshd", "-De"]  # the workers' main process: mpirun reaches them over SSH


class MPIJobError(K8sJobError):
    """A job that cannot run as an MPIJob as asked; the message says what to change."""


def mpirun_options(custom: str) -> list[str]:
    """The request's ``sagemaker_mpi_custom_mpi_options`` as the toolkit turns them into mpirun's:
    split on whitespace, ``--NCCL_DEBUG X`` becoming ``-x NCCL_DEBUG=X``."""
    words, out = custom.split(), []
    while words:
        word = words.pop(0)
        if word == "--NCCL_DEBUG" and words:
            out += ["-x", f"NCCL_DEBUG={words.pop(0)}"]
        else:
            out.append(word)
    return out


def launcher_command(job: JobSpec, world: int, options: K8sJobOptions, efa: bool) -> list[str]:
    """``mpirun`` over the hostfile mpi-operator mounts, the ranks starting the entry script with
    mpi4py (an uncaught exception aborts the whole job instead of hanging the others)."""
    env = ["-x", "PATH", "-x", "LD_LIBRARY_PATH"]
    if options.endpoint_url:
        env += ["-x", f"AWS_ENDPOINT_URL={options.endpoint_url}"]
    if efa:
        env += ["-x", "FI_PROVIDER=efa"]
    custom = str(hp.decode_one(job.hyperparameters, hp.MPI_CUSTOM_OPTIONS, "") or "")
    argv = toolkit.container_argv(job.hyperparameters, options.toolkit_version)
    return [
        *FORWARD_STOPS, "mpirun", "--allow-run-as-root", "-np", str(world),
        "-bind-to", "none", "-map-by", "slot", *env, *mpirun_options(custom), "-wdir", f"{DEFAULT_ROOT}/code",
        "python", "-m", "mpi4py", job.entry_point, *argv,
    ]  # fmt: skip


def check_name(name: str, workers: int) -> str:
    """The job name, if ``<name>-worker-<N-1>`` is a DNS-1035 label (mpi-operator's rule)."""
    try:
        return check_pod_name(name, f"{name}-worker-{workers - 1}", "an MPIJob")
    except K8sJobError as exc:
        raise MPIJobError(str(exc)) from None


def plan_mpijob(request: dict | JobSpec, options: K8sJobOptions) -> dict:
    """The MPIJob that runs ``request`` (a CreateTrainingJob request, or the job read from one): one
    worker per instance."""
    job = JobSpec.of(request, options.toolkit_version)
    check_kubernetes_job(job, MPIJOB)
    shape = node_shape(job, options)
    name = check_name(job.name, job.hosts)
    env = endpoint_env(options)
    worker = {
        "name": "worker",
        "image": options.image,
        "command": [*FORWARD_STOPS, "--term-after-ranks", *SSHD],  # SIGTERM to the ranks, then sshd
        **({"env": env} if env else {}),
        "resources": {"limits": shape.limits},
        "volumeMounts": rank_mounts(),
    }
    agent = agent_container(options, f"metadata.labels['{REPLICA_INDEX_LABEL}']")
    agent["readinessProbe"] = ready_probe()  # the launcher waits for ready workers
    launcher = {
        "name": "launcher",
        "image": options.image,
        "command": launcher_command(job, job.world, options, bool(shape.efa)),
        **({"env": env} if env else {}),
    }
    run_policy = {
        "cleanPodPolicy": "Running",
        "backoffLimit": options.backoff_limit,
        "ttlSecondsAfterFinished": options.ttl_seconds_after_finished,
    }
    if job.max_runtime:
        run_policy["activeDeadlineSeconds"] = job.max_runtime  # SageMaker's MaxRuntimeInSeconds
    labels = job_labels(name)
    pod = {"serviceAccountName": options.service_account, "terminationGracePeriodSeconds": STOP_WINDOW_S}
    return {
        "apiVersion": API_VERSION,
        "kind": "MPIJob",
        "metadata": {"name": name, "namespace": options.namespace, "labels": labels},
        "spec": {
            "slotsPerWorker": shape.slots,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": "/root/.ssh",
            "runPolicy": run_policy,
            "mpiReplicaSpecs": {
                "Launcher": {
                    "replicas": 1,
                    "restartPolicy": "Never",
                    "template": {"metadata": {"labels": labels}, "spec": {**pod, "containers": [launcher]}},
                },
                "Worker": {
                    "replicas": job.hosts,
                    "restartPolicy": "Never",
                    "template": {
                        "metadata": {"labels": labels},
                        # the agent sees the ranks (in /proc), to outlive them on a stop
                        "spec": {
                            **pod,
                            "shareProcessNamespace": True,
                            "containers": [worker, agent],
                            "volumes": pod_volumes(),
                        },  # fmt: skip
                    },
                },
            },
        },
    }
