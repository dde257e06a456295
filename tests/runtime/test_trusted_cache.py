"""Cache folders only this user can write (runtime/trusted_cache.py) and their shell twin
(scripts/lib/trusted-cache.sh), on real folders and files, with a real other user: the tests run as
root, and "another user" is nobody (uid 65534), made the owner with chown."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.runtime.trusted_cache import (
    UntrustedCacheError,
    check_path,
    create_new,
    open_trusted,
    trusted_dir,
)

NOBODY = 65534
REPO = Path(__file__).resolve().parents[2]
SHELL_LIB = REPO / "scripts" / "lib" / "trusted-cache.sh"


@pytest.fixture
def root_user():
    if os.geteuid() != 0:
        pytest.skip("needs root, to make files another user's (chown)")


@pytest.fixture
def base(tmp_path):
    """A private folder (0700) holding the cache roots of a test."""
    tmp_path.chmod(0o700)
    return tmp_path


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# trusted_dir: the folders from the cache root down


def test_missing_folders_are_made_0700_whatever_the_umask(base):
    old = os.umask(0o002)
    try:
        got = trusted_dir(base / "cache" / "ops" / "key", root=base / "cache")
    finally:
        os.umask(old)
    assert got == base / "cache" / "ops" / "key"
    assert [mode(p) for p in (base / "cache", base / "cache" / "ops", got)] == [0o700] * 3
    assert trusted_dir(got, root=base / "cache") == got  # a second time: checked, nothing changed


def test_an_existing_folder_keeps_its_mode(base):
    (base / "cache").mkdir(mode=0o755)
    (base / "cache").chmod(0o755)
    trusted_dir(base / "cache" / "ops", root=base / "cache")
    assert mode(base / "cache") == 0o755 and mode(base / "cache" / "ops") == 0o700


def test_a_folder_of_another_user_is_refused_naming_it_its_owner_and_mode(base, root_user):
    cache = base / "cache"
    (cache / "ops").mkdir(parents=True, mode=0o700)
    os.chown(cache / "ops", NOBODY, NOBODY)
    with pytest.raises(UntrustedCacheError) as caught:
        trusted_dir(
            cache / "ops" / "key", root=cache, hint="set SAGEMAKER_DIST_CACHE to a folder of your own"
        )
    message = str(caught.value)
    assert f"{cache / 'ops'} (owner " in message and "uid 65534" in message and "(0700)" in message
    assert "belongs to another user" in message and "remove it" in message
    assert "SAGEMAKER_DIST_CACHE" in message
    assert not (cache / "ops" / "key").exists()  # nothing made under it
    assert isinstance(caught.value, ConfigurationError)


def test_the_cache_root_of_another_user_is_refused(base, root_user):
    (base / "cache").mkdir(mode=0o700)
    os.chown(base / "cache", NOBODY, NOBODY)
    with pytest.raises(UntrustedCacheError, match="belongs to another user"):
        trusted_dir(base / "cache")


@pytest.mark.parametrize("bits", [0o770, 0o707, 0o775, 0o757])
def test_a_folder_writable_by_group_or_others_is_refused_with_the_chmod_that_fixes_it(base, bits):
    cache = base / "cache"
    (cache / "ops").mkdir(parents=True)
    (cache / "ops").chmod(bits)
    with pytest.raises(UntrustedCacheError, match=r"writable by group or others.*chmod go-w .*ops"):
        trusted_dir(cache / "ops", root=cache)
    (cache / "ops").chmod(bits & ~0o022)
    trusted_dir(cache / "ops", root=cache)


def test_a_link_below_the_root_is_refused_not_followed(base):
    cache = base / "cache"
    elsewhere = base / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    cache.mkdir(mode=0o700)
    (cache / "ops").symlink_to(elsewhere)
    with pytest.raises(UntrustedCacheError, match="is a symbolic link"):
        trusted_dir(cache / "ops" / "key", root=cache)
    assert list(elsewhere.iterdir()) == []


def test_a_cache_root_that_is_a_link_is_resolved_and_its_target_checked(base, root_user):
    target = base / "disk" / "cache"
    target.mkdir(parents=True, mode=0o700)
    (base / "link").symlink_to(target)
    assert trusted_dir(base / "link" / "ops", root=base / "link") == target / "ops"
    os.chown(target, NOBODY, NOBODY)
    with pytest.raises(UntrustedCacheError, match=f"{target} .*belongs to another user"):
        trusted_dir(base / "link" / "ops", root=base / "link")


def test_the_roots_parent_may_be_sticky_like_tmp_but_not_just_writable(base, root_user):
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone could rename the cache away and put their own in its place
    with pytest.raises(UntrustedCacheError, match=f"{shared} .*writable by group or others"):
        trusted_dir(shared / "cache")
    assert not (shared / "cache").exists()
    shared.chmod(0o1777)  # /tmp: nobody else can rename or remove what is ours there
    assert mode(trusted_dir(shared / "cache")) == 0o700
    os.chown(shared, NOBODY, NOBODY)  # its owner can, sticky or not
    with pytest.raises(UntrustedCacheError, match=f"{shared} .*belongs to another user"):
        trusted_dir(shared / "cache")


def test_in_a_sticky_parent_a_root_planted_by_another_user_is_refused(base, root_user):
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "cache").mkdir(mode=0o700)
    os.chown(shared / "cache", NOBODY, NOBODY)
    with pytest.raises(UntrustedCacheError, match="belongs to another user"):
        trusted_dir(shared / "cache" / "ops", root=shared / "cache")


def test_without_create_nothing_is_made_and_what_is_there_is_checked(base):
    assert trusted_dir(base / "cache" / "ops", root=base / "cache", create=False) == base / "cache" / "ops"
    assert not (base / "cache").exists()
    (base / "cache").mkdir(mode=0o777)
    (base / "cache").chmod(0o777)
    with pytest.raises(UntrustedCacheError):
        trusted_dir(base / "cache" / "ops", root=base / "cache", create=False)


def test_folders_made_at_the_same_time_are_checked_as_any(base):
    errors = []

    def make():
        try:
            trusted_dir(base / "cache" / "a" / "b", root=base / "cache")
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == [] and mode(base / "cache" / "a" / "b") == 0o700


# files: check_path, open_trusted, create_new


def test_check_path_refuses_a_file_of_another_user_a_writable_one_and_a_link(base, root_user):
    f = base / "f"
    assert check_path(f) is None  # nothing there
    f.write_bytes(b"x")
    f.chmod(0o755)
    assert check_path(f).st_size == 1
    f.chmod(0o775)
    with pytest.raises(UntrustedCacheError, match="writable by group or others"):
        check_path(f)
    f.chmod(0o755)
    os.chown(f, NOBODY, NOBODY)
    with pytest.raises(UntrustedCacheError, match="belongs to another user"):
        check_path(f)
    (base / "link").symlink_to(base / "mine")
    (base / "mine").write_bytes(b"mine")
    with pytest.raises(UntrustedCacheError, match="is a symbolic link"):
        check_path(base / "link")
    with pytest.raises(UntrustedCacheError, match="is not a regular file"):
        check_path(base, "file")


def test_open_trusted_never_follows_a_link_the_file_outside_stays_unchanged(base):
    outside = base / "outside"
    outside.write_bytes(b"precious")
    outside.chmod(0o600)
    (base / ".lock").symlink_to(outside)
    with pytest.raises(UntrustedCacheError, match=r"\.lock .*is a symbolic link"):
        open_trusted(base / ".lock", os.O_RDWR | os.O_CREAT)
    assert outside.read_bytes() == b"precious" and mode(outside) == 0o600
    # a dangling link: O_CREAT does not create its target either
    (base / "dangling").symlink_to(base / "target")
    with pytest.raises(UntrustedCacheError, match="is a symbolic link"):
        open_trusted(base / "dangling", os.O_RDWR | os.O_CREAT)
    assert not (base / "target").exists()


def test_open_trusted_makes_a_0600_file_and_refuses_one_of_another_user(base, root_user):
    fd = open_trusted(base / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    assert mode(base / ".lock") == 0o600
    os.chown(base / ".lock", NOBODY, NOBODY)
    with pytest.raises(UntrustedCacheError, match="belongs to another user"):
        open_trusted(base / ".lock", os.O_RDWR | os.O_CREAT)
    with pytest.raises(FileNotFoundError):
        open_trusted(base / "missing", os.O_RDONLY)


def test_open_trusted_refuses_a_fifo_without_blocking(base):
    os.mkfifo(base / "fifo", 0o600)
    with pytest.raises(UntrustedCacheError, match="is not a regular file"):
        open_trusted(base / "fifo", os.O_RDONLY)


def test_create_new_never_writes_through_a_link_or_over_a_file(base):
    outside = base / "outside"
    outside.write_bytes(b"precious")
    (base / "marker").symlink_to(outside)
    with pytest.raises(FileExistsError):
        create_new(base / "marker", b"planted")
    assert outside.read_bytes() == b"precious"
    create_new(base / "new", b"data")
    assert (base / "new").read_bytes() == b"data"
    with pytest.raises(FileExistsError):
        create_new(base / "new", b"again")


def test_importing_it_loads_nothing_heavy():
    code = (
        "import sys, sagemaker_dist.runtime.trusted_cache\n"
        "heavy = [m for m in ('tensorflow', 'torch', 'boto3', 'sagemaker', 'numpy') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


# scripts/lib/trusted-cache.sh: the same rule in the shell scripts' caches


def shell(*args, umask: str = "022") -> subprocess.CompletedProcess:
    script = f'set -euo pipefail\numask {umask}\n. "{SHELL_LIB}"\ntrusted_cache_dir "$@"\necho checked\n'
    return subprocess.run(
        ["bash", "-c", script, "setup.sh", *map(str, args)], capture_output=True, text=True, timeout=30
    )


def test_shell_makes_the_cache_0700_and_passes_a_good_one(base):
    done = shell(base / "cache", base / "cache" / "podman" / "storage", umask="002")
    assert done.returncode == 0 and done.stdout == "checked\n", done.stderr
    assert [
        mode(p) for p in (base / "cache", base / "cache" / "podman", base / "cache" / "podman" / "storage")
    ] == [0o700] * 3
    (base / "cache").chmod(0o755)
    assert shell(base / "cache", base / "cache" / "podman").returncode == 0


def test_shell_refuses_a_cache_of_another_user_naming_it_and_the_fix(base, root_user):
    (base / "cache" / "horovod-x").mkdir(parents=True, mode=0o700)
    os.chown(base / "cache" / "horovod-x", NOBODY, NOBODY)
    done = shell(base / "cache", base / "cache" / "horovod-x")
    assert done.returncode == 2 and "checked" not in done.stdout
    assert f"{base / 'cache' / 'horovod-x'} (owner nobody (uid 65534)" in done.stderr
    assert "belongs to another user" in done.stderr and "SAGEMAKER_DIST_CACHE" in done.stderr
    assert shell(base / "cache").returncode == 0  # the root alone is fine
    os.chown(base / "cache", NOBODY, NOBODY)
    assert "belongs to another user" in shell(base / "cache").stderr


def test_shell_refuses_a_cache_writable_by_group_or_others(base):
    (base / "cache").mkdir(mode=0o700)
    (base / "cache").chmod(0o775)
    done = shell(base / "cache")
    assert done.returncode == 2 and "writable by group or others" in done.stderr
    assert f"chmod go-w '{base / 'cache'}'" in done.stderr
    (base / "cache").chmod(0o700)
    (base / "cache" / "podman").mkdir(mode=0o777)
    (base / "cache" / "podman").chmod(0o777)
    assert "writable by group or others" in shell(base / "cache", base / "cache" / "podman").stderr


def test_shell_the_roots_parent_may_be_sticky_but_not_just_writable(base):
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    done = shell(shared / "cache")
    assert done.returncode == 2 and f"the folder that holds the cache, {shared}" in done.stderr
    shared.chmod(0o1777)
    assert shell(shared / "cache").returncode == 0
    assert mode(shared / "cache") == 0o700


def test_shell_refuses_a_link_below_the_root_and_resolves_a_root_that_is_one(base):
    (base / "disk").mkdir(mode=0o700)
    (base / "cache").symlink_to(base / "disk")
    assert shell(base / "cache", base / "cache" / "podman").returncode == 0
    assert (base / "disk" / "podman").is_dir()
    (base / "disk" / "horovod-x").symlink_to(base / "elsewhere")
    done = shell(base / "cache", base / "cache" / "horovod-x")
    assert done.returncode == 2 and "is a symbolic link" in done.stderr


def test_the_podman_scripts_storage_goes_through_the_check(base):
    """scripts/lib/podman-env.sh (container-test.sh, fresh-machine-check.sh) checks its cache first."""
    script = (
        f'set -euo pipefail\n. "{REPO}/scripts/lib/podman-env.sh"\nSAGEMAKER_DIST_CACHE_ROOT="$1"\n'
        'podman_paths "$SAGEMAKER_DIST_CACHE_ROOT/podman"\necho "storage in $PODMAN_HOME"\n'
    )
    run = ["bash", "-c", script, "container-test.sh", str(base / "cache")]
    done = subprocess.run(run, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and f"storage in {base / 'cache' / 'podman'}" in done.stdout, done.stderr
    assert mode(base / "cache") == 0o700 and mode(base / "cache" / "podman") == 0o700
    (base / "cache" / "podman").chmod(0o777)
    done = subprocess.run(run, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "storage in" not in done.stdout
    assert f"{base / 'cache' / 'podman'} (owner " in done.stderr and "chmod go-w" in done.stderr
