"""Writing shards to S3 through moto server: manifests read back, copy idempotence, failures."""

from __future__ import annotations

import json
import uuid

import pytest
from boto3.s3.transfer import TransferConfig
from helpers.fault_proxy import fault_proxy
from helpers.s3_data import ODD_NAMES, all_keys, dataset, filled_bucket, put_objects

from sagemaker_dist.aws.s3_objects import MissingBucketError, list_objects, parse_s3_uri
from sagemaker_dist.contract.layout import LayoutError
from sagemaker_dist.launch.shard_writer import (
    COMPLETE_MARKER,
    IncompleteShardsError,
    ShardPlanError,
    ShardWriteError,
    plan_shard_set,
    read_shard_set,
    write_shards,
)
from sagemaker_dist.launch.sharding import plan_shards

COUNT = 1_100


@pytest.fixture(scope="module")
def big_bucket(moto_server):
    """1,100 numbered objects plus the odd names under data/ (listed past one page)."""
    return filled_bucket(moto_server, f"big-{uuid.uuid4().hex[:10]}", dataset("data/", COUNT))


def _plan(s3, uri, shards, suffix=None):
    return plan_shards([(o.key, o.size) for o in list_objects(uri, suffix=suffix, client=s3)], shards)


def _read_manifest(s3, uri):
    bucket, key = parse_s3_uri(uri)
    return json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def _resolve(manifest):
    """The S3 (bucket, key) of every entry, the way SageMaker joins prefix and relative key."""
    bucket, prefix = parse_s3_uri(manifest[0]["prefix"])
    return [(bucket, prefix + rel) for rel in manifest[1:]]


def test_manifests_read_back_to_exactly_the_listing(s3, bucket, big_bucket):
    source = f"s3://{big_bucket}/data/"
    plan = _plan(s3, source, 8)
    shard_set = write_shards(plan, source, f"s3://{bucket}/out", client=s3)

    assert shard_set.s3_data_type == "ManifestFile"
    assert shard_set.channel_names == [f"train_{i}" for i in range(8)]
    assert shard_set.uris == [f"s3://{bucket}/out/train/{i}.manifest" for i in range(8)]
    seen = []
    for i, uri in enumerate(shard_set.uris):
        manifest = _read_manifest(s3, uri)
        assert manifest[0] == {"prefix": f"s3://{big_bucket}/data/"}
        assert all(isinstance(rel, str) and not rel.startswith("/") for rel in manifest[1:])
        resolved = _resolve(manifest)
        assert [key for _, key in resolved] == plan.shards[i]
        seen.extend(resolved)
    listed = all_keys(s3, big_bucket, "data/")
    assert sorted(key for _, key in seen) == sorted(listed)
    assert len(seen) == COUNT + len(ODD_NAMES)
    # Odd keys resolve to real objects.
    for b, key in seen:
        if "part-" not in key:
            assert s3.head_object(Bucket=b, Key=key)["ContentLength"] == listed[key]
    # The complete marker records the same set.
    assert read_shard_set(f"s3://{bucket}/out", client=s3) == shard_set
    assert shard_set.plan_uri == f"s3://{bucket}/out/train/{COMPLETE_MARKER}"


def test_manifest_prefix_is_the_folder_of_a_partial_key_prefix(s3, bucket, big_bucket):
    source = f"s3://{big_bucket}/data/part-000"  # not a folder: part-00000 .. part-00099
    plan = _plan(s3, source, 2)
    shard_set = write_shards(plan, source, f"s3://{bucket}/o/", role="validation", client=s3)
    manifest = _read_manifest(s3, shard_set.uris[0])
    assert manifest[0] == {"prefix": f"s3://{big_bucket}/data/"}
    assert all(rel.startswith("part-000") for rel in manifest[1:])
    assert shard_set.uris[0] == f"s3://{bucket}/o/validation/0.manifest"
    assert sum(shard_set.objects_per_shard) == 100


@pytest.fixture
def small_source(s3, bucket):
    objects = dataset("in/", 30)
    put_objects(s3, bucket, objects)
    return f"s3://{bucket}/in/", objects


def test_copy_mode_copies_once_then_skips(s3, bucket, small_source, capsys):
    source, objects = small_source
    plan = _plan(s3, source, 4)
    out = f"s3://{bucket}/copies"
    first = write_shards(plan, source, out, mode="copy", client=s3, progress=True)
    assert f"copy {len(objects)} objects: 100%" in capsys.readouterr().err  # the tqdm bar
    assert first.s3_data_type == "S3Prefix"
    assert first.uris == [f"s3://{bucket}/copies/train/{i}/" for i in range(4)]
    assert (first.copied, first.skipped) == (len(objects), 0)
    for i, keys in enumerate(plan.shards):
        for key in keys:
            dest = f"copies/train/{i}/{key[len('in/') :]}"
            assert s3.get_object(Bucket=bucket, Key=dest)["Body"].read() == objects[key]
    # Each S3Prefix channel holds exactly its shard (nothing of the others, not the marker).
    for i, uri in enumerate(first.uris):
        _, prefix = parse_s3_uri(uri)
        assert len(all_keys(s3, bucket, prefix)) == len(plan.shards[i])

    second = write_shards(plan, source, out, mode="copy", client=s3, progress=False)
    assert (second.copied, second.skipped, second.deleted) == (0, len(objects), 0)

    # A destination with the wrong size is copied again; only that one.
    some_key = plan.shards[1][0]
    s3.put_object(Bucket=bucket, Key=f"copies/train/1/{some_key[len('in/') :]}", Body=b"truncated")
    third = write_shards(plan, source, out, mode="copy", client=s3, progress=False)
    assert (third.copied, third.skipped) == (1, len(objects) - 1)
    assert read_shard_set(out, client=s3) == third


