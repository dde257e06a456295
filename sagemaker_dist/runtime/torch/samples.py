"""WebDataset samples decoded for PyTorch: a record of ``record_format="WebDataset"`` is one sample's tar
members (``framing.tar``); ``sample_decoder`` turns it into the values a training step wants, and its
``collate`` makes batches of them.

Kinds of file, by the usual WebDataset extensions (``cls``, ``json``, ``txt``, ``npy``, ``jpg``/``png``)
or named per extension:

- ``"bytes"``: the file's bytes;
- ``"int"``: a decimal integer (WebDataset's ``cls``), batched as an int64 tensor;
- ``"json"``: parsed JSON, batched as a list;
- ``"text"``: UTF-8 text, batched as a list of ``str``;
- ``"npy"``: a numpy ``.npy`` array (no pickles; its header's shape checked against its bytes before
  anything is allocated), as a tensor, batched by ``torch.stack``;
- ``"image"``: the encoded image's bytes, batched as a ``RaggedBatch`` that ``decode_jpeg_batch``
  decodes where the model trains (on the GPU with nvJPEG, or the CPU).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence

import numpy as np

from sagemaker_dist.errors import DataError
from sagemaker_dist.runtime.framing.tar import TarError, parse_sample

KINDS = ("bytes", "int", "json", "text", "npy", "image")
# the kind an extension gets where none is named
DEFAULT_KINDS = {
    "cls": "int",
    "cls2": "int",
    "index": "int",
    "json": "json",
    "txt": "text",
    "text": "text",
    "npy": "npy",
    "jpg": "image",
    "jpeg": "image",
    "png": "image",
}
NPY_MAGIC = b"\x93NUMPY"


class SampleDecodeError(DataError):
    """A sample that does not have or hold what the decoder was told it does; names the sample's key."""


def _int(key: str, ext: str, data: bytes) -> int:
    text = data.strip()
    try:
        return int(text)
    except ValueError:
        raise SampleDecodeError(f"sample {key!r}: {ext!r} is not a decimal integer ({text[:20]!r})") from None


def _npy(key: str, ext: str, data: bytes):
    """A ``.npy`` file as an array, its header read first: the bytes must hold exactly the shape and dtype
    it claims (``numpy.load`` would set aside the claimed size before reading)."""
    import torch

    view = memoryview(data)
    if bytes(view[:6]) != NPY_MAGIC or len(data) < 10:
        raise SampleDecodeError(f"sample {key!r}: {ext!r} is not a .npy file")
    major = data[6]
    if major == 1:
        length, start = int.from_bytes(data[8:10], "little"), 10
    elif major in (2, 3):
        length, start = int.from_bytes(data[8:12], "little"), 12
    else:
        raise SampleDecodeError(f"sample {key!r}: {ext!r} is a .npy file of version {major}")
    try:
        header = ast.literal_eval(data[start : start + length].decode("latin1"))
        dtype = np.dtype(header["descr"])
        shape = tuple(int(n) for n in header["shape"])
        fortran = bool(header["fortran_order"])
    except (ValueError, SyntaxError, KeyError, TypeError) as exc:
        raise SampleDecodeError(
            f"sample {key!r}: {ext!r} has a .npy header that cannot be read ({exc})"
        ) from None
    if dtype.hasobject or any(n < 0 for n in shape):
        raise SampleDecodeError(f"sample {key!r}: {ext!r} holds Python objects or a negative shape; not read")
    count = int(np.prod(shape, dtype=object))
    body = len(data) - start - length
    if count * dtype.itemsize != body:
        raise SampleDecodeError(
            f"sample {key!r}: {ext!r} claims {shape} of {dtype} ({count * dtype.itemsize} bytes) in {body} "
            "bytes"
        )
    array = np.frombuffer(data, dtype=dtype, count=count, offset=start + length)
    array = array.reshape(shape, order="F" if fortran else "C")
    return torch.from_numpy(np.ascontiguousarray(array).astype(dtype.newbyteorder("="), copy=True))


def _decode_file(kind: str, key: str, ext: str, data: bytes):
    if kind == "bytes" or kind == "image":
        return data
    if kind == "int":
        return _int(key, ext, data)
    if kind == "text":
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SampleDecodeError(f"sample {key!r}: {ext!r} is not UTF-8 text ({exc.reason})") from None
    if kind == "json":
        try:
            return json.loads(data)
        except ValueError as exc:
            raise SampleDecodeError(f"sample {key!r}: {ext!r} is not JSON ({exc})") from None
    return _npy(key, ext, data)


def ragged(records: Sequence[bytes]):
    """``records`` as one ``RaggedBatch`` (a uint8 data tensor and int64 offsets): what
    ``decode_jpeg_batch`` decodes."""
    import torch

    from sagemaker_dist.runtime.torch.batch_cutter import RaggedBatch

    lengths = np.fromiter((len(r) for r in records), dtype=np.int64, count=len(records))
    offsets = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    data = np.frombuffer(b"".join(records), dtype=np.uint8) if len(records) else np.empty(0, np.uint8)
    return RaggedBatch(torch.from_numpy(data.copy()), torch.from_numpy(offsets))


