"""The embedded S3's state dir loads nothing another user could have written: what it
holds becomes the objects jobs read (checkpoints, code). Real folders and a real other user: the
tests run as root, and "another user" is nobody (uid 65534), made the owner with chown."""

from __future__ import annotations

import os
import stat
import uuid

import pytest

from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.local import endpoint

NOBODY = 65534


@pytest.fixture
def base(tmp_path):
    tmp_path.chmod(0o700)
    return tmp_path


@pytest.fixture
def root_user():
    if os.geteuid() != 0:
        pytest.skip("needs root, to make files another user's (chown)")


@pytest.fixture
def name():
    """The state's bucket: a name of its own per test, as the tests' moto server is shared."""
    return f"state-{uuid.uuid4().hex[:12]}"


def saved_state(base, name="bucket"):
    state = base / "state"
    (state / name / "ckpt").mkdir(parents=True, mode=0o700)
    for d in (state, state / name, state / name / "ckpt"):
        d.chmod(0o700)
    (state / name / "ckpt" / "model.pt").write_bytes(b"weights")
    (state / name / "ckpt" / "model.pt").chmod(0o600)
    return state


def served(s3, name: str) -> list[str] | None:
    """The keys the server holds in bucket ``name`` (None: no such bucket)."""
    if name not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        return None
    return [obj["Key"] for obj in s3.list_objects_v2(Bucket=name).get("Contents", [])]


def test_a_file_another_user_put_in_the_state_is_refused_not_served(base, root_user, s3, name):
    state = saved_state(base, name)
    os.chown(state / name / "ckpt" / "model.pt", NOBODY, NOBODY)
    with pytest.raises(ConfigurationError, match=r"model\.pt .*belongs to another user.*--s3-state-dir"):
        endpoint._load_state(s3, state)
    assert not served(s3, name)
    os.chown(state / name / "ckpt" / "model.pt", 0, 0)
    buckets, etags = endpoint._load_state(s3, state)  # ours: served
    assert served(s3, name) == ["ckpt/model.pt"] and buckets == {name} and (name, "ckpt/model.pt") in etags


def test_a_state_dir_of_another_user_is_refused_before_anything_starts(base, root_user, s3):
    state = saved_state(base)
    os.chown(state, NOBODY, NOBODY)
    with pytest.raises(ConfigurationError, match=f"{state} .*belongs to another user"):
        with endpoint.embedded_s3(state):
            pytest.fail("the endpoint started on another user's state")
    with pytest.raises(ConfigurationError, match="belongs to another user"):
        endpoint._load_state(s3, state)


def test_a_state_writable_by_others_is_refused(base, s3, name):
    state = saved_state(base, name)
    (state / name / "ckpt").chmod(0o777)
    with pytest.raises(ConfigurationError, match=r"ckpt .*writable by group or others.*chmod go-w"):
        endpoint._load_state(s3, state)
    assert not served(s3, name)


def test_a_lock_that_is_a_link_is_not_followed(base):
    outside = base / "victim"
    outside.write_text("precious")
    (base / "state.lock").symlink_to(outside)
    with pytest.raises(ConfigurationError, match=r"state\.lock .*is a symbolic link"):
        with endpoint._state_lock(base / "state"):
            pass
    assert outside.read_text() == "precious"  # the old code wrote its pid into it
    (base / "state.lock").unlink()
    (base / "state.lock").symlink_to(base / "made-through-the-link")
    with pytest.raises(ConfigurationError, match="is a symbolic link"):
        with endpoint._state_lock(base / "state"):
            pass
    assert not (base / "made-through-the-link").exists()


def test_the_lock_is_0600_and_its_folder_0700_when_made(base):
    with endpoint._state_lock(base / "cache" / "local-s3"):
        pass
    assert stat.S_IMODE(os.stat(base / "cache").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(base / "cache" / "local-s3.lock").st_mode) == 0o600


def test_a_state_dir_in_a_folder_anyone_can_write_is_refused_in_a_sticky_one_it_is_not(
    base, root_user, s3, name
):
    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigurationError, match=f"{shared} .*writable by group or others"):
        with endpoint._state_lock(shared / "state"):
            pass
    shared.chmod(0o1777)  # /tmp
    with endpoint._state_lock(shared / "state"):
        pass
    # there, another user's ".old" (a half-done swap, as the recovery reads it) is never adopted ...
    (shared / "state.old" / name).mkdir(parents=True)
    (shared / "state.old" / name / "code.tar.gz").write_bytes(b"planted")
    os.chown(shared / "state.old", NOBODY, NOBODY)
    with pytest.raises(ConfigurationError, match=r"state\.old .*belongs to another user"):
        endpoint._load_state(s3, shared / "state")
    assert served(s3, name) is None and not (shared / "state").exists()
    # ... and another user's leftover of a save is theirs to remove
    leftover = shared / ".state.saving-abc"
    leftover.mkdir()
    os.chown(leftover, NOBODY, NOBODY)
    os.chown(shared / "state.old", 0, 0)
    endpoint._recover_state(shared / "state")
    assert leftover.is_dir() and (shared / "state" / name).is_dir()


def test_a_saved_state_is_writable_by_no_one_else_whatever_the_umask(base):
    from sagemaker_dist.aws.s3_objects import s3_client

    state = base / "state"
    old = os.umask(0o002)
    try:
        with endpoint.embedded_s3(state):
            client = s3_client()
            client.create_bucket(Bucket="kept-bucket")
            client.put_object(Bucket="kept-bucket", Key="deep/er/key.txt", Body=b"x")
    finally:
        os.umask(old)
    modes = {str(p.relative_to(base)): stat.S_IMODE(os.lstat(p).st_mode) for p in [state, *state.rglob("*")]}
    assert modes and all(m & 0o022 == 0 for m in modes.values()), modes
    assert (state / "kept-bucket" / "deep" / "er" / "key.txt").read_bytes() == b"x"
    with endpoint.embedded_s3(None, set_env=False) as url:  # and it loads back
        _, etags = endpoint._load_state(endpoint._local_client(url), state)
    assert ("kept-bucket", "deep/er/key.txt") in etags


def test_a_saved_state_holds_its_own_buckets_not_another_moto_servers(s3, bucket, tmp_path):
    """moto keeps one store per process: an embedded S3 started beside another moto server (the
    tests' here, an earlier one in a notebook) saves the buckets it loaded or made, not the other's."""
    from sagemaker_dist.aws.s3_objects import s3_client

    state = tmp_path / "state"
    with endpoint.embedded_s3(state):
        client = s3_client()
        client.create_bucket(Bucket="own-bucket")
        client.put_object(Bucket="own-bucket", Key="a", Body=b"1")
    assert sorted(p.name for p in state.iterdir()) == ["own-bucket"]
    with endpoint.embedded_s3(state):  # again in this process: the bucket it loads is its own
        s3_client().put_object(Bucket="own-bucket", Key="b", Body=b"2")
    assert sorted(p.name for p in state.iterdir()) == ["own-bucket"]
    assert sorted(p.name for p in (state / "own-bucket").iterdir()) == ["a", "b"]
    assert bucket in {b["Name"] for b in s3.list_buckets()["Buckets"]}  # the other server's, untouched
