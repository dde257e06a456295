"""Sharded checkpoints of FSDP2 models through ``torch.distributed.checkpoint`` (DCP), on every rank.

A DDP model is whole on every rank, so rank 0 saves it (``checkpointing.py``). An FSDP2 model
(``fully_shard``) is not whole anywhere: each rank saves its own shard of the model and the optimizer
with DCP into the same checkpoint directory, and a checkpoint loads onto any number of ranks (DCP
reshards). The directory has the same names and completeness rule as every other checkpoint here
(``runtime/checkpoint_format.py``): ``<root>/checkpoints/epoch-NNNNN[-step-SSSSSS]`` holding
``__<rank>_<n>.distcp`` (the shards), ``dcp.metadata`` (DCP's index of them; a name without the leading
dot that DCP gives it, since checkpoint mirrors skip dot files as in progress) and ``meta.json`` (position,
scheduler, extras as plain JSON, and every file with its size: the commit marker).

A save: every rank writes its shard into ``.tmp-<name>-<token>-<n>`` (each host's copy of the checkpoint
directory: on SageMaker, each host syncs its own to the same S3 prefix); the ranks then say which files
they wrote and their sizes (one gather); rank 0 writes ``meta.json`` last, fsyncs and renames the
directory into place, and only then do the other hosts rename theirs. A rank that fails or is killed
before that leaves a ``.tmp-*`` directory that never counts, and the previous complete checkpoint stays in
force. ``save(..., blocking=False)`` copies the state to host memory (the only part the loop waits for) and
writes it with ``dcp.async_save`` on a Gloo group of its own, committing from a thread when every rank is
done; the next save first waits for it, so at most one is in flight.

Nothing in a checkpoint runs code when loaded: whoever can write the checkpoint prefix in S3 writes what
every rank reads. ``dcp.metadata`` is a pickle, read with an unpickler that builds DCP's metadata classes
and nothing else; the shards' tensors are read with ``weights_only=True``, and so are their plain values
(DCP's own planner reads those with ``weights_only=False``); a shard file must be one listed in
``meta.json``, inside the checkpoint. Anything else is ``UnsafeCheckpointError``, naming the file.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import pickle
import secrets
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from sagemaker_dist.runtime.checkpoint_format import (
    META_FILE,
    Checkpoint,
    CheckpointMismatchError,
    _fsync_dir,
    checkpoint_name,
    install_directory,
    list_checkpoints,
    prune_checkpoints,
    remove_stale_temporaries,
)
from sagemaker_dist.runtime.torch.checkpointing import UnsafeCheckpointError

log = logging.getLogger(__name__)

FORMAT = "torch-dcp"
METADATA_FILE = "dcp.metadata"
SHARD_SUFFIX = ".distcp"
DEFAULT_WAIT_S = 1800.0


def is_sharded(model) -> bool:
    """True when ``fully_shard`` (FSDP2) was applied to ``model`` or any module in it."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - a PyTorch without FSDP2
        return False
    return any(isinstance(m, FSDPModule) for m in model.modules())


# --- reading without running code --------------------------------------------------------------------

