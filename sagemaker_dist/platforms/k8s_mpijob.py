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

import re
from dataclasses import dataclass

from sagemaker_dist.contract import hyperparameters as hp
from sagemaker_dist.contract import toolkit
from sagemaker_dist.contract.paths import DEFAULT_ROOT
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.host.job_spec import JobSpec
from sagemaker_dist.launch.instances import normalize_instance_type
from sagemaker_dist.platforms.node_plan import check_mpi_job, efa_interfaces, ranks_per_node
from sagemaker_dist.platforms.pipe_agent import READY_FILE

API_VERSION = "kubeflow.org/v2beta1"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"  # set by mpi-operator on each worker pod
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
OPT_ML_VOLUME = "opt-ml"
SSHD = ["/usr/sbin/sshd", "-De"]  # the workers' main process: mpirun reaches them over SSH
STOP_WINDOW_S = 120  # terminationGracePeriodSeconds: SIGTERM to SIGKILL, as SageMaker gives a stop
AGENT_DRAIN_S = 110  # the pipe agent's life after SIGTERM: the ranks' stop checkpoint reaches S3
FORWARD_STOPS = ["python", "-m", "sagemaker_dist.host.stop_forwarding"]  # PID 1 in front of sshd, mpirun


class MPIJobError(ConfigurationError):
    """A job that cannot run as an MPIJob as asked; the message says what to change."""


@dataclass(frozen=True)
class MPIJobOptions:
    """Where and how the MPIJob runs (what the request does not say)."""

    image: str
    spec_uri: str  # the request in S3, read by every pipe agent
    namespace: str = "default"
    service_account: str = "sagemaker-dist"  # with S3 read (and checkpoint/TensorBoard write) access
    backoff_limit: int = 0
    ttl_seconds_after_finished: int = 3600
    endpoint_url: str | None = None  # another S3 endpoint, for agents and ranks
    processes_per_host: int | None = None  # fewer ranks than GPUs, or the count of a CPU type
    toolkit_version: str = toolkit.DEFAULT_TOOLKIT_VERSION


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


def launcher_command(job: JobSpec, world: int, options: MPIJobOptions, efa: bool) -> list[str]:
    """``mpirun`` over the hostfile mpi-operator mounts, the ranks starting the entry script with
    mpi4py (an uncaught exception aborts the whole job instead of hanging the others)."""
    env = ["-x", "PATH", "-x", "LD_LIBRARY_PATH"]
    if options.endpoint_url:
        env += ["-x", f"AWS_ENDPOINT_URL={options.endpoint_url}"]
    if efa:
        env += ["-x", "FI_PROVIDER=efa"]
    custom = str(hp.decode_one(job.hyperparameters, hp.MPI_CUSTOM_OPTIONS, "") or "")
    argv = toolkit.script_argv(job.hyperparameters, options.toolkit_version, {"HOME": "/root"}, None)
    return [
        *FORWARD_STOPS, "mpirun", "--allow-run-as-root", "-np", str(world),
        "-bind-to", "none", "-map-by", "slot", *env, *mpirun_options(custom), "-wdir", f"{DEFAULT_ROOT}/code",
        "python", "-m", "mpi4py", job.entry_point, *argv,
    ]  # fmt: skip


def agent_command(options: MPIJobOptions) -> list[str]:
    """The sidecar: this worker's pipe agent, its node index from mpi-operator's replica-index label."""
    return [
        "python", "-m", "sagemaker_dist.cli", "pipe-agent", "--spec", options.spec_uri,
        "--node-index", "$(NODE_INDEX)", "--root", DEFAULT_ROOT, "--drain", str(AGENT_DRAIN_S),
    ]  # fmt: skip


def check_name(name: str, workers: int) -> str:
    """The job name, if ``<name>-worker-<N-1>`` is a DNS-1035 label (mpi-operator's rule)."""
    last = f"{name}-worker-{workers - 1}"
    if len(last) > 63 or not _DNS_1035.match(last):
        raise MPIJobError(
            f"job name {name!r} cannot name an MPIJob: its last worker pod {last!r} must be a DNS-1035 "
            "label (lower-case letters, digits and '-', starting with a letter, at most 63 characters); "
            "choose a shorter lower-case job name"
        )
    return name


