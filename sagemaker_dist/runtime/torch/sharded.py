"""Sharded checkpoints of FSDP2 models through ``torch.distributed.checkpoint`` (DCP), on every rank.

A DDP model is whole on every rank, so rank 0 saves it (``checkpointing.py``). An FSDP2 model
(``fully_shard``) is not whole anywhere: each rank saves its own shard of the model and the optimizer
with DCP into the same checkpoint, and a checkpoint loads onto any number of ranks (DCP reshards). A
checkpoint has the same names and completeness rule as every other checkpoint here
(``runtime/checkpoint_format.py``): ``epoch-NNNNN[-step-SSSSSS]`` holding ``__<rank>_<n>.distcp`` (the
shards), ``dcp.metadata`` (DCP's index of them; a name without the leading dot that DCP gives it, since
checkpoint mirrors skip dot files as in progress) and ``meta.json`` (position, scheduler, extras as plain
JSON, and every file with its size: the commit marker).

A save: every rank writes its shard (into its host's ``.tmp-<name>-<token>-<n>`` copy of a checkpoint
directory, or straight under the checkpoint's S3 prefix: ``sharded_storage.py``); the ranks then say
which files they wrote and their sizes (one gather); rank 0 writes ``meta.json`` last (and renames its
host's directory into place; then the other hosts rename theirs). A rank that fails or is killed before
that leaves files that never count, and the previous complete checkpoint stays in force.
``save(..., blocking=False)`` copies the state to host memory (the only part the loop waits for) and
writes it with ``dcp.async_save`` on a Gloo group of its own, committing from a thread when every rank is
done; the next save first waits for it, so at most one is in flight (``sharded_saves.py``).

Nothing in a checkpoint runs code when loaded (``sharded_safety.py``): ``dcp.metadata`` is read with an
unpickler that builds DCP's metadata classes only, every shard must be a file ``meta.json`` lists, and
the shards' values are read ``weights_only``, from a directory and from S3 alike. One read whole in one
process: ``read_sharded_checkpoint`` (``sharded_reading.py``).
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time

from sagemaker_dist.runtime.checkpoint_format import (
    Checkpoint,
    CheckpointMismatchError,
    checkpoint_name,
)
from sagemaker_dist.runtime.torch.checkpointing import UnsafeCheckpointError
from sagemaker_dist.runtime.torch.sharded_reading import (  # noqa: F401 - importable from here too
    FORMAT,
    checked_meta,
    read_sharded_checkpoint,
)
from sagemaker_dist.runtime.torch.sharded_safety import (  # noqa: F401 - importable from here too
    METADATA_FILE,
    check_shards,
    load_planner,
    read_metadata_file,
    unsafe_cause,
)
from sagemaker_dist.runtime.torch.sharded_saves import (  # noqa: F401 - importable from here too
    DEFAULT_WAIT_S,
    Pending,
    StagingBuffer,
    failures,
    first_line,
    jsonable,
)
from sagemaker_dist.runtime.torch.sharded_storage import store_for

log = logging.getLogger(__name__)

SHARD_SUFFIX = ".distcp"


def is_sharded(model) -> bool:
    """True when ``fully_shard`` (FSDP2) was applied to ``model`` or any module in it."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - a PyTorch without FSDP2
        return False
    return any(isinstance(m, FSDPModule) for m in model.modules())


# --- saving and restoring on every rank --------------------------------------------------------------


