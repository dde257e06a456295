"""The S3 endpoint local mode reads from: an embedded moto server (default) or real S3.

The embedded server keeps its buckets in a state directory between commands (moto itself is
in-memory), so ``sagemaker-dist demo-data`` and a later ``sagemaker-dist local`` see the same
objects and a rerun finds the checkpoints the previous run synced. Each object is a file under
``<state dir>/<bucket>/<key>``; a key that would land outside its bucket's folder (``/abs/path``,
``../..``) is left out with a warning, never written.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import socket
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path

from sagemaker_dist.aws.s3_objects import s3_client
from sagemaker_dist.contract.environment import ENDPOINT_URL, cache_home, set_variables
from sagemaker_dist.contract.paths import UnsafePathError, contained_path
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.runtime.trusted_cache import UntrustedCacheError, check_path, open_trusted, trusted_dir

_CACHE = cache_home()
DEFAULT_STATE_DIR = _CACHE / "sagemaker-dist" / "local-s3"
STATE_HINT = "give this command a state dir of your own (--s3-state-dir)"
FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "local",
    "AWS_SECRET_ACCESS_KEY": "local",
    "AWS_DEFAULT_REGION": "us-east-1",
    "SAGEMAKER_VALIDATE_ROLE": "false",
}


def _local_client(url: str):
    """A client of the embedded server: its fake credentials, whatever the environment holds."""
    import boto3

    session = boto3.session.Session(
        aws_access_key_id="local", aws_secret_access_key="local", region_name="us-east-1"
    )
    return s3_client(session=session, endpoint_url=url)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _trusted_state_dir(state_dir: Path) -> Path:
    """``state_dir`` with the links in its path resolved, its parent made (0700) where missing; refused
    (``UntrustedCacheError``) where another user could have written it or its parent (unless that is
    sticky, as /tmp is): what it holds goes into the buckets jobs read (checkpoints, code)."""
    state_dir = Path(os.path.abspath(state_dir))
    state_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return trusted_dir(state_dir, create=False, hint=STATE_HINT)


def _ours(path: Path) -> bool:
    """Whether ``path`` is a file or folder of ours that only we can write (not a link)."""
    try:
        return check_path(path, "dir" if path.is_dir() and not path.is_symlink() else "file") is not None
    except UntrustedCacheError:
        return False


def _drop_others_write(tree: Path) -> None:
    """No folder or file under ``tree`` writable by group or others, whatever the umask made them."""
    for folder, _, files in os.walk(tree):
        for path in [folder, *(os.path.join(folder, f) for f in files)]:
            mode = os.lstat(path).st_mode
            if mode & 0o022 and not stat.S_ISLNK(mode):
                os.chmod(path, stat.S_IMODE(mode) & ~0o022)


def _old_state(state_dir: Path) -> Path:
    """Where the previous state waits while a new one is swapped in."""
    return state_dir.with_name(state_dir.name + ".old")


def _recover_state(state_dir: Path) -> None:
    """Undo what a crash during ``_save_state`` left (under the state lock, so no save is running):
    the previous state put back if the swap stopped half-way, leftover temporary dirs removed."""
    old = _old_state(state_dir)
    if not os.path.lexists(state_dir) and check_path(old, "dir", hint=STATE_HINT):  # refused if not ours
        old.rename(state_dir)
    if state_dir.parent.is_dir():
        for leftover in state_dir.parent.glob(f".{state_dir.name}.saving-*"):
            if _ours(leftover):  # another user's (a sticky parent as /tmp) is theirs to remove
                shutil.rmtree(leftover, ignore_errors=True)


def _transfers(client):
    """One transfer manager for a whole load or save: boto3's ``upload_file`` / ``download_file`` make
    a manager (and its threads) per call, 10 ms an object, which a state of hundreds of objects pays on
    every command."""
    from boto3.s3.transfer import TransferConfig, create_transfer_manager

    return create_transfer_manager(client, TransferConfig(max_concurrency=8))


def _etags(client, buckets) -> dict[tuple[str, str], str]:
    """``(bucket, key) -> ETag`` of every object of ``buckets``."""
    tags = {}
    for name in buckets:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            for obj in page.get("Contents", []):
                tags[(name, obj["Key"])] = obj["ETag"]
    return tags


def _linked(source: Path, target: Path) -> bool:
    """Whether ``source`` could be hard-linked as ``target`` (not where it is gone or on another
    file system)."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        return False
    return True


def _load_state(client, state_dir: Path) -> tuple[set[str], dict[tuple[str, str], str]]:
    """Put every file of ``state_dir`` into the server (links are skipped: only what we saved); a
    folder or file there that another user could have written is refused (``UntrustedCacheError``).
    Returns the buckets loaded, and each loaded object's ETag by ``(bucket, key)``, so that
    ``_save_state`` keeps the files of objects left as they were rather than fetch them again."""
    _recover_state(state_dir)
    trusted_dir(state_dir, create=False, hint=STATE_HINT)
    if not state_dir.is_dir():
        return set(), {}
    buckets = []
    with _transfers(client) as transfers:
        uploads = []
        for bucket_dir in sorted(
            p for p in state_dir.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")
        ):
            check_path(bucket_dir, "dir", hint=STATE_HINT)
            client.create_bucket(Bucket=bucket_dir.name)
            buckets.append(bucket_dir.name)
            for path in sorted(bucket_dir.rglob("*")):
                if path.is_symlink():
                    continue
                if path.is_dir():
                    check_path(path, "dir", hint=STATE_HINT)
                elif path.is_file():
                    check_path(path, "file", hint=STATE_HINT)
                    key = path.relative_to(bucket_dir).as_posix()
                    uploads.append(transfers.upload(str(path), bucket_dir.name, key))
        for upload in uploads:
            upload.result()
    return set(buckets), _etags(client, buckets)


