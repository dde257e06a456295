"""What every Kubernetes form of the job shares (the MPIJob's workers, the TrainJob's nodes): the options
the request does not give, the pod's ``/opt/ml`` emptyDir, the pipe-agent sidecar that feeds it from S3,
a node's GPUs and EFA interfaces, SageMaker's stop window, and the YAML. Pure: no I/O.

A stop (the job or a pod deleted, a node drained or preempted): the kubelet sends SIGTERM to each
container's PID 1 and SIGKILL after the pod's ``terminationGracePeriodSeconds`` (120 s, SageMaker's
window). The ranks' container runs under the image's stop-forwarding entry point
(``host/stop_forwarding.py``), which hands SIGTERM to the ranks (they agree on a step, rank 0 checkpoints
it, they end 0); the pipe agent sees them (``shareProcessNamespace``) and keeps feeding and syncing
checkpoints until they have ended (``--drain``), then uploads the model as SageMaker does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sagemaker_dist.aws.instances import normalize_instance_type
from sagemaker_dist.contract import toolkit
from sagemaker_dist.contract.paths import DEFAULT_ROOT
from sagemaker_dist.contract.stop_window import AGENT_DRAIN_S
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.host.job_spec import JobSpec
from sagemaker_dist.platforms.node_plan import efa_interfaces, ranks_per_node
from sagemaker_dist.platforms.pipe_agent import READY_FILE

GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
OPT_ML_VOLUME = "opt-ml"
SHM_VOLUME = "dshm"
AGENT_CONTAINER = "pipe-agent"
FORWARD_STOPS = ["python", "-m", "sagemaker_dist.host.stop_forwarding"]  # PID 1 in front of the ranks
NODE_INDEX_ENV = "NODE_INDEX"  # the agent's node index, from the downward API


class K8sJobError(ConfigurationError):
    """A job that cannot run on Kubernetes as asked; the message says what to change."""


@dataclass(frozen=True)
class K8sJobOptions:
    """Where and how the job runs on Kubernetes (what the request does not say)."""

    image: str
    spec_uri: str  # the request in S3, read by every pipe agent
    namespace: str = "default"
    service_account: str = "sagemaker-dist"  # with S3 read (and checkpoint/TensorBoard write) access
    backoff_limit: int = 0
    ttl_seconds_after_finished: int = 3600
    endpoint_url: str | None = None  # another S3 endpoint, for agents and ranks
    processes_per_host: int | None = None  # fewer ranks than GPUs, or the count of a CPU type
    toolkit_version: str = toolkit.DEFAULT_TOOLKIT_VERSION


@dataclass(frozen=True)
class NodeShape:
    """One node's ranks and what its pod asks for."""

    slots: int  # ranks on the node
    limits: dict  # GPUs and EFA interfaces
    efa: int


def node_shape(job: JobSpec, options: K8sJobOptions) -> NodeShape:
    """The node's ranks (its GPUs, or ``options.processes_per_host``), checked against the request's."""
    instance_type, processes_per_host = (
        normalize_instance_type(job.instance_type or ""),
        job.processes_per_host,
    )
    slots, gpus = ranks_per_node(instance_type, options.processes_per_host)
    if slots != processes_per_host:
        raise K8sJobError(
            f"the request runs {processes_per_host} rank(s) per host but {slots} slot(s) per node were "
            f"asked for ({instance_type}); plan the request for {slots} (processes_per_host) or pass "
            f"--processes-per-host {processes_per_host}"
        )
    efa = efa_interfaces(instance_type)
    limits = {GPU_RESOURCE: gpus} if gpus else {}
    if efa:
        limits[EFA_RESOURCE] = efa
    return NodeShape(slots, limits, efa)


def check_pod_name(name: str, last_pod: str, owner: str) -> str:
    """The job name, if its last pod's name ``last_pod`` is a DNS-1035 label (``owner``'s rule)."""
    if len(last_pod) > 63 or not DNS_1035.match(last_pod):
        raise K8sJobError(
            f"job name {name!r} cannot name {owner}: its last pod {last_pod!r} must be a DNS-1035 label "
            "(lower-case letters, digits and '-', starting with a letter, at most 63 characters); choose a "
            "shorter lower-case job name"
        )
    return name


def endpoint_env(options: K8sJobOptions) -> list[dict]:
    """``AWS_ENDPOINT_URL`` for every container, where the job's S3 is another endpoint."""
    return [{"name": "AWS_ENDPOINT_URL", "value": options.endpoint_url}] if options.endpoint_url else []


def agent_command(options: K8sJobOptions) -> list[str]:
    """The sidecar's command: this node's pipe agent, its node index from the downward API."""
    return [
        "python", "-m", "sagemaker_dist.cli", "pipe-agent", "--spec", options.spec_uri,
        "--node-index", f"$({NODE_INDEX_ENV})", "--root", DEFAULT_ROOT, "--drain", str(AGENT_DRAIN_S),
    ]  # fmt: skip


def agent_container(options: K8sJobOptions, node_index_field: str) -> dict:
    """The pipe-agent sidecar; ``node_index_field`` is the pod field that numbers the node (fieldPath)."""
    return {
        "name": AGENT_CONTAINER,
        "image": options.image,
        "command": agent_command(options),
        "env": [
            {"name": NODE_INDEX_ENV, "valueFrom": {"fieldRef": {"fieldPath": node_index_field}}},
            *endpoint_env(options),
        ],
        # an agent that fails (no S3 access, say) leaves the pod unready: its error shows in kubectl describe
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [opt_ml_mount()],
    }


def ready_probe() -> dict:
    """The agent is ready once the node's tree and FIFOs are in place."""
    return {"exec": {"command": ["test", "-f", f"{DEFAULT_ROOT}/{READY_FILE}"]}, "periodSeconds": 2}


def opt_ml_mount() -> dict:
    return {"name": OPT_ML_VOLUME, "mountPath": DEFAULT_ROOT}


def rank_mounts() -> list[dict]:
    """The ranks' container: the node's ``/opt/ml`` and a ``/dev/shm`` in memory (NCCL, DataLoader)."""
    return [opt_ml_mount(), {"name": SHM_VOLUME, "mountPath": "/dev/shm"}]


def pod_volumes() -> list[dict]:
    return [
        {"name": OPT_ML_VOLUME, "emptyDir": {}},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
    ]


def job_labels(name: str) -> dict:
    return {"app.kubernetes.io/name": "sagemaker-dist", "sagemaker-dist/job": name}


def to_yaml(document: dict) -> str:
    """The manifest as YAML (keys in the order written, as kubectl users read them)."""
    try:
        import yaml
    except ImportError:
        raise K8sJobError("writing YAML needs PyYAML: pip install 'pyyaml>=6,<7'") from None

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):  # the same dict twice is written out twice, not as &id001
            return True

    return yaml.dump(document, Dumper=Dumper, sort_keys=False, default_flow_style=False, width=100)


def to_yaml_stream(documents: list[dict]) -> str:
    """Several manifests in one file, as ``kubectl apply -f`` reads them."""
    return "---\n".join(to_yaml(d) for d in documents)
