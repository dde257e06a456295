"""The index a pack leaves beside its shards: what it holds, and its reading where the shards are planned.

``sagemaker-dist pack`` writes ``OUTPUT/shards/shard-*.tar`` (the channel's data) and, last,
``OUTPUT/index.json`` (each shard's records and bytes). A prefix ``.../shards/`` whose parent holds an
index is a pack's output: :func:`plan_prefix` checks the listing against the index (the same shards, of
the same sizes: a shard changed, missing or added since the pack is refused before any job starts) and
plans with each shard's record count, so the plan says how many samples each worker reads. A
``.../shards/`` whose pack left markers but no index did not finish, and the pack's own root (index and
markers beside the shards) is not a channel's data: both are refused with the prefix to use.

The index holds the format, each shard's name, records, bytes and digest, the totals, the classes and
labels, the source, the seed and plan, and what was skipped (``index_of``; ``read_pack_index`` reads a
finished pack's).
"""

from __future__ import annotations

import json
import os

from sagemaker_dist.aws.s3_objects import (
    S3Object,
    list_objects,
    make_client,
    parse_s3_uri,
    s3_call,
)
from sagemaker_dist.errors import DataError
from sagemaker_dist.launch.pack_plan import INDEX_VERSION, WEBDATASET, PackPlan
from sagemaker_dist.launch.pack_store import INDEX, MARKERS_DIR, SHARDS_DIR, S3Store, output_store
from sagemaker_dist.launch.sharding import ShardPlan, plan_shards, with_records

DIFFERENCES_SHOWN = 3
SKIPPED_IN_INDEX = 1000  # skipped files listed in the index (all are counted)


class PackIndexError(DataError):
    """A pack's shards that disagree with its index, or a pack that did not finish."""


def index_of(plan: PackPlan, sizes: dict[int, tuple[int, int]]) -> dict:
    """The index of ``plan`` written with ``sizes`` (shard index -> (records, bytes))."""
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


def read_pack_index(output: str | os.PathLike, client=None) -> dict:
    """The index of a finished pack under ``output``; a DataError where there is none (never written,
    or a pack that did not finish)."""
    store = output_store(str(output), client)
    raw = store.get(INDEX)
    if raw is None:
        raise DataError(f"no {INDEX} under {store.where}: no pack finished there (run sagemaker-dist pack)")
    return json.loads(raw)


def _folder(uri: str) -> str:
    return uri if uri.endswith("/") else uri + "/"


def pack_root(prefix: str) -> str | None:
    """``s3://b/out/`` for a prefix ``s3://b/out/shards/`` (a pack's channel data), else None."""
    folder = _folder(prefix)
    tail = f"/{SHARDS_DIR}/"
    if not folder.endswith(tail) or folder.count("/") < 4:  # (s3://shards/ is a bucket, no pack's folder)
        return None
    return folder[: -len(SHARDS_DIR) - 1]


def find_pack_index(prefix: str, client=None) -> tuple[str, dict] | None:
    """``(its URI, the index)`` of the pack whose shards ``prefix`` holds; None where it is no pack's
    ``shards/``. A pack that left its markers but no index (it did not finish) is a PackIndexError."""
    root = pack_root(prefix)
    if root is None:
        return None
    store = S3Store(root, client or make_client())  # pack's own reads of its OUTPUT, errors worded alike
    raw = store.get(INDEX)
    if raw is None:
        markers = s3_call(
            f"list {store.uri(MARKERS_DIR)}/",
            store.bucket,
            store.client.list_objects_v2,
            Bucket=store.bucket,
            Prefix=f"{store.prefix}{MARKERS_DIR}/",
            MaxKeys=1,
        )
        if markers.get("Contents"):
            raise PackIndexError(
                f"{root} holds a pack's shards and markers but no {INDEX}: that pack did not finish "
                "(run sagemaker-dist pack again; it keeps the shards already complete)"
            )
        return None
    try:
        index = json.loads(raw)
        if not isinstance(index, dict) or not isinstance(index.get("shards"), list):
            raise ValueError("no list of shards")
    except ValueError as exc:
        raise PackIndexError(f"{root}{INDEX} is not a pack index ({exc})") from None
    return root + INDEX, index


