"""This rank under ``torchrun``: its channel, checked before any collective, then the process group.

``setup_ddp`` does the local checks first, in well under a second and with no peer involved: the
rank variables torchrun sets, the channel layout against the world (``ranks.check_rank_channels``:
a layout planned for another world size, a Pipe channel several ranks of a host would read), and a
claim on the rank's FIFO (an flock next to the epoch counter: a second reader of the same channel on
the host fails at once, naming the process that holds it). Only then does it start the process
group (``env://``: NCCL where CUDA is, else Gloo) with a bounded timeout, so a peer that never comes
or dies fails the collective instead of hanging the job. The per-step agreements run on a Gloo group
of their own on the CPU, so they never wait on the GPU's stream.

``ddp_main`` wraps a script's ``main``: an exception is printed with the rank and its traceback (and
recorded for torchrun's error summary), so the failed job names the rank that raised.
"""

from __future__ import annotations

import datetime
import fcntl
import functools
import os
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sagemaker_dist.contract import distributions
from sagemaker_dist.contract.layout import INPUT_MODES, LayoutError
from sagemaker_dist.contract.rank_slots import TORCHRUN_VARIABLES
from sagemaker_dist.errors import ConfigurationError, JobFailedError
from sagemaker_dist.runtime import environment
from sagemaker_dist.runtime.config import ContainerConfig
from sagemaker_dist.runtime.ranks import RankChannelError, RankInfo, check_rank_channels
from sagemaker_dist.runtime.stop import positive_seconds
from sagemaker_dist.runtime.torch.group_exit import bind_collectives_first, keep_until_exit

TIMEOUT_ENV = environment.COLLECTIVE_TIMEOUT  # seconds a collective may wait for its peers
DEFAULT_TIMEOUT_S = 1800.0  # torch's own default for Gloo and NCCL


def torchrun_rank(environ: Mapping[str, str] | None = None) -> RankInfo:
    """This process's rank from torchrun's variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
    ``LOCAL_WORLD_SIZE``); 0 of 1 when none is set (a plain ``python train.py``)."""
    env = environment.environ(environ)
    present = [n for n in TORCHRUN_VARIABLES if n in env]
    if not present:
        return RankInfo(0, 0, 1, 1, "default")
    missing = [n for n in TORCHRUN_VARIABLES if n not in env]
    if missing:
        raise RankChannelError(
            f"torchrun's rank variables are incomplete: {', '.join(present)} set, {', '.join(missing)} "
            "missing; start the script with torchrun (or set all four)"
        )
    try:
        values = [int(env[n]) for n in TORCHRUN_VARIABLES]
    except ValueError as exc:
        raise RankChannelError(f"torchrun's rank variables are not whole numbers: {exc}") from exc
    return RankInfo(*values, source="torchrun")


def check_launched_for_torchrun(config: ContainerConfig, environ: Mapping[str, str]) -> None:
    """Refuse, before any channel check, a process of a job launched for another distribution.

    A PyTorch script launched without ``--distribution torchrun`` runs as the default distribution's
    job (Horovod: mpirun or horovodrun, no torchrun variables), so each process sees itself as rank 0 of
    1 and the channel check would blame the processes per host. The job's distribution (the layout's,
    else the toolkit switch in its hyperparameters) says what was launched: one whose processes do not
    get torchrun's variables, with this process started by its launcher (one of its rank variables
    set) or planned for several ranks, is named here with the distribution to launch it with. A process
    that torchrun started (its variables set) passes, and so does a plain ``python train.py`` of a
    one-rank job."""
    if any(name in environ for name in TORCHRUN_VARIABLES):
        return
    try:
        launched, layout = config.distribution, config.layout
    except LayoutError:
        return  # check_rank_channels names a layout it cannot read
    if launched is None or TORCHRUN_VARIABLES in launched.rank_variables:
        return
    markers = [name for name in launched.rank_markers if name in environ]
    if not markers and (layout is None or layout.world_size <= 1):
        return
    wanted = next(d for d in distributions.REGISTRY.values() if TORCHRUN_VARIABLES in d.rank_variables)
    seen = f"{markers[0]} is set, torchrun's RANK is not" if markers else "torchrun's RANK is not set"
    planned = f" for {layout.world_size} {launched.workers}" if layout is not None else ""
    raise RankChannelError(
        f"this job was launched as a {launched.title} job (distribution {launched.name!r}: {launched.runs})"
        f"{planned}, but this script sets up {wanted.title} ranks, which only torchrun starts ({seen}). "
        f"Launch it with --distribution {wanted.name} (distribution={wanted.name!r} on the "
        "DistributedEstimator)"
    )


