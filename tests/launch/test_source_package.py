"""Packing source_dir as sourcedir.tar.gz: deterministic, checked before anything is written or uploaded."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from sagemaker_dist.launch.source_package import (
    MAX_SOURCE_BYTES,
    TARBALL_NAME,
    SourcePackageError,
    pack_source,
    upload_source,
)


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "code"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("from pkg import net\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "net.py").write_text("WIDTH = 64\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "run.sh", 0o750)
    for junk in ("__pycache__", ".git", ".ipynb_checkpoints"):
        (root / junk).mkdir()
        (root / junk / "x").write_text("junk")
    (root / "pkg" / "net.pyc").write_bytes(b"\0")
    return root


def names(path) -> list[str]:
    with tarfile.open(path) as tar:
        return sorted(tar.getnames())


def test_packs_code_without_caches_and_with_normalized_metadata(src, tmp_path):
    package = pack_source("train.py", src, dest_dir=tmp_path / "out")
    assert package.path == tmp_path / "out" / TARBALL_NAME
    assert package.entry_point == "train.py"
    assert names(package.path) == ["pkg/__init__.py", "pkg/net.py", "run.sh", "train.py"]
    assert list(package.files) == ["pkg/__init__.py", "pkg/net.py", "run.sh", "train.py"]
    with tarfile.open(package.path) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert {m.mtime for m in members.values()} == {0}
        assert {(m.uid, m.gid, m.uname, m.gname) for m in members.values()} == {(0, 0, "", "")}
        assert members["run.sh"].mode == 0o755 and members["train.py"].mode == 0o644
        assert tar.extractfile("pkg/net.py").read() == b"WIDTH = 64\n"
    assert list((tmp_path / "out").iterdir()) == [package.path]  # no temporary file left behind


def test_a_linked_file_inside_source_dir_is_packed_as_its_content(src, tmp_path):
    (src / "lib").mkdir()
    (src / "lib" / "shared.py").write_text("SHARED = 1\n")
    (src / "pkg" / "shared.py").symlink_to(src / "lib" / "shared.py")
    with tarfile.open(pack_source("train.py", src, dest_dir=tmp_path / "out").path) as tar:
        member = tar.getmember("pkg/shared.py")
        assert member.isfile() and tar.extractfile(member).read() == b"SHARED = 1\n"


def test_a_link_out_of_source_dir_is_refused_before_anything_is_written(src, tmp_path):
    """It packed the file it points to (a credentials file, say) into the job's S3 and container."""
    secret = tmp_path / "credentials"
    secret.write_text("[default]\naws_secret_access_key = x\n")
    (src / "pkg" / "creds.py").symlink_to(secret)
    with pytest.raises(SourcePackageError) as caught:
        pack_source("train.py", src, dest_dir=tmp_path / "out")
    message = str(caught.value)
    assert f"source_dir {str(src)!r} holds the link 'pkg/creds.py', which leads out of" in message
    assert "copy that file into source_dir" in message
    assert not (tmp_path / "out").exists()


def test_linked_folders_are_not_followed_and_env_files_are_left_out(src, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "data.bin").write_bytes(b"\0" * 10)
    (src / "data").symlink_to(elsewhere)
    for name in (".env", ".env.local", "pkg/.env.production"):
        (src / name).write_text("API_KEY=secret\n")
    (src / "environment.py").write_text("")  # only .env and .env.* are secrets
    package = pack_source("train.py", src, dest_dir=tmp_path / "out")
    assert list(package.files) == ["environment.py", "pkg/__init__.py", "pkg/net.py", "run.sh", "train.py"]


def test_same_sources_give_the_same_bytes(src, tmp_path):
    first = pack_source("train.py", src, dest_dir=tmp_path / "a")
    os.utime(src / "train.py", (1_000_000, 1_000_000))  # touching a file must not change the tarball
    second = pack_source("train.py", src, dest_dir=tmp_path / "b")
    assert first.sha256 == second.sha256
    assert first.path.read_bytes() == second.path.read_bytes()
    (src / "train.py").write_text("changed\n")
    assert pack_source("train.py", src, dest_dir=tmp_path / "c").sha256 != first.sha256


def test_entry_point_in_a_subfolder_and_absolute_inside_source_dir(src, tmp_path):
    assert pack_source("pkg/net.py", src, dest_dir=tmp_path).entry_point == "pkg/net.py"
    assert pack_source(str(src / "pkg" / "net.py"), src, dest_dir=tmp_path).entry_point == "pkg/net.py"


def test_without_source_dir_only_the_entry_script_is_packed(src, tmp_path):
    package = pack_source(str(src / "train.py"), dest_dir=tmp_path)
    assert names(package.path) == ["train.py"]


@pytest.mark.parametrize(
    ("entry", "source_dir", "message"),
    [
        ("trian.py", "code", "'trian.py' does not exist in source_dir.*Python files there: .*train.py"),
        ("../train.py", "code", "does not exist in source_dir"),
        ("pkg", "code", "'pkg' does not exist in source_dir"),
        ("train.py", "missing-dir", "is not a directory"),
        ("/elsewhere/train.py", "code", "is outside source_dir"),
        ("nowhere.py", None, "entry script 'nowhere.py' does not exist"),
        ("__pycache__/x", "code", "excluded location"),
    ],
)
def test_bad_entry_points_are_refused_before_writing(src, tmp_path, entry, source_dir, message):
    out = tmp_path / "out"
    source = None if source_dir is None else tmp_path / source_dir
    with pytest.raises(SourcePackageError, match=message):
        pack_source(entry, source, dest_dir=out)
    assert not out.exists()


