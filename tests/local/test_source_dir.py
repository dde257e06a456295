"""The source package unpacked on a host: tarfile's ``data`` filter where Python has it, the same
refusals by hand on patch releases without it (Debian 12's Python 3.11.2)."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from sagemaker_dist.host.source_dir import SourceDirError, fetch_source_dir
from sagemaker_dist.launch.s3_objects import s3_client


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
    hps = {"sagemaker_submit_directory": f"s3://{bucket}/src/sourcedir.tar.gz"}
    return fetch_source_dir(None, hps, tmp_path, s3_client())


def test_a_package_unpacks_with_or_without_the_data_filter(python_tarfile, s3, bucket, tmp_path):
    code = _fetch(s3, bucket, tmp_path, _package(_file("train.py"), _file("lib/util.py")))
    assert (code / "train.py").read_text() == "print('hi')\n"
    assert (code / "lib" / "util.py").is_file()


@pytest.mark.parametrize("member", [_file("../outside.py"), _link("train.py", "/etc/passwd")])
def test_a_member_outside_the_package_or_a_link_is_refused(python_tarfile, member, s3, bucket, tmp_path):
    with pytest.raises(REFUSALS):
        _fetch(s3, bucket, tmp_path, _package(member))
    assert not (tmp_path / "outside.py").exists()


def test_an_absolute_member_never_lands_outside_the_package(python_tarfile, s3, bucket, tmp_path):
    """The data filter makes it relative; without it, it is refused. Either way nothing at /abs."""
    name = f"/{tmp_path.name}-abs/train.py"
    try:
        code = _fetch(s3, bucket, tmp_path, _package(_file(name)))
    except SourceDirError as exc:
        assert name in str(exc)
    else:
        assert (code / name.lstrip("/")).is_file()
    assert not os.path.exists(name)
