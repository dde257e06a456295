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
"""

from __future__ import annotations

import json
import os
from typing import Any

from sagemaker_dist.runtime.checkpoint_format import (
    Checkpoint,
    CheckpointMismatchError,
    latest_checkpoint,
    remove_stale_temporaries,
    write_checkpoint,
)

STATE_FILE = "state.pt"
FORMAT = "torch"


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
    meta = {"format": FORMAT, "extra": _jsonable(extra or {})}
    return write_checkpoint(
        directory, epoch, step, lambda tmp: torch.save(state, tmp / STATE_FILE), meta, keep=keep
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
                state = torch.load(found.path / STATE_FILE, map_location="cpu", weights_only=False)
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
            except Exception as exc:  # every rank raises below: none waits for a broadcast that never comes
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
        raise CheckpointMismatchError(payload["error"])
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