def test_size_limit_is_checked_before_packing(src, tmp_path):
    (src / "big.bin").write_bytes(b"\1" * 3000)
    out = tmp_path / "out"
    with pytest.raises(SourcePackageError, match=r"over the 2048 bytes limit for code \(largest: big.bin"):
        pack_source("train.py", src, dest_dir=out, max_bytes=2048)
    assert not out.exists()
    assert pack_source("train.py", src, dest_dir=out, max_bytes=4096).source_bytes > 3000


def test_the_real_500_mib_limit_with_a_sparse_file(src, tmp_path):
    with open(src / "huge.ckpt", "wb") as f:  # sparse: apparent size only, nothing read or written
        f.truncate(MAX_SOURCE_BYTES + 1)
    with pytest.raises(SourcePackageError, match="over the 500.0 MiB limit.*huge.ckpt.*Put data in S3"):
        pack_source("train.py", src, dest_dir=tmp_path / "out")


def test_upload_puts_the_tarball_at_the_given_uri(src, tmp_path, s3, bucket):
    package = pack_source("train.py", src, dest_dir=tmp_path)
    uri = f"s3://{bucket}/jobs/j1/source/{TARBALL_NAME}"
    assert upload_source(package, uri, client=s3) == uri
    obj = s3.get_object(Bucket=bucket, Key=f"jobs/j1/source/{TARBALL_NAME}")
    assert obj["Metadata"]["sha256"] == package.sha256
    with tarfile.open(fileobj=io.BytesIO(obj["Body"].read())) as tar:
        assert tar.extractfile("train.py").read() == b"from pkg import net\n"
    with pytest.raises(SourcePackageError, match="names a prefix"):
        upload_source(package, f"s3://{bucket}/jobs/j1/source/", client=s3)
    with pytest.raises(SourcePackageError, match="could not upload.*no-such-bucket-x.*bucket exists"):
        upload_source(package, f"s3://no-such-bucket-x/j/{TARBALL_NAME}", client=s3)


def test_a_hard_link_to_a_file_outside_source_dir_is_refused(src, tmp_path):
    """A hard link looks like any file: it packed /etc/shadow's content when one pointed there."""
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$hash:19000:0:99999:7:::\n")
    os.link(secret, src / "pkg" / "table.txt")
    with pytest.raises(
        SourcePackageError, match=r"holds 'pkg/table\.txt', a hard link whose file has 2 names, 1 of"
    ):
        pack_source("train.py", src, dest_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    os.unlink(secret)  # both names inside now: an ordinary file
    os.link(src / "pkg" / "table.txt", src / "pkg" / "copy.txt")
    package = pack_source("train.py", src, dest_dir=tmp_path / "out")
    assert {"pkg/copy.txt", "pkg/table.txt"} <= set(package.files)


def test_links_inside_source_dir_to_excluded_files_and_the_usual_secrets_stay_out(src, tmp_path):
    (src / ".env").write_text("API_KEY=secret\n")
    (src / "settings.txt").symlink_to(".env")  # in-tree, but it points at a secret
    os.link(src / ".env", src / "pkg" / "defaults.cfg")  # a second name of the secret
    for name in (".envrc", ".netrc", ".aws/credentials", ".ssh/id_ed25519", "pkg/.aws/config"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text("secret\n")
    package = pack_source("train.py", src, dest_dir=tmp_path / "out")
    assert list(package.files) == ["pkg/__init__.py", "pkg/net.py", "run.sh", "train.py"]
    with tarfile.open(package.path) as tar:
        assert all(b"secret" not in tar.extractfile(m).read() for m in tar.getmembers())
    assert package.left_out == (
        ".aws/", ".env", ".envrc", ".git/", ".ipynb_checkpoints/", ".netrc", ".ssh/", "__pycache__/",
        "pkg/.aws/", "pkg/defaults.cfg (the same file as .env)", "pkg/net.pyc",
        "settings.txt (the same file as .env)",
    )  # fmt: skip
    line = package.left_out_line()
    assert line.startswith("source_dir: left out of sourcedir.tar.gz by the exclude list (source_exclude=")
    assert "settings.txt (the same file as .env)" in line


def test_the_exclude_list_can_be_replaced(src, tmp_path):
    (src / ".env").write_text("NOT_A_SECRET=1\n")
    package = pack_source(
        "train.py", src, dest_dir=tmp_path / "out", exclude=["__pycache__/", "*.pyc", ".ipynb*/"]
    )
    assert (
        ".env" in package.files and ".git/x" in package.files and ".ipynb_checkpoints/x" not in package.files
    )
    with pytest.raises(SourcePackageError, match="in an excluded location"):
        pack_source("train.py", src, dest_dir=tmp_path / "out", exclude=["train.py"])
