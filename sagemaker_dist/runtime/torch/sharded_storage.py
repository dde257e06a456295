"""Where sharded checkpoints lie: a directory (each host's, synced to S3 by SageMaker or our mirrors), or an
S3 prefix written straight by every rank through s3torchconnector's DCP writer.

Both keep the same names and the same rule: a checkpoint counts only when its ``meta.json`` (the commit
marker, written by rank 0 last, after every rank said its shard is written) parses and every file it
lists has the listed size. A directory is written under ``.tmp-*`` and renamed into place. S3 has no
rename: a checkpoint is written under its final prefix, whose old objects (its ``meta.json`` first) are
deleted before any rank writes, so a prefix holds either a committed checkpoint or shards without a
marker, which are never read and are deleted at the next start.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.runtime import environment
from sagemaker_dist.runtime.checkpoint_format import (
    CHECKPOINT_NAME_RE,
    META_FILE,
    Checkpoint,
    complete_checkpoint,
    fsync_dir,
    install_directory,
    list_checkpoints,
    prune_checkpoints,
    remove_stale_temporaries,
)
from sagemaker_dist.runtime.torch.sharded_safety import (
    METADATA_FILE,
    check_shards,
    load_metadata,
    read_metadata_file,
    safe_read_metadata,
)
from sagemaker_dist.runtime.torch.sharded_saves import staged_writer

S3_EXTRA = "s3torchconnector"  # setup.py's extra that installs the S3 writer


def is_s3_uri(location) -> bool:
    return isinstance(location, str) and location.startswith("s3://")


def store_for(location, *, region: str | None = None):
    """The storage of ``location``: an ``s3://bucket/prefix`` URI or a directory."""
    return S3Store(location, region=region) if is_s3_uri(location) else LocalStore(location)


class LocalStore:
    """Checkpoints in a directory: each host's copy written under ``.tmp-*``, renamed into place."""

    shared = False  # each host may see its own copy: every rank lists what it sees

    def __init__(self, directory):
        self.root = Path(directory)

    def location(self, name: str) -> Path:
        return self.root / name

    def read_bytes(self, location: Path, file: str) -> bytes:
        return (Path(location) / file).read_bytes()

    def metadata(self, location: Path):
        return read_metadata_file(Path(location) / METADATA_FILE)

    def complete(self) -> list[Checkpoint]:
        return list_checkpoints(self.root)

    def clear_leftovers(self) -> None:
        remove_stale_temporaries(self.root)

    def begin(self, name: str, token: str, n: int) -> Path:
        """Where this rank writes its shard: its host's temporary copy of the checkpoint."""
        tmp = self.root / f".tmp-{name}-{token}-{n}"
        tmp.mkdir(parents=True, exist_ok=True)
        return tmp

    def clear(self, location) -> None:
        """Nothing to clear: a directory is written aside and swapped in."""

    def reader(self, location: Path, allowed: set[str]):
        from torch.distributed.checkpoint import FileSystemReader

        return _safe_reader(FileSystemReader, self)(location, allowed=allowed)

    def writer(self, where: Path, staging=None):
        from torch.distributed.checkpoint import FileSystemWriter

        writer = staged_writer(FileSystemWriter)(where, sync_files=True, overwrite=True)
        writer.staging = staging
        return writer

    def written(self, where: Path, rank: int) -> dict[str, int]:
        """The files this rank wrote into ``where`` and their sizes (rank 0: DCP's index too)."""
        prefix = f"__{rank}_"
        found = (
            {p.name: p.stat().st_size for p in where.iterdir() if p.name.startswith(prefix)}
            if where.is_dir()
            else {}
        )
        if rank == 0 and (where / METADATA_FILE).is_file():
            found[METADATA_FILE] = (where / METADATA_FILE).stat().st_size
        return found

    def commit(self, where: Path, final: Path, meta: dict) -> None:
        """Rank 0: ``meta.json`` last, fsynced, then its host's copy renamed into place."""
        partial = where / f".{META_FILE}.partial"
        with open(partial, "w") as fh:
            fh.write(json.dumps(meta, indent=1, sort_keys=True))
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(partial, where / META_FILE)
        fsync_dir(where)
        install_directory(where, final)

    def prune(self, keep: int | None) -> list[str]:
        return [c.path.name for c in prune_checkpoints(self.root, keep)]

    def follow(self, where: Path, final: Path, outcome: dict) -> None:
        """Another host's first rank, after rank 0 committed: rename this host's copy, prune alike."""
        if outcome["ok"] and where.is_dir():  # this host has a copy of its own
            fsync_dir(where)
            install_directory(where, final)
        if outcome["keep"] is not None:
            for old in self.root.glob("epoch-*"):
                if old.name not in outcome["keep"] and old.name != final.name:
                    shutil.rmtree(old, ignore_errors=True)

    def discard(self, where: Path, rank: int) -> None:
        shutil.rmtree(where, ignore_errors=True)


