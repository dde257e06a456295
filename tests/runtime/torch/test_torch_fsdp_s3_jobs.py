"""Real ``torchrun`` jobs (2 Gloo ranks) of an FSDP2 model whose checkpoints go straight to S3.

``fsdp_pipe_script.py`` with ``PipeTraining(checkpoint_s3_uri=...)``: every rank writes its shard through
s3torchconnector's DCP writer (its CRT client) to the ThreadedMotoServer on 127.0.0.1 over HTTP; a stop
mid-epoch commits the stop's checkpoint there, and the next attempt resumes from it. The states are
compared as in ``test_torch_fsdp_jobs.py``, the checkpoints read back from S3 with
``read_sharded_checkpoint``.
"""

from __future__ import annotations

import json
import uuid

import pytest
from helpers.torchrun_job import run_torchrun
from test_torch_fsdp_jobs import (
    COMMON,
    SCRIPT,
    assert_same_state,
    feed,
    fresh_container,
    job_root,
    state,
    trained,
)

torch = pytest.importorskip("torch")
pytest.importorskip("s3torchconnector")

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.timeout(400)]

PREFIX = "jobs/fsdp-1/checkpoints"


@pytest.fixture(scope="module")
def s3_job(moto_server, tmp_path_factory):
    """A 2-rank job stopped by rank 1 after step 2 of epoch 1 (step checkpoints every 2 steps, in the
    background), then the next attempt on a fresh container; the checkpoints only in S3."""
    import boto3

    bucket = f"fsdp-{uuid.uuid4().hex[:10]}"
    env = {
        "AWS_ENDPOINT_URL": moto_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        s3 = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1")
        s3.create_bucket(Bucket=bucket)
        base = tmp_path_factory.mktemp("fsdp-s3")
        root = job_root(base, 2)
        uri = f"s3://{bucket}/{PREFIX}"
        job_env = {**env, **COMMON, "TEST_CHECKPOINT_S3_URI": uri}
        stopped = run_torchrun(
            SCRIPT, root, base / "out-stop", feed(2, 2), TEST_STOP_AT="1:2", TEST_DUMP_EVERY="1", **job_env
        )
        stopped.objects = _objects(s3, bucket)
        fresh_container(root)
        resumed = run_torchrun(SCRIPT, root, base / "out-resume", feed(2, 1), **job_env)
        yield stopped, resumed, root, uri, s3, bucket


def _objects(s3, bucket: str) -> dict[str, int]:
    found = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        found.update((o["Key"][len(PREFIX) + 1 :], o["Size"]) for o in page.get("Contents", []))
    return found


def test_every_rank_writes_its_shard_to_s3_and_rank_0_commits_last(s3_job):
    stopped, _, root, _, s3, bucket = s3_job
    assert stopped.proc.returncode == 0, stopped.output[-4000:]
    for rank in (0, 1):
        (event,) = stopped.events(rank, "stopped")
        assert (event["epoch"], event["step"], event["checkpoint"]) == (1, 3, "epoch-00001-step-000003")
    names = ["epoch-00000-step-000002", "epoch-00000-step-000004", "epoch-00001"]
    names += ["epoch-00001-step-000002", "epoch-00001-step-000003"]
    files = ["__0_0.distcp", "__1_0.distcp", "dcp.metadata", "meta.json"]
    assert sorted(stopped.objects) == sorted(f"{n}/{f}" for n in names for f in files)
    key = f"{PREFIX}/epoch-00001-step-000003/meta.json"
    meta = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    assert meta["format"] == "torch-dcp" and meta["world_size"] == 2
    assert meta["files"] == {
        f: stopped.objects[f"epoch-00001-step-000003/{f}"] for f in files if f != "meta.json"
    }
    assert meta["extra"]["state"]["batches_seen"] == 8
    assert not any((root / "checkpoints").glob("*"))  # nothing written to the local directory


def test_async_step_checkpoints_in_s3_hold_the_state_of_their_step(s3_job):
    from sagemaker_dist.runtime.torch.sharded import read_sharded_checkpoint

    stopped, _, _, uri, _, _ = s3_job
    dumps = sorted(stopped.out.glob("state-step-*.pt"))
    assert [p.name for p in dumps] == ["state-step-0-2.pt", "state-step-0-4.pt", "state-step-1-2.pt"]
    for dump in dumps:
        epoch, step = (int(v) for v in dump.stem.split("-")[2:])
        saved = read_sharded_checkpoint(f"{uri}/epoch-{epoch:05d}-step-{step:06d}")
        assert_same_state(state(dump), saved)


def test_the_resume_from_s3_restores_the_stop_and_goes_on(s3_job):
    from sagemaker_dist.runtime.torch.sharded import read_sharded_checkpoint

    stopped, resumed, _, uri, _, _ = s3_job
    assert resumed.proc.returncode == 0, resumed.output[-4000:]
    for rank in (0, 1):
        (restored,) = resumed.events(rank, "restored")
        assert restored["resumed_at"] == [1, 3]
        assert restored["lr_step"] == 8 and restored["state"] == {"batches_seen": 8}
        first, second = trained(stopped, rank), trained(resumed, rank)
        assert 0 not in second
        assert [s for s, _, _ in first[1] + second[1]] == [1, 2, 3, 4, 5]  # no step lost or repeated
    saved = read_sharded_checkpoint(f"{uri}/epoch-00001-step-000003")
    assert_same_state(saved, state(resumed.out / "state-restored.pt"))
    assert_same_state(state(resumed.out / "state-final.pt"), read_sharded_checkpoint(f"{uri}/epoch-00002"))
