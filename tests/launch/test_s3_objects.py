"""Listing an S3 prefix through moto server over HTTP: pagination, filters, odd keys, errors."""

from __future__ import annotations

import uuid

import pytest
from helpers.s3_data import ODD_NAMES, body_of, dataset, filled_bucket

from sagemaker_dist.aws.s3_objects import (
    EmptyPrefixError,
    MissingBucketError,
    S3AccessError,
    S3Object,
    S3UriError,
    list_objects,
    parse_s3_uri,
)

COUNT = 1_200  # more than one ListObjectsV2 page (1,000)


@pytest.fixture(scope="module")
def data_bucket(moto_server):
    objects = dataset("data/", COUNT)
    objects["data/"] = b""  # folder placeholder, as the S3 console creates
    objects["data/sub/"] = b""
    objects["data/not-a-folder/"] = b"x"  # has bytes: a real object despite the slash
    objects["data/readme.txt"] = b"hello"
    objects["other/part-0.tfrecord"] = b"nope"
    return filled_bucket(moto_server, f"list-{uuid.uuid4().hex[:10]}", objects)


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("s3://bucket/", ("bucket", "")),
        ("s3://bucket", ("bucket", "")),
        ("s3://my.bucket-1/a/b/", ("my.bucket-1", "a/b/")),
        ("s3://bucket/a b/+ü/part-", ("bucket", "a b/+ü/part-")),
    ],
)
def test_parse_s3_uri(uri, expected):
    assert parse_s3_uri(uri) == expected


@pytest.mark.parametrize(
    "uri, match",
    [
        ("bucket/prefix", "not an S3 URI"),
        ("https://bucket/prefix", "not an S3 URI"),
        ("s3://", "not a valid S3 bucket name"),
        ("s3://Bucket/x", "not a valid S3 bucket name"),
        ("s3://ab/x", "not a valid S3 bucket name"),
        ("s3://a..b/x", "not a valid S3 bucket name"),
        ("s3://bucket\n/x", "not a valid S3 bucket name"),
        (None, "not an S3 URI"),
    ],
)
def test_parse_s3_uri_rejects(uri, match):
    with pytest.raises(S3UriError, match=match):
        parse_s3_uri(uri)


def test_lists_past_one_page_and_skips_placeholders(aws_env, data_bucket):
    objects = list_objects(f"s3://{data_bucket}/data/")  # client from AWS_ENDPOINT_URL
    keys = [o.key for o in objects]
    assert len(keys) == COUNT + len(ODD_NAMES) + 2
    assert "data/" not in keys and "data/sub/" not in keys
    assert "data/not-a-folder/" in keys
    assert "other/part-0.tfrecord" not in keys
    assert keys == sorted(keys)
    assert S3Object("data/part-00007.tfrecord", len(body_of(7))) in objects


def test_suffix_filter(s3, data_bucket):
    objects = list_objects(f"s3://{data_bucket}/data/", suffix=".tfrecord", client=s3)
    assert len(objects) == COUNT + len(ODD_NAMES)
    assert all(o.key.endswith(".tfrecord") for o in objects)


def test_prefix_matches_key_starts(s3, data_bucket):
    objects = list_objects(f"s3://{data_bucket}/data/part-0001", client=s3)
    assert [o.key for o in objects] == [f"data/part-{i:05d}.tfrecord" for i in range(10, 20)]


def test_odd_keys_survive_the_round_trip(s3, data_bucket):
    listed = {o.key: o.size for o in list_objects(f"s3://{data_bucket}/data/", client=s3)}
    for i, name in enumerate(ODD_NAMES):
        key = f"data/{name}"
        assert listed[key] == len(body_of(1000 + i)), key
        assert s3.get_object(Bucket=data_bucket, Key=key)["Body"].read() == body_of(1000 + i)


def test_missing_bucket(s3):
    with pytest.raises(MissingBucketError, match="bucket 'no-such-bucket-x' does not exist"):
        list_objects("s3://no-such-bucket-x/data/", client=s3)


def test_empty_prefix(s3, data_bucket):
    with pytest.raises(EmptyPrefixError, match="no objects to shard under .*it is empty"):
        list_objects(f"s3://{data_bucket}/nothing-here/", client=s3)


def test_only_placeholders_is_empty(s3, data_bucket):
    with pytest.raises(EmptyPrefixError):
        list_objects(f"s3://{data_bucket}/data/sub/", client=s3)


def test_suffix_matching_nothing_says_so(s3, data_bucket):
    with pytest.raises(EmptyPrefixError, match=r"none of its 1211 object\(s\) end with '.parquet'.*--suffix"):
        list_objects(f"s3://{data_bucket}/data/", suffix=".parquet", client=s3)


def test_unreachable_endpoint_is_a_named_error(aws_env, monkeypatch):
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    import boto3
    from botocore.config import Config

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    client = boto3.client("s3", config=Config(retries={"mode": "standard", "max_attempts": 1}))
    with pytest.raises(S3AccessError, match="could not list s3://bucket/data/.*check AWS_ENDPOINT_URL"):
        list_objects("s3://bucket/data/", client=client)


def test_sync_folder_mirrors_a_folder_uploads_what_changed_and_refuses_a_link_out(s3, bucket, tmp_path):
    from sagemaker_dist.aws.s3_objects import sync_folder
    from sagemaker_dist.errors import DataError

    folder = tmp_path / "data"
    (folder / "cls-a").mkdir(parents=True)
    (folder / "cls-a" / "1.bin").write_bytes(b"a" * 10)
    (folder / "2.bin").write_bytes(b"b" * 20)
    uri = f"s3://{bucket}/mirror/"
    assert sync_folder(folder, uri, client=s3) == (2, 30)
    tag = s3.head_object(Bucket=bucket, Key="mirror/2.bin")["LastModified"]
    (folder / "cls-a" / "1.bin").unlink()
    (folder / "3.bin").write_bytes(b"c" * 5)
    assert sync_folder(folder, uri, client=s3) == (2, 25)
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="mirror/")["Contents"])
    assert keys == ["mirror/2.bin", "mirror/3.bin"]  # the deleted file's object is gone
    assert s3.head_object(Bucket=bucket, Key="mirror/2.bin")["LastModified"] == tag  # unchanged: kept
    secret = tmp_path / "secret"
    secret.write_text("x")
    (folder / "link.bin").symlink_to(secret)
    with pytest.raises(DataError, match="holds the link 'link.bin', which leads out of"):
        sync_folder(folder, uri, client=s3)