class SampleDecoder:
    """A ``decode`` for ``PipeBatches(..., record_format="WebDataset")``, with the ``collate`` that goes
    with it; see ``sample_decoder``."""

    def __init__(
        self,
        fields: Mapping[str, str] | Sequence[str] | None = None,
        *,
        as_tuple: bool = False,
        keep_key: bool = False,
    ):
        self.fields: dict[str, str] | None = None
        if fields is not None:
            items = fields.items() if isinstance(fields, Mapping) else ((f, None) for f in fields)
            self.fields = {}
            for ext, kind in items:
                kind = kind or DEFAULT_KINDS.get(ext, "bytes")
                if kind not in KINDS:
                    raise ValueError(f"extension {ext!r}: kind {kind!r} is not one of {', '.join(KINDS)}")
                self.fields[ext] = kind
        if as_tuple and self.fields is None:
            raise ValueError("as_tuple=True needs the fields, in the order the tuple takes them")
        self.as_tuple = as_tuple
        self.keep_key = keep_key

    def _kind(self, ext: str) -> str:
        return self.fields[ext] if self.fields is not None else DEFAULT_KINDS.get(ext, "bytes")

    def __call__(self, record) -> dict | tuple:
        try:
            files = parse_sample(record)
        except TarError as exc:
            raise SampleDecodeError(f"a record is not a WebDataset sample: {exc}") from None
        key = files.pop("__key__")
        names = list(self.fields) if self.fields is not None else sorted(files)
        out = {}
        for ext in names:
            data = files.get(ext)
            if data is None:
                raise SampleDecodeError(
                    f"sample {key!r} has no {ext!r} file (it has: {', '.join(sorted(files)) or 'none'})"
                )
            out[ext] = _decode_file(self._kind(ext), key, ext, data)
        if self.keep_key:
            out["__key__"] = key
        return tuple(out[n] for n in out) if self.as_tuple else out

    def collate(self, samples: list) -> dict | tuple:
        """A batch of decoded samples: images as one ``RaggedBatch``, ints as an int64 tensor, arrays
        stacked, text, JSON and bytes as lists (``__key__``: a list of keys)."""
        if not samples:
            return () if self.as_tuple else {}
        if self.as_tuple:
            names = list(self.fields)
            return tuple(self._column(n, [s[i] for s in samples]) for i, n in enumerate(names))
        return {name: self._column(name, [s[name] for s in samples]) for name in samples[0]}

    def _column(self, ext: str, values: list):
        import torch

        if ext == "__key__":
            return values
        kind = self._kind(ext)
        if kind == "image":
            return ragged(values)
        if kind == "int":
            return torch.tensor(values, dtype=torch.int64)
        if kind == "npy":
            try:
                return torch.stack(values)
            except RuntimeError as exc:
                raise SampleDecodeError(f"the batch's {ext!r} arrays differ in shape: {exc}") from None
        return values

    def decode_batch(self, batch) -> dict | tuple:
        """A ``RaggedBatch`` of sample records (``RecordBatches(..., record_format="WebDataset")``) decoded
        and collated as ``PipeBatches`` would hand it out with this decoder."""
        data = batch.data.cpu().numpy()
        offsets = batch.offsets.tolist()
        return self.collate([self(data[a:b]) for a, b in zip(offsets[:-1], offsets[1:])])


def sample_decoder(
    fields: Mapping[str, str] | Sequence[str] | None = None,
    *,
    as_tuple: bool = False,
    keep_key: bool = False,
) -> SampleDecoder:
    """A decoder of WebDataset samples: pass it as ``decode=`` and its ``collate`` as ``collate=``.

    ``fields``: the extensions to keep (their kinds from the extension: ``cls`` an int, ``jpg``/``png``
    an image, ``json``, ``txt``, ``npy``; anything else bytes), or extension -> kind (one of ``KINDS``);
    None keeps every file of each sample, by its extension's kind. A sample without one of the fields is
    a ``SampleDecodeError`` naming its key. ``as_tuple``: values in the order of ``fields`` instead of a
    dict. ``keep_key``: the sample's key too, as ``"__key__"``.

    ```python
    decode = sample_decoder({"jpg": "image", "cls": "int"})
    batches = PipeBatches(job, 64, record_format="WebDataset", decode=decode, collate=decode.collate)
    for batch in training.batches(batches):
        images = decode_jpeg_batch(batch["jpg"], device=job.device, size=(224, 224))
        labels = batch["cls"].to(job.device)
    ```
    """
    return SampleDecoder(fields, as_tuple=as_tuple, keep_key=keep_key)