def _save_state(
    client,
    state_dir: Path,
    skip: set[str] | frozenset[str] = frozenset(),
    loaded: dict[tuple[str, str], str] | None = None,
) -> None:
    """Mirror every bucket (but those in ``skip``) into ``state_dir``: written to a temporary dir, then
    swapped in by two renames (the previous state to ``<state dir>.old``, the new one into place), so
    that a crash leaves either state whole (``_recover_state`` puts the previous one back), never none
    or half of one. An object whose ETag is the one ``loaded`` gives it (``_load_state``) is unchanged:
    its file is linked from the previous state, not downloaded again."""
    state_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _recover_state(state_dir)
    loaded = loaded or {}
    tmp = Path(tempfile.mkdtemp(prefix=f".{state_dir.name}.saving-", dir=state_dir.parent))
    left_out = []
    fix = "it is not kept between commands (a key that is not a relative path cannot be a file there)"
    try:
        names = [b["Name"] for b in client.list_buckets().get("Buckets", []) if b["Name"] not in skip]
        bucket_dirs = {
            name: contained_path(tmp, name, "the embedded S3 state: bucket", fix=fix) for name in names
        }
        for bucket_dir in bucket_dirs.values():
            bucket_dir.mkdir()
        with _transfers(client) as transfers:
            downloads = []
            for (name, key), etag in _etags(client, names).items():
                if key.endswith("/"):
                    continue
                try:
                    what = f"the embedded S3 state: bucket {name!r} has the key"
                    target = contained_path(bucket_dirs[name], key, what, fix=fix)
                except UnsafePathError as exc:
                    left_out.append(str(exc))
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                if loaded.get((name, key)) == etag and _linked(state_dir / name / key, target):
                    continue  # the file it was loaded from
                downloads.append(transfers.download(name, key, str(target)))
            for download in downloads:
                download.result()
        _drop_others_write(tmp)  # the next load refuses what others could write
        old = _old_state(state_dir)
        shutil.rmtree(old, ignore_errors=True)  # a previous swap's leftover; state_dir is whole
        if state_dir.exists():
            state_dir.rename(old)
        tmp.rename(state_dir)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for line in left_out:
        print(f"warning: {line}")


@contextmanager
def _state_lock(state_dir: Path):
    """One command at a time per state dir: two would each load it and the last to save would win. The
    lock file is opened without following a link and must be ours (a sticky parent may hold others')."""
    state_dir = _trusted_state_dir(state_dir)
    lock_path = state_dir.with_name(state_dir.name + ".lock")
    with os.fdopen(open_trusted(lock_path, os.O_RDWR | os.O_CREAT, 0o600, hint=STATE_HINT), "r+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            raise ConfigurationError(
                f"the embedded S3 state dir {state_dir} is in use by another sagemaker-dist command "
                f"(pid {holder}); wait for it to finish, or give this one its own --s3-state-dir"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def embedded_s3(state_dir: str | Path | None = DEFAULT_STATE_DIR, set_env: bool = True):
    """Start a moto S3 server on 127.0.0.1, load ``state_dir`` into it; save and stop on exit.

    Yields the endpoint URL. With ``set_env`` the process environment points boto3 at it (fake
    credentials, ``AWS_ENDPOINT_URL``) for the duration, and is restored afterwards.
    """
    from moto.server import ThreadedMotoServer

    if state_dir is not None:
        state_dir = _trusted_state_dir(Path(state_dir))
        with _state_lock(state_dir), embedded_s3(None, set_env) as url:
            client = _local_client(url)
            # moto keeps one store per process: buckets that another moto server of this process (a
            # test's, an earlier one in a notebook) holds are not this state's, unless it loads them
            others = {bucket["Name"] for bucket in client.list_buckets().get("Buckets", [])}
            loaded_buckets, loaded = _load_state(client, state_dir)
            try:
                yield url
            finally:  # also after a failed or interrupted job: a rerun resumes from its checkpoints
                try:
                    _save_state(client, state_dir, skip=others - loaded_buckets, loaded=loaded)
                except Exception as exc:  # noqa: BLE001 - report, never mask the job's own error
                    print(f"warning: could not save the embedded S3 state to {state_dir}: {exc}")
        return
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    saved = (
        set_variables({**FAKE_CREDENTIALS, ENDPOINT_URL: url, "AWS_SESSION_TOKEN": None}) if set_env else None
    )
    try:
        yield url
    finally:
        if saved is not None:
            set_variables(saved)
        server.stop()
