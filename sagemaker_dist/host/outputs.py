"""The job's outputs as SageMaker handles them: checkpoints synced both ways with
CheckpointConfig.S3Uri, and ``model.tar.gz`` / ``output.tar.gz`` packed into the output path.

A key under the checkpoint prefix becomes a file under each host's checkpoint dir only if it stays
inside it (``contract.paths.contained_path``); uploads walk the dir without following linked
folders (``S3Mirror``), and the tarballs store links as links, so neither carries a file from
outside the job's tree to S3 that the job's own script did not put there.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
import threading
from pathlib import Path

from sagemaker_dist.contract.paths import contained_name, contained_path
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
        """Download every object under the prefix into each host's checkpoint dir (each file written
        under a temporary dot name, which the mirror skips, then renamed). Every key is checked
        before the first download: one that would land outside the dir refuses the job."""
        if not self.s3_uri:
            return 0
        fix = "remove that object from the checkpoint prefix (or give the job another checkpoint_s3_uri)"
        objects = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + "/" if self.prefix else ""):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(self.prefix) :].lstrip("/")
                if not rel or rel.endswith("/"):
                    continue
                uri = f"s3://{self.bucket}/{obj['Key']}"
                what = f"checkpoint prefix {self.s3_uri}: object {uri} would be restored as"
                contained_name(rel, what, fix=fix)
                objects.append((obj["Key"], rel, what))
        for key, rel, what in objects:
            for mirror in self.mirrors:
                target = contained_path(mirror.local_dir, rel, what, fix=fix)
                target.parent.mkdir(parents=True, exist_ok=True)
                partial = target.with_name(f".{target.name}.restoring")
                try:
                    self.client.download_file(self.bucket, key, str(partial))
                except BaseException:
                    partial.unlink(missing_ok=True)
                    raise
                os.replace(partial, target)
                mirror.mark_current(target)
        return len(objects)

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