def plan_mpijob(request: dict, options: MPIJobOptions) -> dict:
    """The MPIJob that runs ``request`` (a CreateTrainingJob request): one worker per instance."""
    job = JobSpec.from_request(request, toolkit_version=options.toolkit_version)
    check_mpi_job(job, "an MPIJob")
    instance_type = normalize_instance_type((request.get("ResourceConfig") or {}).get("InstanceType", ""))
    slots, gpus = ranks_per_node(instance_type, options.processes_per_host)
    if slots != job.processes_per_host:
        raise MPIJobError(
            f"the request runs {job.processes_per_host} rank(s) per host but {slots} slot(s) per worker "
            f"were asked for ({instance_type}); plan the request for {slots} (processes_per_host) or pass "
            f"--processes-per-host {job.processes_per_host}"
        )
    name = check_name(job.name, job.hosts)
    efa = efa_interfaces(instance_type)
    worker_limits = {GPU_RESOURCE: gpus} if gpus else {}
    if efa:
        worker_limits[EFA_RESOURCE] = efa
    env = (
        {"env": [{"name": "AWS_ENDPOINT_URL", "value": options.endpoint_url}]} if options.endpoint_url else {}
    )
    opt_ml = {"name": OPT_ML_VOLUME, "mountPath": DEFAULT_ROOT}
    worker = {
        "name": "worker",
        "image": options.image,
        "command": [*FORWARD_STOPS, "--term-after-ranks", *SSHD],  # SIGTERM to the ranks, then sshd
        **env,
        "resources": {"limits": worker_limits},
        "volumeMounts": [opt_ml, {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    node_index = {"fieldRef": {"fieldPath": f"metadata.labels['{REPLICA_INDEX_LABEL}']"}}
    agent = {
        "name": "pipe-agent",
        "image": options.image,
        "command": agent_command(options),
        "env": [{"name": "NODE_INDEX", "valueFrom": node_index}, *env.get("env", [])],
        # ready once the tree and the FIFOs are in place: the launcher waits for ready workers
        "readinessProbe": {
            "exec": {"command": ["test", "-f", f"{DEFAULT_ROOT}/{READY_FILE}"]},
            "periodSeconds": 2,
        },
        # an agent that fails (no S3 access, say) leaves the pod unready: its error shows in kubectl describe
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [opt_ml],
    }
    launcher = {
        "name": "launcher",
        "image": options.image,
        "command": launcher_command(job, job.world, options, bool(efa)),
        **env,
    }
    volumes = [
        {"name": OPT_ML_VOLUME, "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    max_run = (request.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds")
    run_policy = {
        "cleanPodPolicy": "Running",
        "backoffLimit": options.backoff_limit,
        "ttlSecondsAfterFinished": options.ttl_seconds_after_finished,
    }
    if max_run:
        run_policy["activeDeadlineSeconds"] = int(max_run)  # SageMaker's MaxRuntimeInSeconds
    labels = {"app.kubernetes.io/name": "sagemaker-dist", "sagemaker-dist/job": name}
    pod = {"serviceAccountName": options.service_account, "terminationGracePeriodSeconds": STOP_WINDOW_S}
    return {
        "apiVersion": API_VERSION,
        "kind": "MPIJob",
        "metadata": {"name": name, "namespace": options.namespace, "labels": labels},
        "spec": {
            "slotsPerWorker": slots,
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
                            "volumes": volumes,
                        },  # fmt: skip
                    },
                },
            },
        },
    }


def to_yaml(document: dict) -> str:
    """The manifest as YAML (keys in the order written, as kubectl users read them)."""
    try:
        import yaml
    except ImportError:
        raise MPIJobError("writing YAML needs PyYAML: pip install 'pyyaml>=6,<7'") from None

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):  # the same dict twice is written out twice, not as &id001
            return True

    return yaml.dump(document, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=100)
