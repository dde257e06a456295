"""S3 URIs (``s3://bucket/key`` parsed, built and joined) and the one retry policy every S3 client uses."""

from __future__ import annotations

import re

from sagemaker_dist.errors import ConfigurationError

S3_SCHEME = "s3://"
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


class S3UriError(ConfigurationError):
    """A string that is not an ``s3://bucket/prefix`` URI."""


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ``("bucket", "some/prefix")``; keys are taken verbatim."""
    if not isinstance(uri, str) or not uri.startswith(S3_SCHEME):
        raise S3UriError(f"{uri!r} is not an S3 URI; write it as s3://bucket/prefix/")
    bucket, _, key = uri[len(S3_SCHEME) :].partition("/")
    if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
        raise S3UriError(
            f"{uri!r} names bucket {bucket!r}, which is not a valid S3 bucket name "
            "(3-63 characters: lowercase letters, digits, '.', '-'); write it as s3://bucket/prefix/"
        )
    return bucket, key


def s3_uri(bucket: str, key: str = "") -> str:
    return f"{S3_SCHEME}{bucket}/{key}"


def join_s3(base: str, *parts: str) -> str:
    """``join_s3("s3://b/out/", "job", "source")`` -> ``s3://b/out/job/source`` (no doubled slashes)."""
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])


# botocore's standard retry mode backs off between tries; the timeouts keep a hanging endpoint from
# hanging a job. Every S3 client of ours is built from these settings, by one of two factories:
# launch.s3_objects.s3_client (SDK side, local mode, platforms) and runtime.s3_mirror.s3_client (the
# container, which may not import launch); tests/launch/test_s3_client_policy.py checks there is no other.
S3_MAX_ATTEMPTS = 5
S3_CONNECT_TIMEOUT_S = 5
S3_READ_TIMEOUT_S = 30


def s3_client_settings(max_attempts: int = S3_MAX_ATTEMPTS, **extra) -> dict:
    """Keyword arguments for ``botocore.config.Config``: standard retries and our timeouts."""
    return {
        "retries": {"mode": "standard", "max_attempts": max_attempts},
        "connect_timeout": S3_CONNECT_TIMEOUT_S,
        "read_timeout": S3_READ_TIMEOUT_S,
        **extra,
    }