class S3Uri(str):
    """``s3://bucket/key`` with what checkpoints use of a path: its last part, its parent, a child."""

    @property
    def name(self) -> str:
        return self.rstrip("/").rsplit("/", 1)[-1]

    @property
    def parent(self) -> S3Uri:
        return S3Uri(self.rstrip("/").rsplit("/", 1)[0])

    def __truediv__(self, child: str) -> S3Uri:
        return S3Uri(f"{self.rstrip('/')}/{child}")

    @property
    def bucket(self) -> str:
        return self[len("s3://") :].split("/", 1)[0]

    @property
    def key(self) -> str:
        """The key of the object (or the prefix, without its trailing slash)."""
        rest = self[len("s3://") :].split("/", 1)
        return rest[1].strip("/") if len(rest) > 1 else ""


def _region() -> str:
    region = environment.aws_region()
    if region:
        return region
    try:
        import boto3

        return boto3.session.Session().region_name or "us-east-1"
    except Exception:  # noqa: BLE001 - no boto3 configuration: S3 redirects the CRT client itself
        return "us-east-1"


class S3Store:
    """Checkpoints under an S3 prefix, every rank writing its shard there through s3torchconnector.

    The endpoint is AWS's, or ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` as boto3 takes it (path
    style there: local mode's embedded S3, MinIO); the region ``region``, else ``AWS_REGION``.
    """

    shared = True  # one view for every rank: rank 0 lists it

    def __init__(self, uri: str, *, region: str | None = None):
        try:
            import s3torchconnector  # noqa: F401
        except ImportError:
            raise ConfigurationError(
                f"checkpoints in {uri} are written straight to S3 with s3torchconnector, which is not "
                f"installed: pip install 'sagemaker-dist[{S3_EXTRA}]' (or write them to a directory, "
                "which SageMaker's CheckpointConfig syncs to S3)"
            ) from None
        self.root = S3Uri(uri.rstrip("/"))
        if not self.root.bucket:
            raise ConfigurationError(f"{uri!r}: give s3://bucket/prefix for the checkpoints")
        self.region = region or _region()
        self.endpoint = environment.s3_endpoint_url()
        self._client = None

    @property
    def client(self):
        """One CRT client per store (it starts its threads again in a forked child by itself)."""
        if self._client is None:
            from s3torchconnector import S3ClientConfig
            from s3torchconnector._s3client import S3Client

            config = S3ClientConfig(force_path_style=self.endpoint is not None)
            self._client = S3Client(self.region, endpoint=self.endpoint, s3client_config=config)
        return self._client

    def _filesystem(self, reader_constructor=None):
        from s3torchconnector.dcp.s3_file_system import S3FileSystem

        return S3FileSystem(self.region, s3_client=self.client, reader_constructor=reader_constructor)

    def location(self, name: str) -> S3Uri:
        return self.root / name

    def _prefix(self, location: S3Uri | None = None) -> str:
        key = (location or self.root).key
        return f"{key}/" if key else ""

    def objects(self, location: S3Uri | None = None) -> dict[str, int]:
        """Every object under ``location`` (default: all checkpoints), key -> size."""
        found: dict[str, int] = {}
        for page in self.client.list_objects(self.root.bucket, self._prefix(location)):
            found.update((info.key, info.size) for info in page.object_info)
        return found

    def read_bytes(self, location: S3Uri, file: str) -> bytes:
        from s3torchconnectorclient import S3Exception

        try:
            return self.client.get_object(self.root.bucket, (location / file).key).read()
        except S3Exception as exc:
            raise OSError(f"{location / file}: {exc}") from None

    def metadata(self, location: S3Uri):
        return load_metadata(io.BytesIO(self.read_bytes(location, METADATA_FILE)), location / METADATA_FILE)

    def _groups(self) -> dict[str, dict[str, int]]:
        """The checkpoint prefixes under the root, each with its files (name -> size)."""
        groups: dict[str, dict[str, int]] = {}
        base = self._prefix()
        for key, size in self.objects().items():
            name, _, file = key[len(base) :].partition("/")
            if CHECKPOINT_NAME_RE.match(name) and file and "/" not in file:
                groups.setdefault(name, {})[file] = size
        return groups

    def complete(self) -> list[Checkpoint]:
        found = []
        for name, files in self._groups().items():
            if META_FILE not in files:
                continue
            location = self.location(name)
            checkpoint = complete_checkpoint(
                name, location, lambda location=location: self.read_bytes(location, META_FILE), files.get
            )
            if checkpoint is not None:
                found.append(checkpoint)
        return sorted(found, key=lambda c: c.position)

    def _delete(self, location: S3Uri) -> None:
        """Every object under ``location``, its ``meta.json`` first (it stops counting before it thins)."""
        keys = sorted(self.objects(location), key=lambda k: not k.endswith(f"/{META_FILE}"))
        for key in keys:
            self.client.delete_object(self.root.bucket, key)

    def clear_leftovers(self) -> None:
        """Rank 0 at the start: the shards of saves that never got their ``meta.json``."""
        for name, files in self._groups().items():
            if META_FILE not in files:
                self._delete(self.location(name))

    def begin(self, name: str, token: str, n: int) -> S3Uri:
        return self.location(name)  # no rename in S3: written in place, counted once marked

    def clear(self, location: S3Uri) -> None:
        """Rank 0, before any rank writes: what an earlier save left under this name."""
        self._delete(location)

    def reader(self, location: S3Uri, allowed: set[str]):
        from s3torchconnector.dcp import S3StorageReader

        reader = _safe_reader(S3StorageReader, self)(self.region, str(location), allowed=allowed)
        reader.fs = self._filesystem(reader._reader_constructor)
        return reader

    def writer(self, where: S3Uri, staging=None):
        from s3torchconnector.dcp import S3StorageWriter

        writer = staged_writer(S3StorageWriter)(self.region, str(where), overwrite=True)
        writer.fs = self._filesystem()
        writer.staging = staging
        return writer

    def written(self, where: S3Uri, rank: int) -> dict[str, int]:
        base = self._prefix(where)
        names = {key[len(base) :]: size for key, size in self.objects(where).items()}
        mine = {n: s for n, s in names.items() if n.startswith(f"__{rank}_")}
        if rank == 0 and METADATA_FILE in names:
            mine[METADATA_FILE] = names[METADATA_FILE]
        return mine

    def commit(self, where: S3Uri, final: S3Uri, meta: dict) -> None:
        with self.client.put_object(self.root.bucket, (final / META_FILE).key) as out:
            out.write(json.dumps(meta, indent=1, sort_keys=True).encode())

    def prune(self, keep: int | None) -> list[str]:
        if keep is None or keep <= 0:
            return []  # nothing to delete (only a directory's other hosts use the names)
        found = self.complete()
        for old in found[:-keep]:
            self._delete(old.path)
        return [c.path.name for c in found[-keep:]]

    def follow(self, where, final, outcome) -> None:
        """Nothing: every host wrote into the one prefix."""

    def discard(self, where: S3Uri, rank: int) -> None:
        if rank == 0:  # every rank is past its write (the outcome was broadcast after the reports)
            self._delete(where)


def _safe_reader(base, store):
    """``base`` (a DCP ``FileSystemReader``) reading ``dcp.metadata`` with ``sharded_safety``'s
    unpickler and every shard a file that ``meta.json`` lists."""

    class SafeReader(base):
        def __init__(self, *args, allowed: set[str], **kwargs):
            super().__init__(*args, **kwargs)
            self.allowed = allowed

        def _get_metadata_path(self, rank=None):
            return self.fs.concat_path(self.path, METADATA_FILE)

        def read_metadata(self, *args, **kwargs):
            location = self.path if isinstance(self.path, Path) else S3Uri(self.path)
            checked = check_shards(store.metadata(location), self.allowed, location / METADATA_FILE)
            return safe_read_metadata(self, checked)

    return SafeReader
