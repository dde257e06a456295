"""Rank-0 checkpoints of a DDP job, in the same directories as the TensorFlow ones, restored and broadcast.

A checkpoint is ``<root>/checkpoints/epoch-NNNNN`` (after NNNNN whole epochs) or
``epoch-NNNNN-step-SSSSSS`` (inside epoch NNNNN after SSSSSS steps: a stop), holding ``state.pt``
(model, optimizer, scheduler, what the script adds) and ``meta.json`` listing every file and its
size (``runtime/checkpoint_format.py``: the same names, the same completeness rule, the same atomic
write). It is written under a ``.tmp-*`` name, fsynced and renamed into place: a crash or a
half-synced S3 copy never looks complete. Only rank 0 writes. At start every rank calls
``restore_torch_checkpoint``: rank 0 loads the newest complete checkpoint, and every rank gets its
position, the optimizer's and scheduler's state (one object broadcast) and the model's tensors (a
broadcast each). A checkpoint of another model fails on every rank (``CheckpointMismatchError``),
never half-loaded.

Whoever can write the checkpoint prefix in S3 writes what rank 0 loads, so ``state.pt`` is loaded with
``weights_only=True``: tensors and plain values only, never an object whose unpickling runs code. A
file holding anything else is refused, naming it (``UnsafeCheckpointError``), and ``extra`` and the
scheduler's state are checked for the same at save time, so a job never writes what it cannot resume.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sagemaker_dist.errors import DataError
from sagemaker_dist.runtime.checkpoint_format import (
    Checkpoint,
    CheckpointMismatchError,
    latest_checkpoint,
    remove_stale_temporaries,
    write_checkpoint,
)

STATE_FILE = "state.pt"
FORMAT = "torch"


class UnsafeCheckpointError(CheckpointMismatchError):
    """A ``state.pt`` holding objects beyond tensors and plain values: loading it would run its code."""


class CheckpointReadError(DataError):
    """A complete checkpoint whose ``state.pt`` cannot be read (I/O, memory) or is damaged."""


_ERRORS = {"unsafe": UnsafeCheckpointError, "read": CheckpointReadError, "mismatch": CheckpointMismatchError}


def unwrapped(model):
    """The module under a ``DistributedDataParallel`` (or ``torch.compile``) wrapper, else ``model``."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if inner is None:
            return model
        model = inner


def save_torch_checkpoint(
    directory: str | os.PathLike,
    epoch: int,
    step: int = 0,
    *,
    model,
    optimizer=None,
    scheduler=None,
    extra: dict | None = None,
    keep: int | None = 3,
) -> Checkpoint:
    """Write the checkpoint of ``epoch`` whole epochs and ``step`` steps of the next (rank 0 only),
    atomically (``checkpoint_format.write_checkpoint``); keep the newest ``keep`` (None: all). Returns it."""
    import torch

    state = {
        "model": unwrapped(model).state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "extra": extra or {},
        "epoch": int(epoch),
        "step": int(step),
    }
    _check_loadable(state["extra"], "extra=", "tensors, numbers, strings, lists, tuples and dicts of them")
    _check_loadable(
        state["scheduler"], "the scheduler's state_dict()", "a scheduler whose state is plain values"
    )
    meta = {"format": FORMAT, "extra": _jsonable(extra or {})}
    return write_checkpoint(
        directory, epoch, step, lambda tmp: torch.save(state, tmp / STATE_FILE), meta, keep=keep
    )


def _check_loadable(value: Any, what: str, fix: str) -> None:
    """Refuse at save time what ``weights_only=True`` would refuse at resume (an arbitrary object)."""
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch's UnpicklingError or what a rebuilt object raised
        raise UnsafeCheckpointError(
            f"{what} holds objects a checkpoint cannot carry: it is loaded without running code "
            f"(weights_only=True), which refuses them ({_first_line(exc)}); pass {fix}"
        ) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _load_state(path):
    """``state.pt`` loaded as tensors and plain values only; anything else is ``UnsafeCheckpointError``."""
    import pickle

    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, MemoryError) as exc:
        raise CheckpointReadError(
            f"checkpoint file {path} could not be read ({type(exc).__name__}: {_first_line(exc)}); check "
            "the disk and memory, or delete that checkpoint directory to resume from the one before"
        ) from None
    except pickle.UnpicklingError as exc:
        if "Weights only load failed" not in str(exc):  # not a refusal: bytes that are no pickle at all
            raise _damaged(path, exc) from None
        raise UnsafeCheckpointError(
            f"checkpoint file {path} holds objects other than tensors and plain values "
            f"({_first_line(exc)}); it is refused, since loading it would run code from it. It was not "
            "written by save_torch_checkpoint from tensors and plain values: if you trust it, load it "
            "yourself; otherwise delete that checkpoint directory, or give the job a fresh checkpoint "
            "location, and check who can write the checkpoint prefix"
        ) from None
    except Exception as exc:  # noqa: BLE001 - torch's zip reader and unpickler raise RuntimeError, EOFError, ...
        raise _damaged(path, exc) from None


