"""The embedded S3 endpoint keeps its buckets between commands; demo-data writes to the endpoint."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from sagemaker_dist.cli import main

PUT = """
from sagemaker_dist import embedded_s3
from sagemaker_dist.aws.s3_objects import s3_client
with embedded_s3({state!r}):
    c = s3_client()
    c.create_bucket(Bucket="kept-bucket")
    c.put_object(Bucket="kept-bucket", Key="a/b.txt", Body=b"hello")
"""
GET = """
from sagemaker_dist import embedded_s3
from sagemaker_dist.aws.s3_objects import s3_client
with embedded_s3({state!r}):
    print(s3_client().get_object(Bucket="kept-bucket", Key="a/b.txt")["Body"].read().decode())
"""


def _python(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_embedded_endpoint_state_survives_between_processes(tmp_path):
    state = str(tmp_path / "state")
    _python(PUT.format(state=state))
    assert (tmp_path / "state" / "kept-bucket" / "a" / "b.txt").read_bytes() == b"hello"
    assert _python(GET.format(state=state)).strip() == "hello"  # a fresh server loaded it back


def test_demo_data_command_writes_tfrecords_to_the_endpoint(aws_env, s3, bucket, capsys):
    code = main(
        [
            "demo-data",
            "--endpoint-url",
            aws_env["AWS_ENDPOINT_URL"],
            "--prefix",
            f"s3://{bucket}/d/",
            "--files",
            "3",
            "--records-per-file",
            "4",
            "--validation-files",
            "1",
        ]
    )
    assert code == 0
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    assert keys == ["d/dataset.json"] + [f"d/train/part-0000{i}.tfrecord" for i in range(3)] + [
        "d/validation/part-00000.tfrecord"
    ]
    assert "16 records" in capsys.readouterr().out


def test_two_commands_cannot_share_one_state_dir_at_once(tmp_path):
    """Both would load the state and the last to save would silently drop the other's objects: a second
    command on a state dir in use stops at once, naming it and the holder."""
    from sagemaker_dist.local.endpoint import _state_lock

    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    command = [
        sys.executable,
        "-m",
        "sagemaker_dist.cli",
        "demo-data",
        "--files",
        "1",
        "--s3-state-dir",
        str(state),
    ]
    with _state_lock(state):
        held = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert held.returncode == 2, held.stderr
    assert f"{state} is in use by another sagemaker-dist command (pid {os.getpid()})" in held.stderr
    assert "--s3-state-dir" in held.stderr and not state.exists()
    free = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert free.returncode == 0, free.stderr
    assert (state / "sagemaker-dist-demo").is_dir()  # saved on exit, once the dir was free


def test_a_save_keeps_unchanged_objects_files_and_writes_only_what_changed(tmp_path):
    """A state of hundreds of objects is loaded and saved by every command: an object left as it was
    keeps its file (the same inode, linked into the new state), one that changed is written again,
    one deleted is gone, and an empty bucket stays."""
    from sagemaker_dist.aws.s3_objects import s3_client
    from sagemaker_dist.local.endpoint import embedded_s3

    state = tmp_path / "state"
    kept, empty = (
        f"kept-{uuid.uuid4().hex[:8]}",
        f"empty-{uuid.uuid4().hex[:8]}",
    )  # the process's moto store is shared
    with embedded_s3(state):
        c = s3_client()
        for name in (kept, empty):
            c.create_bucket(Bucket=name)
        for key in ("same.bin", "changed.bin", "deleted.bin", "deep/same.bin"):
            c.put_object(Bucket=kept, Key=key, Body=key.encode())
    files = {p.relative_to(state).as_posix(): p.stat().st_ino for p in state.rglob("*") if p.is_file()}
    with embedded_s3(state):
        c = s3_client()
        c.put_object(Bucket=kept, Key="changed.bin", Body=b"new bytes")
        c.delete_object(Bucket=kept, Key="deleted.bin")
        c.put_object(Bucket=kept, Key="added.bin", Body=b"added")
    after = {p.relative_to(state).as_posix(): p for p in state.rglob("*") if p.is_file()}
    assert sorted(after) == [f"{kept}/{k}" for k in ("added.bin", "changed.bin", "deep/same.bin", "same.bin")]
    for key in ("same.bin", "deep/same.bin"):
        assert after[f"{kept}/{key}"].stat().st_ino == files[f"{kept}/{key}"]  # linked, not fetched
        assert after[f"{kept}/{key}"].read_bytes() == key.encode()
    assert after[f"{kept}/changed.bin"].read_bytes() == b"new bytes"
    assert after[f"{kept}/changed.bin"].stat().st_ino != files[f"{kept}/changed.bin"]
    assert after[f"{kept}/added.bin"].read_bytes() == b"added"
    assert (state / empty).is_dir() and not any((state / empty).iterdir())
    assert not (tmp_path / "state.old").exists()