_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in (
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),  # a layout by its name ("torch.strided")
    ("torch", "Size"),
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata dataclasses, torch dtypes, sizes and layouts; refuses every other global
    (a pickle runs code only through the globals it names)."""

    def find_class(self, module: str, name: str):
        import torch

        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not part of DCP's metadata")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("persistent ids are not part of DCP's metadata")


def _refused(path, why: str) -> UnsafeCheckpointError:
    return UnsafeCheckpointError(
        f"checkpoint file {path} {why}; it is refused, since loading it could run code or read files "
        "outside the checkpoint. It was not written by this job's sharded checkpoints: delete that "
        "checkpoint directory, or give the job a fresh checkpoint location, and check who can write "
        "the checkpoint prefix"
    )


def read_metadata_file(path: str | os.PathLike):
    """DCP's ``Metadata`` from ``path``, unpickled with DCP's metadata classes only."""
    from torch.distributed.checkpoint.metadata import Metadata

    with open(path, "rb") as fh:
        try:
            metadata = _MetadataUnpickler(fh).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as exc:
            raise _refused(path, f"is not DCP metadata built from its own classes ({exc})") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise _refused(path, "does not hold DCP's Metadata")
    return metadata


def checked_metadata(checkpoint: Path, allowed: set[str]):
    """The checkpoint's DCP metadata, every shard it names one of ``allowed`` (what ``meta.json``
    lists): no path out of the checkpoint, no stream transforms."""
    path = checkpoint / METADATA_FILE
    metadata = read_metadata_file(path)
    for info in metadata.storage_data.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or name not in allowed or "/" in name:
            raise _refused(path, f"names shard {name!r}, which meta.json does not list")
        if getattr(info, "transform_descriptors", None):
            raise _refused(path, f"asks for stream transforms {info.transform_descriptors!r}")
    return metadata


def _reader_class():
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        """DCP's file reader with the metadata read by ``read_metadata_file`` and every shard a file
        that ``meta.json`` lists (no path out of the checkpoint, no stream transforms)."""

        def __init__(self, path, allowed: set[str]):
            super().__init__(path)
            self.allowed = allowed

        def _get_metadata_path(self, rank=None):
            return Path(self.path) / METADATA_FILE

        def read_metadata(self, *args, **kwargs):
            metadata = checked_metadata(Path(self.path), self.allowed)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader


def _safe_bytes(value: io.BytesIO, what: str):
    import torch

    try:
        return torch.load(value, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise _refused(what, f"holds a value other than tensors and plain values ({exc})") from None


def _load_planner(full: bool = False):
    """DCP's load planner with the non-tensor values (optimizer hyperparameters) read ``weights_only``.
    ``full``: build the state dict from the checkpoint (``read_sharded_checkpoint``)."""
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.default_planner import (
        DefaultLoadPlanner,
        _EmptyStateDictLoadPlanner,
    )

    base = _EmptyStateDictLoadPlanner if full else DefaultLoadPlanner

    class SafeLoadPlanner(base):
        def load_bytes(self, read_item, value):
            loaded = _safe_bytes(value, f"item {read_item.dest_index.fqn!r}")
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return SafeLoadPlanner()


def _writer(path: Path, staging: StagingBuffer | None = None):
    """DCP's file writer with its metadata under ``dcp.metadata``; an async save copies the state into
    ``staging`` (DCP's own stager allocates a fresh copy each time)."""
    from torch.distributed.checkpoint import FileSystemWriter

    class Writer(FileSystemWriter):
        def _get_metadata_path(self, rank=None):
            return Path(self.path) / METADATA_FILE

        def stage(self, state_dict):
            if staging is None:
                return super().stage(state_dict)
            self.per_thread_copy_ahead = 0  # already in host memory
            return staging.copy(state_dict)

    return Writer(path, sync_files=True, overwrite=True)


class StagingBuffer:
    """This rank's state copied to host memory for a background write: allocated at the first save
    (pinned where CUDA is) and reused, since the next save waits for the previous one. A fresh copy
    touches every page anew: 300 MB a rank took 1.47 s that way against 0.22 s into this buffer (2
    ranks on the 2-core VM)."""

    def __init__(self):
        self.buffer = None
        self.signature = None

    @staticmethod
    def _signature(state_dict) -> tuple:
        import torch
        from torch.utils._pytree import tree_flatten

        leaves, spec = tree_flatten(state_dict)
        shapes = tuple(
            (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else type(x).__name__ for x in leaves
        )
        return str(spec), shapes

    def copy(self, state_dict):
        import torch
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        signature = self._signature(state_dict)
        if self.buffer is None or signature != self.signature:
            self.buffer = _create_cpu_state_dict(state_dict, pin_memory=torch.cuda.is_available())
            self.signature = signature
        return _copy_state_dict(state_dict, self.buffer)


def read_sharded_checkpoint(path: str | os.PathLike) -> dict:
    """The whole state of a sharded checkpoint in this process (``{"model": ..., "optim": ...}`` with
    full tensors, on the CPU), read as ``PipeTraining`` reads it: for a look, a comparison or an export
    to one file, without a process group."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    path = Path(path)
    meta = _checked_meta(path)
    checked_metadata(path, set(meta["files"]))
    state: dict = {}
    _load_state_dict(
        state,
        storage_reader=_reader_class()(path, set(meta["files"])),
        planner=_load_planner(full=True),
        no_dist=True,
    )
    return state


def _checked_meta(path: Path) -> dict:
    try:
        meta = json.loads((path / META_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointMismatchError(f"{path} has no readable {META_FILE} ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("files"), dict):
        raise CheckpointMismatchError(
            f"{path} is not a sharded checkpoint (its {META_FILE} says format {meta.get('format')!r})"
            if isinstance(meta, dict)
            else f"{path}: {META_FILE} is not an object"
        )
    return meta


# --- saving and restoring on every rank --------------------------------------------------------------


def _jsonable(value: Any, what: str) -> Any:
    """``value`` as JSON gives it back (tuples become lists); a value JSON cannot carry is an error."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise UnsafeCheckpointError(
            f"{what} cannot go into a sharded checkpoint: its positions, scheduler and extras are "
            f"plain JSON ({exc}); pass numbers, strings, lists and dicts of them"
        ) from None


@dataclasses.dataclass
class _Pending:
    """An async save: its position, its staging time and the thread that writes and commits it."""

    epoch: int
    step: int
    started: float
    blocked_s: float
    thread: threading.Thread | None = None
    outcome: dict | None = None
    error: BaseException | None = None


class ShardedCheckpoints:
    """The sharded checkpoints of one job, on every rank; see the module's docstring.

    ``rank``, ``local_rank``, ``world_size``: this process (its host's lowest local rank renames that
    host's copy). ``group``: the process group of the blocking saves and of the restore (the job's Gloo
    ``agreement_group``; None is the default group). ``async_group``: a Gloo group that only the
    background saves use (the loop's collectives never wait behind them); None: every save blocks.
    ``timeout_s`` bounds the wait for a save in flight.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        model,
        optimizer=None,
        scheduler=None,
        rank: int = 0,
        local_rank: int = 0,
        world_size: int = 1,
        group=None,
        async_group=None,
        keep: int | None = 3,
        timeout_s: float = DEFAULT_WAIT_S,
    ):
        self.directory = Path(directory)
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.rank, self.local_rank, self.world_size = int(rank), int(local_rank), int(world_size)
        self.group, self.async_group = group, async_group
        self.keep = keep
        self.timeout_s = float(timeout_s)
        self.token: str | None = None  # rank 0's, agreed at the first restore or save: tmp named alike
        self.saves = 0
        self.pending: _Pending | None = None
        self.committed: tuple[int, int] | None = None  # the newest position this job committed
        self.blocked_s: list[float] = []  # how long each save held the loop (staging, or the whole save)
        self.staging = StagingBuffer()

    # collectives (no-ops in a job of one process) ----------------------------------------------------

    @staticmethod
    def _distributed() -> bool:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def _gather(self, value, group) -> list:
        import torch.distributed as dist

        if not self._distributed():
            return [value]
        out: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(out, value, group=group)
        return out

    def _broadcast(self, value, group):
        import torch.distributed as dist

        if not self._distributed():
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, group=group)
        return box[0]

    # restore -----------------------------------------------------------------------------------------

    def restore(self) -> tuple[int, int, Checkpoint | None, dict]:
        """``(epoch, step, checkpoint, meta)`` of the newest checkpoint complete on every rank, loaded
        into the model, optimizer and scheduler; ``(0, 0, None, {})`` without one. Call on every rank."""
        if self.rank == 0:
            remove_stale_temporaries(self.directory)
        self._barrier(self.group)
        if self.rank != 0 and self.local_rank == 0:
            remove_stale_temporaries(self.directory)  # a host of its own (on a shared one: nothing left)
        mine = [(c.epoch, c.step, c.path.name) for c in list_checkpoints(self.directory)]
        seen = self._gather(mine, self.group)
        common = set(seen[0]).intersection(*map(set, seen[1:]))
        chosen = max(common) if common else None
        newest = max(seen[0]) if seen[0] else None
        self._agree_token()
        if chosen is None:
            if any(seen):
                having = [r for r, s in enumerate(seen) if s]
                raise CheckpointMismatchError(
                    f"rank(s) {_ranks(having)} see complete checkpoints in {self.directory} and rank(s) "
                    f"{_ranks(r for r, s in enumerate(seen) if not s)} see none: a sharded checkpoint is "
                    "read by every rank, so every host needs all of it. SageMaker restores the "
                    "checkpoint prefix onto each host; on a cluster, put the checkpoint directory on a "
                    "file system every host shares"
                )
            return 0, 0, None, {}
        if self.rank == 0 and newest != chosen:
            lacking = [r for r, s in enumerate(seen) if newest not in s]
            print(
                f"sagemaker-dist: checkpoint {newest[2]} is not complete on rank(s) {_ranks(lacking)}; "
                f"resuming from {chosen[2]}, the newest every rank has",
                flush=True,
            )
        path = self.directory / chosen[2]
        meta = self._agreed_meta(path)
        self._load(path, meta)
        self.committed = (chosen[0], chosen[1])
        return chosen[0], chosen[1], Checkpoint(chosen[0], path, chosen[1], meta), meta

    def _agreed_meta(self, path: Path) -> dict:
        """The chosen checkpoint's ``meta.json``, its DCP metadata checked; the same error on every rank
        when some rank cannot use it (before any rank starts DCP's collectives)."""
        meta, error = None, None
        try:
            meta = _checked_meta(path)
            checked_metadata(path, set(meta["files"]))
        except UnsafeCheckpointError as exc:
            error = ("unsafe", str(exc))
        except CheckpointMismatchError as exc:
            error = ("mismatch", str(exc))
        errors = [e for e in self._gather(error, self.group) if e]
        if errors and errors[0][0] == "unsafe":
            raise UnsafeCheckpointError(errors[0][1])
        if errors:
            raise CheckpointMismatchError(
                f"{errors[0][1]}: this job's model is sharded (FSDP2), which resumes from sharded "
                "checkpoints only. Give the job a fresh checkpoint location, or delete the epoch-* "
                f"directories in {path.parent}"
            )
        return meta

    def _state(self) -> dict:
        """The model's (and optimizer's) state as DCP saves and loads it: this rank's shards."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model)}
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state}

    def _load(self, path: Path, meta: dict) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        error = None
        try:
            state = self._state()
            dcp.load(
                state,
                storage_reader=_reader_class()(path, set(meta["files"])),
                planner=_load_planner(),
                process_group=self.group,
            )
            if self.optimizer is None:
                set_model_state_dict(self.model, state["model"])
            else:
                set_state_dict(
                    self.model,
                    self.optimizer,
                    model_state_dict=state["model"],
                    optim_state_dict=state["optim"],
                )
            if self.scheduler is not None and meta.get("scheduler") is not None:
                self.scheduler.load_state_dict(meta["scheduler"])
        except UnsafeCheckpointError:
            raise
        except _failures() as exc:  # DCP raises its CheckpointException on every rank
            error = exc
            unsafe = _unsafe_cause(exc)
            if unsafe is not None:
                raise unsafe from None
        if error is not None:
            raise CheckpointMismatchError(
                f"checkpoint {path} does not match this job's model and optimizer: "
                f"{_first_line(error)}. Resume from checkpoints of this model: give the job a fresh "
                f"checkpoint location, or delete the epoch-* directories in {path.parent}"
            ) from error

    # save --------------------------------------------------------------------------------------------

    def save(self, epoch: int, step: int, *, extra: dict | None = None, blocking: bool = True):
        """Checkpoint ``epoch`` whole epochs and ``step`` steps of the next, on every rank. Blocking: the
        committed ``Checkpoint`` (None where it failed: the previous one stays in force). Otherwise the
        write goes on in the background after the state is copied, and None is returned."""
        import torch.distributed.checkpoint as dcp

        try:
            self.wait()
        except Exception as exc:  # noqa: BLE001 - that one never counts; this one is written anyway
            if self.rank == 0:
                print(f"sagemaker-dist: the previous checkpoint was not completed: {exc}", flush=True)
        if self.committed == (epoch, step):
            return self._checkpoint(epoch, step)  # written already (a periodic save at the stop's step)
        meta = {
            "format": FORMAT,
            "world_size": self.world_size,
            "scheduler": _jsonable(self.scheduler.state_dict(), "the scheduler's state_dict()")
            if self.scheduler is not None
            else None,
            "extra": _jsonable(extra or {}, "extra="),
        }
        self._agree_token()
        self.saves += 1
        final = self.directory / checkpoint_name(epoch, step)
        tmp = self.directory / f".tmp-{final.name}-{self.token}-{self.saves}"
        tmp.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        state = self._state()
        if blocking or (self.async_group is None and self._distributed()):
            error = None
            try:
                dcp.save(state, storage_writer=_writer(tmp), process_group=self.group)
            except _failures() as exc:  # DCP raises it on every rank: none commits
                error = f"{type(exc).__name__}: {_first_line(exc)}"
            outcome = self._commit(tmp, final, epoch, step, meta, error, self.group)
            self.blocked_s.append(time.monotonic() - started)
            return self._checkpoint(epoch, step) if outcome.get("ok") else None
        writer = _writer(tmp, self.staging)
        future = dcp.async_save(state, storage_writer=writer, process_group=self.async_group)
        blocked = time.monotonic() - started
        self.blocked_s.append(blocked)
        pending = _Pending(epoch, step, started, blocked)

        def finish() -> None:
            error = None
            try:
                future.result(timeout=self.timeout_s)
            except _failures() as exc:  # every rank's save failed alike (DCP gathers them)
                error = f"{type(exc).__name__}: {_first_line(exc)}"
            try:
                pending.outcome = self._commit(tmp, final, epoch, step, meta, error, self.async_group)
            except BaseException as exc:  # noqa: BLE001 - reported by wait()
                pending.error = exc

        pending.thread = threading.Thread(
            target=finish, name=f"sagemaker-dist-save-{final.name}", daemon=True
        )
        pending.thread.start()
        self.pending = pending
        return None

    def _checkpoint(self, epoch: int, step: int) -> Checkpoint:
        return Checkpoint(epoch, self.directory / checkpoint_name(epoch, step), step)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait (bounded) for the save in flight to be committed or given up; True when it was committed
        (or none was in flight). A save that failed leaves the previous checkpoint in force."""
        pending, self.pending = self.pending, None
        if pending is None:
            return True
        pending.thread.join(self.timeout_s + 60 if timeout is None else timeout)
        if pending.thread.is_alive():
            raise TimeoutError(
                f"the checkpoint of epoch {pending.epoch} step {pending.step} was still being written "
                f"after {self.timeout_s + 60:.0f} s; the previous complete checkpoint stays in force"
            )
        if pending.error is not None:
            raise pending.error
        return bool(pending.outcome and pending.outcome.get("ok"))

    def _own_files(self, tmp: Path) -> dict[str, int]:
        prefix = f"__{self.rank}_"
        found = (
            {p.name: p.stat().st_size for p in tmp.iterdir() if p.name.startswith(prefix)}
            if tmp.is_dir()
            else {}
        )
        if self.rank == 0 and (tmp / METADATA_FILE).is_file():
            found[METADATA_FILE] = (tmp / METADATA_FILE).stat().st_size
        return found

    def _commit(self, tmp: Path, final: Path, epoch: int, step: int, meta: dict, error, group) -> dict:
        """Every rank: say what it wrote; rank 0 writes ``meta.json`` and renames its host's copy, then
        the other hosts rename theirs. Returns ``{"ok": ..., "keep": [...], "error": ...}`` everywhere."""
        reports = self._gather(
            {"error": error, "files": self._own_files(tmp) if error is None else {}}, group
        )
        outcome: dict = {"ok": False, "keep": None, "error": None}
        if self.rank == 0:
            outcome = self._install_first(tmp, final, epoch, step, meta, reports)
        outcome = self._broadcast(outcome, group)
        if self.rank != 0 and self.local_rank == 0:
            if outcome["ok"] and tmp.is_dir():  # this host has a copy of its own
                _fsync_dir(tmp)
                install_directory(tmp, final)
            if outcome["keep"] is not None:
                for old in self.directory.glob("epoch-*"):
                    if old.name not in outcome["keep"] and old.name != final.name:
                        shutil.rmtree(old, ignore_errors=True)
        if not outcome["ok"]:
            shutil.rmtree(tmp, ignore_errors=True)
            if self.rank == 0:
                print(
                    f"sagemaker-dist: checkpoint {final.name} was not written ({outcome['error']}); the "
                    "previous complete checkpoint stays in force",
                    flush=True,
                )
            return outcome
        self.committed = max(self.committed or (epoch, step), (epoch, step))
        return outcome

    def _install_first(self, tmp, final, epoch, step, meta, reports) -> dict:
        failed = [(r, x["error"]) for r, x in enumerate(reports) if x["error"]]
        if failed:
            return {"ok": False, "keep": None, "error": f"rank {failed[0][0]}: {failed[0][1]}"}
        files: dict[str, int] = {}
        for report in reports:
            files.update(report["files"])
        try:
            listed = read_metadata_file(tmp / METADATA_FILE).storage_data.values()
            missing = sorted({i.relative_path for i in listed} - set(files))
            if missing:
                return {"ok": False, "keep": None, "error": f"shard(s) {', '.join(missing)} not reported"}
            meta = {**meta, "epoch": epoch, "step": step, "files": files, "written_at": time.time()}
            partial = tmp / f".{META_FILE}.partial"
            with open(partial, "w") as fh:
                fh.write(json.dumps(meta, indent=1, sort_keys=True))
                fh.flush()
                os.fsync(fh.fileno())
            os.rename(partial, tmp / META_FILE)
            _fsync_dir(tmp)
            install_directory(tmp, final)
            kept = prune_checkpoints(self.directory, self.keep)
        except Exception as exc:  # noqa: BLE001 - told to every rank: none renames
            return {"ok": False, "keep": None, "error": f"{type(exc).__name__}: {_first_line(exc)}"}
        log.info("sharded checkpoint %s written by %d rank(s)", final, len(reports))
        return {"ok": True, "keep": [c.path.name for c in kept], "error": None}

    def _agree_token(self) -> None:
        """Rank 0's token for this job's ``.tmp-*`` names, on every rank (once; a collective)."""
        if self.token is None:
            self.token = self._broadcast(secrets.token_hex(4), self.group)

    def _barrier(self, group) -> None:
        import torch.distributed as dist

        if self._distributed():
            dist.barrier(group=group)

    def close(self) -> None:
        """Wait for the save in flight (at the end of training, before the process group goes)."""
        self.wait()


def _ranks(ranks) -> str:
    return ", ".join(map(str, ranks))


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _failures() -> tuple[type[BaseException], ...]:
    """What a failed DCP call raises: its ``CheckpointException`` (a ``BaseException``) or an error."""
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


def _unsafe_cause(exc: BaseException) -> UnsafeCheckpointError | None:
    """The ``UnsafeCheckpointError`` a rank raised inside DCP, which hands it back as one of the
    ``(exception, traceback)`` pairs of its ``CheckpointException.failures``."""
    if isinstance(exc, UnsafeCheckpointError):
        return exc
    for pair in (getattr(exc, "failures", None) or {}).values():
        inner = pair[0] if isinstance(pair, tuple) and pair else pair
        if isinstance(inner, UnsafeCheckpointError):
            return UnsafeCheckpointError(str(inner))
    cause = exc.__cause__ or exc.__context__
    return _unsafe_cause(cause) if isinstance(cause, BaseException) and cause is not exc else None
