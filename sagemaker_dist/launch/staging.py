"""Shard the bare prefixes of per-worker roles into manifests: plan every role first (listing only),
write only once the whole request built from the planned URIs has been validated.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sagemaker_dist.contract.layout import PER_WORKER, ChannelLayout
from sagemaker_dist.launch.inputs import ChannelSource, JobInputs
from sagemaker_dist.launch.pack_index import describe_records, plan_prefix
from sagemaker_dist.launch.shard_writer import MANIFEST, plan_shard_set, write_shards
from sagemaker_dist.launch.sharding import ShardPlan, check_host_split


@dataclass
class StagedShards:
    """Each role's channel sources (planned manifest URIs for sharded prefixes) and what to write."""

    shards_uri: str
    sources: dict = field(default_factory=dict)
    writes: list[tuple[ShardPlan, str, str]] = field(default_factory=list)  # (plan, prefix, role)

    def write(self, client) -> None:
        for plan, prefix, role in self.writes:
            write_shards(plan, prefix, self.shards_uri, mode=MANIFEST, role=role, client=client)


def plan_role_shards(
    inputs: JobInputs, layout: ChannelLayout, shards_uri: str, client, say, order_seed: int | None = None
) -> StagedShards:
    """List and balance every bare prefix of a per-worker role; nothing is written yet. ``order_seed``:
    each manifest's objects in an order drawn from the seed and the shard (``plan_shards``), else name
    order."""
    staged = StagedShards(shards_uri)
    for r in layout.roles:
        spec = inputs.roles[r.role]
        if isinstance(spec, str) and r.spread == PER_WORKER:
            say(f"sharding {spec} into {r.count} manifest(s) for {r.role}")
            # raises EmptyPrefixError if there are none; a pack's shards are checked against its index
            plan, index_uri = plan_prefix(spec, r.count, client=client, order_seed=order_seed)
            if index_uri is not None:
                say(describe_records(plan, index_uri))
            check_host_split(plan, layout.hosts, r.distribution, r.role)
            planned = plan_shard_set(plan, spec, shards_uri, MANIFEST, r.role)
            staged.writes.append((plan, spec, r.role))
            spec = ChannelSource(tuple(planned.uris), planned.s3_data_type)
        staged.sources[r.role] = spec
    return staged
