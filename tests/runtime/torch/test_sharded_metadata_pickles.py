"""DCP's metadata as every Python pickles it: Debian 12's Python 3.11.2 (and 3.12 on) writes an enum
member as ``getattr(its class, its name)``, where 3.11.7 writes ``its class(its value)``. The safe
reader takes both for DCP's own enums, and still refuses ``getattr`` on anything else."""

from __future__ import annotations

import enum
import io
import pickle

import pytest

from sagemaker_dist.runtime.torch.checkpointing import UnsafeCheckpointError
from sagemaker_dist.runtime.torch.sharded_safety import load_metadata, read_metadata_file

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

pytestmark = pytest.mark.torch


class _EnumsByName(pickle.Pickler):
    """Pickles as Python 3.11.2 and 3.12 do: an Enum member as ``getattr(class, name)``."""

    def reducer_override(self, obj):
        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj.name)
        return NotImplemented


def _by_name(obj) -> bytes:
    out = io.BytesIO()
    _EnumsByName(out).dump(obj)
    return out.getvalue()


@pytest.fixture
def metadata(tmp_path):
    dcp.save({"weight": torch.arange(6.0).view(2, 3), "step": torch.tensor(4)}, checkpoint_id=tmp_path)
    return read_metadata_file(tmp_path / ".metadata")


def test_metadata_with_its_enums_pickled_by_name_reads_as_the_same_metadata(metadata):
    data = _by_name(metadata)
    assert b"getattr" in data  # the pickle holds the by-name form
    assert load_metadata(io.BytesIO(data), "dcp.metadata") == metadata


def _getattr_pickle(module: str, qualname: str, name: str) -> bytes:
    """A pickle of ``getattr(module.qualname, name)``, written opcode by opcode (GLOBAL, UNICODE,
    TUPLE2, REDUCE, STOP), as a planted file would hold it."""
    return b"cbuiltins\ngetattr\n" + f"c{module}\n{qualname}\n".encode() + f"V{name}\n".encode() + b"\x86R."


METADATA = "torch.distributed.checkpoint.metadata"


@pytest.mark.parametrize(
    "module, qualname, name",
    [
        (METADATA, "Metadata", "__init__"),  # a metadata class, not an enum
        (METADATA, "_MEM_FORMAT_ENCODING", "__class__"),  # DCP's enum, not one of its members
        (METADATA, "_MEM_FORMAT_ENCODING", "_member_map_"),
        ("os", "system", "__call__"),  # no allowed class at all
    ],
)
def test_getattr_on_anything_but_a_dcp_enum_member_is_refused(module, qualname, name):
    with pytest.raises(UnsafeCheckpointError, match="is not DCP metadata built from its own classes"):
        load_metadata(io.BytesIO(_getattr_pickle(module, qualname, name)), "dcp.metadata")


def test_a_dcp_enum_member_by_name_is_that_member():
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    member = next(iter(_MEM_FORMAT_ENCODING))
    data = _getattr_pickle(METADATA, "_MEM_FORMAT_ENCODING", member.name)
    assert pickle.loads(data) is member  # the same bytes, as pickle itself reads them
    from sagemaker_dist.runtime.torch.sharded_safety import _MetadataUnpickler

    assert _MetadataUnpickler(io.BytesIO(data)).load() is member
