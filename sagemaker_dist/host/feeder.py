"""A channel's objects on a host, as SageMaker deals and streams them.

Which objects each host receives each epoch: key order for a prefix, listed order for a manifest;
ShuffleConfig is a seeded permutation per epoch, taken before ShardedByS3Key deals the objects to
hosts, so a host's shard changes between epochs (our model of undocumented SageMaker behaviour). In
File mode each object's path under the channel (``S3Item.rel``) becomes a file under
``/opt/ml/input/data/<channel>``: one that would land outside it (an absolute manifest entry, a
``..`` that climbs out) is refused when the channel is listed, before anything is downloaded or any
rank starts.

Pipe mode streams them into ``<channel>_<epoch>`` FIFOs as SageMaker does: FIFO ``<channel>_0`` is
created, the objects are streamed into it when the reader opens it, and ``<channel>_1`` is created
once the reader has closed ``<channel>_0`` (after EOF, or early), with RecordIO wrapping where asked;
a channel shuffled per epoch is marked beside its FIFOs (``runtime.epoch_reader.order``), so a
resumed reader replays the FIFOs up to its stopped epoch's even where the job's layout carries no
ShuffleConfig.
"""

from __future__ import annotations

import errno
import json
import os
import random
import stat
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sagemaker_dist.aws.s3_objects import list_objects
from sagemaker_dist.contract.paths import contained_name, contained_path, fifo_name
from sagemaker_dist.contract.record_formats import (
    RECORDIO_WHOLE,
    recordio_header,
    recordio_padding,
    recordio_parts,
)
from sagemaker_dist.contract.s3_uri import parse_s3_uri
from sagemaker_dist.contract.training_request import ChannelSpec
from sagemaker_dist.errors import DataError
from sagemaker_dist.runtime.epoch_reader.order import per_epoch_order_marker


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
            raise FeedError(
                f"channel {spec.name!r}: manifest {spec.s3_uri} does not exist. If the request came from "
                "`launch --dry-run` (which writes none), write them first: `sagemaker-dist shard SOURCE "
                "OUTPUT` with the job's instance type and count (OUTPUT: the prefix above the role's folder)"
            ) from exc
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


CHUNK = 1 << 20
POLL_S = 0.02


def recordio_headers(size: int):
    """(offset, header) pairs that frame an object of ``size`` bytes as one (multipart) RecordIO record."""
    return [(offset, recordio_header(flag, length)) for offset, flag, length in recordio_parts(size)]


class TFRecordCounter:
    """Counts TFRecord records in a byte stream by walking the length headers (no copies).

    Not ``records.TFRecordFramer``: that one needs each record whole in one buffer to check its CRCs,
    while the feeder only passes chunks through and must not buffer or re-check them."""

    def __init__(self):
        self.records = 0
        self.valid = True
        self._skip = 0
        self._header = b""

    def feed(self, data: bytes) -> None:
        view, i, n = memoryview(data), 0, len(data)
        while self.valid and i < n:
            if self._skip:
                step = min(self._skip, n - i)
                self._skip -= step
                i += step
                continue
            take = min(12 - len(self._header), n - i)
            self._header += bytes(view[i : i + take])
            i += take
            if len(self._header) == 12:
                (length,) = struct.unpack("<Q", self._header[:8])
                if length > 1 << 40:
                    self.valid = False
                    return
                self._skip = length + 4
                self._header = b""
                self.records += 1

    def end_object(self) -> None:
        if self._skip or self._header:
            self.valid = False


TIMELINE_STEP_S = 0.1


@dataclass
class FeedStats:
    """What one channel FIFO of one host delivered."""

    host: str
    channel: str
    epochs: int = 0
    objects: int = 0
    bytes: int = 0
    records: int | None = 0
    first_open: float | None = None
    first_byte: float | None = None
    last_byte: float | None = None
    errors: list[str] = field(default_factory=list)
    # (monotonic time, bytes delivered so far), at most one sample per TIMELINE_STEP_S: what the
    # reader took over time (a FIFO write returns only once the reader made room)
    timeline: list[tuple[float, int]] = field(default_factory=list)


