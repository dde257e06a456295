"""Pipe-mode channel layout: which channel each Horovod rank reads, within SageMaker's 20-channel cap.

Pure planning core shared by the SDK side (which creates the channels) and the container runtime
(which reads the layout back from a hyperparameter and never guesses). No AWS, TF or Horovod here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from sagemaker_dist.contract import distributions, hyperparameters
from sagemaker_dist.contract.distributions import DEFAULT, NAMES, DistributionError, is_registered
from sagemaker_dist.errors import ConfigurationError

MAX_CHANNELS = 20
MAX_CHANNEL_NAME = 64
CHANNEL_NAME_RE = re.compile(r"^[A-Za-z0-9.\-_]+$")
# SageMaker's pattern allows them, but a channel's File-mode folder is /opt/ml/input/data/<name>:
# '..' would be /opt/ml/input, over the job's config, and '.' the data folder itself.
DOT_CHANNEL_NAMES = (".", "..")
DOT_CHANNEL_NAME_PROBLEM = (
    "names the data folder or its parent, not a folder of its own; give it a letter or digit"
)
LAYOUT_HYPERPARAMETER = hyperparameters.LAYOUT
LAYOUT_VERSION = 1

PER_RANK = "per-rank"
PER_LOCAL_RANK = "per-local-rank"
STRATEGIES = (PER_RANK, PER_LOCAL_RANK)

# How a role is spread over workers: one channel per worker, or one channel all workers share.
PER_WORKER = "per-worker"
SINGLE = "single"

FULLY_REPLICATED = "FullyReplicated"
SHARDED_BY_S3_KEY = "ShardedByS3Key"
RECORD_WRAPPERS = ("None", "RecordIO")
INPUT_MODES = ("Pipe", "File", "FastFile")

# How the workers train together: the registry's names (contract/distributions.py), kept here for the
# code that imports them from the layout.
HOROVOD = distributions.HOROVOD
TF_MWMS = distributions.TF_MWMS
DISTRIBUTIONS = NAMES


class LayoutError(ConfigurationError):
    """A channel layout that SageMaker would reject or that would stall Horovod."""


def fifo_would_be_shared(input_mode: str | None, readers_per_host: int) -> bool:
    """A FIFO has one reader: a Pipe channel that several processes of a host read silently splits its
    bytes between them and stalls the job. The one home of that rule."""
    return input_mode == "Pipe" and readers_per_host > 1


def check_channel_name(name: str) -> str:
    """Return ``name`` if CreateTrainingJob accepts it as a channel name, else raise LayoutError."""
    if not isinstance(name, str) or not name:
        raise LayoutError(f"channel name {name!r} is empty; use letters, digits, '.', '-' or '_'")
    if len(name) > MAX_CHANNEL_NAME:
        raise LayoutError(
            f"channel name {name!r} is {len(name)} characters; SageMaker allows at most "
            f"{MAX_CHANNEL_NAME}. Choose a shorter name."
        )
    if not CHANNEL_NAME_RE.fullmatch(name):  # fullmatch: '$' alone would accept a trailing newline
        bad = sorted({c for c in name if not re.match(r"[A-Za-z0-9.\-_]", c)})
        raise LayoutError(
            f"channel name {name!r} has characters SageMaker rejects ({''.join(bad)!r}); "
            "use only letters, digits, '.', '-' and '_'"
        )
    if name in DOT_CHANNEL_NAMES:
        raise LayoutError(f"channel name {name!r} {DOT_CHANNEL_NAME_PROBLEM}")
    return name


@dataclass(frozen=True)
class RoleLayout:
    """One role (train, validation, eval): its channel base name and how it maps to workers."""

    role: str
    base: str
    spread: str  # PER_WORKER or SINGLE
    count: int  # number of channels for this role
    distribution: str  # FullyReplicated or ShardedByS3Key

    @property
    def channels(self) -> list[str]:
        if self.spread == SINGLE:
            return [self.base]
        return [f"{self.base}_{i}" for i in range(self.count)]


@dataclass(frozen=True)
class ChannelLayout:
    """Channels of one job and the rule that maps a rank to its channel."""

    strategy: str
    hosts: int
    processes_per_host: int
    roles: tuple[RoleLayout, ...]
    input_mode: str = "Pipe"
    record_wrapper: str = "None"
    shuffle_seed: int | None = None
    extra_channels: tuple[str, ...] = field(default_factory=tuple)
    distribution: str = DEFAULT

    @property
    def world_size(self) -> int:
        return self.hosts * self.processes_per_host

    @property
    def shared_channels(self) -> tuple[str, ...]:
        """Channels every rank reads in full: single roles (one channel) and extra channels."""
        return tuple(r.base for r in self.roles if r.spread == SINGLE) + tuple(self.extra_channels)

    @property
    def channel_names(self) -> list[str]:
        names = [n for r in self.roles for n in r.channels]
        return names + list(self.extra_channels)

    def role(self, role: str) -> RoleLayout:
        for r in self.roles:
            if r.role == role:
                return r
        known = ", ".join(r.role for r in self.roles) or "none"
        raise LayoutError(f"the layout has no {role!r} channels (roles present: {known})")

    def has_role(self, role: str) -> bool:
        return any(r.role == role for r in self.roles)

    def channel_for(self, role: str, rank: int, local_rank: int) -> str:
        """The channel a rank reads for ``role``: its own for per-worker roles, shared for single."""
        r = self.role(role)
        if r.spread == SINGLE:
            return r.base
        index = rank if self.strategy == PER_RANK else local_rank
        if not 0 <= index < r.count:
            kind = "rank" if self.strategy == PER_RANK else "local rank"
            raise LayoutError(
                f"{kind} {index} has no {role} channel: the layout has {r.count} "
                f"({r.channels[0]}..{r.channels[-1]}) for {self.hosts} host(s) x "
                f"{self.processes_per_host} process(es)"
            )
        return f"{r.base}_{index}"

    def explain(self) -> list[str]:
        """Human-readable lines saying what the layout is and why."""
        lines = [
            f"{self.hosts} host(s) x {self.processes_per_host} process(es) = {self.world_size} "
            + distributions.distribution(self.distribution).workers
            + f"; strategy {self.strategy}; {len(self.channel_names)} of "
            f"{MAX_CHANNELS} channels; input mode {self.input_mode}",
        ]
        for r in self.roles:
            chans = r.channels
            shown = chans[0] if len(chans) == 1 else f"{chans[0]} .. {chans[-1]}"
            if r.spread == SINGLE:
                how = "one channel every rank reads in full"
            elif self.strategy == PER_RANK:
                how = "one channel per rank, each with its own shard"
                if self.input_mode == "File" and self.hosts > 1:
                    how += f" (File mode: each of the {self.hosts} hosts downloads every rank's channel)"
            else:
                how = (
                    "one channel per local rank, ShardedByS3Key across hosts "
                    "(SageMaker splits each channel's objects across hosts by object count, "
                    "not by bytes)"
                )
            lines.append(f"  {r.role}: {shown} ({len(chans)}, {r.distribution}) - {how}")
        if self.extra_channels:
            lines.append(f"  other channels: {', '.join(self.extra_channels)}")
        if self.shuffle_seed is not None:
            lines.append(f"  ShuffleConfig seed {self.shuffle_seed}")
        if self.record_wrapper != "None":
            lines.append(f"  RecordWrapperType {self.record_wrapper}")
        return lines

    def to_json(self) -> str:
        """Compact JSON for the ``sagemaker_dist_layout`` hyperparameter (no S3 URIs: <= 2500 chars)."""
        doc = {
            "version": LAYOUT_VERSION,
            "strategy": self.strategy,
            "hosts": self.hosts,
            "processes_per_host": self.processes_per_host,
            "input_mode": self.input_mode,
            "record_wrapper": self.record_wrapper,
            "shuffle_seed": self.shuffle_seed,
            "roles": [
                {
                    "role": r.role,
                    "base": r.base,
                    "spread": r.spread,
                    "count": r.count,
                    "distribution": r.distribution,
                }
                for r in self.roles
            ],
            "extra_channels": list(self.extra_channels),
        }
        if not distributions.is_default(self.distribution):  # absent: layouts written before stay readable
            doc["distribution"] = self.distribution
        return json.dumps(doc, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | dict) -> ChannelLayout:
        """Read the layout back (the toolkit may already have json-decoded the hyperparameter)."""
        try:
            doc = json.loads(text) if isinstance(text, str) else dict(text)
            if doc.get("version") != LAYOUT_VERSION:
                raise LayoutError(
                    f"layout version {doc.get('version')!r} is not {LAYOUT_VERSION}; "
                    "use the same sagemaker-dist version on the SDK side and in the container"
                )
            if doc["strategy"] not in STRATEGIES:
                raise LayoutError(f"unknown strategy {doc['strategy']!r}")
            if not is_registered(doc.get("distribution", DEFAULT)):
                raise LayoutError(f"unknown distribution {doc['distribution']!r}")
            roles = tuple(RoleLayout(**r) for r in doc["roles"])
            return cls(
                strategy=doc["strategy"],
                hosts=int(doc["hosts"]),
                processes_per_host=int(doc["processes_per_host"]),
                roles=roles,
                input_mode=doc.get("input_mode", "Pipe"),
                record_wrapper=doc.get("record_wrapper", "None"),
                shuffle_seed=doc.get("shuffle_seed"),
                extra_channels=tuple(doc.get("extra_channels", ())),
                distribution=doc.get("distribution", DEFAULT),
            )
        except LayoutError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise LayoutError(
                f"hyperparameter {LAYOUT_HYPERPARAMETER!r} is not a sagemaker-dist layout ({exc}); "
                "launch the job with sagemaker-dist so it writes one"
            ) from exc


def layout_of(request_hyperparameters) -> ChannelLayout | None:
    """The layout a request's hyperparameters carry (JSON-encoded, as SageMaker passes them), or None
    for a request sagemaker-dist did not plan."""
    if LAYOUT_HYPERPARAMETER not in request_hyperparameters:
        return None
    return ChannelLayout.from_json(hyperparameters.decode_one(request_hyperparameters, LAYOUT_HYPERPARAMETER))


def _role_count(strategy: str, hosts: int, gpus: int) -> int:
    return hosts * gpus if strategy == PER_RANK else gpus


def _count_channels(strategy, hosts, gpus, validation, eval_channel, extra) -> int:
    per_worker = _role_count(strategy, hosts, gpus)
    n = per_worker  # train
    if validation == PER_WORKER:
        n += per_worker
    elif validation == SINGLE:
        n += 1
    if eval_channel:
        n += 1
    return n + extra


def plan_layout(
    hosts: int,
    processes_per_host: int,
    *,
    strategy: str = "auto",
    validation: str | None = None,
    eval_channel: bool = False,
    extra_channels: tuple[str, ...] | list[str] = (),
    reserved_channels: int = 0,
    train_name: str = "train",
    validation_name: str = "validation",
    eval_name: str = "eval",
    input_mode: str = "Pipe",
    record_wrapper: str = "None",
    shuffle_seed: int | None = None,
    distribution: str = DEFAULT,
) -> ChannelLayout:
    """Choose a channel layout for ``hosts`` x ``processes_per_host`` workers.

    ``strategy='auto'`` takes per-rank (one FullyReplicated channel per rank, exact byte balance)
    when it fits in 20 channels, else per-local-rank (ShardedByS3Key, fits any number of hosts); in
    File mode on several hosts it takes per-local-rank first, so each host downloads its share only.
    ``validation`` is None, ``'single'`` or ``'per-worker'``. ``reserved_channels`` counts channels
    a launcher adds on its own (e.g. a code channel). ``distribution='tf-mwms'`` has one worker per
    host, so one channel per host (``train_<host index>``), ShardedByS3Key above the cap.
    """
    _check_arguments(
        hosts, processes_per_host, validation, input_mode, record_wrapper, shuffle_seed, reserved_channels
    )
    check_distribution(distribution, processes_per_host)
    extra = tuple(check_channel_name(n) for n in extra_channels)
    extra_count = len(extra) + reserved_channels

    def count(s: str) -> int:
        return _count_channels(s, hosts, processes_per_host, validation, eval_channel, extra_count)

    strategy = _choose_strategy(strategy, count, hosts, processes_per_host, input_mode)
    names = (train_name, validation_name, eval_name)
    roles = _roles(strategy, hosts, processes_per_host, validation, eval_channel, names)
    layout = ChannelLayout(
        strategy=strategy,
        hosts=hosts,
        processes_per_host=processes_per_host,
        roles=tuple(roles),
        input_mode=input_mode,
        record_wrapper=record_wrapper,
        shuffle_seed=shuffle_seed,
        extra_channels=extra,
        distribution=distribution,
    )
    names = layout.channel_names
    for n in names:
        check_channel_name(n)
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise LayoutError(f"channel names repeat: {', '.join(dupes)}; give each role its own name")
    return layout


def check_distribution(distribution: str, processes_per_host: int) -> None:
    """The distribution is registered and its rule about processes per host holds."""
    try:
        distributions.distribution(distribution).check_processes_per_host(processes_per_host)
    except DistributionError as exc:
        raise LayoutError(str(exc)) from None


def _check_arguments(
    hosts, processes_per_host, validation, input_mode, record_wrapper, shuffle_seed, reserved
):
    if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1:
        raise LayoutError(f"instance count is {hosts!r}; it must be a whole number >= 1")
    if not isinstance(processes_per_host, int) or processes_per_host < 1:
        raise LayoutError(
            f"processes per host is {processes_per_host!r}; it must be >= 1 "
            "(for CPU instances pass processes_per_host= explicitly)"
        )
    if validation not in (None, SINGLE, PER_WORKER):
        raise LayoutError(f"validation={validation!r}; use None, 'single' or 'per-worker'")
    if input_mode not in INPUT_MODES:
        raise LayoutError(f"input mode {input_mode!r} is not one of {', '.join(INPUT_MODES)}")
    if record_wrapper not in RECORD_WRAPPERS:
        raise LayoutError(f"record wrapper {record_wrapper!r} is not one of {RECORD_WRAPPERS}")
    if shuffle_seed is not None and (not isinstance(shuffle_seed, int) or shuffle_seed < 0):
        raise LayoutError(f"shuffle seed {shuffle_seed!r} must be a whole number >= 0")
    if isinstance(reserved, bool) or not isinstance(reserved, int) or reserved < 0:
        raise LayoutError(f"reserved channels {reserved!r} must be a whole number >= 0")


def _choose_strategy(strategy: str, count, hosts: int, processes_per_host: int, input_mode: str) -> str:
    """``auto`` takes the first strategy within the cap; a named one must fit, else say what would.

    In File mode every host downloads every FullyReplicated channel in full before the script starts,
    so with several hosts per-rank channels would put the whole dataset on every host: ``auto`` then
    takes per-local-rank, whose ShardedByS3Key channels give each host its own share only."""
    if strategy == "auto":
        order = (PER_LOCAL_RANK, PER_RANK) if input_mode == "File" and hosts > 1 else STRATEGIES
        fitting = [s for s in order if count(s) <= MAX_CHANNELS]
        if not fitting:
            strategy = PER_LOCAL_RANK  # fall through to the error below, which lists the counts
        else:
            strategy = fitting[0]
    if strategy not in STRATEGIES:
        raise LayoutError(f"strategy {strategy!r} is not 'auto', {PER_RANK!r} or {PER_LOCAL_RANK!r}")
    if count(strategy) > MAX_CHANNELS:
        counts = "; ".join(f"{s}: {count(s)} channels" for s in STRATEGIES)
        fits = [s for s in STRATEGIES if count(s) <= MAX_CHANNELS]
        hint = (
            f"use strategy {fits[0]!r}"
            if fits
            else "use validation='single' or None, fewer processes per host, or fewer extra channels"
        )
        raise LayoutError(
            f"{hosts} host(s) x {processes_per_host} process(es) need {count(strategy)} channels "
            f"with strategy {strategy!r}, over SageMaker's cap of {MAX_CHANNELS} ({counts}); {hint}"
        )

    return strategy


def _roles(strategy, hosts, processes_per_host, validation, eval_channel, names) -> list[RoleLayout]:
    train_name, validation_name, eval_name = names
    per_worker = _role_count(strategy, hosts, processes_per_host)
    dist = FULLY_REPLICATED if strategy == PER_RANK else SHARDED_BY_S3_KEY
    roles = [RoleLayout("train", train_name, PER_WORKER, per_worker, dist)]
    if validation == PER_WORKER:
        roles.append(RoleLayout("validation", validation_name, PER_WORKER, per_worker, dist))
    elif validation == SINGLE:
        roles.append(RoleLayout("validation", validation_name, SINGLE, 1, FULLY_REPLICATED))
    if eval_channel:
        roles.append(RoleLayout("eval", eval_name, SINGLE, 1, FULLY_REPLICATED))
    return roles
