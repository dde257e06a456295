"""A drafted request is not a request: the stand-ins a dry run writes where it cannot know the real
value, and the checks that keep a host from running one.

``launch --dry-run`` (``DistributedEstimator.draft_request``) makes the whole CreateTrainingJob request
without AWS. What needs AWS gets a stand-in that no real job has: the account ``000000000000``, the
output bucket ``output-bucket-not-yet-resolved``, and for each per-worker channel of a bare prefix (a
shard manifest a launch would list and write) ``s3://sagemaker-dist-draft-not-sharded/<role>/<n>``.
A host (local mode, the pipe agent on Slurm and Kubernetes) refuses such a request, and refuses one
whose per-worker channels all name the same bare prefix: every rank would read all of it.
"""

from __future__ import annotations

from collections.abc import Iterable

from sagemaker_dist.contract.training_request import TrainingRequest
from sagemaker_dist.errors import ConfigurationError

PLACEHOLDER_ACCOUNT = "000000000000"
PLACEHOLDER_OUTPUT = "s3://output-bucket-not-yet-resolved"
PLACEHOLDER_SHARDS = "s3://sagemaker-dist-draft-not-sharded"
_PLACEHOLDERS = (PLACEHOLDER_OUTPUT, PLACEHOLDER_SHARDS)
_FIX = (
    "Make the request with S3 reachable (launch --dry-run then lists and plans the shards, and "
    "DistributedEstimator.prepare writes them), or run the data directly: sagemaker-dist local --train "
    "s3://bucket/prefix/"
)


class DraftRequestError(ConfigurationError):
    """A request with a dry run's stand-ins, or per-worker channels that all name one bare prefix."""


def placeholder_channel_uri(role: str, index: int) -> str:
    """The stand-in for per-worker channel ``index`` of ``role``'s bare prefix in a draft."""
    return f"{PLACEHOLDER_SHARDS}/{role}/{index}"


def check_not_a_draft(request: TrainingRequest, per_worker_channels: Iterable[tuple[str, list[str]]]) -> None:
    """Refuse a draft's stand-ins, and per-worker channels (``(role, channel names)``) that all read the
    same bare S3 prefix."""
    uris = {c.name: (c.s3_uri, c.data_type) for c in request.channels}
    for where, uri in [
        *((f"channel {n}", u[0]) for n, u in uris.items()),
        ("the output path", request.output_path),
    ]:
        if uri.startswith(_PLACEHOLDERS):
            raise DraftRequestError(
                f"this request is a dry run's draft: {where} is the stand-in {uri}, written where S3 could "
                f"not be asked. {_FIX}"
            )
    for role, names in per_worker_channels:
        sources = {uris.get(name) for name in names}
        if len(names) > 1 and len(sources) == 1 and None not in sources:
            uri, data_type = sources.pop()
            if data_type == "S3Prefix":
                raise DraftRequestError(
                    f"the {len(names)} per-worker {role} channels ({names[0]} ... {names[-1]}) all name the "
                    f"whole prefix {uri}: every rank would train on all of it, {len(names)} times the data. "
                    f"Give each its own shard (sagemaker-dist shard, or a launch that shards it). {_FIX}"
                )
