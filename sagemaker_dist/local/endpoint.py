"""The S3 endpoint local mode reads from: an embedded moto server (default) or real S3.

The embedded server keeps its buckets in a state directory between commands (moto itself is
in-memory), so ``sagemaker-dist demo-data`` and a later ``sagemaker-dist local`` see the same
objects and a rerun finds the checkpoints the previous run synced.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path

_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
DEFAULT_STATE_DIR = _CACHE / "sagemaker-dist" / "local-s3"
FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_DEFAULT_REGION": "us-east-1",
    "SAGEMAKER_VALIDATE_ROLE": "false",
}
# Retries for every request local mode makes; botocore's standard mode backs off between tries.
RETRY_CONFIG = {"mode": "standard", "max_attempts": 5}


def s3_client(endpoint_url: str | None = None, max_attempts: int | None = None):
    """A boto3 S3 client with botocore's standard retries (``AWS_ENDPOINT_URL`` is honoured)."""
    import boto3
    from botocore.config import Config

    retries = dict(RETRY_CONFIG)
    if max_attempts is not None:
        retries["max_attempts"] = max_attempts
    config = Config(retries=retries, connect_timeout=5, read_timeout=30)
    kwargs = {"config": config}
    if endpoint_url:
        kwargs["endpoint_url"] = endpoint_url
    return boto3.client("s3", **kwargs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_state(client, state_dir: Path) -> None:
    if not state_dir.is_dir():
        return
    for bucket_dir in sorted(p for p in state_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
        client.create_bucket(Bucket=bucket_dir.name)
        for path in sorted(bucket_dir.rglob("*")):
            if path.is_file():
                client.upload_file(str(path), bucket_dir.name, path.relative_to(bucket_dir).as_posix())


def _save_state(client, state_dir: Path) -> None:
    """Mirror every bucket into ``state_dir`` (written to a temp dir, then swapped in)."""
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".saving-", dir=state_dir.parent))
    try:
        for bucket in client.list_buckets().get("Buckets", []):
            name = bucket["Name"]
            (tmp / name).mkdir()
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
                for obj in page.get("Contents", []):
                    target = tmp / name / obj["Key"]
                    if obj["Key"].endswith("/"):
                        continue
                    target.parent.mkdir(parents=True, exist_ok=True)
                    client.download_file(name, obj["Key"], str(target))
        old = state_dir.with_name(state_dir.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if state_dir.exists():
            state_dir.rename(old)
        tmp.rename(state_dir)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def embedded_s3(state_dir: str | Path | None = DEFAULT_STATE_DIR, set_env: bool = True):
    """Start a moto S3 server on 127.0.0.1, load ``state_dir`` into it; save and stop on exit.

    Yields the endpoint URL. With ``set_env`` the process environment points boto3 at it (fake
    credentials, ``AWS_ENDPOINT_URL``) for the duration, and is restored afterwards.
    """
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    client = None
    saved = {k: os.environ.get(k) for k in [*FAKE_CREDENTIALS, "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"]}
    try:
        if set_env:
            os.environ.update(FAKE_CREDENTIALS)
            os.environ["AWS_ENDPOINT_URL"] = url
            os.environ.pop("AWS_SESSION_TOKEN", None)
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="local",
            aws_secret_access_key="local",
        )
        if state_dir is not None:
            _load_state(client, Path(state_dir))
        yield url
    finally:
        if state_dir is not None and client is not None:
            try:  # also after a failed or interrupted job: a rerun resumes from its checkpoints
                _save_state(client, Path(state_dir))
            except Exception as exc:  # noqa: BLE001 - report, never mask the job's own error
                print(f"warning: could not save the embedded S3 state to {state_dir}: {exc}")
        if set_env:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        server.stop()