def records_by_key(prefix: str, objects: list[S3Object], index_uri: str, index: dict) -> dict[str, int]:
    """Each listed key's record count from ``index``; a PackIndexError naming the first differences where
    the listing and the index do not hold the same shards of the same sizes."""
    bucket, key = parse_s3_uri(_folder(prefix))
    base = key[: -len(SHARDS_DIR) - 1]  # the index names shards from the pack's root: shards/shard-0.tar
    try:
        indexed = {base + s["name"]: (int(s["bytes"]), int(s["records"])) for s in index["shards"]}
    except (KeyError, TypeError, ValueError) as exc:
        raise PackIndexError(f"{index_uri} lists a shard without a name, bytes or records ({exc})") from None
    listed = {o.key: o.size for o in objects}
    differences = []
    for k in sorted(set(listed) | set(indexed)):
        if k not in indexed:
            differences.append(f"s3://{bucket}/{k} ({listed[k]} bytes) is not in the index")
        elif k not in listed:
            differences.append(f"s3://{bucket}/{k} is in the index but not in S3")
        elif listed[k] != indexed[k][0]:
            differences.append(f"s3://{bucket}/{k} is {listed[k]} bytes, {indexed[k][0]} in the index")
    if differences:
        shown = "; ".join(differences[:DIFFERENCES_SHOWN])
        extra = len(differences) - DIFFERENCES_SHOWN
        more = f" (and {extra} more)" if extra > 0 else ""
        raise PackIndexError(
            f"{prefix} disagrees with its pack's index {index_uri}: {shown}{more}. The shards changed after "
            "the pack: run sagemaker-dist pack again, or train from a prefix that is no pack's"
        )
    return {k: indexed[k][1] for k in listed}


def _refuse_pack_root(prefix: str, objects: list[S3Object]) -> None:
    """A pack's root lists its index and markers beside the shards: none of them is a record."""
    _, key = parse_s3_uri(_folder(prefix))
    names = {o.key[len(key) :] for o in objects}
    if INDEX in names and any(n.startswith(f"{MARKERS_DIR}/") for n in names):
        raise PackIndexError(
            f"{prefix} is a pack's output (its {INDEX} and {MARKERS_DIR}/ markers beside the shards): the "
            f"channel's data is {_folder(prefix)}{SHARDS_DIR}/"
        )


def plan_prefix(
    prefix: str,
    num_shards: int,
    *,
    client=None,
    suffix: str | None = None,
    order_seed: int | None = None,
) -> tuple[ShardPlan, str | None]:
    """List ``prefix``, check it against its pack's index where it is a pack's ``shards/``, and split it
    into ``num_shards`` shards balanced by bytes (``plan_shards``); ``(plan, the index's URI or None)``.
    With an index, ``plan.records`` holds each object's records (``records_per_shard``: each worker's)."""
    client = client or make_client()
    objects = list_objects(prefix, suffix=suffix, client=client)
    found = find_pack_index(prefix, client)
    if found is None:
        _refuse_pack_root(prefix, objects)
    plan = plan_shards([(o.key, o.size) for o in objects], num_shards, order_seed=order_seed)
    if found is None:
        return plan, None
    index_uri, index = found
    if suffix:  # the index's shards the filter keeps: the listing is compared with those
        index = {**index, "shards": [s for s in index["shards"] if str(s.get("name", "")).endswith(suffix)]}
    return with_records(plan, records_by_key(prefix, objects, index_uri, index)), index_uri


def describe_records(plan: ShardPlan, index_uri: str) -> str:
    """One line: the records the index gives and how they fall to the workers."""
    per = plan.records_per_shard or []
    return (
        f"pack index {index_uri}: {sum(per)} records, {min(per, default=0)} to {max(per, default=0)} per "
        "worker"
    )
