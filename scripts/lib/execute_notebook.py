"""Execute a notebook top to bottom in local mode into an executed copy (tests/test_notebook.py and
scripts/docs.sh share it, so CI runs the notebook once).

Usage: execute_notebook.py SOURCE TARGET [--reuse] [--cell-timeout S]
The copy records the SHA-256 of the source it ran; ``--reuse`` keeps a copy whose source is unchanged
(the suite ran it moments before). No AWS_* variables reach the kernel: the notebook brings its own
embedded S3 endpoint. Progress bars' redraws are coalesced to their last state, as a front end shows
them. Written to a temporary file, then renamed; a failing cell exits 1 naming the cell, and the copy
holds the outputs up to it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

KEY = "sagemaker_dist"


def source_digest(source: Path) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()


def up_to_date(source: Path, target: Path) -> bool:
    import nbformat

    if not target.exists():
        return False
    meta = nbformat.read(target, as_version=4).metadata.get(KEY) or {}
    return meta.get("source_sha256") == source_digest(source) and meta.get("complete") is True


def execute(source: Path, target: Path, cell_timeout: float) -> bool:
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError
    from nbconvert.preprocessors import CoalesceStreamsPreprocessor

    for key in [k for k in os.environ if k.startswith("AWS_")]:
        del os.environ[key]  # the kernel inherits this environment
    nb = nbformat.read(source, as_version=4)
    client = NotebookClient(
        nb,
        timeout=cell_timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(source.parent.resolve())}},
    )
    complete = False
    try:
        client.execute()
        complete = True
    except CellExecutionError as exc:
        print(f"execute_notebook: {source} failed: {exc}", file=sys.stderr)
    finally:
        nb, _ = CoalesceStreamsPreprocessor().preprocess(nb, {})
        nb.metadata[KEY] = {"source_sha256": source_digest(source), "complete": complete}
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.part")
        nbformat.write(nb, partial)
        partial.replace(target)
    return complete


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--reuse", action="store_true", help="keep a complete copy of the unchanged source")
    parser.add_argument("--cell-timeout", type=float, default=600)
    args = parser.parse_args()
    if args.reuse and up_to_date(args.source, args.target):
        print(f"execute_notebook: {args.target} is a complete run of the current {args.source}; kept")
        return 0
    return 0 if execute(args.source, args.target, args.cell_timeout) else 1


if __name__ == "__main__":
    sys.exit(main())
