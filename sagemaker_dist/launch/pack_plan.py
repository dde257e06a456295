"""The shards of a scanned source, before anything is written: the formats, a shard size from text, the
samples shuffled (seeded) and keyed by position, cut into shards balanced by bytes (a multiple of the job's
ranks where asked), each shard's digest of what goes into it (what a rerun compares to skip it)."""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass

from sagemaker_dist.contract.tar_format import END_OF_ARCHIVE, member_bytes
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.launch.pack_items import Item, Source

WEBDATASET = "webdataset"
TFRECORD = "tfrecord"
FORMATS = (WEBDATASET, TFRECORD)
SUFFIXES = {WEBDATASET: ".tar", TFRECORD: ".tfrecord"}
INDEX_VERSION = 1  # of the index and of the shards' digests
DEFAULT_SHARD_BYTES = 128 * 1000**2
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)


class PackError(ConfigurationError):
    """A pack request that cannot work (options, output); nothing was written."""


def parse_size(text: str | int) -> int:
    """Bytes from ``"64MB"``, ``"64MiB"``, ``"1.5GB"`` or a number of bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _SIZE.match(str(text))
        if not match:
            raise PackError(f"shard size {text!r} is not a size such as 64MB, 256MiB or 1GB")
        unit = (match.group(2) or "").lower()
        base = 1024 if "i" in unit else 1000
        scale = base ** "bkmgt".index(unit[0]) if unit and unit[0] != "b" else 1
        value = int(float(match.group(1)) * scale)
    if value < 1:
        raise PackError(f"shard size {text!r}: give 1 byte or more")
    return value


@dataclass(frozen=True)
class Sample:
    key: str
    item: Item

    def files(self) -> list[tuple[str, bytes | None]]:
        """(extension, data or None for the source file's bytes) of the sample's tar members."""
        out: list[tuple[str, bytes | None]] = [(self.item.extension, None)]
        if self.item.label is not None:
            out.append(("cls", str(self.item.label).encode()))
        if self.item.meta:
            out.append(("json", json.dumps(self.item.meta, sort_keys=True, ensure_ascii=False).encode()))
        return out

    def tar_bytes(self) -> int:
        return sum(
            member_bytes(f"{self.key}.{ext}", self.item.size if data is None else len(data))
            for ext, data in self.files()
        )


@dataclass(frozen=True)
class ShardSpec:
    index: int
    name: str
    samples: tuple[Sample, ...]
    bytes: int  # exact for WebDataset; the images' bytes plus framing, about, for TFRecord
    digest: str


@dataclass(frozen=True)
class PackPlan:
    source: Source
    format: str
    seed: int
    shards: tuple[ShardSpec, ...]
    digest: str

    @property
    def records(self) -> int:
        return sum(len(s.samples) for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)


def _sample_bytes(sample: Sample, fmt: str) -> int:
    if fmt == WEBDATASET:
        return sample.tar_bytes()
    return sample.item.size + 64  # the Example's fields and the TFRecord frame, about


def _digest(fmt: str, samples: Iterable[Sample]) -> str:
    rows = [[fmt, INDEX_VERSION]]
    rows += [[s.key, s.item.path, s.item.size, s.item.mtime_ns, s.item.label, s.item.meta] for s in samples]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def _cuts(sizes: list[int], shards: int) -> list[int]:
    """Where to cut ``sizes`` (in order) into ``shards`` runs of about equal bytes, each one non-empty."""
    total = sum(sizes)
    cuts, run, k = [0], 0, 1
    for i, size in enumerate(sizes):
        run += size
        left_items = len(sizes) - (i + 1)
        left_cuts = shards - k
        if k < shards and (run >= total * k / shards or left_items == left_cuts):
            if left_items >= left_cuts:
                cuts.append(i + 1)
                k += 1
    cuts.append(len(sizes))
    return cuts


def plan_pack(
    source: Source,
    *,
    format: str = WEBDATASET,
    shard_bytes: int | None = None,
    shards: int | None = None,
    multiple_of: int = 1,
    seed: int = 0,
) -> PackPlan:
    """The shards of ``source``: its samples shuffled with ``seed`` (so each shard mixes the classes),
    keyed by their position (``000000``, ...), cut into ``shards`` runs (or as many as make shards of
    about ``shard_bytes``), rounded up to a multiple of ``multiple_of`` (the job's ranks: every rank then
    gets as many shards), balanced by bytes."""
    if format not in FORMATS:
        raise PackError(f"format {format!r} is not one of {', '.join(FORMATS)}")
    if multiple_of < 1:
        raise PackError(f"multiple_of={multiple_of}: give 1 or more")
    order = list(source.items)
    random.Random(seed).shuffle(order)
    width = max(6, len(str(len(order) - 1)))
    samples = [Sample(f"{i:0{width}d}", item) for i, item in enumerate(order)]
    sizes = [_sample_bytes(s, format) for s in samples]
    if shards is None:
        shards = max(1, math.ceil(sum(sizes) / (shard_bytes or DEFAULT_SHARD_BYTES)))
    elif shards < 1:
        raise PackError(f"shards={shards}: give 1 or more")
    shards = math.ceil(shards / multiple_of) * multiple_of
    if shards > len(samples):
        raise PackError(
            f"{shards} shards for {len(samples)} samples: a shard holds one sample at least; give fewer "
            "shards" + (f" or a smaller multiple_of than {multiple_of}" if multiple_of > 1 else "")
        )
    cuts = _cuts(sizes, shards)
    suffix = SUFFIXES[format]
    specs = []
    for index, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        part = tuple(samples[a:b])
        extra = len(END_OF_ARCHIVE) if format == WEBDATASET else 0
        specs.append(
            ShardSpec(
                index, f"shard-{index:06d}{suffix}", part, sum(sizes[a:b]) + extra, _digest(format, part)
            )
        )
    plan_digest = hashlib.sha256(json.dumps([s.digest for s in specs]).encode()).hexdigest()
    return PackPlan(source, format, seed, tuple(specs), plan_digest)
