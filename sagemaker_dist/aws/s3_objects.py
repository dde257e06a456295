"""List the objects under an S3 prefix (the thin I/O edge in front of the sharding planner), and
``s3_client``, which builds every S3 client of the SDK side, local mode and the platforms.

Uses boto3's paginator, so prefixes with more than 1,000 objects list fully, and botocore's standard
retry mode. The endpoint comes from boto3's own configuration, so ``AWS_ENDPOINT_URL`` points it at
any S3-compatible server.
"""

from __future__ import annotations

from dataclasses import dataclass

from sagemaker_dist.aws.progress import progress_bar
from sagemaker_dist.contract.s3_uri import (  # noqa: F401 - S3UriError re-exported
    S3_MAX_ATTEMPTS,
    S3UriError,
    parse_s3_uri,
    s3_client_settings,
)
from sagemaker_dist.errors import AwsError, DataError


class S3AccessError(AwsError):
    """S3 refused a request (missing bucket, no permission, bad endpoint)."""


class MissingBucketError(S3AccessError):
    """The bucket named in a URI does not exist on the endpoint in use."""


class EmptyPrefixError(DataError):
    """No objects (after the suffix filter) under a prefix."""


@dataclass(frozen=True, slots=True)  # slots: a million of them stay small
class S3Object:
    key: str
    size: int


def s3_client(
    *, session=None, endpoint_url: str | None = None, max_attempts: int = S3_MAX_ATTEMPTS, **settings
):
    """The one S3 client factory outside the container: contract's retry and timeout policy always.

    ``session`` (a boto3 Session: the caller's credentials and region) defaults to boto3's own
    configuration, so ``AWS_ENDPOINT_URL`` applies; ``settings`` add to or override the policy's
    ``botocore.config.Config`` keywords. (The container's twin is ``runtime.s3_mirror.s3_client``:
    the runtime may not import ``launch``.)
    """
    import boto3
    from botocore.config import Config

    config = Config(**s3_client_settings(max_attempts, **settings))
    kwargs = {"endpoint_url": endpoint_url} if endpoint_url else {}
    return (session or boto3.session.Session()).client("s3", config=config, **kwargs)


def make_client(max_pool_connections: int = 50):
    """An S3 client for many concurrent server-side copies of 64 MiB parts: more tries, a longer read
    timeout and a connection pool to match."""
    return s3_client(max_attempts=10, max_pool_connections=max_pool_connections, read_timeout=120)


def describe_client_error(exc, bucket: str, action: str, missing_codes=("NoSuchBucket",)) -> S3AccessError:
    """Turn a botocore ClientError into one of our errors that says what to check."""
    code = str(exc.response.get("Error", {}).get("Code", ""))
    if code in missing_codes:
        return MissingBucketError(
            f"bucket {bucket!r} does not exist (while trying to {action}); create it or fix the "
            "URI (check AWS_ENDPOINT_URL and the region if you use a non-default S3 endpoint)"
        )
    return S3AccessError(
        f"S3 refused to {action} in bucket {bucket!r}: {code or 'error'} ({exc}); "
        "check the URI, your credentials and their permissions"
    )


def unreachable(exc, action: str) -> S3AccessError:
    """No answer from S3 at all (no credentials, endpoint down or misspelt)."""
    return S3AccessError(
        f"could not {action}: {exc}; check AWS_ENDPOINT_URL (if you use one), your network and "
        "your AWS credentials"
    )


def s3_call(action: str, bucket: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, botocore's errors turned into ours naming ``action`` (``read s3://...``)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return fn(*args, **kwargs)
    except ClientError as exc:
        raise describe_client_error(exc, bucket, action) from exc
    except BotoCoreError as exc:
        raise unreachable(exc, action) from exc


def is_folder_marker(key: str, size: int) -> bool:
    """An empty object whose key ends in '/': the S3 console's "folder", no data of the dataset."""
    return key.endswith("/") and size == 0


def list_objects(s3_uri: str, suffix: str | None = None, client=None) -> list[S3Object]:
    """Every object under ``s3_uri`` in key order, skipping folder placeholders (``key/``, 0 bytes).

    ``suffix`` keeps only keys ending with it (e.g. ``.tfrecord``). Raises MissingBucketError or
    EmptyPrefixError rather than returning nothing.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = parse_s3_uri(s3_uri)
    client = client or make_client()
    paginator = client.get_paginator("list_objects_v2")
    found: list[S3Object] = []
    listed = 0
    try:
        with progress_bar(desc=f"list {s3_uri}", unit=" objects") as bar:
            for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
                for item in page.get("Contents", ()):
                    key, size = item["Key"], int(item["Size"])
                    if is_folder_marker(key, size):
                        continue
                    listed += 1
                    if suffix and not key.endswith(suffix):
                        continue
                    found.append(S3Object(key, size))
                bar.update(len(page.get("Contents", ())))
    except ClientError as exc:
        raise describe_client_error(exc, bucket, f"list {s3_uri}") from exc
    except BotoCoreError as exc:
        raise unreachable(exc, f"list {s3_uri}") from exc
    if not found:
        why = f"none of its {listed} object(s) end with {suffix!r}" if suffix and listed else "it is empty"
        raise EmptyPrefixError(
            f"no objects to shard under {s3_uri} ({why}); check the prefix"
            + (" and --suffix" if suffix else "")
            + " (prefixes match key starts, so end a folder prefix with '/')"
        )
    return found


def sync_folder(folder, s3_uri: str, client=None) -> tuple[int, int]:
    """Make the prefix ``s3_uri`` hold exactly the files under ``folder`` (keys by relative path);
    ``(files, bytes)``. An object already there with the same size is kept (a rerun uploads only what
    changed in size), one the folder no longer has is deleted: a job never trains on stale files. A link
    that leads out of ``folder`` is refused, links to folders are not followed: nothing from elsewhere
    goes up."""
    import os
    from pathlib import Path

    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    from sagemaker_dist.contract.paths import contained_path

    root = Path(folder)
    bucket, prefix = parse_s3_uri(s3_uri if s3_uri.endswith("/") else s3_uri + "/")
    client = client or make_client()
    files = []
    for here, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(names):
            path = Path(here, name)
            rel = path.relative_to(root).as_posix()
            contained_path(root, rel, f"folder {str(root)!r} holds the link", error=DataError)
            if path.is_file():
                files.append((rel, path))
    if not files:
        raise EmptyPrefixError(f"folder {str(root)!r} holds no files to upload")
    try:
        have = {o.key: o.size for o in list_objects(s3_uri, client=client)}
    except EmptyPrefixError:
        have = {}
    sizes = [path.stat().st_size for _, path in files]
    with progress_bar(total=sum(sizes), desc=f"upload {root} to {s3_uri}", unit="B", unit_scale=True) as bar:
        for (rel, path), size in zip(files, sizes):
            key = prefix + rel
            if have.get(key) != size:
                try:
                    client.upload_file(str(path), bucket, key)
                except (S3UploadFailedError, ClientError, BotoCoreError) as exc:
                    raise S3AccessError(f"could not upload {path} to s3://{bucket}/{key}: {exc}") from exc
            bar.update(size)
    stale = sorted(set(have) - {prefix + rel for rel, _ in files})
    for start in range(0, len(stale), 1000):  # DeleteObjects takes 1000 keys at a time
        try:
            client.delete_objects(
                Bucket=bucket, Delete={"Objects": [{"Key": k} for k in stale[start : start + 1000]]}
            )
        except (ClientError, BotoCoreError) as exc:
            raise S3AccessError(f"could not delete stale objects under {s3_uri}: {exc}") from exc
    return len(files), sum(sizes)