class StreamTarget:
    """A byte sink over a FIFO write fd; raises BrokenPipeError when the reader closed early."""

    def __init__(self, fd: int, stats: FeedStats, counter: TFRecordCounter | None):
        self.fd, self.stats, self.counter = fd, stats, counter

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self.fd, view)
            view = view[written:]
        now = time.monotonic()
        if self.stats.first_byte is None:
            self.stats.first_byte = now
        self.stats.last_byte = now
        self.stats.bytes += len(data)
        timeline = self.stats.timeline
        if not timeline or now - timeline[-1][0] >= TIMELINE_STEP_S:
            timeline.append((now, self.stats.bytes))
        else:
            timeline[-1] = (timeline[-1][0], self.stats.bytes)
        if self.counter is not None:
            self.counter.feed(data)


_STREAM_ERRORS: tuple = ()


def _stream_errors() -> tuple:
    """Errors a response body can raise mid-stream; botocore does not retry those, we do (with Range)."""
    global _STREAM_ERRORS
    if not _STREAM_ERRORS:
        from botocore.exceptions import BotoCoreError
        from urllib3.exceptions import HTTPError

        _STREAM_ERRORS = (BotoCoreError, HTTPError, ConnectionError, TimeoutError)
    return _STREAM_ERRORS


def stream_object(client, item: S3Item, write, attempts: int = 5, chunk: int = CHUNK, on_size=None) -> int:
    """Stream one object into ``write``; resume with a Range request after a mid-stream failure.

    ``on_size(size)`` is called once, before the first byte, with the object's size. Returns the size.
    """
    from botocore.exceptions import ClientError

    offset, size, failures = 0, None, 0
    while True:
        try:
            extra = {"Range": f"bytes={offset}-"} if offset else {}
            response = client.get_object(Bucket=item.bucket, Key=item.key, **extra)
            if size is None:
                size = int(response["ContentLength"])
                if on_size:
                    on_size(size)
            for data in response["Body"].iter_chunks(chunk):
                write(data)
                offset += len(data)
            if offset < size:
                raise ConnectionError(f"stream ended at byte {offset}")
            return size
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            raise FeedError(f"cannot read {item.uri}: {code or exc}") from exc
        except BrokenPipeError:
            raise
        except _stream_errors() as exc:
            failures += 1
            if failures >= attempts:
                where = f"at byte {offset} of {size}" if size is not None else "before the first byte"
                raise FeedError(
                    f"cannot read {item.uri} {where} after {attempts} attempts "
                    f"(botocore retries each request; last error: {exc}). Check the S3 endpoint."
                ) from exc
            time.sleep(min(2.0, 0.1 * 2**failures))


def _open_writer(path: Path, stop: threading.Event) -> int | None:
    """Open the FIFO for writing once a reader opens it; None if ``stop`` is set first."""
    while not stop.is_set():
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
            time.sleep(POLL_S)
            continue
        os.set_blocking(fd, True)
        return fd
    return None


def _wait_reader_closed(path: Path, stop: threading.Event) -> None:
    """Wait until nobody has the FIFO open for reading (a writer probe fails with ENXIO)."""
    while not stop.is_set():
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                return
            raise
        os.close(fd)
        time.sleep(POLL_S)