def test_copy_mode_removes_objects_of_an_earlier_plan(s3, bucket, small_source):
    source, objects = small_source
    out = f"s3://{bucket}/copies"
    write_shards(_plan(s3, source, 4), source, out, mode="copy", client=s3, progress=False)
    smaller = _plan(s3, source, 2)
    again = write_shards(smaller, source, out, mode="copy", client=s3, progress=False)
    assert again.deleted > 0
    remaining = all_keys(s3, bucket, "copies/train/")
    assert not any(k.startswith(("copies/train/2/", "copies/train/3/")) for k in remaining)
    assert len(remaining) == len(objects) + 1  # the copies and the marker


def test_copy_failure_half_way_leaves_nothing_complete(s3, bucket, small_source):
    source, objects = small_source
    out = f"s3://{bucket}/copies"
    plan = _plan(s3, source, 3)
    write_shards(plan, source, out, mode="copy", client=s3, progress=False)
    assert read_shard_set(out, client=s3)  # complete before

    # New data arrives and is planned; then the last new object in copy order disappears, so the
    # copies before it succeed (one worker: they run in plan order) and that one fails.
    extra = {f"in/new-{i:02d}.tfrecord": b"n" * (10 + i) for i in range(12)}
    put_objects(s3, bucket, extra)
    replan = _plan(s3, source, 3)
    order = [(shard, key) for shard, key, _ in replan.items() if key in extra]
    victim_shard, victim = order[-1]
    s3.delete_object(Bucket=bucket, Key=victim)
    with pytest.raises(ShardWriteError) as info:
        write_shards(replan, source, out, mode="copy", client=s3, progress=False, workers=1)
    message = str(info.value)
    assert f"copying s3://{bucket}/{victim}" in message and "Nothing was marked complete" in message
    copied_so_far = all_keys(s3, bucket, "copies/train/")
    for shard, key in order[:-1]:  # half-way: the earlier copies are there ...
        assert f"copies/train/{shard}/{key[len('in/') :]}" in copied_so_far
    with pytest.raises(IncompleteShardsError, match="run 'sagemaker-dist shard' again"):
        read_shard_set(out, client=s3)  # ... but nothing looks complete
    assert f"copies/train/{COMPLETE_MARKER}" not in copied_so_far

    # Put it back: the re-run copies what is missing (not the new objects already copied).
    s3.put_object(Bucket=bucket, Key=victim, Body=extra[victim])
    done = write_shards(replan, source, out, mode="copy", client=s3, progress=False)
    assert done.copied >= 1
    assert done.skipped >= len(order) - 1
    assert done.copied + done.skipped == len(objects) + len(extra)
    assert read_shard_set(out, client=s3) == done
    dest = f"copies/train/{victim_shard}/{victim[len('in/') :]}"
    assert s3.get_object(Bucket=bucket, Key=dest)["Body"].read() == extra[victim]


