"""The job's outputs as SageMaker handles them: checkpoints synced both ways with
CheckpointConfig.S3Uri, and ``model.tar.gz`` / ``output.tar.gz`` packed into the output path.
"""

from __future__ import annotations

import tarfile
import tempfile
import threading
from pathlib import Path

from sagemaker_dist.contract.s3_uri import parse_s3_uri
from sagemaker_dist.runtime.s3_mirror import S3Mirror

CHECKPOINT_SYNC_S = 2.0


class CheckpointSync:
    """CheckpointConfig as SageMaker serves it: download at start, upload new/changed files every 2 s
    and at the end (one runtime ``S3Mirror`` per host's checkpoint dir, all to the same prefix)."""

    def __init__(self, s3_uri: str | None, local_dirs: list[Path], client):
        self.s3_uri, self.dirs, self.client = s3_uri, local_dirs, client
        self.bucket, self.prefix = parse_s3_uri(s3_uri) if s3_uri else (None, "")
        self.prefix = self.prefix.rstrip("/")
        self.mirrors = (
            [S3Mirror(d, self.bucket, self.prefix, client=client, skip_in_progress=True) for d in local_dirs]
            if s3_uri
            else []
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    @property
    def uploaded(self) -> int:
        return sum(m.uploads for m in self.mirrors)

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
                for mirror in self.mirrors:
                    target = mirror.local_dir / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    self.client.download_file(self.bucket, obj["Key"], str(target))
                    mirror.mark_current(target)
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
        for mirror in self.mirrors:  # failed files are retried next round and reported in the summary
            mirror.upload_changed(errors=self.errors)

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
