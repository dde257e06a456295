"""Write WebDataset shards (tar files of samples) without the ``webdataset`` library.

``WebDatasetWriter`` writes samples, each a dict of ``"__key__"`` and extension -> value, as the tar
members ``<key>.<extension>`` (``contract.tar_format``: ustar headers, a pax header for a long or
non-ASCII name), and two zero blocks at the end. What ``webdataset.WebDataset``, GNU tar and the
runtime's ``record_format="WebDataset"`` readers read. Given a path, it fills a temporary file beside it
and renames it into place on a clean close, as ``TFRecordWriter`` does, so the path never holds half a
shard.

Values become bytes as WebDataset's default encoders make them: ``bytes`` as they are, ``str`` in
UTF-8, an ``int`` in decimal (a ``cls`` file), a ``dict`` or ``list`` as JSON, a numpy array as ``.npy``
(``numpy.save``, no pickles).
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping
from typing import BinaryIO

from sagemaker_dist.contract.tar_format import END_OF_ARCHIVE, key_and_extension, tar_member
from sagemaker_dist.launch.records import RecordEncodeError, RecordFileWriter, RecordTypeError


def encode_value(key: str, extension: str, value) -> bytes:
    """The bytes of one file of a sample (see the module's docstring for the types)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bool):
        raise RecordTypeError(f"sample {key!r}, {extension!r}: a bool; write 0/1 or a string")
    if isinstance(value, int):
        return str(value).encode("ascii")
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if type(value).__module__ == "numpy" and hasattr(value, "dtype"):
        import numpy as np

        out = io.BytesIO()
        np.save(out, value, allow_pickle=False)
        return out.getvalue()
    raise RecordTypeError(
        f"sample {key!r}, {extension!r}: a {type(value).__name__}; give bytes, str, int, dict, list or a "
        "numpy array"
    )


def check_sample_name(key: object, extension: object) -> str:
    """``<key>.<extension>`` where a reader splits it back into the same key and extension, else an error."""
    if not isinstance(key, str) or not key:
        raise RecordEncodeError(f"a sample's '__key__' is a non-empty string, not {key!r}")
    if not isinstance(extension, str) or not extension:
        raise RecordEncodeError(f"sample {key!r}: an extension is a non-empty string, not {extension!r}")
    name = f"{key}.{extension}"
    if "\0" in name or key_and_extension(name) != (key, extension.lower()) or extension != extension.lower():
        raise RecordEncodeError(
            f"sample {key!r}, extension {extension!r}: readers would not read {name!r} back as this key and "
            "extension (the key's last path component may hold no dot, the extension no '/'; extensions are "
            "lower case)"
        )
    return name


class WebDatasetWriter(RecordFileWriter):
    """Write samples as one WebDataset shard (a tar file).

    ``write(sample)`` appends one sample: ``sample["__key__"]`` is its key, every other item a file
    ``<key>.<extension>``; ``close()`` writes the end-of-archive blocks and (given a path) renames the
    temporary file into place; ``discard()`` (what an exception in the ``with`` block does) drops it.
    ``records`` counts samples, ``bytes`` the tar's bytes. ``mtime`` is every member's modification time
    (seconds; default 0, so that the same samples make the same bytes).

    ```python
    with WebDatasetWriter("shard-000000.tar") as out:
        for i, (jpeg, label) in enumerate(samples):
            out.write({"__key__": f"{i:06d}", "jpg": jpeg, "cls": label})
    ```
    """

    def __init__(self, path_or_fileobj: str | os.PathLike | BinaryIO, *, mtime: int = 0):
        super().__init__(path_or_fileobj)
        self.mtime = int(mtime)

    def write(self, sample: Mapping[str, object]) -> None:  # type: ignore[override]
        """Append one sample (its files in the dict's order)."""
        if self._closed:
            raise RecordEncodeError(f"write() on a closed {type(self).__name__}")
        if not isinstance(sample, Mapping):
            raise RecordTypeError(
                f"a sample is a dict of '__key__' and extension -> value, not a {type(sample).__name__}"
            )
        key = sample.get("__key__")
        members = [(ext, value) for ext, value in sample.items() if not str(ext).startswith("__")]
        if not members:
            raise RecordEncodeError(f"sample {key!r} has no file (only '__key__' and other '__' items)")
        out = []
        for ext, value in members:
            name = check_sample_name(key, ext)
            out.append(tar_member(name, encode_value(key, ext, value), self.mtime))
        data = b"".join(out)
        self._file.write(data)
        self.records += 1
        self.bytes += len(data)

    def close(self) -> None:
        if not self._closed:
            self._file.write(END_OF_ARCHIVE)
            self.bytes += len(END_OF_ARCHIVE)
        super().close()
