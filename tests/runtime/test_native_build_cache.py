"""The compiled reader's build cache loads nothing another user could have put there.

No TensorFlow needed: a stand-in ``tensorflow`` module records which libraries ``load_op_library``
was asked to load, and a stand-in compiler writes the "library". The tests run as root; "another
user" is nobody (uid 65534), made the owner with chown. The real TensorFlow load of a planted library
is in test_pipe_readers.py.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
import types

import pytest

from sagemaker_dist.runtime.tensorflow.data import native_build

NOBODY = 65534


class FakeTensorFlow(types.ModuleType):
    """What native_build asks of TensorFlow; ``loaded`` lists every library it was asked to load."""

    def __init__(self):
        super().__init__("tensorflow")
        self.__version__ = "0.0-test"
        self.sysconfig = types.SimpleNamespace(
            get_compile_flags=lambda: ["-DTEST"], get_link_flags=lambda: []
        )
        self.loaded: list[str] = []

    def load_op_library(self, path):
        self.loaded.append(path)
        return types.SimpleNamespace(**{native_build.OP_NAME: object()})


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty build cache in a private folder, a fresh reader choice, a stand-in TensorFlow and a
    stand-in compiler that counts its runs; yields (tf, the library's planned path, the run count file)."""
    tmp_path.chmod(0o700)
    monkeypatch.setattr(native_build, "_loaded", {})
    monkeypatch.setenv(native_build.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(native_build.READER_ENV, raising=False)
    tf = FakeTensorFlow()
    monkeypatch.setitem(sys.modules, "tensorflow", tf)
    runs = tmp_path / "runs"
    compiler = tmp_path / "g++"
    compiler.write_text(f'#!/bin/sh\necho run >> {runs}\nfor a; do out=$a; done\necho so > "$out"\n')
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    _, library = native_build.build_plan(tf)
    return tf, library, runs


@pytest.fixture
def root_user():
    if os.geteuid() != 0:
        pytest.skip("needs root, to make files another user's (chown)")


def plant_library(library, owner=None, mode=0o755):
    library.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    library.write_text("planted")
    library.chmod(mode)
    if owner is not None:
        os.chown(library, owner, owner)


def choose(caplog, setting="auto"):
    os.environ[native_build.READER_ENV] = setting
    with caplog.at_level(logging.INFO, logger=native_build.__name__):
        return native_build.compiled_op()


def test_a_good_cache_builds_loads_and_keeps_private_modes(cache, caplog):
    tf, library, runs = cache
    assert choose(caplog) is not None
    assert tf.loaded == [str(library)] and runs.read_text() == "run\n"
    root = library.parents[2]
    assert [stat.S_IMODE(os.lstat(p).st_mode) for p in (root, root / "ops", library.parent)] == [0o700] * 3
    assert stat.S_IMODE(os.lstat(library).st_mode) == 0o755  # readable by all, writable by us only
    assert stat.S_IMODE(os.lstat(library.parent / native_build.LOCK).st_mode) == 0o600
    assert "the compiled reader runs" in caplog.text


def test_a_library_of_another_user_is_never_loaded_auto_runs_python_and_says_why(cache, caplog, root_user):
    tf, library, runs = cache
    plant_library(library, owner=NOBODY)
    assert choose(caplog) is None
    assert tf.loaded == [] and not runs.exists()  # neither loaded nor built over
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and "the Python reader runs" in warning[0]
    assert (
        str(library) in warning[0] and "belongs to another user" in warning[0] and "uid 65534" in warning[0]
    )


def test_compiled_with_a_library_of_another_user_is_an_error_naming_why(cache, caplog, root_user):
    tf, library, _ = cache
    plant_library(library, owner=NOBODY)
    with pytest.raises(native_build.NativeReaderError, match=r"compiled.*not safe.*belongs to another user"):
        choose(caplog, "compiled")
    assert tf.loaded == []


@pytest.mark.parametrize("mode", [0o775, 0o757])
def test_a_library_writable_by_group_or_others_is_never_loaded(cache, caplog, mode):
    tf, library, _ = cache
    plant_library(library, mode=mode)
    assert choose(caplog) is None and tf.loaded == []
    assert "writable by group or others" in caplog.text


def test_a_library_that_is_a_link_is_never_followed(cache, caplog, tmp_path):
    tf, library, _ = cache
    elsewhere = tmp_path / "elsewhere.so"
    elsewhere.write_text("not ours to load")
    library.parent.mkdir(parents=True, mode=0o700)
    library.symlink_to(elsewhere)
    assert choose(caplog) is None and tf.loaded == []
    assert "is a symbolic link" in caplog.text


def test_a_cache_root_of_another_user_runs_python_and_is_left_alone(cache, caplog, root_user):
    tf, library, runs = cache
    root = library.parents[2]
    root.mkdir(mode=0o700)
    os.chown(root, NOBODY, NOBODY)
    assert choose(caplog) is None
    assert tf.loaded == [] and not runs.exists() and list(root.iterdir()) == []
    assert "the build cache is not safe to load from" in caplog.text and str(root) in caplog.text
    with pytest.raises(native_build.NativeReaderError, match="belongs to another user"):
        choose(caplog, "compiled")


def test_a_key_folder_writable_by_others_is_refused(cache, caplog):
    tf, library, _ = cache
    library.parent.mkdir(parents=True)
    library.parent.chmod(0o777)
    plant_library(library)
    assert choose(caplog) is None and tf.loaded == []
    assert f"chmod go-w {library.parent}" in caplog.text


def test_a_lock_that_is_a_link_is_not_followed_the_file_outside_stays_as_it_was(cache, tmp_path):
    _, library, runs = cache
    library.parent.mkdir(parents=True, mode=0o700)
    outside = tmp_path / "victim"
    outside.write_text("precious")
    (library.parent / native_build.LOCK).symlink_to(outside)
    with pytest.raises(native_build._Unavailable, match=r"not safe.*\.lock .*is a symbolic link"):
        native_build._build([os.environ["CXX"]], library, force=False)
    assert outside.read_text() == "precious" and not runs.exists()
    (library.parent / native_build.LOCK).unlink()
    (library.parent / native_build.LOCK).symlink_to(tmp_path / "made-through-the-link")
    with pytest.raises(native_build._Unavailable, match="is a symbolic link"):
        native_build._build([os.environ["CXX"]], library, force=False)
    assert not (tmp_path / "made-through-the-link").exists()


def test_a_planted_failure_marker_is_ignored_with_a_log_line(cache, caplog, root_user):
    _, library, runs = cache
    command = [os.environ["CXX"]]
    library.parent.mkdir(parents=True, mode=0o700)
    marker = library.parent / native_build.FAILED
    marker.write_text(" ".join(command) + "\n\nit failed, honest\n")  # the right token, not ours
    os.chown(marker, NOBODY, NOBODY)
    with caplog.at_level(logging.WARNING, logger=native_build.__name__):
        native_build._build(command, library, force=False)  # auto builds all the same
    assert runs.read_text() == "run\n" and library.read_text() == "so\n" and not marker.exists()
    assert f"ignoring {marker}" in caplog.text and "belongs to another user" in caplog.text


def test_a_marker_of_ours_without_this_builds_command_line_is_ignored(cache, caplog):
    _, library, runs = cache
    library.parent.mkdir(parents=True, mode=0o700)
    (library.parent / native_build.FAILED).write_text("g++ something else\n\nerror\n")
    with caplog.at_level(logging.WARNING, logger=native_build.__name__):
        native_build._build([os.environ["CXX"]], library, force=False)
    assert runs.read_text() == "run\n" and "not the record of this build's failure" in caplog.text


def test_our_own_marker_still_stops_auto_and_is_written_without_following_a_link(cache, tmp_path):
    _, library, _ = cache
    failing = tmp_path / "failing-g++"
    failing.write_text("#!/bin/sh\necho 'op.cc:1: error: nope' >&2\nexit 1\n")
    failing.chmod(0o755)
    command = [str(failing)]
    library.parent.mkdir(parents=True, mode=0o700)
    outside = tmp_path / "victim"
    outside.write_text("precious")
    marker = library.parent / native_build.FAILED
    marker.symlink_to(outside)  # ignored, and replaced: never written through
    with pytest.raises(native_build._Unavailable, match="exited 1: op.cc:1: error: nope"):
        native_build._build(command, library, force=False)
    assert outside.read_text() == "precious"
    assert not marker.is_symlink() and marker.read_text().startswith(f"{failing}\n\n")
    with pytest.raises(native_build._Unavailable, match="failed to build before"):
        native_build._build(command, library, force=False)
