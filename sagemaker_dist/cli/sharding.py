"""``sagemaker-dist plan`` and ``sagemaker-dist shard``: the channel layout and the per-worker shards.

Every check that needs no AWS call (instance type, count, channel names, the 20-channel cap, URIs)
runs before the first S3 request. S3 is reached through boto3's own configuration, so
``AWS_ENDPOINT_URL`` points both commands at any S3-compatible endpoint.
"""

from __future__ import annotations

import argparse

from sagemaker_dist.aws.instances import processes_per_host
from sagemaker_dist.cli import add_distribution_argument
from sagemaker_dist.contract.distributions import distribution
from sagemaker_dist.contract.layout import (
    LAYOUT_HYPERPARAMETER,
    PER_LOCAL_RANK,
    STRATEGIES,
    ChannelLayout,
    check_channel_name,
    plan_layout,
)
from sagemaker_dist.contract.s3_uri import parse_s3_uri
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.launch.shard_writer import MANIFEST, MODES, check_output_outside_source, write_shards
from sagemaker_dist.launch.sharding import ShardPlan, check_host_split


def _add_layout_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster and channels")
    g.add_argument("--instance-type", required=True, help="SageMaker training instance type (ml.p3.16xlarge)")
    g.add_argument("--instance-count", type=int, required=True, help="number of instances (hosts), >= 1")
    g.add_argument(
        "--processes-per-host",
        type=int,
        help="Horovod processes per host (default: the instance type's GPU count; needed for CPU types)",
    )
    g.add_argument(
        "--strategy",
        default="auto",
        choices=("auto", *STRATEGIES),
        help="per-rank: one FullyReplicated channel per rank (exact byte balance); per-local-rank: one "
        "ShardedByS3Key channel per GPU, split across hosts by SageMaker; auto: per-rank if it fits "
        "in 20 channels (default)",
    )
    add_distribution_argument(g)
    g.add_argument("--validation", choices=("single", "per-worker"), help="add validation channel(s)")
    g.add_argument("--eval", action="store_true", help="add one 'eval' channel every rank reads")
    g.add_argument(
        "--extra-channel", action="append", default=[], metavar="NAME", help="another channel (repeatable)"
    )
    g.add_argument(
        "--reserved-channels", type=int, default=0, metavar="N", help="channels the launcher adds on its own"
    )
    g.add_argument("--shuffle-seed", type=int, help="ShuffleConfig seed for the Pipe channels")
    g.add_argument(
        "--object-order-seed",
        type=int,
        help="each shard's objects in an order drawn from this seed and the shard (default: name order)",
    )
    g.add_argument("--record-wrapper", default="None", choices=("None", "RecordIO"), help="RecordWrapperType")
    g.add_argument("--input-mode", default="Pipe", choices=("Pipe", "File", "FastFile"))
    g.add_argument("--role", default="train", help="base name of the sharded channels (default: train)")


def _layout_from_args(args) -> ChannelLayout:
    check_channel_name(args.role)
    per_host = args.processes_per_host
    if per_host is None:  # one worker per host whatever its GPUs, or (None) one per GPU
        per_host = distribution(args.distribution).default_processes_per_host()
    per_host = processes_per_host(args.instance_type, per_host)
    return plan_layout(
        args.instance_count,
        per_host,
        strategy=args.strategy,
        validation=args.validation,
        eval_channel=args.eval,
        extra_channels=args.extra_channel,
        reserved_channels=args.reserved_channels,
        train_name=args.role,
        input_mode=args.input_mode,
        record_wrapper=args.record_wrapper,
        shuffle_seed=args.shuffle_seed,
        distribution=args.distribution,
    )


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # unreachable


def format_plan_table(plan: ShardPlan, channel_base: str = "train") -> list[str]:
    """The plan as a table: shard, channel, objects, bytes, share of total, then a summary line."""
    header = f"{'shard':>5}  {'channel':<14} {'objects':>9}  {'bytes':>16}  {'size':>10}  {'share':>7}"
    lines = [header, "-" * len(header)]
    for shard, objects, size, share in plan.table():
        channel = f"{channel_base}_{shard}"
        lines.append(
            f"{shard:>5}  {channel:<14} {objects:>9}  {size:>16}  {_human(size):>10}  {share * 100:>6.2f}%"
        )
    lines.append(
        f"total: {plan.num_objects} objects, {plan.total_bytes} bytes ({_human(plan.total_bytes)}) in "
        f"{plan.num_shards} shards; largest shard / lower bound = {plan.imbalance:.6f}"
    )
    return lines


def _print(lines) -> None:
    for line in lines:
        print(line)


