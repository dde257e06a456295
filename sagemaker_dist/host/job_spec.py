"""The parts of a CreateTrainingJob request that a host runs (hosts, ranks per host, layout, entry
script, channels), read and checked once, with no I/O: local mode and every platform's pipe agent
start from it."""

from __future__ import annotations

from dataclasses import dataclass

from sagemaker_dist.aws.request_validation import validate_request
from sagemaker_dist.contract import distributions, toolkit
from sagemaker_dist.contract import hyperparameters as hp
from sagemaker_dist.contract.draft import check_not_a_draft
from sagemaker_dist.contract.layout import PER_WORKER, ChannelLayout, layout_of
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.host.channel_objects import ChannelSpec


class JobSpecError(ConfigurationError):
    """A CreateTrainingJob request (or the file holding it) that cannot be run as given; names what
    to fix."""


@dataclass(frozen=True)
class JobSpec:
    """The parts of a CreateTrainingJob request a host runs, checked once."""

    request: dict
    name: str
    hyperparameters: dict[str, str]
    hosts: int
    processes_per_host: int
    layout: ChannelLayout | None
    entry_point: str
    default_mode: str
    specs: tuple[ChannelSpec, ...]
    timeout: float | None
    toolkit_version: str = toolkit.DEFAULT_TOOLKIT_VERSION  # the image's sagemaker-training

    @property
    def world(self) -> int:
        return self.hosts * self.processes_per_host

    @property
    def distribution(self) -> str:
        """How the ranks train together: the layout's; a request without our layout is run as the
        toolkit runs an MPI job, so as the registry's default (Horovod)."""
        return self.layout.distribution if self.layout is not None else distributions.DEFAULT

    @classmethod
    def from_request(
        cls, request, timeout: float | None = None, toolkit_version: str = toolkit.DEFAULT_TOOLKIT_VERSION
    ) -> JobSpec:
        if not isinstance(request, dict):
            raise JobSpecError(f"the request is a {type(request).__name__}, not a CreateTrainingJob dict")
        validate_request(request)  # what CreateTrainingJob would refuse, a host refuses too
        hps = {k: str(v) for k, v in (request.get("HyperParameters") or {}).items()}
        default_mode = (request.get("AlgorithmSpecification") or {}).get("TrainingInputMode", "File")
        hosts = int((request.get("ResourceConfig") or {}).get("InstanceCount", 1))
        layout = layout_of(hps)
        per_worker = [(r.role, r.channels) for r in layout.roles if r.spread == PER_WORKER] if layout else []
        check_not_a_draft(request, per_worker)  # stand-ins, or every rank on the whole prefix
        per_host = _processes_per_host(hps, layout)
        if layout is not None and (layout.hosts, layout.processes_per_host) != (hosts, per_host):
            raise JobSpecError(
                f"the layout hyperparameter is for {layout.hosts} host(s) x {layout.processes_per_host} "
                f"process(es) but the request asks for {hosts} x {per_host}; plan the layout for the job "
                "you run"
            )
        entry_point = hp.decode_one(hps, hp.PROGRAM)
        if not entry_point:
            raise JobSpecError("hyperparameter sagemaker_program (the entry script) is missing")
        if timeout is None:  # SageMaker stops a job at MaxRuntimeInSeconds; so does local mode
            timeout = (request.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds")
        channels = request.get("InputDataConfig") or []
        return cls(
            request=request,
            name=request.get("TrainingJobName", "local-job"),
            hyperparameters=hps,
            hosts=hosts,
            processes_per_host=per_host,
            layout=layout,
            entry_point=entry_point,
            default_mode=default_mode,
            specs=tuple(ChannelSpec.from_request(ch, default_mode) for ch in channels),
            timeout=timeout,
            toolkit_version=toolkit_version,
        )


def _processes_per_host(hps: dict, layout: ChannelLayout | None) -> int:
    value = hp.decode_one(hps, hp.MPI_PROCESSES_PER_HOST)
    if value is None and layout is not None:
        value = layout.processes_per_host
    try:
        value = int(value if value is not None else 1)
    except (TypeError, ValueError) as exc:
        raise JobSpecError(
            f"sagemaker_mpi_num_of_processes_per_host is {value!r}; give a whole number"
        ) from exc
    if value < 1:
        raise JobSpecError(f"sagemaker_mpi_num_of_processes_per_host is {value}; it must be >= 1")
    return value
