"""Pack an image set (a local folder or an S3 prefix) into balanced WebDataset or TFRecord shards, in S3
or a local folder.

The source is one of three layouts, local or in S3 (``s3://bucket/images/``, ``s3://bucket/list.jsonl``:
``launch.pack_s3``):

- a folder with one sub-folder per class (an ImageFolder): ``root/<class>/<image>``; the classes are
  the sub-folders' names in sorted order, labels their positions;
- a JSON Lines file, one object per sample: ``{"path": "img/1.jpg", "label": 3, ...}`` (the path
  relative to the file's folder; the other fields go into the sample's ``json`` file);
- a CSV file of ``path,label`` rows (a header row ``path,label`` is allowed).

A label is an int (kept as it is), or a name (names sorted, labels their positions; the index lists
them). ``scan_source`` lists and checks the samples before anything is written: a path that climbs out
of the source's folder (``..``, an absolute path, a link that leads out) is an error; a file that is
missing, unreadable or not the image its extension says, and a row without a label, are skipped and
reported (``strict=True`` makes them errors). ``plan_pack`` shuffles the samples (seeded) and cuts them
into shards balanced by bytes, of a chosen size or number (a multiple of the job's ranks where asked).
``pack`` writes each shard fully to a local file, then moves it into place or uploads it through boto3's
transfer manager (uploads in parallel); an S3 object is only ever a whole shard. After each shard a small
marker records its digest (what went into it), so a rerun of the same plan skips the shards already
complete. The index (``index.json``: shards, records, bytes, classes, what was skipped) is written last,
so a pack without its index is not finished.

Output layout, under ``OUTPUT`` (``s3://bucket/prefix/`` or a folder): ``shards/shard-000000.tar``
(or ``.tfrecord``), ..., the channel's data and nothing else; ``index.json``; ``.pack/`` (the markers).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sagemaker_dist.contract.paths import contained_path
from sagemaker_dist.contract.tar_format import END_OF_ARCHIVE, member_bytes
from sagemaker_dist.errors import ConfigurationError, DataError
from sagemaker_dist.launch.pack_items import (  # noqa: F401 - the source's model, re-exported
    CSV,
    EXTENSION_ALIASES,
    IMAGE_MAGIC,
    IMAGEFOLDER,
    JSONL,
    LAYOUTS,
    Item,
    PackInputError,
    Skipped,
    Source,
    _csv_rows,
    _jsonl_rows,
    _labelled,
)

WEBDATASET = "webdataset"
TFRECORD = "tfrecord"
FORMATS = (WEBDATASET, TFRECORD)
SUFFIXES = {WEBDATASET: ".tar", TFRECORD: ".tfrecord"}
SHARDS_DIR = "shards"
INDEX = "index.json"
MARKERS_DIR = ".pack"
INDEX_VERSION = 1
DEFAULT_SHARD_BYTES = 128 * 1000**2
SKIPPED_IN_INDEX = 1000  # skipped files listed in the index (all are counted)
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}


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


def _readable_image(path: str, ext: str | None) -> tuple[str | None, os.stat_result | None]:
    """``(why, stat)``: why ``path`` cannot be packed (None: it can: missing, not a regular file (a FIFO is
    never opened), unreadable, not the image its name says), and its stat."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file", None
        with open(path, "rb") as f:
            head = f.read(16)
    except FileNotFoundError:
        return "missing", None
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})", None
    magic = IMAGE_MAGIC.get(ext or "")
    if magic is not None and not head.startswith(magic):
        return f"not a {ext.upper()} file (its first bytes are {head[:4]!r})", None
    return None, st


def _checked_file(root: Path, rel: str, what: str) -> Path:
    """``root/rel``, refused (an error, not a skip) where the name or a link leads out of ``root``."""
    return contained_path(
        root,
        rel,
        what,
        fix="list only files inside the source's folder",
        error=PackInputError,
    )