class ChannelFeeder(threading.Thread):
    """Feeds one channel of one host, one FIFO per epoch, until stopped."""

    def __init__(
        self,
        spec,
        items,
        data_dir,
        host_index,
        hosts,
        client,
        stop,
        on_error,
        host_name=None,
        attempts=5,
        max_epochs=None,
    ):
        super().__init__(name=f"feed-{host_name or host_index}-{spec.name}", daemon=True)
        self.spec, self.items, self.data_dir = spec, items, Path(data_dir)
        self.host_index, self.hosts, self.client = host_index, hosts, client
        self.stop_event, self.on_error, self.attempts = stop, on_error, attempts
        self.max_epochs = max_epochs
        self.stats = FeedStats(host_name or f"algo-{host_index + 1}", spec.name)
        self.fifos: list[Path] = []
        if spec.shuffle_seed is not None and spec.input_mode == "Pipe" and self.data_dir.is_dir():
            # the readers' resume replays the FIFOs up to a stopped epoch's where objects come in another
            # order each epoch: said beside the FIFOs (before any), for a seed the job's layout lacks
            per_epoch_order_marker(self.data_dir, spec.name).touch(mode=0o600)

    def close(self) -> None:
        """After the job: let the thread end (if it was started) and remove the FIFOs it made."""
        if self.ident is not None:
            self.join(2)
        self.remove_fifos()

    def fifo(self, epoch: int) -> Path:
        return self.data_dir / fifo_name(self.spec.name, epoch)

    def run(self) -> None:
        try:
            epoch = 0
            while not self.stop_event.is_set() and (self.max_epochs is None or epoch < self.max_epochs):
                self._feed_epoch(epoch)
                epoch += 1
        except FeedError as exc:
            self.stats.errors.append(str(exc))
            self.on_error(f"host {self.stats.host} channel {self.spec.name!r}: {exc}")
        except Exception as exc:  # noqa: BLE001 - any feeder crash must stop the job, not hang it
            self.stats.errors.append(repr(exc))
            self.on_error(f"host {self.stats.host} channel {self.spec.name!r}: feeder failed: {exc!r}")

    def _feed_epoch(self, epoch: int) -> None:
        path = self.fifo(epoch)
        os.mkfifo(path, 0o600)  # the job's user's alone: a second reader would take its bytes
        self.fifos.append(path)
        fd = _open_writer(path, self.stop_event)
        if fd is None:
            return
        if self.stats.first_open is None:
            self.stats.first_open = time.monotonic()
        wrap = self.spec.record_wrapper == "RecordIO"
        counter = None if wrap or self.stats.records is None else TFRecordCounter()
        target = StreamTarget(fd, self.stats, counter)
        try:
            for item in epoch_objects(self.items, self.spec, epoch, self.host_index, self.hosts):
                if self.stop_event.is_set():
                    return
                if wrap:
                    _stream_wrapped(self.client, item, target, self.attempts)
                    self.stats.records += 1
                else:
                    stream_object(self.client, item, target.write, self.attempts)
                    if counter:
                        counter.end_object()
                self.stats.objects += 1
            if counter is not None:
                self.stats.records = self.stats.records + counter.records if counter.valid else None
            self.stats.epochs += 1  # before close: the reader's EOF means this count is final
        except BrokenPipeError:
            if counter is not None and counter.valid and self.stats.records is not None:
                self.stats.records += counter.records
            self.stats.epochs += 1  # the reader closed early: SageMaker moves on to the next epoch too
        finally:
            os.close(fd)
        _wait_reader_closed(path, self.stop_event)
        try:
            path.unlink()
            self.fifos.remove(path)
        except FileNotFoundError:
            pass

    def remove_fifos(self) -> None:
        per_epoch_order_marker(self.data_dir, self.spec.name).unlink(missing_ok=True)
        for path in list(self.fifos):
            try:
                if stat.S_ISFIFO(os.stat(path).st_mode):
                    path.unlink()
            except FileNotFoundError:
                pass
        self.fifos.clear()


def _stream_wrapped(client, item: S3Item, target: StreamTarget, attempts: int) -> None:
    """Stream one object as one RecordIO record (multipart above 2^29 - 1 bytes), zero-padded to 4."""
    state = {"pos": 0, "part_start": 0, "headers": []}

    def on_size(size: int) -> None:
        state["headers"] = recordio_headers(size)
        state["size"] = size

    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            headers = state["headers"]
            if headers and headers[0][0] == state["pos"]:
                _, header = headers.pop(0)
                if state["pos"]:
                    target.write(recordio_padding(state["pos"] - state["part_start"]))
                state["part_start"] = state["pos"]
                target.write(header)
            limit = headers[0][0] - state["pos"] if headers else len(view)
            piece = view[:limit]
            target.write(bytes(piece))
            state["pos"] += len(piece)
            view = view[len(piece) :]

    size = stream_object(client, item, write, attempts, on_size=on_size)
    if size == 0:
        target.write(recordio_header(RECORDIO_WHOLE, 0))
    target.write(recordio_padding(size - state["part_start"]))