class ShardedCheckpoints:
    """The sharded checkpoints of one job, on every rank; see the module's docstring.

    ``directory``: a directory, or an ``s3://bucket/prefix`` every rank writes its shard to straight
    (s3torchconnector; ``region`` default ``AWS_REGION``). ``rank``, ``local_rank``, ``world_size``: this
    process (its host's lowest local rank renames that host's copy of a directory). ``group``: the
    process group of the blocking saves and of the restore (the job's Gloo ``agreement_group``; None is
    the default group). ``async_group``: a Gloo group that only the background saves use (the loop's
    collectives never wait behind them); None: every save blocks. ``timeout_s`` bounds the wait for a
    save in flight.
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
        region: str | None = None,
    ):
        self.store = store_for(directory, region=region)
        self.directory = self.store.root
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.rank, self.local_rank, self.world_size = int(rank), int(local_rank), int(world_size)
        self.group, self.async_group = group, async_group
        self.keep = keep
        self.timeout_s = float(timeout_s)
        self.token: str | None = None  # rank 0's, agreed at the first restore or save: tmp named alike
        self.saves = 0
        self.pending: Pending | None = None
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

    def _agree_token(self) -> None:
        """Rank 0's token for this job's ``.tmp-*`` names, on every rank (once; a collective)."""
        if self.token is None:
            self.token = self._broadcast(secrets.token_hex(4), self.group)

    def _barrier(self, group) -> None:
        import torch.distributed as dist

        if self._distributed():
            dist.barrier(group=group)

    # restore -----------------------------------------------------------------------------------------

    def _seen(self) -> list[list[tuple[int, int, str]]]:
        """The complete checkpoints each rank sees: its host's directory, or rank 0's look at S3."""
        if self.store.shared:
            mine = [(c.epoch, c.step, c.path.name) for c in self.store.complete()] if self.rank == 0 else None
            return [self._broadcast(mine, self.group)]
        mine = [(c.epoch, c.step, c.path.name) for c in self.store.complete()]
        return self._gather(mine, self.group)

    def restore(self) -> tuple[int, int, Checkpoint | None, dict]:
        """``(epoch, step, checkpoint, meta)`` of the newest checkpoint complete on every rank, loaded
        into the model, optimizer and scheduler; ``(0, 0, None, {})`` without one. Call on every rank."""
        if self.rank == 0:
            self.store.clear_leftovers()
        self._barrier(self.group)
        if self.rank != 0 and self.local_rank == 0 and not self.store.shared:
            self.store.clear_leftovers()  # a host of its own (on a shared one: nothing left)
        seen = self._seen()
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
        path = self.store.location(chosen[2])
        meta = self._agreed_meta(path)
        self._load(path, meta)
        self.committed = (chosen[0], chosen[1])
        return chosen[0], chosen[1], Checkpoint(chosen[0], path, chosen[1], meta), meta

    def _agreed_meta(self, path) -> dict:
        """The chosen checkpoint's ``meta.json``, its DCP metadata checked; the same error on every rank
        when some rank cannot use it (before any rank starts DCP's collectives)."""
        meta, error = None, None
        try:
            meta = checked_meta(self.store, path)
            check_shards(self.store.metadata(path), set(meta["files"]), path / METADATA_FILE)
        except UnsafeCheckpointError as exc:
            error = ("unsafe", str(exc))
        except (CheckpointMismatchError, OSError) as exc:
            error = ("mismatch", str(exc))
        errors = [e for e in self._gather(error, self.group) if e]
        if errors and errors[0][0] == "unsafe":
            raise UnsafeCheckpointError(errors[0][1])
        if errors:
            raise CheckpointMismatchError(
                f"{errors[0][1]}: this job's model is sharded (FSDP2), which resumes from sharded "
                "checkpoints only. Give the job a fresh checkpoint location, or delete the epoch-* "
                f"checkpoints in {self.directory}"
            )
        return meta

    def _state(self) -> dict:
        """The model's (and optimizer's) state as DCP saves and loads it: this rank's shards."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model)}
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state}

    def _load(self, path, meta: dict) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        error = None
        try:
            state = self._state()
            dcp.load(
                state,
                storage_reader=self.store.reader(path, set(meta["files"])),
                planner=load_planner(),
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
        except failures() as exc:  # DCP raises its CheckpointException on every rank
            error = exc
            unsafe = unsafe_cause(exc)
            if unsafe is not None:
                raise unsafe from None
        if error is not None:
            raise CheckpointMismatchError(
                f"checkpoint {path} does not match this job's model and optimizer: "
                f"{first_line(error)}. Resume from checkpoints of this model: give the job a fresh "
                f"checkpoint location, or delete the epoch-* checkpoints in {self.directory}"
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
            "scheduler": jsonable(self.scheduler.state_dict(), "the scheduler's state_dict()")
            if self.scheduler is not None
            else None,
            "extra": jsonable(extra or {}, "extra="),
        }
        self._agree_token()
        self.saves += 1
        final = self.store.location(checkpoint_name(epoch, step))
        started = time.monotonic()
        if self.store.shared:  # written in place: what an earlier save left there goes first
            if self.rank == 0:
                self.store.clear(final)
            self._barrier(self.group)
        tmp = self.store.begin(final.name, self.token, self.saves)
        state = self._state()
        if blocking or (self.async_group is None and self._distributed()):
            error = None
            try:
                dcp.save(state, storage_writer=self.store.writer(tmp), process_group=self.group)
            except failures() as exc:  # DCP raises it on every rank: none commits
                error = f"{type(exc).__name__}: {first_line(exc)}"
            outcome = self._commit(tmp, final, epoch, step, meta, error, self.group)
            self.blocked_s.append(time.monotonic() - started)
            return self._checkpoint(epoch, step) if outcome.get("ok") else None
        writer = self.store.writer(tmp, self.staging)
        future = dcp.async_save(state, storage_writer=writer, process_group=self.async_group)
        blocked = time.monotonic() - started
        self.blocked_s.append(blocked)
        pending = Pending(epoch, step, started, blocked)

        def finish() -> None:
            error = None
            try:
                future.result(timeout=self.timeout_s)
            except failures() as exc:  # every rank's save failed alike (DCP gathers them)
                error = f"{type(exc).__name__}: {first_line(exc)}"
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
        return Checkpoint(epoch, self.store.location(checkpoint_name(epoch, step)), step)

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

    def _commit(self, tmp, final, epoch: int, step: int, meta: dict, error, group) -> dict:
        """Every rank: say what it wrote; rank 0 writes ``meta.json`` (the commit marker) and renames
        its host's copy, then the other hosts rename theirs. Returns ``{"ok": ..., "keep": [...],
        "error": ...}`` everywhere."""
        if error is None:
            try:
                files = self.store.written(tmp, self.rank)
            except Exception as exc:  # noqa: BLE001 - this rank cannot say: nobody commits
                files, error = {}, f"{type(exc).__name__}: {first_line(exc)}"
        else:
            files = {}
        reports = self._gather({"error": error, "files": files}, group)
        outcome: dict = {"ok": False, "keep": None, "error": None}
        if self.rank == 0:
            outcome = self._install_first(tmp, final, epoch, step, meta, reports)
        outcome = self._broadcast(outcome, group)
        if self.rank != 0 and self.local_rank == 0:
            self.store.follow(tmp, final, outcome)
        if not outcome["ok"]:
            self.store.discard(tmp, self.rank)
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
            listed = self.store.metadata(tmp).storage_data.values()
            missing = sorted({i.relative_path for i in listed} - set(files))
            if missing:
                return {"ok": False, "keep": None, "error": f"shard(s) {', '.join(missing)} not reported"}
            meta = {**meta, "epoch": epoch, "step": step, "files": files, "written_at": time.time()}
            self.store.commit(tmp, final, meta)
        except Exception as exc:  # noqa: BLE001 - told to every rank: none renames
            return {"ok": False, "keep": None, "error": f"{type(exc).__name__}: {first_line(exc)}"}
        log.info("sharded checkpoint %s written by %d rank(s)", final, len(reports))
        try:
            kept = self.store.prune(self.keep)
        except Exception as exc:  # noqa: BLE001 - committed all the same; older ones stay a while
            log.warning("older checkpoints in %s were not pruned: %s", self.directory, exc)
            kept = None
        return {"ok": True, "keep": kept, "error": None}

    def close(self) -> None:
        """Wait for the save in flight (at the end of training, before the process group goes)."""
        self.wait()


def _ranks(ranks) -> str:
    return ", ".join(map(str, ranks))
