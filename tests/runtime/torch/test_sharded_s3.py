"""Sharded (DCP) checkpoints written straight to S3 through s3torchconnector, against moto over HTTP.

One process saves and restores through ``ShardedCheckpoints("s3://...")`` here (s3torchconnector's CRT
client talking to the ThreadedMotoServer on 127.0.0.1); ``test_sharded_jobs_s3.py`` runs torchrun jobs.
What is checked is what the directory format promises: a checkpoint counts only with its ``meta.json``
(written last), a planted pickle never runs, the state comes back equal.
"""

from __future__ import annotations

import json
import pickle

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("s3torchconnector")

from test_sharded_checkpoints import Planted, assert_snapshot, parts, snapshot, train  # noqa: E402

from sagemaker_dist.runtime.torch.checkpointing import UnsafeCheckpointError  # noqa: E402
from sagemaker_dist.runtime.torch.sharded import (  # noqa: E402
    METADATA_FILE,
    ShardedCheckpoints,
    read_sharded_checkpoint,
)

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning")]


def keys(s3, bucket: str, prefix: str = "") -> dict[str, int]:
    found = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        found.update((o["Key"], o["Size"]) for o in page.get("Contents", []))
    return found


def saver(uri: str, model, optimizer, scheduler, keep=None) -> ShardedCheckpoints:
    return ShardedCheckpoints(uri, model=model, optimizer=optimizer, scheduler=scheduler, keep=keep)


@pytest.fixture
def uri(bucket):
    return f"s3://{bucket}/jobs/run-1/checkpoints"


def test_a_checkpoint_in_s3_restores_model_optimizer_scheduler_and_extras(s3, bucket, uri):
    model, optimizer, scheduler = parts()
    train(model, optimizer, scheduler, 3)
    expected = snapshot(model, optimizer)
    written = saver(uri, model, optimizer, scheduler).save(0, 3, extra={"state": {"seen": 12}})
    assert str(written.path) == f"{uri}/epoch-00000-step-000003"
    assert sorted(keys(s3, bucket)) == [
        f"jobs/run-1/checkpoints/epoch-00000-step-000003/{name}"
        for name in ("__0_0.distcp", METADATA_FILE, "meta.json")
    ]
    meta = json.loads(
        s3.get_object(Bucket=bucket, Key="jobs/run-1/checkpoints/epoch-00000-step-000003/meta.json")[
            "Body"
        ].read()
    )
    sizes = keys(s3, bucket, "jobs/run-1/checkpoints/epoch-00000-step-000003/")
    assert meta["files"] == {
        name: sizes[f"jobs/run-1/checkpoints/epoch-00000-step-000003/{name}"]
        for name in ("__0_0.distcp", METADATA_FILE)
    }
    model, optimizer, scheduler = parts(seed=1)
    epoch, step, found, meta = saver(uri, model, optimizer, scheduler).restore()
    assert (epoch, step, found.path.name) == (0, 3, "epoch-00000-step-000003")
    assert meta["extra"] == {"state": {"seen": 12}}
    assert scheduler.last_epoch == 3
    assert_snapshot(model, optimizer, expected)
    whole = read_sharded_checkpoint(f"{uri}/epoch-00000-step-000003")
    assert torch.equal(whole["model"]["0.weight"], expected["model"]["0.weight"])


def test_an_async_save_to_s3_holds_the_state_it_was_given_and_prunes(s3, bucket, uri):
    model, optimizer, scheduler = parts()
    checkpoints = saver(uri, model, optimizer, scheduler, keep=2)
    for step in (1, 2, 3):
        train(model, optimizer, scheduler, 1)
        if step == 3:
            expected = snapshot(model, optimizer)
        assert checkpoints.save(0, step, blocking=False) is None
    train(model, optimizer, scheduler, 2)  # while the last one is written
    assert checkpoints.wait() is True
    names = sorted({k.split("/")[3] for k in keys(s3, bucket)})
    assert names == ["epoch-00000-step-000002", "epoch-00000-step-000003"]  # keep=2
    model2, optimizer2, scheduler2 = parts(seed=1)
    assert saver(uri, model2, optimizer2, scheduler2).restore()[:2] == (0, 3)
    assert_snapshot(model2, optimizer2, expected)


def test_shards_without_their_commit_marker_never_count_and_are_cleared(s3, bucket, uri):
    model, optimizer, scheduler = parts()
    train(model, optimizer, scheduler, 2)
    expected = snapshot(model, optimizer)
    checkpoints = saver(uri, model, optimizer, scheduler)
    checkpoints.save(0, 2)
    train(model, optimizer, scheduler, 2)
    checkpoints.save(1, 0)
    base = "jobs/run-1/checkpoints"
    s3.delete_object(Bucket=bucket, Key=f"{base}/epoch-00001/meta.json")  # a save that never committed
    s3.put_object(Bucket=bucket, Key=f"{base}/epoch-00002/__0_0.distcp", Body=b"half")  # a rank's shard
    model2, optimizer2, scheduler2 = parts(seed=1)
    epoch, step, found, _ = saver(uri, model2, optimizer2, scheduler2).restore()
    assert (epoch, step, found.path.name) == (0, 2, "epoch-00000-step-000002")
    assert_snapshot(model2, optimizer2, expected)
    assert sorted({k.split("/")[3] for k in keys(s3, bucket)}) == ["epoch-00000-step-000002"]