def collective_timeout(environ: Mapping[str, str] | None = None) -> float:
    """Seconds a collective waits for its peers: ``$SAGEMAKER_DIST_COLLECTIVE_TIMEOUT``, else 1800."""
    raw = environment.collective_timeout(environ)
    if not raw:
        return DEFAULT_TIMEOUT_S
    return positive_seconds(raw, f"{TIMEOUT_ENV}={raw!r}", error=RankChannelError)


class DeviceAssignmentError(ConfigurationError):
    """This host runs more ranks than the GPUs its processes see: two ranks would share one GPU."""


def _visible_gpus(count: int, cuda_visible_devices: str | None) -> str:
    if cuda_visible_devices is None:
        return f"{count} GPU(s) (CUDA_VISIBLE_DEVICES is not set: every GPU of the host)"
    return f"{count} GPU(s) (CUDA_VISIBLE_DEVICES={cuda_visible_devices!r})"


def cuda_device_index(
    local_rank: int, local_world_size: int, device_count: int, cuda_visible_devices: str | None
) -> int:
    """The GPU (an index among the visible ones) of local rank ``local_rank`` of ``local_world_size``
    ranks on this host: its own, ``local_rank``. Where the host runs more ranks than its processes see
    GPUs, two ranks would share one (NCCL then fails at its first collective, or they share its memory
    and run out of it), so every rank of the host refuses at once with ``DeviceAssignmentError``,
    naming the GPUs it sees and what to change."""
    if 0 <= local_rank < local_world_size <= device_count:
        return local_rank
    seen = _visible_gpus(device_count, cuda_visible_devices)
    raise DeviceAssignmentError(
        f"local rank {local_rank} of LOCAL_WORLD_SIZE={local_world_size}: this host runs "
        f"{local_world_size} rank(s), but this process sees {seen}, so ranks would share a GPU (one "
        "process per GPU under DDP). Start at most "
        f"{device_count} process(es) per host (torchrun --nproc_per_node {device_count}; processes per "
        "host of the job), or make a GPU visible to every rank (unset CUDA_VISIBLE_DEVICES, or list "
        f"{local_world_size} GPUs in it)"
    )


def _cuda_device(info: RankInfo):
    """This rank's GPU (``cuda_device_index``), made the current device. CUDA_VISIBLE_DEVICES is read
    from this process's environment, the one CUDA saw, whatever ``setup_ddp``'s ``environ``."""
    import torch

    index = cuda_device_index(
        info.local_rank, info.local_size, torch.cuda.device_count(), environment.cuda_visible_devices()
    )
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


class ChannelClaim:
    """This process's claim on a Pipe channel of its host: an flock held for the process's life.

    A FIFO has one reader; two processes reading one channel silently split its records. The claim
    is ``<pipe_state>/<channel>.reader`` (where the epoch counter is), holding the claimant's pid."""

    def __init__(self, config: ContainerConfig, channel: str, who: str):
        state = config.pipe_state_dir
        state.mkdir(parents=True, exist_ok=True)
        self.path = state / f"{channel}.reader"
        self.channel = channel
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 200, 0).decode(errors="replace").strip() or "?"
            os.close(self._fd)
            self._fd = -1
            raise RankChannelError(
                f"{who}: channel {channel!r} is already read by another process on this host ({holder}); "
                "a Pipe-mode FIFO has one reader only (two readers silently split its records). Start "
                "one process per channel: as many ranks per host as the layout was planned for, each "
                "with its own LOCAL_RANK"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"pid {os.getpid()} ({who})".encode(), 0)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # the flock goes with the descriptor
            self._fd = -1