def _damaged(path, exc: BaseException) -> CheckpointReadError:
    return CheckpointReadError(
        f"checkpoint file {path} is damaged ({type(exc).__name__}: {_first_line(exc)}), though its size is "
        f"the one meta.json lists; delete {Path(path).parent} to resume from the checkpoint before it"
    )


def _jsonable(value: Any):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def restore_torch_checkpoint(
    directory: str | os.PathLike,
    *,
    model,
    optimizer=None,
    scheduler=None,
    rank: int,
    group=None,
) -> tuple[int, int, Checkpoint | None, dict]:
    """``(epoch, step, checkpoint, extra)``: where training resumes, on every rank (call it on all).

    Rank 0 removes leftovers of a crashed writer, loads the newest complete checkpoint into
    ``model`` (unwrapped from DDP), ``optimizer`` and ``scheduler``; the position, the optimizer's and
    scheduler's state and ``extra`` reach the other ranks in one object broadcast on ``group`` (the
    job's Gloo agreement group), the model's tensors in a broadcast each on the default group.
    ``(0, 0, None, {})`` without a checkpoint. Other ranks get ``checkpoint`` None."""
    import torch
    import torch.distributed as dist

    module = unwrapped(model)
    payload: dict[str, Any] = {"position": (0, 0), "error": None, "found": False}
    found = None
    if rank == 0:
        remove_stale_temporaries(directory)
        found = latest_checkpoint(directory)
        if found is not None:
            payload["position"] = found.position
            payload["found"] = True
            try:
                if found.meta.get("format") != FORMAT:
                    raise ValueError(f"it is a {found.meta.get('format', 'TensorFlow')!r} checkpoint")
                state = _load_state(found.path / STATE_FILE)
                if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
                    raise ValueError(f"{STATE_FILE} is not a dict with the model's state_dict")
                module.load_state_dict(state["model"])
                if optimizer is not None and state.get("optimizer") is not None:
                    optimizer.load_state_dict(state["optimizer"])
                if scheduler is not None and state.get("scheduler") is not None:
                    scheduler.load_state_dict(state["scheduler"])
                payload.update(
                    optimizer=state.get("optimizer"),
                    scheduler=state.get("scheduler"),
                    extra=state.get("extra"),
                )
            except (UnsafeCheckpointError, CheckpointReadError) as exc:  # every rank raises it below
                payload.update(
                    error=str(exc), kind="unsafe" if isinstance(exc, UnsafeCheckpointError) else "read"
                )
            except Exception as exc:  # every rank raises below: none waits for a broadcast that never comes
                payload["kind"] = "mismatch"
                payload["error"] = (
                    f"checkpoint {found.path} does not match this job's model and optimizer: {exc}. Resume "
                    "from checkpoints of this model: give the job a fresh checkpoint location, or delete "
                    f"the epoch-* directories in {found.path.parent}"
                )
    distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if distributed:
        box = [payload]
        dist.broadcast_object_list(box, src=0, group=group)
        payload = box[0]
    if payload["error"]:
        raise _ERRORS[payload.get("kind", "mismatch")](payload["error"])
    if distributed and payload["found"]:
        if rank != 0:
            if optimizer is not None and payload.get("optimizer") is not None:
                optimizer.load_state_dict(payload["optimizer"])
            if scheduler is not None and payload.get("scheduler") is not None:
                scheduler.load_state_dict(payload["scheduler"])
        with torch.no_grad():
            for tensor in module.state_dict().values():
                dist.broadcast(tensor, src=0)
    epoch, step = payload["position"]
    return int(epoch), int(step), found, dict(payload.get("extra") or {})
