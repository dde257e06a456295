"""The ``inputs`` of a launch, parsed once into a typed value the planner and the renderer share.

``inputs`` maps ``train`` (required), ``validation`` and ``eval`` to S3 prefixes, URI lists or
ShardSets; other keys are extra channels every rank shares (one S3 URI each). A bare string or a
ShardSet alone is ``train``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sagemaker_dist.contract.layout import PER_WORKER, SINGLE, check_channel_name
from sagemaker_dist.contract.s3_uri import S3UriError, parse_s3_uri
from sagemaker_dist.errors import ConfigurationError

LAYOUT_ROLES = ("train", "validation", "eval")


class EstimatorError(ConfigurationError):
    """A job description that cannot become a valid training job."""


@dataclass(frozen=True)
class ChannelSource:
    """Where the channels of one role read from: one URI per channel, all of one S3DataType."""

    uris: tuple[str, ...]
    s3_data_type: str = "S3Prefix"  # or ManifestFile


RoleSource = ChannelSource | str  # a bare str is a prefix still to shard (or to share)


@dataclass(frozen=True)
class JobInputs:
    """Parsed inputs: each layout role's source and the extra (shared) channels."""

    roles: Mapping[str, RoleSource]
    extras: Mapping[str, str]

    def validation_spread(self, preference: str) -> str | None:
        """How validation is laid out: several URIs are per-worker; a prefix follows ``preference``."""
        spec = self.roles.get("validation")
        if spec is None:
            return None
        if isinstance(spec, ChannelSource):
            return PER_WORKER if len(spec.uris) > 1 else SINGLE
        return PER_WORKER if preference == PER_WORKER else SINGLE


def check_s3_uri(uri, what: str) -> str:
    """``uri`` if it is an S3 URI (the contract's parser decides), else an error naming ``what``."""
    try:
        parse_s3_uri(uri)
    except S3UriError as exc:
        raise EstimatorError(
            f"{what} is {uri!r}; give an S3 URI like 's3://bucket/prefix/' ({exc})"
        ) from None
    return uri


def is_shard_set(spec) -> bool:
    return hasattr(spec, "uris") and hasattr(spec, "s3_data_type")


def _as_source(spec, what: str) -> RoleSource:
    """A ShardSet or a list of URIs becomes a ChannelSource; a bare S3 URI stays a str (to shard or share)."""
    if is_shard_set(spec):
        return ChannelSource(tuple(check_s3_uri(u, what) for u in spec.uris), spec.s3_data_type)
    if isinstance(spec, str):
        return check_s3_uri(spec, what)
    if isinstance(spec, Sequence) and spec:
        return ChannelSource(tuple(check_s3_uri(u, f"{what} entry") for u in spec))
    raise EstimatorError(
        f"{what} is {spec!r}; give an S3 prefix, a list of S3 URIs (one per channel) or the ShardSet "
        "from sagemaker_dist.launch.shard_writer.write_shards"
    )


def parse_inputs(inputs) -> JobInputs:
    """Check ``inputs`` and type them; an already parsed ``JobInputs`` is returned as it is."""
    if isinstance(inputs, JobInputs):
        return inputs
    if isinstance(inputs, str) or is_shard_set(inputs):
        inputs = {"train": inputs}
    if not isinstance(inputs, Mapping) or "train" not in inputs:
        raise EstimatorError(
            "inputs need a 'train' entry: launch({'train': 's3://bucket/prefix/'}) or launch('s3://...')"
        )
    roles = {k: _as_source(v, f"inputs[{k!r}]") for k, v in inputs.items() if k in LAYOUT_ROLES}
    extras = {}
    for name, spec in inputs.items():
        if name not in LAYOUT_ROLES:
            check_channel_name(name)
            if not isinstance(spec, str):
                raise EstimatorError(f"extra channel {name!r} takes one S3 URI, not {spec!r}")
            extras[name] = check_s3_uri(spec, f"inputs[{name!r}]")
    return JobInputs(roles, extras)
