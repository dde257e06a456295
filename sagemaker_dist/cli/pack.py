"""``sagemaker-dist pack``: a local image set into balanced WebDataset or TFRecord shards.

The planning and writing are ``launch.pack``'s; this is the command line around them."""

from __future__ import annotations

import argparse

from sagemaker_dist.launch.pack import DEFAULT_SHARD_BYTES, FORMATS, WEBDATASET, parse_size

SKIPPED_SHOWN = 10  # skipped files printed; the index lists up to launch.pack.SKIPPED_IN_INDEX


def _size(text: str) -> int:
    from sagemaker_dist.errors import ConfigurationError

    try:
        return parse_size(text)
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= 1")
    return value


def run_pack(args) -> int:
    from sagemaker_dist.launch.pack import pack, plan_pack, scan_source

    source = scan_source(
        args.source, path_field=args.path_field, label_field=args.label_field, strict=args.strict
    )
    plan = plan_pack(
        source,
        format=args.format,
        shard_bytes=args.shard_size,
        shards=args.shards,
        multiple_of=args.multiple_of,
        seed=args.seed,
    )
    classes = f", {len(source.classes)} classes" if source.classes else ""
    counts = [len(s.samples) for s in plan.shards]
    print(
        f"{len(source.items)} samples{classes} ({source.layout}) from {args.source}: {len(plan.shards)} "
        f"{args.format} shard(s) of about {plan.bytes / len(plan.shards) / 1e6:.1f} MB "
        f"({min(counts)}{'' if min(counts) == max(counts) else f'-{max(counts)}'} samples each)"
    )
    if source.ignored:
        print(f"ignored {source.ignored} file(s) that are not images (by extension)")
    if source.skipped:
        print(f"skipped {len(source.skipped)} file(s) (--strict makes this an error):")
        for skipped in source.skipped[:SKIPPED_SHOWN]:
            print(f"  {skipped.path}: {skipped.reason}")
        if len(source.skipped) > SKIPPED_SHOWN:
            print(f"  ... and {len(source.skipped) - SKIPPED_SHOWN} more (listed in the index)")
    if args.dry_run:
        for shard in plan.shards[:SKIPPED_SHOWN]:
            print(f"  {shard.name}: {len(shard.samples)} samples, {shard.bytes} bytes")
        print("dry run: nothing written")
        return 0
    result = pack(
        plan,
        args.output,
        workers=args.workers,
        concurrency=args.concurrency,
        resume=not args.no_resume,
        progress=False if args.no_progress else None,
    )
    print(result)
    fmt = result.index["record_format"]
    print(f"train on it: --train {result.shards_uri} (record_format={fmt!r} in the script's reader)")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "pack",
        help="pack an image set (class folders, JSON lines, CSV; local or in S3) into balanced WebDataset "
        "or TFRecord shards",
        description=(
            'Read SOURCE (a folder with one sub-folder per class, a .jsonl file of {"path", "label"} '
            "objects, or a .csv file of path,label rows; paths relative to the file's folder; local, or in "
            "S3: s3://bucket/images/, s3://bucket/list.jsonl), shuffle its "
            "samples (--seed) and write them as shards balanced by bytes under OUTPUT (s3://bucket/prefix/ "
            "or a folder): OUTPUT/shards/shard-000000.tar, ... (the channel's data), then OUTPUT/index.json "
            "last. A rerun of the same plan skips the shards already complete. A path that leads out of "
            "SOURCE's folder is an error; missing, unreadable or mislabelled files are skipped and listed. "
            "Example: sagemaker-dist pack ./images s3://bucket/images/ --shard-size 256MB --multiple-of 8"
        ),
    )
    p.add_argument(
        "source", help="a folder of class folders, a .jsonl file or a .csv file; local or s3://bucket/..."
    )
    p.add_argument("output", help="s3://bucket/prefix/ or a local folder")
    p.add_argument("--format", default=WEBDATASET, choices=FORMATS, help="shard format (default webdataset)")
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--shard-size",
        type=_size,
        help=f"about this many bytes a shard: 64MB, 256MiB, 1GB (default {DEFAULT_SHARD_BYTES // 10**6}MB)",
    )
    size.add_argument("--shards", type=_positive, help="this many shards instead")
    p.add_argument(
        "--multiple-of",
        type=_positive,
        default=1,
        help="round the shard count up to a multiple of this (the job's ranks: each gets as many)",
    )
    p.add_argument("--seed", type=int, default=0, help="the shuffle's seed (default 0)")
    p.add_argument(
        "--path-field", default="path", help="JSON lines / CSV header: the path's field (default path)"
    )
    p.add_argument(
        "--label-field", default="label", help="JSON lines / CSV header: the label's field (default label)"
    )
    p.add_argument(
        "--strict", action="store_true", help="a file that cannot be packed is an error, not a skip"
    )
    p.add_argument("--workers", type=_positive, default=4, help="shards written at once (default 4)")
    p.add_argument("--concurrency", type=_positive, default=8, help="uploads at once (default 8)")
    p.add_argument("--no-resume", action="store_true", help="write every shard again, even complete ones")
    p.add_argument("--dry-run", action="store_true", help="print the plan and write nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_pack)
