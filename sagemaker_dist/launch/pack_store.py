"""Where a pack's output goes: its layout under ``OUTPUT`` and the two places it can be, a local folder or
an S3 prefix, behind one small interface (list, get, put a marker or the index, put a shard file, delete).

Under ``OUTPUT``: ``shards/`` (the channel's data and nothing else), ``index.json``, ``.pack/`` (the
markers of complete shards). A shard file is moved into place (a folder) or uploaded through boto3's
transfer manager (an S3 prefix): an object there is only ever a whole shard."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

from sagemaker_dist.launch.pack_plan import PackError

SHARDS_DIR = "shards"
INDEX = "index.json"
MARKERS_DIR = ".pack"


class _LocalStore:
    """OUTPUT as a local folder."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.where = str(self.root)

    def uri(self, name: str) -> str:
        return str(self.root / name)

    def prepare(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise PackError(f"output {self.where!r} is a file; give a folder or an s3:// prefix")
        (self.root / SHARDS_DIR).mkdir(parents=True, exist_ok=True)
        (self.root / MARKERS_DIR).mkdir(exist_ok=True)

    def staging(self) -> str:
        staging = self.root / MARKERS_DIR / "staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        return str(staging)

    def list(self, folder: str) -> dict[str, int]:
        here = self.root / folder
        if not here.is_dir():
            return {}
        return {p.name: p.stat().st_size for p in here.iterdir() if p.is_file()}

    def get(self, name: str) -> bytes | None:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            return None

    def put_bytes(self, name: str, data: bytes) -> None:
        path = self.root / name
        temporary = path.with_name(f".{path.name}.tmp")
        temporary.write_bytes(data)
        os.replace(temporary, path)

    def put_file(self, local: str, name: str, done: Callable[[], None]) -> Future:
        os.replace(local, self.root / name)
        future: Future = Future()
        done()
        future.set_result(None)
        return future

    def delete(self, names: list[str]) -> None:
        for name in names:
            (self.root / name).unlink(missing_ok=True)

    def close(self, staging: str | None, cancel: bool = False) -> None:
        if staging:
            shutil.rmtree(staging, ignore_errors=True)


class S3Store:
    """OUTPUT as an S3 prefix: uploads through one boto3 transfer manager (parallel, multipart above
    its threshold); an object appears whole or not at all."""

    def __init__(self, uri: str, client=None, concurrency: int = 8):
        from sagemaker_dist.aws.s3_objects import make_client
        from sagemaker_dist.contract.s3_uri import parse_s3_uri

        self.bucket, prefix = parse_s3_uri(uri if uri.endswith("/") else uri + "/")
        self.prefix = prefix
        self.where = f"s3://{self.bucket}/{prefix}"
        self.client = client or make_client(max_pool_connections=max(10, 2 * concurrency))
        self.concurrency = concurrency
        self._manager = None

    def uri(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{name}"

    def _call(self, action: str, fn, *args, **kwargs):
        from sagemaker_dist.aws.s3_objects import s3_call

        return s3_call(action, self.bucket, fn, *args, **kwargs)

    def prepare(self) -> None:
        self._call(f"reach {self.where}", self.client.head_bucket, Bucket=self.bucket)

    def staging(self) -> str:
        return tempfile.mkdtemp(prefix="sagemaker-dist-pack-")

    def list(self, folder: str) -> dict[str, int]:
        prefix = f"{self.prefix}{folder}/"
        found = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        for page in self._call(f"list {self.uri(folder)}/", list, pages):
            for item in page.get("Contents", ()):
                found[item["Key"][len(prefix) :]] = int(item["Size"])
        return found

    def get(self, name: str) -> bytes | None:
        from botocore.exceptions import ClientError

        def read():
            try:
                return self.client.get_object(Bucket=self.bucket, Key=self.prefix + name)["Body"].read()
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                    return None
                raise

        return self._call(f"read {self.uri(name)}", read)

    def put_bytes(self, name: str, data: bytes) -> None:
        self._call(
            f"write {self.uri(name)}",
            self.client.put_object,
            Bucket=self.bucket,
            Key=self.prefix + name,
            Body=data,
        )

    def put_file(self, local: str, name: str, done: Callable[[], None]) -> Future:
        from boto3.s3.transfer import TransferConfig, create_transfer_manager
        from s3transfer.subscribers import BaseSubscriber

        if self._manager is None:
            config = TransferConfig(max_concurrency=self.concurrency, multipart_threshold=64 * 1024**2)
            self._manager = create_transfer_manager(self.client, config)

        class _Done(BaseSubscriber):
            def on_done(self, future, **kwargs):
                done()

        return self._manager.upload(local, self.bucket, self.prefix + name, subscribers=[_Done()])

    def delete(self, names: list[str]) -> None:
        for start in range(0, len(names), 1000):
            objects = [{"Key": self.prefix + n} for n in names[start : start + 1000]]
            self._call(
                f"delete under {self.where}",
                self.client.delete_objects,
                Bucket=self.bucket,
                Delete={"Objects": objects},
            )

    def close(self, staging: str | None, cancel: bool = False) -> None:
        try:
            if self._manager is not None:
                if cancel:  # (s3transfer's shutdown(cancel=True) passes its arguments in the wrong order)
                    error = PackError("pack stopped: uploads cancelled")
                    self._manager.__exit__(type(error), error, None)
                else:
                    self._manager.shutdown()
        finally:
            if staging:
                shutil.rmtree(staging, ignore_errors=True)


def output_store(output: str, client=None, concurrency: int = 8):
    if str(output).startswith("s3://"):
        return S3Store(str(output), client, concurrency)
    return _LocalStore(output)
