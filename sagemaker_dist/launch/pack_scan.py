"""A source's samples, listed and checked before anything is written: ``scan_source`` reads a local folder
of class folders, a JSON Lines or a CSV file here, and hands ``s3://`` sources to ``launch.pack_s3``.

A path that climbs out of the source's folder (``..``, an absolute path, a link that leads out) is an
error; a file that is missing, unreadable or not the image its extension says, and a row without a label,
are skipped and reported (``strict=True`` makes them errors). Nothing is read beyond each file's first
bytes."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from sagemaker_dist.contract.paths import contained_path
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


def checked_file(root: Path, rel: str, what: str) -> Path:
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
        real = os.path.realpath(checked_file(root, rel, what))
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
        found = _scan_rows(source, JSONL, jsonl_rows(source, path_field, label_field))
    elif source.is_file() and source.suffix.lower() == ".csv":
        found = _scan_rows(source, CSV, csv_rows(source, path_field, label_field))
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
            checked_file(root, entry.name, "class folder")
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
    return labelled(root, file, layout, staged, skipped)
