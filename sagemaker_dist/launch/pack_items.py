"""What ``pack`` reads, whatever the source's place (a local folder, an S3 prefix): the layouts, the image
checks by magic bytes, a sample's source (``Item``), what was skipped, the rows of JSON Lines and CSV
files and their labels. ``launch.pack_scan`` scans local sources, ``launch.pack_s3`` S3 ones."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

from sagemaker_dist.errors import DataError

IMAGEFOLDER, JSONL, CSV = "imagefolder", "jsonl", "csv"
LAYOUTS = (IMAGEFOLDER, JSONL, CSV)
# ImageFolder takes these files as images (other files are counted, not packed); the bytes each must
# start with
IMAGE_MAGIC = {
    "jpg": (b"\xff\xd8\xff",),
    "jpeg": (b"\xff\xd8\xff",),
    "png": (b"\x89PNG\r\n\x1a\n",),
    "gif": (b"GIF87a", b"GIF89a"),
    "bmp": (b"BM",),
    "webp": (b"RIFF",),
}
EXTENSION_ALIASES = {"jpeg": "jpg"}  # the sample's file takes WebDataset's usual extension


class PackInputError(DataError):
    """A source that cannot be packed as it is: names the file, the line or the path."""


@dataclass(frozen=True)
class Item:
    """One sample's source: ``path`` relative to the source's folder, its size and modification time (for
    the shard's digest), its label (None: none), ``meta`` (JSON Lines' other fields)."""

    path: str
    size: int
    mtime_ns: int
    label: int | None
    meta: dict | None = None
    real: str = field(default="", compare=False, repr=False)  # the file, every link resolved (at the scan)

    @property
    def extension(self) -> str:
        name = self.path.rpartition("/")[2]
        ext = name.rpartition(".")[2].lower() if "." in name.lstrip(".") else "bin"
        return EXTENSION_ALIASES.get(ext, ext)


@dataclass(frozen=True)
class Skipped:
    path: str
    reason: str


@dataclass
class Source:
    """What ``scan_source`` found: the samples in path order, the class names (None where labels are
    ints), what was skipped and why."""

    root: Path
    layout: str
    items: list[Item]
    classes: list[str] | None
    skipped: list[Skipped] = field(default_factory=list)
    ignored: int = 0  # ImageFolder files that are not images (by extension)
    client: object = field(default=None, compare=False, repr=False)  # an S3 source's client


def _labels(raw: list) -> tuple[list[int | None], list[str] | None]:
    """Labels as ints: ints kept (classes None), else names sorted and numbered."""
    present = [r for r in raw if r is not None]
    if all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in present):
        return list(raw), None
    names = sorted({str(r) for r in present})
    index = {name: i for i, name in enumerate(names)}
    return [None if r is None else index[str(r)] for r in raw], names


def jsonl_rows(path, path_field: str, label_field: str, text: str | None = None):
    """The rows of the JSON Lines file ``path`` (or of ``text``, its contents, where given)."""
    with open(path, encoding="utf-8") if text is None else io.StringIO(text) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PackInputError(f"{path}, line {number}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise PackInputError(
                    f"{path}, line {number}: a JSON object per line, not {type(row).__name__}"
                )
            rel = row.get(path_field)
            if not isinstance(rel, str) or not rel:
                raise PackInputError(
                    f"{path}, line {number}: no {path_field!r} (the file's path) in {line[:80]!r}"
                )
            label = row.get(label_field)
            if label is not None and (isinstance(label, (bool, float, dict, list))):
                raise PackInputError(
                    f"{path}, line {number}: label {label!r} is not an int or a name (a string)"
                )
            meta = {k: v for k, v in row.items() if k not in (path_field, label_field)} or None
            yield number, rel, label, meta


def csv_rows(path, path_field: str, label_field: str, text: str | None = None):
    """The rows of the CSV file ``path`` (or of ``text``, its contents, where given)."""
    with open(path, newline="", encoding="utf-8") if text is None else io.StringIO(text, newline="") as f:
        for number, row in enumerate(csv.reader(f), 1):
            if not row or not any(cell.strip() for cell in row):
                continue
            if number == 1 and [c.strip() for c in row] == [path_field, label_field]:
                continue  # the header row
            if len(row) > 2:
                raise PackInputError(f"{path}, line {number}: {len(row)} columns; rows are path,label")
            rel = row[0].strip()
            label = row[1].strip() if len(row) > 1 else ""
            if not rel:
                raise PackInputError(f"{path}, line {number}: no path")
            yield number, rel, (int(label) if label.isdigit() else label) if label else None, None


def labelled(root, file, layout: str, staged: list[tuple[Item, object]], skipped: list[Skipped]) -> Source:
    """The rows' items with their labels as ints (names numbered), each path listed once."""
    labels, classes = _labels([label for _, label in staged])
    items = [
        Item(item.path, item.size, item.mtime_ns, label, item.meta, item.real)
        for (item, _), label in zip(staged, labels)
    ]
    seen: dict[str, int] = {}
    for item in items:
        seen[item.path] = seen.get(item.path, 0) + 1
    twice = [p for p, n in seen.items() if n > 1]
    if twice:
        raise PackInputError(f"{file}: {len(twice)} path(s) listed more than once, the first {twice[0]!r}")
    return Source(root, layout, items, classes, skipped)
