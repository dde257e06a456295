"""The source package unpacked on a host: our own checks and tarfile's ``data`` filter where Python has
it, the same refusals and stripped mode bits by hand on patch releases without it (Debian 12's 3.11.2)."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from sagemaker_dist.aws.s3_objects import s3_client
from sagemaker_dist.host.lifecycle import SourceDirError, fetch_source_dir


def _package(*members: tarfile.TarInfo, body: bytes = b"print('hi')\n") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info in members:
            tar.addfile(info, io.BytesIO(body) if info.isfile() else None)
    return buf.getvalue()


def _file(name: str, size: int = 12) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def _link(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info


# Both paths where this Python has the filter; the by-hand one alone where it has not (3.11.2).
PATHS = ["data filter", "without the data filter"] if hasattr(tarfile, "data_filter") else ["without"]
# What the data filter raises, on a Python that has one.
REFUSALS = (SourceDirError, tarfile.FilterError) if hasattr(tarfile, "FilterError") else (SourceDirError,)


@pytest.fixture(params=PATHS)
def python_tarfile(request, monkeypatch):
    """The by-hand path as on 3.11.2, which has no ``tarfile.data_filter``."""
    if request.param == "without the data filter":
        monkeypatch.delattr(tarfile, "data_filter")
    return request.param


def _fetch(s3, bucket, tmp_path, body: bytes):
    s3.put_object(Bucket=bucket, Key="src/sourcedir.tar.gz", Body=body)
    return fetch_source_dir(None, f"s3://{bucket}/src/sourcedir.tar.gz", tmp_path, s3_client())


def test_a_package_unpacks_with_or_without_the_data_filter(python_tarfile, s3, bucket, tmp_path):
    code = _fetch(s3, bucket, tmp_path, _package(_file("train.py"), _file("lib/util.py")))
    assert (code / "train.py").read_text() == "print('hi')\n"
    assert (code / "lib" / "util.py").is_file()


@pytest.mark.parametrize("member", [_file("../outside.py"), _link("train.py", "/etc/passwd")])
def test_a_member_outside_the_package_or_a_link_is_refused(python_tarfile, member, s3, bucket, tmp_path):
    with pytest.raises(REFUSALS):
        _fetch(s3, bucket, tmp_path, _package(member))
    assert not (tmp_path / "outside.py").exists()


def test_an_absolute_member_is_refused_naming_it(python_tarfile, s3, bucket, tmp_path):
    """The data filter would make it relative; we refuse it, with or without the filter, so nothing
    lands at /abs."""
    name = f"/{tmp_path.name}-abs/train.py"
    with pytest.raises(SourceDirError, match=f"holds '{name}', which is an absolute path"):
        _fetch(s3, bucket, tmp_path, _package(_file(name)))
    assert not os.path.exists(name)


def _with_mode(info: tarfile.TarInfo, mode: int, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info.mode, info.type = mode, kind
    return info


def test_setuid_setgid_sticky_and_group_write_bits_are_dropped(python_tarfile, s3, bucket, tmp_path):
    """Without the data filter, tarfile kept a member's setuid bit (and, as root, its owner)."""
    body = _package(
        _with_mode(tarfile.TarInfo("."), 0o1777, tarfile.DIRTYPE),  # the package's own top folder
        _with_mode(tarfile.TarInfo("bin"), 0o3777, tarfile.DIRTYPE),
        _with_mode(_file("bin/tool"), 0o6777),
        _with_mode(_file("train.py"), 0o4666),
    )
    (tmp_path / "work").mkdir()
    code = _fetch(s3, bucket, tmp_path / "work", body)
    modes = {name: (code / name).stat().st_mode & 0o7777 for name in ("bin", "bin/tool", "train.py")}
    assert modes == {"bin": 0o755, "bin/tool": 0o755, "train.py": 0o644}
    assert (code / "bin" / "tool").stat().st_uid == os.getuid()
    assert code.stat().st_mode & 0o7022 == 0


@pytest.mark.parametrize("kind", [tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE])
def test_hard_links_and_devices_are_refused(python_tarfile, kind, s3, bucket, tmp_path):
    info = _with_mode(tarfile.TarInfo("train.py"), 0o644, kind)
    info.linkname = "/etc/passwd" if kind == tarfile.LNKTYPE else ""
    with pytest.raises(SourceDirError, match="holds 'train.py', which is not a plain file or folder"):
        _fetch(s3, bucket, tmp_path, _package(info))