def test_big_objects_copy_multipart(s3, bucket):
    body = bytes(range(256)) * (12 * 1024 * 1024 // 256)  # 12 MiB
    put_objects(s3, bucket, {"big/a.bin": body, "big/b.bin": b"small"})
    source = f"s3://{bucket}/big/"
    config = TransferConfig(multipart_threshold=5 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024)
    shard_set = write_shards(
        _plan(s3, source, 2), source, f"s3://{bucket}/out", mode="copy", client=s3, transfer_config=config
    )
    assert shard_set.copied == 2
    [dest] = [k for k in all_keys(s3, bucket, "out/train/") if k.endswith("a.bin")]
    head = s3.head_object(Bucket=bucket, Key=dest)
    assert head["ContentLength"] == len(body)
    assert head["ETag"].strip('"').endswith("-3")  # three parts: a multipart copy
    assert s3.get_object(Bucket=bucket, Key=dest)["Body"].read() == body


def test_missing_output_bucket_writes_nothing(s3, bucket, small_source):
    source, _ = small_source
    before = all_keys(s3, bucket)
    with pytest.raises(MissingBucketError, match="bucket 'no-such-out' does not exist"):
        write_shards(_plan(s3, source, 2), source, "s3://no-such-out/x/", client=s3)
    assert all_keys(s3, bucket) == before


@pytest.mark.parametrize(
    "output, mode, role, error, match",
    [
        ("{b}/in/shards/", "manifest", "train", ShardPlanError, "overlaps the source"),
        ("{b}/in", "copy", "train", ShardPlanError, "overlaps the source"),
        ("{b}/out/", "zip", "train", ShardPlanError, "mode 'zip'"),
        ("{b}/out/", "manifest", "train data", LayoutError, "characters SageMaker rejects"),
        ("{b}/out/", "manifest", "t" * 63, LayoutError, "at most 64"),
    ],
)
def test_bad_requests_write_nothing(s3, bucket, small_source, output, mode, role, error, match):
    source, _ = small_source
    before = all_keys(s3, bucket)
    with pytest.raises(error, match=match):
        output = "s3://" + output.format(b=bucket)
        write_shards(_plan(s3, source, 2), source, output, mode=mode, role=role, client=s3)
    assert all_keys(s3, bucket) == before


def test_plan_from_another_prefix_is_refused(s3, bucket, small_source):
    source, _ = small_source
    plan = plan_shards([("elsewhere/a", 1), ("in/b", 2)], 2)
    with pytest.raises(ShardPlanError, match="'elsewhere/a' of the plan is not under the source"):
        write_shards(plan, source, f"s3://{bucket}/out/", client=s3)


@pytest.mark.parametrize("mode", ["manifest", "copy"])
def test_plan_shard_set_predicts_what_write_shards_returns_without_writing(s3, bucket, small_source, mode):
    source, _ = small_source
    plan = _plan(s3, source, 3)
    before = all_keys(s3, bucket)
    planned = plan_shard_set(plan, source, f"s3://{bucket}/out", mode=mode, role="validation")
    assert all_keys(s3, bucket) == before
    written = write_shards(plan, source, f"s3://{bucket}/out", mode=mode, role="validation", client=s3)
    assert planned == written and planned.uris == written.uris and planned.plan_uri == written.plan_uri
    with pytest.raises(ShardPlanError, match="overlaps the source"):
        plan_shard_set(plan, source, f"{source}shards/", mode=mode)


def test_stale_objects_s3_cannot_delete_fail_the_write_and_leave_no_marker(s3, bucket, small_source, aws_env):
    import boto3

    source, _ = small_source
    out = f"s3://{bucket}/copies"
    write_shards(_plan(s3, source, 3), source, out, mode="copy", client=s3, progress=False)
    denied = (
        b'<?xml version="1.0" encoding="UTF-8"?><DeleteResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        b"<Error><Key>copies/train/2/x</Key><Code>AccessDenied</Code><Message>Access Denied</Message>"
        b"</Error></DeleteResult>"
    )

    def refuse_deletes(method, path, headers, body):  # DeleteObjects answers 200 with an Errors list
        return (200, "application/xml", denied) if method == "POST" and "delete" in path else None

    with fault_proxy(aws_env["AWS_ENDPOINT_URL"], refuse_deletes) as (proxy, url):
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
        with pytest.raises(ShardWriteError, match=r"not delete 1 stale object.*AccessDenied.*again"):
            write_shards(_plan(s3, source, 2), source, out, mode="copy", client=client, progress=False)
    assert proxy.answered == 1
    with pytest.raises(IncompleteShardsError):
        read_shard_set(out, client=s3)


@pytest.mark.parametrize(
    "body, why",
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "a JSON list"),
        (b'{"version": 1, "complete": true, "uris": []}', "missing role, mode"),
        (b'{"version": 2, "complete": true}', "version 2"),
    ],
)
def test_a_corrupt_marker_reads_as_incomplete(s3, bucket, small_source, body, why):
    source, _ = small_source
    out = f"s3://{bucket}/out"
    write_shards(_plan(s3, source, 2), source, out, client=s3)
    s3.put_object(Bucket=bucket, Key=f"out/train/{COMPLETE_MARKER}", Body=body)
    with pytest.raises(IncompleteShardsError, match=f"{why}.*run 'sagemaker-dist shard' again"):
        read_shard_set(out, client=s3)


def test_manifest_mode_removes_manifests_of_an_earlier_plan_with_more_shards(s3, bucket, small_source):
    source, _ = small_source
    out = f"s3://{bucket}/manifests"
    write_shards(_plan(s3, source, 4), source, out, client=s3, progress=False)
    s3.put_object(Bucket=bucket, Key="manifests/train/notes.txt", Body=b"the user's own")
    again = write_shards(_plan(s3, source, 2), source, out, client=s3, progress=False)
    assert again.deleted == 2
    remaining = set(all_keys(s3, bucket, "manifests/train/"))
    assert remaining == {
        "manifests/train/0.manifest",
        "manifests/train/1.manifest",
        "manifests/train/_plan.json",
        "manifests/train/notes.txt",  # not ours: left alone
    }
