"""Reading a sharded (DCP) checkpoint without running code, wherever it lies (a directory, an S3 prefix).

Whoever can write the checkpoint location writes what every rank reads. ``dcp.metadata`` is a pickle,
read with an unpickler that builds DCP's metadata classes and nothing else; every shard it names must be
a file ``meta.json`` lists, inside the checkpoint, without stream transforms; the shards' plain values
are read with ``weights_only=True`` as their tensors are (DCP's own planner reads those with
``weights_only=False``). Anything else is ``UnsafeCheckpointError``, naming the file.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import IO

from sagemaker_dist.runtime.torch.checkpointing import UnsafeCheckpointError

METADATA_FILE = "dcp.metadata"

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


def _enum_member(cls, name):
    """The member ``name`` of an enum among DCP's metadata classes: Pythons whose ``Enum`` pickles a
    member as ``getattr(its class, its name)`` (Debian 12's 3.11.2, 3.12 and later) write it so; any
    other use of ``getattr`` is refused."""
    import enum

    allowed = isinstance(cls, type) and (cls.__module__, cls.__qualname__) in _METADATA_CLASSES
    if allowed and issubclass(cls, enum.Enum) and isinstance(name, str) and name in cls.__members__:
        return cls[name]
    raise pickle.UnpicklingError(
        f"getattr({getattr(cls, '__qualname__', cls)!r}, {name!r}) is not part of DCP's metadata"
    )


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata dataclasses, torch dtypes, sizes and layouts; refuses every other global
    (a pickle runs code only through the globals it names)."""

    def find_class(self, module: str, name: str):
        import torch

        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not part of DCP's metadata")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("persistent ids are not part of DCP's metadata")


def refused(path, why: str) -> UnsafeCheckpointError:
    """The error for a checkpoint file that could run code or reach outside its checkpoint."""
    return UnsafeCheckpointError(
        f"checkpoint file {path} {why}; it is refused, since loading it could run code or read files "
        "outside the checkpoint. It was not written by this job's sharded checkpoints: delete that "
        "checkpoint, or give the job a fresh checkpoint location, and check who can write the "
        "checkpoint location"
    )


def load_metadata(stream: IO[bytes], where):
    """DCP's ``Metadata`` unpickled from ``stream`` with DCP's metadata classes only (``where`` names
    the file in errors): the one way every storage reads ``dcp.metadata``."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        metadata = _MetadataUnpickler(stream).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError) as exc:
        raise refused(where, f"is not DCP metadata built from its own classes ({exc})") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise refused(where, "does not hold DCP's Metadata")
    return metadata


def read_metadata_file(path: str | os.PathLike):
    """DCP's ``Metadata`` from the file ``path``, unpickled with DCP's metadata classes only."""
    with open(path, "rb") as fh:
        return load_metadata(fh, path)


def check_shards(metadata, allowed: set[str], where):
    """``metadata`` when every shard it names is one of ``allowed`` (what ``meta.json`` lists): no path
    out of the checkpoint, no stream transforms."""
    for info in metadata.storage_data.values():
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or name not in allowed or "/" in name:
            raise refused(where, f"names shard {name!r}, which meta.json does not list")
        if getattr(info, "transform_descriptors", None):
            raise refused(where, f"asks for stream transforms {info.transform_descriptors!r}")
    return metadata


def safe_read_metadata(reader, metadata):
    """What a storage reader's ``read_metadata`` returns: ``metadata`` (already checked) stamped with
    the reader's load id, as DCP's own readers do."""
    from torch.distributed.checkpoint.metadata import StorageMeta

    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    metadata.storage_meta.load_id = reader.load_id
    return metadata


def _safe_bytes(value: io.BytesIO, what: str):
    import torch

    try:
        return torch.load(value, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise refused(what, f"holds a value other than tensors and plain values ({exc})") from None


def load_planner(full: bool = False):
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


def unsafe_cause(exc: BaseException) -> UnsafeCheckpointError | None:
    """The ``UnsafeCheckpointError`` a rank raised inside DCP, which hands it back as one of the
    ``(exception, traceback)`` pairs of its ``CheckpointException.failures``."""
    if isinstance(exc, UnsafeCheckpointError):
        return exc
    for pair in (getattr(exc, "failures", None) or {}).values():
        inner = pair[0] if isinstance(pair, tuple) and pair else pair
        if isinstance(inner, UnsafeCheckpointError):
            return UnsafeCheckpointError(str(inner))
    cause = exc.__cause__ or exc.__context__
    return unsafe_cause(cause) if isinstance(cause, BaseException) and cause is not exc else None
