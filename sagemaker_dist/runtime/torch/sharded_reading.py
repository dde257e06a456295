"""A sharded checkpoint read whole in one process, without a process group (a look, a comparison, an
export), and the check that a checkpoint's ``meta.json`` is one of a sharded checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

from sagemaker_dist.runtime.checkpoint_format import META_FILE, CheckpointMismatchError
from sagemaker_dist.runtime.torch.sharded_safety import METADATA_FILE, check_shards, load_planner
from sagemaker_dist.runtime.torch.sharded_storage import S3Uri, is_s3_uri, store_for

FORMAT = "torch-dcp"


def read_sharded_checkpoint(path: str | os.PathLike) -> dict:
    """The whole state of a sharded checkpoint in this process (``{"model": ..., "optim": ...}`` with
    full tensors, on the CPU), read as ``PipeTraining`` reads it: for a look, a comparison or an export
    to one file, without a process group. ``path``: a checkpoint directory or ``s3://`` prefix."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    location = S3Uri(str(path).rstrip("/")) if is_s3_uri(str(path)) else Path(path)
    store = store_for(location.parent)
    meta = checked_meta(store, location)
    allowed = set(meta["files"])
    check_shards(store.metadata(location), allowed, location / METADATA_FILE)
    state: dict = {}
    _load_state_dict(
        state, storage_reader=store.reader(location, allowed), planner=load_planner(full=True), no_dist=True
    )
    return state


def checked_meta(store, location) -> dict:
    """The checkpoint's ``meta.json``, when it is one of a sharded checkpoint."""
    import json

    try:
        meta = json.loads(store.read_bytes(location, META_FILE))
    except (OSError, ValueError) as exc:
        raise CheckpointMismatchError(f"{location} has no readable {META_FILE} ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or not isinstance(meta.get("files"), dict):
        raise CheckpointMismatchError(
            f"{location} is not a sharded checkpoint (its {META_FILE} says format {meta.get('format')!r})"
            if isinstance(meta, dict)
            else f"{location}: {META_FILE} is not an object"
        )
    return meta