def _stat_item(
    root: Path, rel: str, label: int | None, meta, what: str, skipped: list, check_magic: bool, walked=False
):
    """The item of ``root/rel``, or None (and a ``Skipped``). ``walked``: ``rel`` comes from a walk of
    ``root`` that follows no link to a folder, so it stays inside and only the file itself may be a link
    (checked, and resolved, only then)."""
    full = os.path.join(root, rel)
    if walked and not os.path.islink(full):
        real = os.path.abspath(full)
    else:
        real = os.path.realpath(_checked_file(root, rel, what))
        rel = os.path.normpath(rel)
    ext = rel.rpartition(".")[2].lower() if "." in rel.rpartition("/")[2] else ""
    why, st = _readable_image(full, ext if check_magic else None)
    if why is not None:
        skipped.append(Skipped(rel, why))
        return None
    return Item(rel, st.st_size, st.st_mtime_ns, label, meta, real)


def scan_source(
    source: str | os.PathLike,
    *,
    path_field: str = "path",
    label_field: str = "label",
    strict: bool = False,
    client=None,
) -> Source:
    """List and check the samples of ``source`` (a folder of class folders, a ``.jsonl`` or a ``.csv``
    file; local, or in S3 through ``client``); see the module's docstring. Nothing is read beyond each
    file's first bytes."""
    if str(source).startswith("s3://"):
        from sagemaker_dist.launch.pack_s3 import scan_s3_source

        found = scan_s3_source(str(source), path_field, label_field, client)
    else:
        found = _scan_local(Path(source), path_field, label_field)
    if strict and found.skipped:
        first = found.skipped[0]
        raise PackInputError(
            f"{len(found.skipped)} file(s) of {str(source)!r} cannot be packed, the first {first.path!r}: "
            f"{first.reason} (without --strict they are skipped and reported)"
        )
    if not found.items:
        why = f"; {len(found.skipped)} skipped, the first {found.skipped[0]}" if found.skipped else ""
        raise PackInputError(f"source {str(source)!r} holds no sample to pack{why}")
    return found


def _scan_local(source: Path, path_field: str, label_field: str) -> Source:
    if source.is_dir():
        found = _scan_imagefolder(source)
    elif source.is_file() and source.suffix.lower() in (".jsonl", ".ndjson"):
        found = _scan_rows(source, JSONL, _jsonl_rows(source, path_field, label_field))
    elif source.is_file() and source.suffix.lower() == ".csv":
        found = _scan_rows(source, CSV, _csv_rows(source, path_field, label_field))
    elif not source.exists():
        raise PackInputError(f"source {str(source)!r} does not exist")
    else:
        raise PackInputError(
            f"source {str(source)!r} is not a folder of class folders, a .jsonl file or a .csv file"
        )
    return found


def _scan_imagefolder(root: Path) -> Source:
    classes = sorted(
        p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and not p.is_symlink()
    )
    items: list[Item] = []
    skipped: list[Skipped] = []
    ignored = 0
    for entry in sorted(root.iterdir()):
        if entry.is_file() and not entry.name.startswith("."):
            skipped.append(Skipped(entry.name, "not in a class folder (root/<class>/<image>)"))
        elif entry.is_symlink() and entry.is_dir():
            _checked_file(root, entry.name, "class folder")
            skipped.append(Skipped(entry.name, "a link to a folder (links to folders are not followed)"))
    top = len(str(root)) + 1
    for label, name in enumerate(classes):
        for here, dirs, files in os.walk(os.path.join(root, name), followlinks=False):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for file in sorted(files):
                if file.startswith("."):
                    continue
                rel = f"{here[top:]}/{file}"
                ext = file.rpartition(".")[2].lower() if "." in file else ""
                if ext not in IMAGE_MAGIC:
                    ignored += 1
                    continue
                item = _stat_item(root, rel, label, None, "ImageFolder file", skipped, True, walked=True)
                if item is not None:
                    items.append(item)
    if not classes:
        raise PackInputError(f"folder {str(root)!r} has no class folders (root/<class>/<image>)")
    return Source(root, IMAGEFOLDER, items, classes, skipped, ignored)


