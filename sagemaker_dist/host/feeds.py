"""Each channel of each host becomes a feed with one interface (``start``, ``close``,
``stats``): Pipe mode streams S3 objects into ``<channel>_<epoch>`` FIFOs while the ranks run; File
mode downloads the host's objects before they start, as SageMaker does.
"""

from __future__ import annotations

import time
from pathlib import Path

from sagemaker_dist.contract.training_request import ChannelSpec
from sagemaker_dist.host.channel_objects import (
    FeedError,
    S3Item,
    channel_download_dir,
    download_target,
    epoch_objects,
    resolve_objects,
)
from sagemaker_dist.host.feeder import ChannelFeeder, FeedStats


class FileFeed:
    """A File-mode channel of one host: downloaded when made; nothing runs during the job."""

    def __init__(self, spec, items, tree, client, host_index: int, hosts: int, echo):
        started = time.monotonic()
        dest = channel_download_dir(spec, tree.data_dir)
        size = download_channel(spec, items, dest, client, host_index, hosts)
        # downloaded before the ranks start: no streaming figures
        self.stats = FeedStats(
            tree.name, spec.name, epochs=1, bytes=size, records=None, first_byte=None, last_byte=None
        )
        echo(
            f"{tree.name}: downloaded channel {spec.name} ({size / 1e6:.1f} MB) in "
            f"{time.monotonic() - started:.1f} s (File mode)"
        )

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass


def open_feeds(
    specs, trees, client, stop, on_error, echo, *, hosts=None, items=None, max_epochs=None
) -> list:
    """One feed per (channel, host) for ``trees`` (a ``JobHosts``: hosts from its ``first_index`` of the
    job's ``hosts``, all of them by default); File-mode channels are downloaded here, Pipe ones start
    later and feed ``max_epochs`` epochs (None: until stopped). Every channel is listed (and its keys
    checked) before any is downloaded, unless ``items`` (channel name -> its objects) were listed
    already."""
    hosts = len(trees) if hosts is None else hosts
    listed = [(spec, items[spec.name] if items else resolve_objects(spec, client)) for spec in specs]
    feeds: list = []
    for spec, objects in listed:
        for index, tree in enumerate(trees, trees.first_index):
            if spec.input_mode == "File":
                feeds.append(FileFeed(spec, objects, tree, client, index, hosts, echo))
            else:
                feeds.append(
                    ChannelFeeder(
                        spec, objects, tree.data_dir, index, hosts, client, stop, on_error,
                        host_name=tree.name, max_epochs=max_epochs,
                    )
                )  # fmt: skip
    return feeds


def close_feeds(feeds: list) -> None:
    for feed in feeds:
        feed.close()


def download_channel(spec: ChannelSpec, items: list[S3Item], dest: Path, client, host_index: int, hosts: int):
    """File mode: download this host's objects into ``dest`` (relative key paths kept, each one inside
    ``dest``: checked when listed, and again here with links resolved). Returns bytes."""
    from boto3.s3.transfer import TransferConfig

    dest.mkdir(parents=True, exist_ok=True)
    total = 0
    config = TransferConfig(max_concurrency=4)
    for item in epoch_objects(items, spec, 0, host_index, hosts):
        target = download_target(spec, item, dest)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        try:
            client.download_file(item.bucket, item.key, str(tmp), Config=config)
        except Exception as exc:  # noqa: BLE001 - botocore already retried; name the object
            tmp.unlink(missing_ok=True)
            raise FeedError(f"channel {spec.name!r}: cannot download {item.uri}: {exc}") from exc
        tmp.rename(target)
        total += target.stat().st_size
    return total