def _plan_for(args, layout: ChannelLayout) -> ShardPlan:
    from sagemaker_dist.launch.pack_index import describe_records, plan_prefix

    train = layout.role("train")
    seed = args.object_order_seed
    plan, index_uri = plan_prefix(args.source, train.count, suffix=args.suffix, order_seed=seed)
    check_host_split(plan, layout.hosts, train.distribution, args.role)
    if index_uri is not None:
        print(describe_records(plan, index_uri))
    return plan


def run_plan(args) -> int:
    if args.source:
        parse_s3_uri(args.source)
    layout = _layout_from_args(args)
    _print(layout.explain())
    print("channels: " + ", ".join(layout.channel_names))
    if args.json:
        print(f"hyperparameter {LAYOUT_HYPERPARAMETER}: {layout.to_json()}")
    if args.source:
        plan = _plan_for(args, layout)
        print(f"\nshards of {args.source}:")
        _print(format_plan_table(plan, args.role))
        if layout.strategy == PER_LOCAL_RANK and layout.hosts > 1:
            print(
                f"note: each channel is ShardedByS3Key across {layout.hosts} hosts; SageMaker splits its "
                "objects by count, not by bytes"
            )
    return 0


def run_shard(args) -> int:
    parse_s3_uri(args.source)
    parse_s3_uri(args.output)
    check_channel_name(args.role)
    check_output_outside_source(args.source, args.output, args.role)  # also under --dry-run
    if args.workers < 1:
        raise ConfigurationError(f"--workers {args.workers} must be >= 1")
    layout = _layout_from_args(args)
    _print(layout.explain())
    plan = _plan_for(args, layout)
    _print(format_plan_table(plan, args.role))
    if args.dry_run:
        print("dry run: nothing written")
        return 0
    shard_set = write_shards(
        plan,
        args.source,
        args.output,
        mode=args.mode,
        role=args.role,
        workers=args.workers,
        progress=False if args.no_progress else None,
    )
    if shard_set.mode == MANIFEST:
        print(f"wrote {len(shard_set.uris)} manifests (ManifestFile channels)")
    else:
        print(
            f"copied {shard_set.copied} objects, skipped {shard_set.skipped} already in place, "
            f"removed {shard_set.deleted} stale (S3Prefix channels)"
        )
    for name, uri in zip(shard_set.channel_names, shard_set.uris):
        print(f"  {name}: {uri}")
    print(f"complete: {shard_set.plan_uri}")
    return 0


def register(subparsers) -> None:
    plan = subparsers.add_parser(
        "plan",
        help="show the channel layout for an instance type and count (and the shards of a prefix)",
        description=(
            "Show which Pipe-mode channels a job gets and which channel each Horovod rank reads. "
            "Given an S3 prefix, also list it and show how its objects balance into one shard per worker. "
            "Writes nothing. Example: sagemaker-dist plan --instance-type ml.p3.16xlarge "
            "--instance-count 2 s3://bucket/data/"
        ),
    )
    plan.add_argument("source", nargs="?", help="optional s3://bucket/prefix/ to balance")
    plan.add_argument("--suffix", help="only objects whose key ends with this, e.g. .tfrecord")
    plan.add_argument("--json", action="store_true", help="also print the layout hyperparameter JSON")
    _add_layout_arguments(plan)
    plan.set_defaults(func=run_plan)

    shard = subparsers.add_parser(
        "shard",
        help="split an S3 prefix into one balanced shard per worker (manifests or copies)",
        description=(
            "List SOURCE, balance its objects by bytes into one shard per worker channel, and write "
            "one SageMaker manifest per shard (default, zero copy) or server-side copies under "
            "OUTPUT/<role>/<k>/ (--mode copy). OUTPUT/<role>/_plan.json is written last: it exists "
            "only when every shard is complete. Example: sagemaker-dist shard s3://bucket/data/ "
            "s3://bucket/shards/ --instance-type ml.p3.16xlarge --instance-count 2 --dry-run"
        ),
    )
    shard.add_argument("source", help="s3://bucket/prefix/ holding the data files")
    shard.add_argument("output", help="s3://bucket/prefix/ to write the shards under (outside SOURCE)")
    shard.add_argument("--mode", default=MANIFEST, choices=MODES, help="manifest (default) or copy")
    shard.add_argument("--suffix", help="only objects whose key ends with this, e.g. .tfrecord")
    shard.add_argument("--dry-run", action="store_true", help="print the plan as a table and write nothing")
    shard.add_argument("--workers", type=int, default=16, help="concurrent S3 requests (default 16)")
    shard.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_layout_arguments(shard)
    shard.set_defaults(func=run_shard)
