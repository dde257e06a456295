"""An image set in S3 as ``pack``'s source: the three layouts of ``launch.pack``, read from a prefix.

- ``s3://bucket/images/``: an ImageFolder, ``images/<class>/<image>`` (one listing);
- ``s3://bucket/data/list.jsonl`` or ``.csv``: rows whose paths are keys relative to the file's folder
  (``img/1.jpg`` is ``s3://bucket/data/img/1.jpg``; the folder is listed once, not a request a row).

The checks are the local ones: a path that climbs out of the file's folder (``..``, an absolute path)
is an error; an object that is missing, or not the image its extension says (its first 16 bytes, read
with ranged GETs, many at once), or a row without a label, is skipped and reported. A shard reads each
object whole and refuses one whose size changed since the listing: no shard holds a half-read object.
"""

from __future__ import annotations

import posixpath
from concurrent.futures import ThreadPoolExecutor

from sagemaker_dist.aws.s3_objects import (
    is_folder_marker,
    make_client,
    parse_s3_uri,
    s3_call,
)
from sagemaker_dist.contract.paths import contained_name
from sagemaker_dist.launch.pack_items import (
    CSV,
    IMAGE_MAGIC,
    IMAGEFOLDER,
    JSONL,
    Item,
    PackInputError,
    Skipped,
    Source,
    csv_rows,
    jsonl_rows,
    labelled,
)

HEADS_AT_ONCE = 16  # ranged GETs of the images' first bytes in flight


def _listing(client, folder: str) -> dict[str, tuple[int, int]]:
    """key -> (size, modification time in ns) of every object under ``folder`` (an S3 URI)."""
    bucket, prefix = parse_s3_uri(folder)
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {
        o["Key"]: (int(o["Size"]), int(o["LastModified"].timestamp() * 1e9))
        for page in s3_call(f"list {folder}", bucket, list, pages)
        for o in page.get("Contents", ())
    }


def _head(client, bucket: str, key: str) -> bytes:
    return s3_call(
        f"read s3://{bucket}/{key}", bucket, client.get_object, Bucket=bucket, Key=key, Range="bytes=0-15"
    )["Body"].read()


def _magic_of(rel: str):
    """The bytes an object named ``rel`` must start with (None: an extension that is not checked)."""
    name = rel.rpartition("/")[2]
    return IMAGE_MAGIC.get(name.rpartition(".")[2].lower()) if "." in name else None


def _checked(client, bucket: str, rows: list[tuple[str, str, int, int, object, dict | None]], skipped: list):
    """``(item, label)`` of each ``(rel, key, size, mtime, label, meta)`` row whose object is the image its
    extension says (its first bytes, fetched many at once); the others skipped."""
    magics = [_magic_of(row[0]) for row in rows]
    checks = [row[1] for row, magic in zip(rows, magics) if magic is not None]
    with ThreadPoolExecutor(HEADS_AT_ONCE) as pool:
        heads = dict(zip(checks, pool.map(lambda key: _head(client, bucket, key), checks)))
    out = []
    for (rel, key, size, mtime, label, meta), magic in zip(rows, magics):
        if magic is not None and not heads[key].startswith(magic):
            ext = rel.rpartition(".")[2]
            skipped.append(Skipped(rel, f"not a {ext.upper()} file (its first bytes are {heads[key][:4]!r})"))
            continue
        out.append((Item(rel, size, mtime, None, meta, f"s3://{bucket}/{key}"), label))
    return out


def _imagefolder(client, folder: str, listed: dict[str, tuple[int, int]]) -> Source:
    """The ImageFolder under ``folder`` (ending in ``/``) from its listing, ``listed``."""
    bucket, prefix = parse_s3_uri(folder)
    rows, skipped, ignored = [], [], 0
    for key in sorted(listed):
        rel = key[len(prefix) :]
        parts = rel.split("/")
        if key.endswith("/") or any(p.startswith(".") for p in parts):
            continue  # folder placeholders, hidden files and folders, as a local walk skips them
        if len(parts) < 2:
            skipped.append(Skipped(rel, "not in a class folder (root/<class>/<image>)"))
            continue
        name = parts[-1]
        if ("." in name and name.rpartition(".")[2].lower()) not in IMAGE_MAGIC:
            ignored += 1
            continue
        size, mtime = listed[key]
        rows.append((rel, key, size, mtime, parts[0], None))
    classes = sorted({r[4] for r in rows})
    if not classes:
        raise PackInputError(f"{folder} has no class folders of images (root/<class>/<image>)")
    number = {c: i for i, c in enumerate(classes)}
    items = [
        Item(item.path, item.size, item.mtime_ns, number[label], None, item.real)
        for item, label in _checked(client, bucket, rows, skipped)
    ]
    return Source(folder, IMAGEFOLDER, items, classes, skipped, ignored, client)


def _rows_file(client, uri: str, layout: str, path_field: str, label_field: str) -> Source:
    bucket, key = parse_s3_uri(uri)
    body = s3_call(f"read {uri}", bucket, client.get_object, Bucket=bucket, Key=key)["Body"].read()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PackInputError(f"{uri} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    parse = jsonl_rows if layout == JSONL else csv_rows
    root = uri.rpartition("/")[0] + "/"
    base = key.rpartition("/")[0] + "/" if "/" in key else ""
    listed = _listing(client, root)
    name = posixpath.basename(key)
    rows, skipped = [], []
    for number, rel, label, meta in parse(uri, path_field, label_field, text):
        if label is None:
            skipped.append(Skipped(rel, f"no label ({name}, line {number})"))
            continue
        what = f"{name}, line {number}: path"
        rel = str(
            contained_name(rel, what, fix="list only files inside the source's folder", error=PackInputError)
        )
        found = listed.get(base + rel)
        if found is None:
            skipped.append(Skipped(rel, "missing"))
            continue
        rows.append((rel, base + rel, found[0], found[1], label, meta))
    checked = _checked(client, bucket, rows, skipped)
    source = labelled(root, uri, layout, checked, skipped)
    source.client = client
    return source


def scan_s3_source(uri: str, path_field: str, label_field: str, client=None) -> Source:
    """The samples of an S3 source (``launch.pack_scan.scan_source`` for ``s3://`` sources)."""
    client = client or make_client()
    lower = uri.lower()
    if lower.endswith((".jsonl", ".ndjson")):
        return _rows_file(client, uri, JSONL, path_field, label_field)
    if lower.endswith(".csv"):
        return _rows_file(client, uri, CSV, path_field, label_field)
    folder = uri if uri.endswith("/") else uri + "/"
    listed = _listing(client, folder)  # the one listing: the check that it is not empty, then the scan
    if all(is_folder_marker(key, size) for key, (size, _) in listed.items()):
        raise PackInputError(
            f"source {uri!r} holds no objects (an S3 source is a prefix of class folders, "
            "a .jsonl or a .csv object)"
        )
    return _imagefolder(client, folder, listed)


def read_s3_item(client, item: Item) -> bytes:
    """The object's bytes, whole; an error where its size is not the listing's (it changed)."""
    bucket, key = parse_s3_uri(item.real)
    data = s3_call(f"read {item.real}", bucket, client.get_object, Bucket=bucket, Key=key)["Body"].read()
    if len(data) != item.size:
        raise PackInputError(
            f"{item.real} changed while it was packed ({item.size} bytes when listed, now {len(data)}); "
            "run again"
        )
    return data
