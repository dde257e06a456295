"""The job's outputs as SageMaker handles them: checkpoints synced both ways with
CheckpointConfig.S3Uri, and ``model.tar.gz`` / ``output.tar.gz`` packed into the output path.
"""

from __future__ import annotations

import tarfile
import tempfile
import threading
from pathlib import Path

from sagemaker_dist.contract.s3_uri import parse_s3_uri

CHECKPOINT_SYNC_S = 2.0


class CheckpointSync:
    """CheckpointConfig emulation: download at start, upload new/changed files every 2 s and at the end."""

    def __init__(self, s3_uri: str | None, local_dirs: list[Path], client):
        self.s3_uri, self.dirs, self.client = s3_uri, local_dirs, client
        self.bucket, self.prefix = parse_s3_uri(s3_uri) if s3_uri else (None, "")
        self.prefix = self.prefix.rstrip("/")
        self._seen: dict[Path, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.uploaded = 0
        self.errors: list[str] = []

    def restore(self) -> int:
        if not self.s3_uri:
            return 0
        count = 0
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + "/" if self.prefix else ""):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(self.prefix) :].lstrip("/")
                if not rel or rel.endswith("/"):
                    continue
                for d in self.dirs:
                    target = d / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    self.client.download_file(self.bucket, obj["Key"], str(target))
                    stat = target.stat()
                    self._seen[target] = (stat.st_size, stat.st_mtime_ns)
                count += 1
        return count

    def start(self) -> None:
        if self.s3_uri:
            self._thread = threading.Thread(target=self._run, name="checkpoint-sync", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(CHECKPOINT_SYNC_S):
            self.sync_once()

    def sync_once(self) -> None:
        for d in self.dirs:
            for path in sorted(p for p in d.rglob("*") if p.is_file()):
                rel = path.relative_to(d).as_posix()
                if any(part.startswith(".") for part in rel.split("/")) or rel.endswith((".tmp", ".partial")):
                    continue  # files being written; the runtime renames them into place when complete
                try:
                    stat = path.stat()
                    state = (stat.st_size, stat.st_mtime_ns)
                    if self._seen.get(path) == state:
                        continue
                    key = f"{self.prefix}/{rel}" if self.prefix else rel
                    self.client.upload_file(str(path), self.bucket, key)
                    self._seen[path] = state
                    self.uploaded += 1
                except FileNotFoundError:
                    continue  # replaced while we looked; the next round uploads the new one
                except Exception as exc:  # noqa: BLE001 - retried next round, reported in the summary
                    self.errors.append(f"{rel}: {exc}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)
        if self.s3_uri:
            self.sync_once()

    def __enter__(self) -> CheckpointSync:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()  # also after a failure: the last complete checkpoint reaches S3 for a rerun


def pack_and_upload(directory: Path, s3_uri: str, client) -> str | None:
    """Tar ``directory`` (contents at the top, like SageMaker) to ``s3_uri``; None when it is empty."""
    if not directory.is_dir() or not any(directory.iterdir()):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        tarball = Path(tmp) / "archive.tar.gz"
        with tarfile.open(tarball, "w:gz") as tar:
            for path in sorted(directory.iterdir()):
                tar.add(path, arcname=path.name)
        bucket, key = parse_s3_uri(s3_uri)
        client.upload_file(str(tarball), bucket, key)
    return s3_uri