@dataclass
class DdpJob:
    """What ``setup_ddp`` returns: this rank, its channels (role -> channel), the device it trains on
    and the groups its collectives run on (``agreement_group``: Gloo on the CPU, for the per-step
    agreements; None means the default group)."""

    rank_info: RankInfo
    config: ContainerConfig
    channels: dict[str, str]
    device: Any
    backend: str
    timeout_s: float
    agreement_group: Any = None
    claims: list[ChannelClaim] = field(default_factory=list, repr=False)
    checked_in_s: float = 0.0  # how long the local checks took, before the first collective
    created_group: bool = False  # setup_ddp started the default process group (else its owner did, or none)
    closed: bool = field(default=False, repr=False)

    @property
    def rank(self) -> int:
        return self.rank_info.rank

    @property
    def local_rank(self) -> int:
        return self.rank_info.local_rank

    @property
    def world_size(self) -> int:
        return self.rank_info.size

    @property
    def is_chief(self) -> bool:
        return self.rank_info.rank == 0

    @property
    def channel(self) -> str:
        """This rank's train channel."""
        return self.channels["train"] if "train" in self.channels else next(iter(self.channels.values()))

    @property
    def device_ids(self) -> list[int] | None:
        """What ``DistributedDataParallel(device_ids=...)`` takes: this rank's GPU, or None on the CPU."""
        return [self.device.index] if self.device.type == "cuda" else None

    def mean(self, values: Mapping[str, float]) -> dict[str, float]:
        """Each value averaged over the ranks (one allreduce on the agreement group): the metrics of an
        epoch as the whole job saw them."""
        import torch
        import torch.distributed as dist

        names = sorted(values)
        if not names or not dist.is_initialized():
            return {n: float(values[n]) for n in names}
        tensor = torch.tensor([float(values[n]) for n in names], dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.agreement_group)
        return {n: float(v) / self.world_size for n, v in zip(names, tensor.tolist())}

    def barrier(self) -> None:
        """Every rank here (on the agreement group: bounded by the job's timeout)."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier(group=self.agreement_group)

    def close(self) -> None:
        """Leave the process group and release the channel claims (at the end of the script; again, it
        does nothing). Every rank leaves together (a barrier first): a rank that tears its group down and
        exits while a peer still uses it (rank 0 writing the last checkpoint) can abort in C++ at
        interpreter exit ("terminate called without an active exception"). Only what ``setup_ddp``
        started is destroyed: a process group the script started before it stays, for its owner to end
        (the agreement group made beside it goes)."""
        import torch.distributed as dist

        if self.closed:
            return
        self.closed = True
        if dist.is_initialized():
            dist.barrier(group=self.agreement_group)
            if self.created_group:
                dist.destroy_process_group()
            elif self.agreement_group is not None:
                dist.destroy_process_group(self.agreement_group)
        while self.claims:
            self.claims.pop().release()


def setup_ddp(
    roles: tuple[str, ...] | list[str] = ("train",),
    *,
    backend: str | None = None,
    timeout_s: float | None = None,
    root: str | os.PathLike | None = None,
    input_modes: tuple[str, ...] = INPUT_MODES,
    environ: Mapping[str, str] | None = None,
) -> DdpJob:
    """Check this rank's channel for each of ``roles``, claim its FIFOs, then start the process group.

    Everything before ``init_process_group`` is local and fails fast (``RankChannelError`` naming the
    rank, the channel it expected and the channels present): no rank waits for a peer that is about
    to fail. ``input_modes``: the channels' input modes the script reads (``PipeBatches`` reads each).
    ``backend``: None picks NCCL where CUDA is, else Gloo. ``timeout_s`` bounds every
    collective (default ``$SAGEMAKER_DIST_COLLECTIVE_TIMEOUT``, else 1800 s). ``environ`` (default
    ``os.environ``) gives the rank variables and the rendezvous (``MASTER_ADDR``, ``MASTER_PORT``).
    Whatever fails after the claims (the GPU, the rendezvous) releases them, and a process group this
    call started is destroyed again: a retry in the same process starts afresh. A process group that
    was already started is used as it is (and left to its owner by ``DdpJob.close``).
    """
    started = time.monotonic()
    env = dict(environment.environ(environ))
    info = torchrun_rank(env)
    config = ContainerConfig.load(root, env)
    check_launched_for_torchrun(config, env)
    channels = {role: check_rank_channels(config, info, role, input_modes) for role in roles}
    timeout = (
        collective_timeout(env)
        if timeout_s is None
        else positive_seconds(timeout_s, f"timeout_s={timeout_s!r}", "give a number of seconds > 0, or None")
    )
    claims = _claim_channels(config, channels, info)
    checked = time.monotonic() - started
    try:
        device, chosen, group, created = _start_group(info, env, backend, timeout)
    except BaseException:
        for claim in claims:
            claim.release()
        raise
    return DdpJob(info, config, channels, device, chosen, timeout, group, claims, checked, created)


def _claim_channels(config: ContainerConfig, channels: dict[str, str], info: RankInfo) -> list[ChannelClaim]:
    """A claim on each Pipe channel of ``channels`` (role -> channel); none held if one fails."""
    who = f"rank {info.rank} (local rank {info.local_rank} of {info.local_size}, {info.size} rank(s))"
    claims: list[ChannelClaim] = []
    try:
        for role, channel in channels.items():
            if config.input_mode(channel) == "Pipe":
                claims.append(ChannelClaim(config, channel, f"{who}, {role}"))
    except BaseException:
        for claim in claims:
            claim.release()
        raise
    return claims


def _start_group(info: RankInfo, env: Mapping[str, str], backend: str | None, timeout: float):
    """This rank's device, the backend, the agreement group and whether the default group was started
    here (a failure after that destroys it again)."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    chosen = backend or ("nccl" if cuda else "gloo")
    device = _cuda_device(info) if cuda else torch.device("cpu")
    if not (info.size > 1 or environment.MASTER_ADDR in env):
        return device, chosen, None, False
    limit = datetime.timedelta(seconds=timeout)
    created = not dist.is_initialized()
    if created:
        bind_collectives_first()
        host, port = _master(env)
        kwargs = {"device_id": device} if chosen == "nccl" else {}
        try:
            store = _rendezvous_store(info, host, port, env, limit)
            dist.init_process_group(
                chosen, store=store, timeout=limit, rank=info.rank, world_size=info.size, **kwargs
            )
        except dist.DistError as exc:  # the store or the backend: the ranks did not meet
            raise _rendezvous_failed(info, f"{host}:{port}", chosen, timeout, exc) from exc
    keep_until_exit(dist.group.WORLD)
    try:
        group = dist.new_group(backend="gloo", timeout=limit) if dist.get_backend() != "gloo" else None
    except BaseException:
        if created:
            dist.destroy_process_group()
        raise
    return device, chosen, group, created


