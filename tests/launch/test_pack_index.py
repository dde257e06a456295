"""The planner reads a pack's index (the moto server over HTTP): a prefix ``OUTPUT/shards/`` is checked
against ``OUTPUT/index.json`` and planned with each shard's records (each worker's samples in the plan,
the launch's log and ``sagemaker-dist plan``); a listing that disagrees with the index (a shard changed,
missing, added), a pack that did not finish and the pack's own root are refused before any job."""

from __future__ import annotations

import json

import pytest

from sagemaker_dist.cli import main
from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.launch.inputs import JobInputs
from sagemaker_dist.launch.pack import pack, plan_pack, scan_source
from sagemaker_dist.launch.pack_index import PackIndexError, plan_prefix
from sagemaker_dist.launch.staging import plan_role_shards


def jpeg(seed: int, size: int) -> bytes:
    return b"\xff\xd8\xff" + bytes((seed * 31 + i) % 251 for i in range(size))


@pytest.fixture
def packed(s3, bucket, tmp_path):
    """An image folder of 2 classes x 12 images packed into 6 WebDataset shards at s3://bucket/out/."""
    for c, name in enumerate(("ant", "bee")):
        (tmp_path / "images" / name).mkdir(parents=True)
        for i in range(12):
            (tmp_path / "images" / name / f"{i:02d}.jpg").write_bytes(jpeg(c * 20 + i, 300 + 97 * i))
    plan = plan_pack(scan_source(tmp_path / "images"), shards=6, seed=1)
    result = pack(plan, f"s3://{bucket}/out/", progress=False)
    return f"s3://{bucket}/out/shards/", result.index


def test_a_packs_shards_are_planned_with_each_workers_records(packed, bucket, s3):
    prefix, index = packed
    plan, index_uri = plan_prefix(prefix, 3)
    assert index_uri == f"s3://{bucket}/out/index.json"
    by_key = {f"out/{s['name']}": s["records"] for s in index["shards"]}
    assert plan.records == [[by_key[k] for k in keys] for keys in plan.shards]
    assert sum(plan.records_per_shard) == index["records"] == 24
    # a prefix that is no pack's plans as before, without records
    s3.put_object(Bucket=bucket, Key="plain/a.tfrecord", Body=b"x" * 10)
    s3.put_object(Bucket=bucket, Key="plain/b.tfrecord", Body=b"y" * 12)
    plain, none = plan_prefix(f"s3://{bucket}/plain/", 2)
    assert none is None and plain.records is None and plain.records_per_shard is None


def test_the_launch_and_the_plan_command_say_the_records_per_worker(packed, capsys):
    prefix, index = packed
    said: list[str] = []
    staged = plan_role_shards(
        JobInputs({"train": prefix}, {}), plan_layout(1, 2), "s3://unused/shards/", None, said.append
    )
    ((plan, _, _),) = staged.writes
    assert sum(plan.records_per_shard) == 24
    assert any(line.startswith("pack index ") and "24 records" in line for line in said)
    argv = ["plan", "--instance-type", "ml.p3.8xlarge", "--instance-count", "1", "--processes-per-host", "3"]
    assert main([*argv, prefix]) == 0
    out = capsys.readouterr().out
    per = plan_prefix(prefix, 3)[0].records_per_shard
    assert f"24 records, {min(per)} to {max(per)} per worker" in out


@pytest.mark.parametrize("change", ["resized", "missing", "added"])
def test_a_listing_that_disagrees_with_the_index_is_refused(packed, bucket, s3, change):
    prefix, _ = packed
    key = "out/shards/shard-000002.tar"
    if change == "resized":
        s3.put_object(Bucket=bucket, Key=key, Body=b"\0" * 1024)
        words = "shard-000002.tar is 1024 bytes"
    elif change == "missing":
        s3.delete_object(Bucket=bucket, Key=key)
        words = "shard-000002.tar is in the index but not in S3"
    else:
        s3.put_object(Bucket=bucket, Key="out/shards/extra.tar", Body=b"\0" * 1024)
        words = "extra.tar (1024 bytes) is not in the index"
    with pytest.raises(PackIndexError, match="disagrees with its pack's index") as caught:
        plan_prefix(prefix, 2)
    assert words in str(caught.value) and "run sagemaker-dist pack again" in str(caught.value)


def test_an_unfinished_pack_and_the_packs_root_are_refused(packed, bucket, s3):
    prefix, _ = packed
    with pytest.raises(PackIndexError, match=f"the channel's data is s3://{bucket}/out/shards/"):
        plan_prefix(f"s3://{bucket}/out/", 2)
    s3.delete_object(Bucket=bucket, Key="out/index.json")  # what a pack that stopped midway leaves
    with pytest.raises(PackIndexError, match="no index.json: that pack did not finish"):
        plan_prefix(prefix, 2)
    s3.put_object(Bucket=bucket, Key="out/index.json", Body=json.dumps({"version": 1}).encode())
    with pytest.raises(PackIndexError, match="is not a pack index"):
        plan_prefix(prefix, 2)
