"""The entry script's folder on a host: a local folder, or the ``sourcedir.tar.gz`` the launch
uploaded (``sagemaker_submit_directory``), downloaded and unpacked as the toolkit would."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

from sagemaker_dist.contract.paths import contained_path
from sagemaker_dist.contract.s3_uri import parse_s3_uri
from sagemaker_dist.errors import ConfigurationError


class SourceDirError(ConfigurationError):
    """The entry script's folder is missing or its package cannot be fetched."""


def fetch_source_dir(source_dir, submit_directory: str | None, work: Path, client) -> Path:
    """The entry script's folder: ``source_dir``, else ``submit_directory`` (the job's
    ``sagemaker_submit_directory``: a path, or the source package in S3, downloaded and unpacked into
    ``work/code``)."""
    if source_dir is not None:
        path = Path(source_dir).resolve()
        if not path.is_dir():
            raise SourceDirError(f"source dir {source_dir} does not exist or is not a directory")
        return path
    uri = submit_directory
    if not uri:
        raise SourceDirError(
            "no source dir: pass source_dir= or set hyperparameter sagemaker_submit_directory"
        )
    if not str(uri).startswith("s3://"):
        return fetch_source_dir(uri, None, work, client)
    bucket, key = parse_s3_uri(uri)
    target = work / "code"
    target.mkdir()
    tarball = work / "sourcedir.tar.gz"
    try:
        client.download_file(bucket, key, str(tarball))
    except Exception as exc:  # noqa: BLE001 - botocore retried already; name the object
        raise SourceDirError(f"cannot download the source package {uri}: {exc}") from exc
    with tarfile.open(tarball) as tar:
        _extract_safely(tar, target, uri)
    return target


def _extract_safely(tar: tarfile.TarFile, target: Path, uri: str) -> None:
    """Unpack only plain files and folders inside ``target``, with what tarfile's ``data`` filter
    does to them (no setuid, setgid or sticky bit, no group or other write, owner read-write, our
    own owner), checked by hand first so that a Python without that filter (3.10.12+, 3.11.4+ and
    3.12 have it; Debian 12's 3.11.2 has not) refuses and strips the same; the filter runs as well
    where there is one."""
    members = [_safe_member(member, target, uri) for member in tar.getmembers()]
    if hasattr(tarfile, "data_filter"):
        tar.extractall(target, members=members, filter="data")
    else:
        tar.extractall(target, members=members)


def _safe_member(member: tarfile.TarInfo, target: Path, uri: str) -> tarfile.TarInfo:
    """``member`` as the ``data`` filter would extract it, or SourceDirError naming it."""
    fix = "pack the source dir with sagemaker-dist (or tar without links, devices or paths outside it)"
    if not (member.isfile() or member.isdir()):
        raise SourceDirError(
            f"the source package {uri} holds {member.name!r}, which is not a plain file or folder; {fix}"
        )
    if not (member.isdir() and member.name in (".", "./")):  # the package's own top folder
        contained_path(target, member.name, f"the source package {uri} holds", fix=fix, error=SourceDirError)
    mode = member.mode & 0o755  # no setuid, setgid, sticky; no group or other write
    if member.isfile():
        mode = (mode if mode & 0o100 else mode & ~0o111) | 0o600
    else:
        mode |= 0o700
    member.mode = mode
    member.uid, member.gid = os.getuid(), os.getgid()
    member.uname = member.gname = ""
    return member
