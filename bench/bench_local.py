"""Local-mode benchmarks (figures in docs/benchmarks.md, section "Local mode").

1. Time to first record, Pipe vs File mode, per dataset size: from the start of the channel's input
   (listing its objects) to the first TFRecord read by a consumer. Pipe streams the objects into the
   FIFO as the reader goes; File downloads every object first. The reference is File mode on the
   same objects in the same run: ratio = File / Pipe.
2. Weak scaling: the same records per rank for 1 and 2 Horovod ranks (real ``run_local`` jobs whose
   ranks read their channel through the runtime's ``rank_dataset``); aggregate records/s and the ratio
   2 ranks / 1 rank (2.0 = perfect on 2 cores).

Usage: .venv/bin/python bench/bench_local.py [--sizes 100MB,2GB] [--object-mb 50]
       [--scaling-records 20000] [--skip-ttfr] [--skip-scaling]
"""

from __future__ import annotations

import argparse
import os
import re
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sagemaker_dist import embedded_s3, run_local  # noqa: E402
from sagemaker_dist.host.feeder import (  # noqa: E402
    ChannelFeeder,  # noqa: E402
    ChannelSpec,
    resolve_objects,
)
from sagemaker_dist.host.lifecycle import download_channel  # noqa: E402
from sagemaker_dist.local.demo import demo_estimator  # noqa: E402
from sagemaker_dist.local.demo_data import tfrecord_file, tfrecord_frame  # noqa: E402
from sagemaker_dist.local.endpoint import s3_client  # noqa: E402

BUCKET = "bench-local"
RECORD_BYTES = 100 * 1024


def parse_size(text: str) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]?B)", text.strip().upper())
    if not match:
        raise SystemExit(f"size {text!r}: write it like 100MB or 2GB")
    return int(float(match.group(1)) * {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}[match.group(2)])


def put_dataset(client, prefix: str, total: int, object_bytes: int) -> int:
    """Objects of ~object_bytes of 100 KB TFRecords (one body, many keys) totalling ~total bytes."""
    record = tfrecord_frame(os.urandom(RECORD_BYTES))
    body = record * max(1, object_bytes // len(record))
    count = max(1, round(total / len(body)))
    for i in range(count):
        client.put_object(Bucket=BUCKET, Key=f"{prefix}part-{i:05d}.tfrecord", Body=body)
    return count * len(body)


def read_first_record(f) -> bytes:
    header = f.read(12)
    (length,) = struct.unpack("<Q", header[:8])
    return f.read(length + 4)


def first_record_pipe(client, uri: str, work: Path) -> float:
    start = time.monotonic()
    spec = ChannelSpec("train_0", uri)
    stop = threading.Event()
    errors: list[str] = []
    feeder = ChannelFeeder(spec, resolve_objects(spec, client), work, 0, 1, client, stop, errors.append)
    feeder.start()
    fifo = work / "train_0_0"
    while not fifo.exists():
        time.sleep(0.001)
    with open(fifo, "rb") as f:
        read_first_record(f)
        elapsed = time.monotonic() - start
        stop.set()
    feeder.join(10)
    feeder.remove_fifos()
    if errors:
        raise SystemExit(errors[0])
    return elapsed


def first_record_file(client, uri: str, work: Path) -> float:
    start = time.monotonic()
    spec = ChannelSpec("train_0", uri, input_mode="File")
    download_channel(spec, resolve_objects(spec, client), work / "train_0", client, 0, 1)
    first = sorted((work / "train_0").iterdir())[0]
    with open(first, "rb") as f:
        read_first_record(f)
    return time.monotonic() - start


def bench_time_to_first_record(sizes: list[str], object_mb: float) -> None:
    client = s3_client()
    print("time to first record (s): Pipe streams, File downloads first; ratio = File / Pipe")
    print(f"{'dataset':>9} {'objects':>8} {'Pipe':>8} {'File':>8} {'ratio':>7}")
    for size in sizes:
        prefix = f"ttfr-{size.lower()}/"
        total = put_dataset(client, prefix, parse_size(size), int(object_mb * 1e6))
        objects = len(resolve_objects(ChannelSpec("x", f"s3://{BUCKET}/{prefix}"), client))
        uri = f"s3://{BUCKET}/{prefix}"
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            pipe = min(first_record_pipe(client, uri, Path(a)) for _ in range(3))
            file = first_record_file(client, uri, Path(b))
        print(
            f"{total / 1e9:>7.2f}GB {objects:>8} {pipe:>8.3f} {file:>8.2f} {file / pipe:>6.0f}x", flush=True
        )
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            for obj in page.get("Contents", []):
                client.delete_object(Bucket=BUCKET, Key=obj["Key"])


def bench_weak_scaling(records_per_rank: int) -> None:
    client = s3_client()
    files_per_rank = 4
    per_file = records_per_rank // files_per_rank
    body = tfrecord_file(per_file, seed=1)
    print(
        f"\nweak scaling: {records_per_rank} CIFAR-shaped records per rank, 2 epochs, Pipe mode, "
        "ranks read through rank_dataset"
    )
    print(f"{'ranks':>5} {'records':>9} {'seconds':>8} {'records/s':>10} {'vs 1 rank':>9}")
    base = None
    for ranks in (1, 2):
        prefix = f"scaling-{ranks}/"
        for i in range(files_per_rank * ranks):
            client.put_object(Bucket=BUCKET, Key=f"{prefix}part-{i:05d}.tfrecord", Body=body)
        estimator = demo_estimator(
            BUCKET,
            1,
            ranks,
            "Pipe",
            {"epochs": 2},
            source_dir=REPO / "tests" / "local_scripts",
            entry_point="count_records.py",
        )
        request = estimator.prepare({"train": f"s3://{BUCKET}/{prefix}"}, printer=None).request
        result = run_local(request, REPO / "tests" / "local_scripts", echo=lambda line: None)
        lines = [
            m
            for line in result.output
            if (m := re.search(r"rank (\d+) records (\d+) seconds ([0-9.]+)", line))
        ]
        total = sum(int(m.group(2)) for m in lines)
        seconds = max(float(m.group(3)) for m in lines)
        rate = total / seconds
        base = base or rate
        print(f"{ranks:>5} {total:>9} {seconds:>8.2f} {rate:>10,.0f} {rate / base:>8.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100MB,2GB")
    parser.add_argument("--object-mb", type=float, default=50.0)
    parser.add_argument("--scaling-records", type=int, default=20000)
    parser.add_argument("--skip-ttfr", action="store_true")
    parser.add_argument("--skip-scaling", action="store_true")
    args = parser.parse_args()
    with embedded_s3(state_dir=None):
        s3_client().create_bucket(Bucket=BUCKET)
        print(f"cpus: {os.cpu_count()}; S3: embedded moto server on 127.0.0.1")
        if not args.skip_ttfr:
            bench_time_to_first_record(args.sizes.split(","), args.object_mb)
        if not args.skip_scaling:
            bench_weak_scaling(args.scaling_records)


if __name__ == "__main__":
    main()
