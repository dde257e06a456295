"""A CreateTrainingJob request as a host runs it (its typed members, and the hosts, ranks per host,
layout and entry script they imply), read and checked once, with no I/O: local mode, the platforms'
planners and every pipe agent start from it. A platform's node plans its part from it
(``plan_node``): which ranks run on it and which channels it feeds (those its ranks read, as the
channel layout maps them, plus the channels every rank shares; on SageMaker every host gets a FIFO
for every channel, and an agent feeds only its own ranks', so a node never waits on a FIFO nobody
will open). Once a host's tree is laid out (``host.lifecycle``), ``HostTree`` holds its paths and
environment, and ``JobHosts`` a job's trees with which host each rank runs on."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path

from sagemaker_dist.aws.request_validation import validate_request
from sagemaker_dist.contract import distributions, toolkit
from sagemaker_dist.contract import hyperparameters as hp
from sagemaker_dist.contract.draft import check_not_a_draft
from sagemaker_dist.contract.layout import PER_WORKER, ChannelLayout, layout_of
from sagemaker_dist.contract.paths import CHECKPOINT_LOCAL_PATH, OptMl
from sagemaker_dist.contract.rank_slots import RankSlot, host_names, rank_slots
from sagemaker_dist.contract.training_request import ChannelSpec, TrainingRequest
from sagemaker_dist.errors import ConfigurationError


class JobSpecError(ConfigurationError):
    """A CreateTrainingJob request (or the file holding it) that cannot be run as given; names what
    to fix."""


@dataclass(frozen=True, kw_only=True)
class JobSpec(TrainingRequest):
    """A CreateTrainingJob request a host can run: its members (``TrainingRequest``'s typed fields)
    and what the hosts derive from them (ranks per host, channel layout, entry script, time limit),
    checked once. Nothing downstream reads the request's dict."""

    processes_per_host: int
    layout: ChannelLayout | None
    entry_point: str
    submit_directory: str | None  # sagemaker_submit_directory: the source package in S3, or a path
    # where the job's TensorBoard logs go: TensorBoardOutputConfig's, else the scripts' hyperparameter
    tensorboard_location: str | None
    timeout: float | None  # the caller's limit, else StoppingCondition.MaxRuntimeInSeconds
    toolkit_version: str = toolkit.DEFAULT_TOOLKIT_VERSION  # the image's sagemaker-training
    # what the hosts derive from the members above, worked out once when the job spec is made
    host_names: tuple[str, ...] = field(init=False)  # as SageMaker names them: algo-1 ..
    slots: tuple[RankSlot, ...] = field(init=False)  # every rank's; ranks fill the hosts in order
    slots_by_host: tuple[tuple[RankSlot, ...], ...] = field(init=False)  # the same, host by host
    # the hyperparameters as the toolkit reads them for the script: the user's, and its argument list
    script_hyperparameters: toolkit.ScriptHyperparameters = field(init=False)

    @property
    def world(self) -> int:
        return self.hosts * self.processes_per_host

    def __post_init__(self) -> None:
        names = tuple(host_names(self.hosts))
        slots = tuple(rank_slots(names, self.processes_per_host))
        per = self.processes_per_host
        derived = {
            "host_names": names,
            "slots": slots,
            "slots_by_host": tuple(slots[i * per : (i + 1) * per] for i in range(self.hosts)),
            "script_hyperparameters": toolkit.ScriptHyperparameters.read(self.hyperparameters),
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)  # frozen: set once, here

    @property
    def toolkit_args(self) -> tuple[str, ...]:
        """The script's arguments as the toolkit lists them (``--key value``, sorted), before any shell."""
        return self.script_hyperparameters.args

    @property
    def distribution(self) -> str:
        """How the ranks train together: the layout's; a request without our layout is run as the
        toolkit runs an MPI job, so as the registry's default (Horovod)."""
        return self.layout.distribution if self.layout is not None else distributions.DEFAULT

    @property
    def specs(self) -> tuple[ChannelSpec, ...]:
        """Deprecated name of ``channels``."""
        warnings.warn("JobSpec.specs is now JobSpec.channels", DeprecationWarning, stacklevel=2)
        return self.channels

    @property
    def default_mode(self) -> str:
        """Deprecated name of ``input_mode``."""
        warnings.warn("JobSpec.default_mode is now JobSpec.input_mode", DeprecationWarning, stacklevel=2)
        return self.input_mode

    @classmethod
    def of(cls, request, toolkit_version: str = toolkit.DEFAULT_TOOLKIT_VERSION) -> JobSpec:
        """``request`` if it is a ``JobSpec`` already (a planner handed on the job it read), else the
        CreateTrainingJob dict read: so a request passed down through planners is read once."""
        return request if isinstance(request, JobSpec) else cls.from_request(request, None, toolkit_version)

    @classmethod
    def from_request(
        cls, request, timeout: float | None = None, toolkit_version: str = toolkit.DEFAULT_TOOLKIT_VERSION
    ) -> JobSpec:
        """``request`` checked as CreateTrainingJob would check it, read (``TrainingRequest``), and
        checked again for what a host needs: its layout fits its hosts, it names an entry script, it
        is no dry run's draft."""
        if not isinstance(request, Mapping):
            raise JobSpecError(f"the request is a {type(request).__name__}, not a CreateTrainingJob dict")
        validate_request(request)  # what CreateTrainingJob would refuse, a host refuses too
        read = TrainingRequest.parse(request, JobSpecError)
        hps = read.hyperparameters
        layout = layout_of(hps)
        per_worker = [(r.role, r.channels) for r in layout.roles if r.spread == PER_WORKER] if layout else []
        check_not_a_draft(read, per_worker)  # stand-ins, or every rank on the whole prefix
        per_host = _processes_per_host(hps, layout)
        if layout is not None and (layout.hosts, layout.processes_per_host) != (read.hosts, per_host):
            raise JobSpecError(
                f"the layout hyperparameter is for {layout.hosts} host(s) x {layout.processes_per_host} "
                f"process(es) but the request asks for {read.hosts} x {per_host}; plan the layout for the "
                "job you run"
            )
        entry_point = hp.decode_one(hps, hp.PROGRAM)
        if not entry_point:
            raise JobSpecError("hyperparameter sagemaker_program (the entry script) is missing")
        return cls(
            **{f.name: getattr(read, f.name) for f in fields(TrainingRequest)},
            processes_per_host=per_host,
            layout=layout,
            entry_point=entry_point,
            submit_directory=hp.decode_one(hps, hp.SUBMIT_DIRECTORY),
            tensorboard_location=read.tensorboard_s3_uri or hp.decode_one(hps, hp.TENSORBOARD_S3_URI),
            # SageMaker stops a job at MaxRuntimeInSeconds; so does local mode
            timeout=read.max_runtime if timeout is None else timeout,
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
    slots = job.slots_by_host[node_index]
    expected = [s.rank for s in slots]
    if ranks is not None and sorted(ranks) != expected:
        raise NodePlanError(
            f"node {node_index} runs rank(s) {', '.join(map(str, expected))} of job {job.name} "
            f"({job.hosts} node(s) x {job.processes_per_host} process(es), filled in order), not "
            f"{', '.join(map(str, ranks)) or 'none'}; start the ranks that way or fix --node-index"
        )
    channels = _node_channels(job, slots)
    if shuffle_seed is not None:
        channels = tuple(replace(c, shuffle_seed=shuffle_seed) for c in channels)
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


@dataclass(frozen=True)
class HostTree(OptMl):
    """The /opt/ml tree of one host (its paths from the contract) and the environment its ranks get;
    ``checkpoint_dir``: CheckpointConfig.LocalPath mapped into it, once the tree is laid out."""

    name: str = ""
    env: dict[str, str] = field(default_factory=dict)
    checkpoint_dir: Path | None = None

    @classmethod
    def laid_out(cls, root: Path, name: str, checkpoint_local_path: str | None) -> HostTree:
        """Host ``name``'s tree at ``root``, its checkpoint dir mapped into it."""
        tree = cls(root, name)
        return replace(tree, checkpoint_dir=tree.checkpoint_path(checkpoint_local_path))

    def checkpoint_path(self, local_path: str | None) -> Path:
        """CheckpointConfig.LocalPath (default /opt/ml/checkpoints) mapped into this tree."""
        return self.local_path(local_path, CHECKPOINT_LOCAL_PATH)


@dataclass(frozen=True)
class JobHosts(Sequence[HostTree]):
    """The trees of a job's hosts laid out here, in host order, and which host each rank runs on: the
    one answer to "where is rank r" for the launchers, the failure messages and the job's summary.
    (SageMaker fills hosts in order: rank r runs on host r // processes_per_host.) Local mode holds
    every host; a platform's node, its own alone: ``first_index`` is the first's index.
    ``host_slots``: the slots of each host's ranks (the job spec's, ``contract.rank_slots``)."""

    trees: tuple[HostTree, ...]
    processes_per_host: int
    first_index: int = 0
    host_slots: tuple[tuple[RankSlot, ...], ...] = ()

    @classmethod
    def of(cls, trees, job: JobSpec, first_index: int = 0) -> JobHosts:
        """``trees``: hosts ``first_index`` on of ``job``, with their ranks' slots."""
        per_host = job.slots_by_host[first_index : first_index + len(trees)]
        return cls(tuple(trees), job.processes_per_host, first_index, per_host)

    @cached_property
    def slots(self) -> tuple[RankSlot, ...]:
        """The slots of the ranks on these hosts, in rank order."""
        return tuple(s for host in self.host_slots for s in host)

    def __getitem__(self, index):
        return self.trees[index]

    def __len__(self) -> int:
        return len(self.trees)

    def __iter__(self) -> Iterator[HostTree]:
        return iter(self.trees)

    @property
    def world(self) -> int:
        return len(self.trees) * self.processes_per_host

    def slot(self, rank: int) -> RankSlot | None:
        """Rank ``rank``'s slot; None for a rank not on these hosts."""
        index = rank - self.slots[0].rank if self.slots else -1
        return self.slots[index] if 0 <= index < len(self.slots) else None

    def host_of(self, rank: int) -> str:
        """The name of the host rank ``rank`` runs on; "?" for a rank outside the job."""
        slot = self.slot(rank)
        return slot.host if slot is not None else "?"

    def local_rank(self, rank: int) -> int:
        slot = self.slot(rank)
        return slot.local_rank if slot is not None else rank % self.processes_per_host