class ProcessGroupError(JobFailedError):
    """The ranks did not meet: the rendezvous at ``MASTER_ADDR:MASTER_PORT`` failed or timed out."""


def _master(env: Mapping[str, str]) -> tuple[str, int]:
    """``MASTER_ADDR`` and ``MASTER_PORT`` of ``env`` (torchrun sets both)."""
    addr, raw = environment.master_addr(env), environment.master_port(env)
    missing = [n for n, v in ((environment.MASTER_ADDR, addr), (environment.MASTER_PORT, raw)) if not v]
    if missing:
        raise RankChannelError(
            f"{' and '.join(missing)} not set: the ranks meet at MASTER_ADDR:MASTER_PORT (rank 0's host, "
            "or torchrun's store); start the script with torchrun, or set both"
        )
    port = int(raw) if raw.strip().isdigit() else -1
    if not 0 < port < 65536:
        raise RankChannelError(f"MASTER_PORT={raw!r}: give a port number from 1 to 65535")
    return addr, port


def _rendezvous_store(
    info: RankInfo, host: str, port: int, env: Mapping[str, str], limit: datetime.timedelta
):
    """The store the ranks meet at, as torch's ``env://`` makes it, from ``env`` instead of
    ``os.environ``: a client of torchrun's own store where its agent says so
    (``TORCHELASTIC_USE_AGENT_STORE``), else rank 0's server at ``MASTER_ADDR:MASTER_PORT``."""
    import torch.distributed as dist

    if env.get(environment.AGENT_STORE) == "True":
        store = dist.TCPStore(host, port, info.size, False, timeout=limit)
    else:
        use_libuv = env.get(environment.USE_LIBUV, "1") == "1"
        store = dist.TCPStore(
            host, port, info.size, info.rank == 0, timeout=limit, multi_tenant=True, use_libuv=use_libuv
        )
    return dist.PrefixStore("default_pg", store)  # as env:// keys it: a store torchrun's agent shares


def _rendezvous_failed(info: RankInfo, where: str, backend: str, timeout: float, exc) -> ProcessGroupError:
    return ProcessGroupError(
        f"rank {info.rank} of {info.size}: the {backend} process group did not start: the ranks did not all "
        f"meet at {where} within {timeout:.0f} s ({type(exc).__name__}: {exc}). Check that every rank "
        "started (torchrun on every host, with the same --nnodes and --nproc_per_node), that MASTER_ADDR "
        f"reaches rank 0's host from every host, and that no rank failed before it; {TIMEOUT_ENV} sets "
        "the wait"
    )


def ddp_main(main):
    """Decorate a script's ``main``: an exception is printed as ``rank N (host H) failed: ...`` with its
    traceback, recorded for torchrun's error summary, and ends the process with 1; ``SystemExit``
    (an agreed stop ends with 0) passes through."""
    try:
        from torch.distributed.elastic.multiprocessing.errors import record
    except ImportError:  # pragma: no cover - PyTorch without elastic

        def record(fn):
            return fn

    recorded = record(main)

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return recorded(*args, **kwargs)
        except SystemExit:
            raise
        except BaseException as exc:
            rank = environment.environ().get(environment.TORCH_RANK, "0")
            host = environment.current_host() or os.uname().nodename
            text = "".join(traceback.format_exception(exc))
            sys.stderr.write(f"sagemaker-dist: rank {rank} (host {host}) failed: {exc!r}\n{text}")
            sys.stderr.flush()
            raise

    return wrapper
