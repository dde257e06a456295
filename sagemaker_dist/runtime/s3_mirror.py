"""Mirror a local directory to an S3 prefix: each round uploads the files new or changed since the last.

TensorBoard's log sync (``tensorboard_sync``) runs rounds of it from a thread. Checkpoints need none:
SageMaker itself syncs ``/opt/ml/checkpoints`` to ``CheckpointConfig.S3Uri``. The client is built with
the contract's one retry and timeout policy (``s3_client_settings``), and ``AWS_ENDPOINT_URL`` (local
mode, tests) and the usual credential chain apply. boto3 is imported only when a client is first needed.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from sagemaker_dist.contract.s3_uri import S3_MAX_ATTEMPTS, s3_client_settings

DEFAULT_MAX_ATTEMPTS = S3_MAX_ATTEMPTS


def s3_client(max_attempts: int = DEFAULT_MAX_ATTEMPTS):
    """A boto3 S3 client with standard retries and short timeouts (a hanging S3 must not hang a round
    for long)."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client("s3", config=Config(**s3_client_settings(max_attempts)))


def _transfer_config():
    """No transfer threads: a round may run at interpreter exit, when new threads are refused."""
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(use_threads=False)


class S3Mirror:
    """Files under ``local_dir`` go to ``s3://bucket/prefix/<relative path>`` when new or changed
    (size or mtime since their last upload). Rounds are serialised, so a round from another thread is
    safe; ``uploads`` counts the files of the rounds that finished."""

    def __init__(
        self,
        local_dir: str | os.PathLike,
        bucket: str,
        prefix: str = "",
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        client=None,
        skip_in_progress: bool = False,
    ):
        self.local_dir = Path(local_dir)
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.max_attempts = int(max_attempts)
        self.uploads = 0
        self._client = client
        self._uploaded: dict[Path, tuple[int, int]] = {}
        self._round_lock = threading.Lock()
        # dot files and *.tmp / *.partial are being written (renamed into place when complete)
        self.skip_in_progress = skip_in_progress

    def client(self):
        """The S3 client, built on first use (build it early where boto3 could not be set up later)."""
        if self._client is None:
            self._client = s3_client(self.max_attempts)
        return self._client

    def upload_changed(self, errors: list[str] | None = None) -> int:
        """Upload every new or changed file once; returns how many were uploaded. Raises on S3 errors
        (files uploaded before the error are not uploaded again next round), unless ``errors`` is
        given: then each failed file is noted there and the round goes on (tried again next round)."""
        with self._round_lock:
            count = 0
            for path, signature in self._changed_files():
                try:
                    self.client().upload_file(
                        str(path), self.bucket, self.key_for(path), Config=_transfer_config()
                    )
                except FileNotFoundError:
                    continue  # replaced while we looked; the next round uploads the new one
                except Exception as exc:  # noqa: BLE001 - with ``errors``: noted, retried next round
                    if errors is None:
                        raise
                    errors.append(f"{path.relative_to(self.local_dir).as_posix()}: {exc}")
                    continue
                self._uploaded[path] = signature
                count += 1
            self.uploads += count
            return count

    def mark_current(self, path: Path) -> None:
        """``path`` is in S3 as it is now (just downloaded from there): skip it until it changes."""
        st = path.stat()
        self._uploaded[path] = (st.st_size, st.st_mtime_ns)

    def _in_progress(self, path: Path) -> bool:
        relative = path.relative_to(self.local_dir).as_posix()
        return any(part.startswith(".") for part in relative.split("/")) or relative.endswith(
            (".tmp", ".partial")
        )

    def key_for(self, path: Path) -> str:
        """The S3 key of ``path``, a file under ``local_dir``."""
        relative = path.relative_to(self.local_dir).as_posix()
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def _changed_files(self):
        if not self.local_dir.is_dir():
            return
        for path in sorted(p for p in self.local_dir.rglob("*") if p.is_file()):
            if self.skip_in_progress and self._in_progress(path):
                continue
            try:
                st = path.stat()
            except FileNotFoundError:  # removed between listing and stat
                continue
            signature = (st.st_size, st.st_mtime_ns)
            if self._uploaded.get(path) != signature:
                yield path, signature
