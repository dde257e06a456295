"""One shard of a plan written to a local file, whole: each sample's source read (a local file as the scan
resolved it, or an S3 object) and framed as WebDataset tar members or a TFRecord Example."""

from __future__ import annotations

import os
import stat

from sagemaker_dist.launch.pack_items import Item, PackInputError, Source
from sagemaker_dist.launch.pack_plan import WEBDATASET, PackError, PackPlan, ShardSpec
from sagemaker_dist.launch.pack_scan import checked_file


def _read_source(source: Source, item: Item) -> bytes:
    """The file's bytes: the file the scan resolved (a link put there since is not followed), still a
    regular file of the size the scan saw."""
    if source.client is not None:
        from sagemaker_dist.launch.pack_s3 import read_s3_item

        return read_s3_item(source.client, item)
    path = item.real or checked_file(source.root, item.path, "file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise PackInputError(f"{path} is no longer a regular file; run again")
            data = f.read(item.size + 1)
    except OSError as exc:
        raise PackInputError(f"{path}: could not be read while packing ({exc.strerror or exc})") from None
    if len(data) != item.size:
        raise PackInputError(
            f"{path} changed while it was packed ({item.size} bytes when listed, now not); run again"
        )
    return data


def write_shard(plan: PackPlan, shard: ShardSpec, path: str | os.PathLike) -> tuple[int, int]:
    """Write one shard to ``path`` (a temporary file beside it, renamed when whole): (records, bytes)."""
    if plan.format == WEBDATASET:
        from sagemaker_dist.launch.tar_shards import WebDatasetWriter

        with WebDatasetWriter(path) as out:
            for sample in shard.samples:
                record = {"__key__": sample.key}
                for ext, data in sample.files():
                    record[ext] = _read_source(plan.source, sample.item) if data is None else data
                out.write(record)
        if out.bytes != shard.bytes:  # pragma: no cover - the plan's sizes are the writer's
            raise PackError(f"{shard.name}: {out.bytes} bytes written where {shard.bytes} were planned")
        return out.records, out.bytes
    from sagemaker_dist.launch.records import TFRecordWriter, encode_example

    with TFRecordWriter(path) as out:
        for sample in shard.samples:
            features = {"image": _read_source(plan.source, sample.item), "key": sample.key}
            features["format"] = sample.item.extension
            if sample.item.label is not None:
                features["label"] = sample.item.label
            out.write(encode_example(features))
    return out.records, out.bytes
