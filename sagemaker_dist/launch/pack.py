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

This module runs a pack (``pack``, ``pack_dataset``) and keeps every public name importable from here.
The parts, one job each: ``pack_items`` (the source's model and its rows), ``pack_scan`` (a local
source's scan; ``pack_s3`` an S3 one's), ``pack_plan`` (the shards), ``pack_shard`` (writing one),
``pack_store`` (where shards go), ``pack_index`` (the index).
"""

from __future__ import annotations

import json
import os
import re
import threading
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from sagemaker_dist.launch.pack_index import (  # noqa: F401 - re-exported
    SKIPPED_IN_INDEX,
    index_of,
    read_pack_index,
)
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
)
from sagemaker_dist.launch.pack_plan import (  # noqa: F401 - re-exported
    DEFAULT_SHARD_BYTES,
    FORMATS,
    INDEX_VERSION,
    SUFFIXES,
    TFRECORD,
    WEBDATASET,
    PackError,
    PackPlan,
    Sample,
    ShardSpec,
    parse_size,
    plan_pack,
)
from sagemaker_dist.launch.pack_scan import scan_source
from sagemaker_dist.launch.pack_shard import write_shard
from sagemaker_dist.launch.pack_store import INDEX, MARKERS_DIR, SHARDS_DIR, output_store  # noqa: F401 (INDEX: re-exported)


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

    store = output_store(str(output), client, concurrency)
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
        index = index_of(plan, sizes)
        store.put_bytes(INDEX, json.dumps(index, indent=1).encode())  # last: the pack is complete
        failed = False
    finally:
        store.close(staging, cancel=failed)
    return PackResult(
        index, store.uri(INDEX), store.uri(SHARDS_DIR) + "/", len(todo), len(done), list(plan.source.skipped)
    )


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
