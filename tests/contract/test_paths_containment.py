"""The one containment rule: a name from S3, a manifest, a tarball or a request becomes a path only
if it stays inside the directory it is meant for."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sagemaker_dist.contract.paths import (
    CHECKPOINT_LOCAL_PATH,
    OptMl,
    UnsafePathError,
    contained_name,
    contained_path,
    local_path_problem,
)
from sagemaker_dist.errors import ConfigurationError, DataError

WHAT = "channel 'train': object s3://b/k would be downloaded as"


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("../x", "climbs out of its directory with '..'"),
        ("../../../../x", "climbs out"),
        ("a/../../x", "climbs out"),
        ("a/./../b/../../x", "climbs out"),
        ("/etc/x", "is an absolute path"),
        ("//x", "is an absolute path"),
        ("", "names no file"),
        (".", "names no file"),
        ("a/..", "names no file"),
        ("../..", "climbs out"),
        ("a\0b", "holds a NUL byte"),
        (5, "is not a string (a int)"),
        ({"k": "v"}, "is not a string (a dict)"),
        (None, "is not a string (a NoneType)"),
    ],
)
def test_names_that_would_escape_are_refused_naming_what_and_the_name(name, problem):
    with pytest.raises(UnsafePathError) as caught:
        contained_name(name, WHAT, fix="rename it")
    message = str(caught.value)
    assert message.startswith(f"{WHAT} {name!r}, which ") and problem in message
    assert message.endswith("; rename it")
    assert isinstance(caught.value, DataError)


@pytest.mark.parametrize(
    ("name", "normal"),
    [
        ("a", "a"),
        ("a/b.tfrecord", "a/b.tfrecord"),
        ("double//slash.tfrecord", "double/slash.tfrecord"),
        ("./a", "a"),
        ("a/../b", "b"),  # a '..' that stays inside is still inside
        ("..a/b..", "..a/b.."),  # dots inside a name are just a name
        ("sub dir/nested+ü.tfrecord", "sub dir/nested+ü.tfrecord"),
        ("a\\..\\..\\x", "a\\..\\..\\x"),  # a backslash is a plain character on POSIX
    ],
)
def test_names_that_stay_inside_are_kept(name, normal):
    assert str(contained_name(name, WHAT)) == normal


def test_the_caller_chooses_the_error_family():
    with pytest.raises(ConfigurationError, match="LocalPath"):
        contained_name("../x", "LocalPath", error=ConfigurationError)


@given(st.lists(st.sampled_from(["a", "b", "..", ".", "", "/", "\0", "x/.."]), max_size=8).map("".join))
def test_any_accepted_name_lands_strictly_inside_the_root(name):
    """Whatever the rule lets through, joined to a root and normalised, is below that root."""
    root = "/srv/job/input/data/train"
    try:
        contained_name(name, WHAT)
    except UnsafePathError:
        return
    landed = os.path.normpath(os.path.join(root, name))
    assert landed.startswith(root + "/")


@given(st.text())
def test_any_text_is_either_refused_or_inside(name):
    root = "/srv/job/ckpt"
    try:
        relative = contained_name(name, WHAT)
    except UnsafePathError:
        return
    assert os.path.normpath(os.path.join(root, str(relative))).startswith(root + "/")


def test_a_link_out_of_the_root_is_refused_where_a_file_is_written(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "inner").mkdir()
    (root / "out").symlink_to(outside)
    (root / "in").symlink_to(root / "inner")
    with pytest.raises(UnsafePathError, match=r"'out/x', which leads out of .*root through a symbolic link"):
        contained_path(root, "out/x", WHAT)
    assert contained_path(root, "in/x", WHAT) == root / "in" / "x"  # a link that stays inside
    assert contained_path(root, "a//b", WHAT) == root / "a" / "b"
    with pytest.raises(UnsafePathError, match="climbs out"):
        contained_path(root, "../outside/x", WHAT)


def test_a_linked_root_is_the_root(tmp_path):
    """A root that is itself a link (a checkpoint dir on a scratch disk) is where files go."""
    (tmp_path / "scratch").mkdir()
    (tmp_path / "ckpt").symlink_to(tmp_path / "scratch")
    assert contained_path(tmp_path / "ckpt", "step-1/w", WHAT) == tmp_path / "ckpt" / "step-1" / "w"


@pytest.mark.parametrize(
    "local_path", ["/opt/ml/../../etc", "/opt/ml/checkpoints/../../../x", "/../x", "/a/../../x"]
)
def test_a_local_path_that_climbs_out_of_the_tree_is_refused(local_path, tmp_path):
    problem = local_path_problem(local_path)
    assert problem and "climbs out" in problem and "/opt/ml/checkpoints" in problem
    with pytest.raises(ConfigurationError, match=f"LocalPath '{local_path}' maps to"):
        OptMl(tmp_path / "algo-1").local_path(local_path, CHECKPOINT_LOCAL_PATH)


def test_a_relative_local_path_is_refused_and_plain_ones_map_into_the_tree(tmp_path):
    tree = OptMl(tmp_path)
    assert "not an absolute container path" in local_path_problem("checkpoints")
    with pytest.raises(ConfigurationError, match="not an absolute container path"):
        tree.local_path("checkpoints", CHECKPOINT_LOCAL_PATH)
    assert tree.local_path(None, CHECKPOINT_LOCAL_PATH) == tmp_path / "checkpoints"
    assert tree.local_path("/opt/ml/ckpt/", CHECKPOINT_LOCAL_PATH) == tmp_path / "ckpt"
    assert tree.local_path("/opt/ml", CHECKPOINT_LOCAL_PATH) == tmp_path / "checkpoints"
    assert tree.local_path("/scratch/ckpt", CHECKPOINT_LOCAL_PATH) == tmp_path / "scratch" / "ckpt"
    assert tree.local_path("/opt/ml/a/../b", CHECKPOINT_LOCAL_PATH) == tmp_path / "a" / ".." / "b"
    assert local_path_problem("/opt/ml/checkpoints") is None