def test_a_shard_cut_short_in_s3_never_counts(s3, bucket, uri):
    model, optimizer, scheduler = parts()
    checkpoints = saver(uri, model, optimizer, scheduler)
    checkpoints.save(0, 1)
    checkpoints.save(0, 2)
    key = "jobs/run-1/checkpoints/epoch-00000-step-000002/__0_0.distcp"
    s3.put_object(Bucket=bucket, Key=key, Body=b"cut")  # not the size meta.json lists
    found = saver(uri, *parts(seed=1)).restore()[2]
    assert found.path.name == "epoch-00000-step-000001"


def test_a_planted_metadata_pickle_in_s3_is_refused_and_never_runs(s3, bucket, uri, tmp_path):
    model, optimizer, scheduler = parts()
    written = saver(uri, model, optimizer, scheduler).save(0, 1)
    prefix = "jobs/run-1/checkpoints/epoch-00000-step-000001"
    marker = tmp_path / "ran"
    planted = pickle.dumps(Planted(marker))
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{METADATA_FILE}", Body=planted)
    meta = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}/meta.json")["Body"].read())
    meta["files"][METADATA_FILE] = len(planted)  # complete, as far as its marker says
    s3.put_object(Bucket=bucket, Key=f"{prefix}/meta.json", Body=json.dumps(meta).encode())
    with pytest.raises(UnsafeCheckpointError, match=r"dcp\.metadata is not DCP metadata .*mkdir"):
        saver(uri, *parts()).restore()
    with pytest.raises(UnsafeCheckpointError):
        read_sharded_checkpoint(str(written.path))
    assert not marker.exists()


def test_a_planted_value_in_an_s3_shard_is_refused_and_never_runs(s3, bucket, uri, tmp_path):
    """The optimizer's plain values come through the same weights_only planner as from a directory."""
    import io

    model, optimizer, scheduler = parts()
    saver(uri, model, optimizer, scheduler).save(0, 1)
    prefix = "jobs/run-1/checkpoints/epoch-00000-step-000001"
    marker = tmp_path / "ran"
    payload = io.BytesIO()
    torch.save(Planted(marker), payload)
    s3.put_object(Bucket=bucket, Key=f"{prefix}/__0_9.distcp", Body=payload.getvalue())
    raw = s3.get_object(Bucket=bucket, Key=f"{prefix}/{METADATA_FILE}")["Body"].read()
    metadata = pickle.loads(raw)  # the test's own file: written just above by DCP
    (index,) = [i for i in metadata.storage_data if i.fqn == "optim.param_groups.0.lr"]
    info = metadata.storage_data[index]
    metadata.storage_data[index] = type(info)("__0_9.distcp", 0, len(payload.getvalue()))
    again = pickle.dumps(metadata)
    s3.put_object(Bucket=bucket, Key=f"{prefix}/{METADATA_FILE}", Body=again)
    meta = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}/meta.json")["Body"].read())
    meta["files"].update({METADATA_FILE: len(again), "__0_9.distcp": len(payload.getvalue())})
    s3.put_object(Bucket=bucket, Key=f"{prefix}/meta.json", Body=json.dumps(meta).encode())
    with pytest.raises(UnsafeCheckpointError, match="optim.param_groups.0.lr"):
        saver(uri, *parts()).restore()
    assert not marker.exists()


def test_checkpoint_s3_uri_serves_sharded_models_only():
    from sagemaker_dist.errors import ConfigurationError
    from sagemaker_dist.runtime.torch.training import PipeTraining

    model, _, _ = parts()  # whole on every rank: rank 0's checkpoints, synced by SageMaker
    with pytest.raises(ConfigurationError, match=r"checkpoint_s3_uri= writes a sharded \(FSDP2\)"):
        PipeTraining(None, model, epochs=1, checkpoint_s3_uri="s3://bucket/ckpt")
    with pytest.raises(ConfigurationError, match=r"give s3://bucket/prefix"):
        PipeTraining(None, model, epochs=1, checkpoint_s3_uri="/opt/ml/checkpoints")


def test_without_s3torchconnector_an_s3_location_says_which_extra(monkeypatch):
    import sys

    from sagemaker_dist.errors import ConfigurationError

    monkeypatch.setitem(sys.modules, "s3torchconnector", None)  # as where it is not installed
    with pytest.raises(ConfigurationError, match=r"pip install 'sagemaker-dist\[s3torchconnector\]'"):
        saver("s3://bucket/ckpt", *parts())