def _scan_rows(file: Path, layout: str, rows: Iterable) -> Source:
    root = file.parent
    skipped: list[Skipped] = []
    staged = []
    for number, rel, label, meta in rows:
        if label is None:
            skipped.append(Skipped(rel, f"no label ({file.name}, line {number})"))
            continue
        ext = PurePosixPath(rel).suffix[1:].lower()
        item = _stat_item(
            root, rel, None, meta, f"{file.name}, line {number}: path", skipped, ext in IMAGE_MAGIC
        )
        if item is not None:
            staged.append((item, label))
    return _labelled(root, file, layout, staged, skipped)


# --- the plan -------------------------------------------------------------------------------------


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


# --- writing a shard ------------------------------------------------------------------------------


def _read_source(source: Source, item: Item) -> bytes:
    """The file's bytes: the file the scan resolved (a link put there since is not followed), still a
    regular file of the size the scan saw."""
    if source.client is not None:
        from sagemaker_dist.launch.pack_s3 import read_s3_item

        return read_s3_item(source.client, item)
    path = item.real or _checked_file(source.root, item.path, "file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise PackInputError(f"{path} is no longer a regular file; run again")
            data = f.read(item.size + 1)
    except OSError as exc:
        raise PackInputError(f"{path}: could not be read while packing ({exc.strerror or exc})") from None
    if len(data) != item.size:
        raise PackInputError(
            f"{path} changed while it was packed ({item.size} bytes when listed, now not); run again"
        )
    return data


def write_shard(plan: PackPlan, shard: ShardSpec, path: str | os.PathLike) -> tuple[int, int]:
    """Write one shard to ``path`` (a temporary file beside it, renamed when whole): (records, bytes)."""
    if plan.format == WEBDATASET:
        from sagemaker_dist.launch.tar_shards import WebDatasetWriter

        with WebDatasetWriter(path) as out:
            for sample in shard.samples:
                record = {"__key__": sample.key}
                for ext, data in sample.files():
                    record[ext] = _read_source(plan.source, sample.item) if data is None else data
                out.write(record)
        if out.bytes != shard.bytes:  # pragma: no cover - the plan's sizes are the writer's
            raise PackError(f"{shard.name}: {out.bytes} bytes written where {shard.bytes} were planned")
        return out.records, out.bytes
    from sagemaker_dist.launch.records import TFRecordWriter, encode_example

    with TFRecordWriter(path) as out:
        for sample in shard.samples:
            features = {"image": _read_source(plan.source, sample.item), "key": sample.key}
            features["format"] = sample.item.extension
            if sample.item.label is not None:
                features["label"] = sample.item.label
            out.write(encode_example(features))
    return out.records, out.bytes


# --- where shards go ------------------------------------------------------------------------------


class _LocalStore:
    """OUTPUT as a local folder."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.where = str(self.root)

    def uri(self, name: str) -> str:
        return str(self.root / name)

    def prepare(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise PackError(f"output {self.where!r} is a file; give a folder or an s3:// prefix")
        (self.root / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
        (self.root / MARKERS_DIR).mkdir(exist_ok=True)

    def staging(self) -> str:
        staging = self.root / MARKERS_DIR / "staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        return str(staging)

    def list(self, folder: str) -> dict[str, int]:
        here = self.root / folder
        if not here.is_dir():
            return {}
        return {p.name: p.stat().st_size for p in here.iterdir() if p.is_file()}

    def get(self, name: str) -> bytes | None:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            return None

    def put_bytes(self, name: str, data: bytes) -> None:
        path = self.root / name
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_bytes(data)
        os.replace(temporary, path)

    def put_file(self, local: str, name: str, done: Callable[[], None]) -> Future:
        os.replace(local, self.root / name)
        future: Future = Future()
        done()
        future.set_result(None)
        return future

    def delete(self, names: list[str]) -> None:
        for name in names:
            (self.root / name).unlink(missing_ok=True)

    def close(self, staging: str | None, cancel: bool = False) -> None:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)


class _S3Store:
    """OUTPUT as an S3 prefix: uploads through one boto3 transfer manager (parallel, multipart above
    its threshold); an object appears whole or not at all."""

    def __init__(self, uri: str, client=None, concurrency: int = 8):
        from sagemaker_dist.aws.s3_objects import make_client
        from sagemaker_dist.contract.s3_uri import parse_s3_uri

        self.bucket, prefix = parse_s3_uri(uri if uri.endswith("/") else uri + "/")
        self.prefix = prefix
        self.where = f"s3://{self.bucket}/{prefix}"
        self.client = client or make_client(max_pool_connections=max(10, 2 * concurrency))
        self.concurrency = concurrency
        self._manager = None

    def uri(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{name}"

    def _call(self, action: str, fn, *args, **kwargs):
        from sagemaker_dist.aws.s3_objects import s3_call

        return s3_call(action, self.bucket, fn, *args, **kwargs)

    def prepare(self) -> None:
        self._call(f"reach {self.where}", self.client.head_bucket, Bucket=self.bucket)

    def staging(self) -> str:
        return tempfile.mkdtemp(prefix="sagemaker-dist-pack-")

    def list(self, folder: str) -> dict[str, int]:
        prefix = f"{self.prefix}{folder}/"
        found = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        for page in self._call(f"list {self.uri(folder)}/", list, pages):
            for item in page.get("Contents", ()):
                found[item["Key"][len(prefix) :]] = int(item["Size"])
        return found

    def get(self, name: str) -> bytes | None:
        from botocore.exceptions import ClientError

        def read():
            try:
                return self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"].read()
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    return None
                raise

        return self._call(f"read {self.uri(name)}", read)

    def put_bytes(self, name: str, data: bytes) -> None:
        self._call(
            f"write {self.uri(name)}",
            self.client.put_object,
            Bucket=self.bucket,
            Key=self.prefix + name,
            Body=data,
        )

    def put_file(self, local: str, name: str, done: Callable[[], None]) -> Future:
        from boto3.s3.transfer import TransferConfig, create_transfer_manager
        from s3transfer.subscribers import BaseSubscriber

        if self._manager is None:
            config = TransferConfig(max_concurrency=self.concurrency, multipart_threshold=64 * 1024**2)
            self._manager = create_transfer_manager(self.client, config)

        class _Done(BaseSubscriber):
            def on_done(self, future, **kwargs):
                done()

        return self._manager.upload(local, self.bucket, self.prefix + name, subscribers=[_Done()])

    def delete(self, names: list[str]) -> None:
        for start in range(0, len(names), 1000):
            objects = [{"Key": self.prefix + n} for n in names[start : start + 1000]]
            self._call(
                f"delete under {self.where}",
                self.client.delete_objects,
                Bucket=self.bucket,
                Delete={"Objects": objects},
            )

    def close(self, staging: str | None, cancel: bool = False) -> None:
        try:
            if self._manager is not None:
                if cancel:  # (s3transfer's shutdown(cancel=True) passes its arguments in the wrong order)
                    error = PackError("pack stopped: uploads cancelled")
                    self._manager.__exit__(type(error), error, None)
                else:
                    self._manager.shutdown()
        finally:
            if staging:
                shutil.rmtree(staging, ignore_errors=True)


def _store(output: str, client=None, concurrency: int = 8):
    if str(output).startswith("s3://"):
        return _S3Store(str(output), client, concurrency)
    return _LocalStore(output)


# --- pack -----------------------------------------------------------------------------------------


@dataclass
class PackResult:
    """What ``pack`` did: the index it wrote (and its address), how many shards it wrote and how many
    it found complete already."""

    index: dict
    index_uri: str
    shards_uri: str
    written: int
    reused: int
    skipped: list[Skipped]

    def __str__(self) -> str:
        idx = self.index
        classes = f", {len(idx['classes'])} classes" if idx.get("classes") else ""
        return (
            f"packed {idx['records']} samples{classes} into {len(idx['shards'])} {idx['format']} shard(s), "
            f"{idx['bytes'] / 1e6:.1f} MB, at {self.shards_uri} ({self.written} written, {self.reused} "
            f"already complete); index {self.index_uri}"
        )


def _marker(shard: ShardSpec, size: int) -> bytes:
    return json.dumps({"digest": shard.digest, "bytes": size, "records": len(shard.samples)}).encode()


def _complete(store, plan: PackPlan) -> set[int]:
    """The shards already in place from an earlier run of this plan: the shard there with the size its
    marker recorded, and the marker's digest the plan's."""
    have = store.list(SHARDS_DIR)
    markers = store.list(MARKERS_DIR)
    done = set()
    for shard in plan.shards:
        if shard.name not in have or f"{shard.name}.json" not in markers:
            continue
        raw = store.get(f"{MARKERS_DIR}/{shard.name}.json")
        try:
            marker = json.loads(raw or b"{}")
        except ValueError:
            continue
        if marker.get("digest") == shard.digest and marker.get("bytes") == have[shard.name]:
            done.add(shard.index)
    return done


def _index(plan: PackPlan, sizes: dict[int, tuple[int, int]]) -> dict:
    source = plan.source
    shards = [
        {
            "name": f"{SHARDS_DIR}/{s.name}",
            "records": sizes[s.index][0],
            "bytes": sizes[s.index][1],
            "digest": s.digest,
        }
        for s in plan.shards
    ]
    return {
        "version": INDEX_VERSION,
        "format": plan.format,
        "record_format": "WebDataset" if plan.format == WEBDATASET else "TFRecord",
        "shards": shards,
        "records": sum(s["records"] for s in shards),
        "bytes": sum(s["bytes"] for s in shards),
        "classes": source.classes,
        "labels": sorted(
            {s.item.label for sh in plan.shards for s in sh.samples if s.item.label is not None}
        ),
        "source": {"layout": source.layout, "path": str(source.root)},
        "seed": plan.seed,
        "plan": plan.digest,
        "skipped": [{"path": s.path, "reason": s.reason} for s in source.skipped[:SKIPPED_IN_INDEX]],
        "skipped_count": len(source.skipped),
    }


def pack(
    plan: PackPlan,
    output: str | os.PathLike,
    *,
    workers: int = 4,
    concurrency: int = 8,
    resume: bool = True,
    client=None,
    progress: bool | None = None,
) -> PackResult:
    """Write ``plan``'s shards under ``output`` (``s3://bucket/prefix/`` or a folder), then its index.

    ``workers`` shards are written at once (each fully, to a local file), ``concurrency`` uploads run in
    boto3's transfer manager. ``resume``: shards already complete from an earlier run of the same plan
    are kept, not written again. Shard files of an earlier, other plan (``shard-*``) are deleted before
    the index is written; any other file under ``shards/`` is an error before anything is written
    (the folder is the channel's data). ``progress``: a bar of the shard bytes done (None: where someone
    watches).
    """
    from sagemaker_dist.aws.progress import progress_bar

    store = _store(str(output), client, concurrency)
    store.prepare()
    present = store.list(SHARDS_DIR)
    planned = {s.name for s in plan.shards}
    foreign = sorted(
        n for n in present if n not in planned and not re.fullmatch(r"shard-\d+\.(tar|tfrecord)", n)
    )
    if foreign:
        raise PackError(
            f"{store.uri(SHARDS_DIR)}/ holds {len(foreign)} file(s) pack did not write, the first "
            f"{foreign[0]!r}; that folder is the channel's data: choose another output, or remove them"
        )
    old_index = store.get(INDEX)
    if old_index is not None:
        store.delete([INDEX])  # the shard set changes or is checked again: nothing looks complete meanwhile
    done = _complete(store, plan) if resume else set()
    todo = [s for s in plan.shards if s.index not in done]
    sizes: dict[int, tuple[int, int]] = {
        s.index: (len(s.samples), present[s.name]) for s in plan.shards if s.index in done
    }
    staging = store.staging()
    lock = threading.Lock()
    in_flight = threading.BoundedSemaphore(max(1, workers) + max(1, concurrency))  # shard files staged
    uploads: list[tuple[ShardSpec, int, int, Future]] = []
    failed = True
    try:
        bar_args = {"desc": f"pack to {store.where}", "unit": "B", "unit_scale": True, "enabled": progress}
        with progress_bar(total=plan.bytes, **bar_args) as bar:
            bar.update(sum(plan.shards[i].bytes for i in done))

            def one(shard: ShardSpec) -> None:
                in_flight.acquire()
                local = os.path.join(staging, shard.name)
                try:
                    records, nbytes = write_shard(plan, shard, local)
                except BaseException:
                    in_flight.release()
                    raise

                def uploaded() -> None:  # in the transfer's thread: nothing here may raise
                    with lock:
                        bar.update(shard.bytes)
                    in_flight.release()

                future = store.put_file(local, f"{SHARDS_DIR}/{shard.name}", uploaded)
                with lock:
                    uploads.append((shard, records, nbytes, future))

            with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
                futures = [pool.submit(one, shard) for shard in todo]
                _, pending = wait(futures, return_when=FIRST_EXCEPTION)
                for f in pending:
                    f.cancel()
            errors = [f.exception() for f in futures if not f.cancelled() and f.exception() is not None]
            if errors:
                raise errors[0]
            for shard, records, nbytes, future in sorted(uploads, key=lambda u: u[0].index):
                future.result()
                store.put_bytes(f"{MARKERS_DIR}/{shard.name}.json", _marker(shard, nbytes))
                sizes[shard.index] = (records, nbytes)
        stale = sorted(n for n in present if n not in planned)
        if stale:
            store.delete([f"{SHARDS_DIR}/{n}" for n in stale] + [f"{MARKERS_DIR}/{n}.json" for n in stale])
        index = _index(plan, sizes)
        store.put_bytes(INDEX, json.dumps(index, indent=1).encode())  # last: the pack is complete
        failed = False
    finally:
        store.close(staging, cancel=failed)
    return PackResult(
        index, store.uri(INDEX), store.uri(SHARDS_DIR) + "/", len(todo), len(done), list(plan.source.skipped)
    )


def read_pack_index(output: str | os.PathLike, client=None) -> dict:
    """The index of a finished pack under ``output``; a DataError where there is none (never written,
    or a pack that did not finish)."""
    store = _store(str(output), client)
    raw = store.get(INDEX)
    if raw is None:
        raise DataError(f"no {INDEX} under {store.where}: no pack finished there (run sagemaker-dist pack)")
    return json.loads(raw)


def pack_dataset(
    source: str | os.PathLike,
    output: str | os.PathLike,
    *,
    format: str = WEBDATASET,
    shard_size: int | str | None = None,
    shards: int | None = None,
    multiple_of: int = 1,
    seed: int = 0,
    path_field: str = "path",
    label_field: str = "label",
    strict: bool = False,
    workers: int = 4,
    concurrency: int = 8,
    resume: bool = True,
    client=None,
    progress: bool | None = None,
) -> PackResult:
    """``sagemaker-dist pack`` from Python: list and check ``source`` (a folder of class folders, a
    ``.jsonl`` or a ``.csv`` file), plan its shards (``shards``, or about ``shard_size`` bytes each,
    rounded up to a multiple of ``multiple_of``; shuffled with ``seed``), and write them under
    ``output`` (``s3://bucket/prefix/`` or a folder) with the index last. Returns a ``PackResult``:
    ``result.shards_uri`` is the channel's data (``--train``), ``result.index`` the index."""
    found = scan_source(source, path_field=path_field, label_field=label_field, strict=strict, client=client)
    plan = plan_pack(
        found,
        format=format,
        shard_bytes=None if shard_size is None else parse_size(shard_size),
        shards=shards,
        multiple_of=multiple_of,
        seed=seed,
    )
    return pack(
        plan,
        output,
        workers=workers,
        concurrency=concurrency,
        resume=resume,
        client=client,
        progress=progress,
    )
