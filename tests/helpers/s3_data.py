"""Test data helpers for the moto S3 server: many objects put concurrently, and awkward key names."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

# Keys that break naive URL handling: spaces, unicode, '+', '%', '?', '#', '&', '=', '~', '//'.
ODD_NAMES = [
    "with space.tfrecord",
    "plus+sign.tfrecord",
    "ünïcödé-数据.tfrecord",
    "percent%20encoded.tfrecord",
    "question?mark.tfrecord",
    "hash#and&amp=.tfrecord",
    "tilde~name.tfrecord",
    "double//slash.tfrecord",
    "sub dir/nested+ü.tfrecord",
]


def put_objects(s3, bucket: str, objects: dict[str, bytes], workers: int = 16) -> None:
    """Put every ``key -> body`` into ``bucket`` with a thread pool (moto's server is threaded)."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(lambda kv: s3.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]), objects.items()))


def body_of(index: int) -> bytes:
    """A small body whose size varies with ``index`` (so that balancing by bytes matters)."""
    return bytes([index % 251]) * (1 + (index * 37) % 400)


def dataset(prefix: str, count: int, odd: bool = True) -> dict[str, bytes]:
    """``count`` numbered TFRecord-named objects under ``prefix`` (plus the odd names)."""
    objects = {f"{prefix}part-{i:05d}.tfrecord": body_of(i) for i in range(count)}
    if odd:
        objects.update({f"{prefix}{name}": body_of(1000 + i) for i, name in enumerate(ODD_NAMES)})
    return objects


def all_keys(s3, bucket: str, prefix: str = "") -> dict[str, int]:
    """Every key under ``prefix`` with its size (paginated)."""
    found = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", ()):
            found[item["Key"]] = item["Size"]
    return found


def client_for(endpoint: str):
    """A boto3 S3 client on ``endpoint`` with fake credentials (for module-scoped fixtures)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def filled_bucket(endpoint: str, name: str, objects: dict[str, bytes]) -> str:
    """Create bucket ``name`` on ``endpoint`` holding ``objects``; returns the name."""
    s3 = client_for(endpoint)
    s3.create_bucket(Bucket=name)
    put_objects(s3, name, objects)
    return name
