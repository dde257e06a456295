"""Which S3 objects each host receives on a channel each epoch, as SageMaker decides it:
key order for a prefix, listed order for a manifest; ShuffleConfig is a seeded permutation per epoch,
taken before ShardedByS3Key deals the objects to hosts, so a host's shard changes between epochs
(our model of undocumented SageMaker behaviour). In File mode each object's path under the channel
(``S3Item.rel``) becomes a file under ``/opt/ml/input/data/<channel>``: one that would land outside
it (an absolute manifest entry, a ``..`` that climbs out) is refused here, when the channel is
listed, before anything is downloaded or any rank starts.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from sagemaker_dist.aws.s3_objects import list_objects
from sagemaker_dist.contract.paths import contained_name, contained_path
from sagemaker_dist.contract.s3_uri import parse_s3_uri
from sagemaker_dist.contract.training_request import ChannelSpec
from sagemaker_dist.errors import DataError


class FeedError(DataError):
    """A channel could not be fed: names the channel and the S3 object."""


@dataclass(frozen=True)
class S3Item:
    bucket: str
    key: str
    size: int | None
    rel: str  # path relative to the channel's prefix (File mode keeps it)

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def resolve_objects(spec: ChannelSpec, client) -> list[S3Item]:
    """The channel's objects in SageMaker's order: key order for a prefix, listed order for a manifest."""
    if spec.input_mode == "File":
        contained_name(spec.name, _CHANNEL_WHAT, fix=_CHANNEL_FIX, error=FeedError)
    if spec.data_type == "ManifestFile":
        bucket, key = parse_s3_uri(spec.s3_uri)
        try:
            doc = json.loads(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        except client.exceptions.NoSuchKey as exc:
            raise FeedError(f"channel {spec.name!r}: manifest {spec.s3_uri} does not exist") from exc
        except ValueError as exc:
            raise FeedError(f"channel {spec.name!r}: manifest {spec.s3_uri} is not JSON ({exc})") from exc
        if not (
            isinstance(doc, list)
            and doc
            and isinstance(doc[0], dict)
            and isinstance(doc[0].get("prefix"), str)
        ):
            raise FeedError(
                f"channel {spec.name!r}: manifest {spec.s3_uri} must be a JSON array starting with "
                '{"prefix": "s3://bucket/prefix/"} followed by relative keys'
            )
        pbucket, pkey = parse_s3_uri(doc[0]["prefix"])
        fix = "make every entry after the prefix a key relative to it (no leading '/', no '..' above it)"
        for rel in doc[1:]:
            _check_rel(spec, rel, f"channel {spec.name!r}: manifest {spec.s3_uri} has the entry", fix)
        return [S3Item(pbucket, pkey + rel, None, rel) for rel in doc[1:]]
    if spec.data_type != "S3Prefix":
        raise FeedError(
            f"channel {spec.name!r}: S3DataType {spec.data_type!r} is not S3Prefix or ManifestFile"
        )
    bucket, prefix = parse_s3_uri(spec.s3_uri)
    items = []
    for obj in sorted(list_objects(spec.s3_uri, client=client), key=lambda o: o.key):
        if obj.key.endswith("/"):
            continue
        rel = obj.key[len(prefix) :].lstrip("/") or obj.key.rsplit("/", 1)[-1]
        _check_rel(spec, rel, _downloaded_as(spec, f"s3://{bucket}/{obj.key}"), _OBJECT_FIX)
        items.append(S3Item(bucket, obj.key, obj.size, rel))
    if not items:
        raise FeedError(f"channel {spec.name!r}: no objects under {spec.s3_uri}")
    return items


_OBJECT_FIX = "rename the object, or move it out from under the channel's prefix"
# SageMaker's channel-name pattern allows '.' and '..', which File mode cannot make a directory of.
_CHANNEL_WHAT = "a File-mode channel is downloaded into /opt/ml/input/data/<its name>, and the name"
_CHANNEL_FIX = "give the channel another name"


def channel_download_dir(spec: ChannelSpec, data_dir: Path) -> Path:
    """The directory File mode downloads the channel into: ``data_dir/<channel>``, inside it."""
    return contained_path(data_dir, spec.name, _CHANNEL_WHAT, fix=_CHANNEL_FIX, error=FeedError)


def _downloaded_as(spec: ChannelSpec, uri: str) -> str:
    return f"channel {spec.name!r}: object {uri} would be downloaded as"


def download_target(spec: ChannelSpec, item: S3Item, dest: Path) -> Path:
    """Where File mode writes ``item`` under the channel's directory ``dest``: the rule of the
    listing again, now with links in ``dest`` resolved (``FeedError`` naming the object otherwise)."""
    return contained_path(dest, item.rel, _downloaded_as(spec, item.uri), fix=_OBJECT_FIX, error=FeedError)


def _check_rel(spec: ChannelSpec, rel, what: str, fix: str) -> None:
    """The containment rule for File mode, where ``rel`` becomes a path; Pipe mode only streams the
    object (a key with ``..`` is a valid key there), but any mode needs a string."""
    if spec.input_mode == "File" or not isinstance(rel, str):
        contained_name(rel, what, fix=fix, error=FeedError)


def epoch_objects(items: list[S3Item], spec: ChannelSpec, epoch: int, host_index: int, hosts: int):
    """Objects one host receives in one epoch: shuffled (if asked, per epoch), then sharded by key."""
    order = list(items)
    if spec.shuffle_seed is not None:
        random.Random(f"{spec.shuffle_seed}:{epoch}").shuffle(order)
    if spec.distribution == "ShardedByS3Key" and hosts > 1:
        order = order[host_index::hosts]
    return order
