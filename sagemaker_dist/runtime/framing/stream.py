"""Reading a stream as records: pick a framer by format name, then frame chunk after chunk.

``frame_views`` is the read loop PipeModeDataset runs (no copy: it yields views of its read buffer);
``frame_stream`` and ``iter_records`` are the same loop for callers that keep what they get (File-mode
channels, tests, plain-Python readers). Pure Python plus numpy; no TensorFlow here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from sagemaker_dist.contract.record_formats import FRAMED_FORMATS, check_record_format
from sagemaker_dist.runtime.framing.base import DEFAULT_CHUNK, FIRST_CHUNK, READ_STEP, STALL_SECONDS, Framer
from sagemaker_dist.runtime.framing.recordio import RecordIOFramer
from sagemaker_dist.runtime.framing.tar import TarFramer
from sagemaker_dist.runtime.framing.textline import TextLineFramer
from sagemaker_dist.runtime.framing.tfrecord import TFRecordFramer

FRAMERS: dict[str, type[Framer]] = {
    "TFRecord": TFRecordFramer,
    "RecordIO": RecordIOFramer,
    "TextLine": TextLineFramer,
    "WebDataset": TarFramer,  # one record per sample (framing.tar)
}


def make_framer(
    record_format: str,
    channel: str = "?",
    epoch: int = 0,
    max_corrupted_records_to_skip: int = 0,
    max_record_bytes: int | None = None,
):
    """A new framer for one epoch of one channel (framers keep the stream offset for error messages).

    ``max_record_bytes``: the longest record accepted (None: ``$SAGEMAKER_DIST_MAX_RECORD_BYTES``,
    else 2 GiB - 1; ``contract.record_formats.max_record_bytes``).
    """
    framer = FRAMERS[check_record_format(record_format, FRAMED_FORMATS)]
    return framer(channel, epoch, max_corrupted_records_to_skip, max_record_bytes)


def frame_views(
    readinto: Callable[[memoryview], int],
    framer: Framer,
    chunk_size: int = DEFAULT_CHUNK,
    ready: Callable[[float], bool] | None = None,
    read: Callable[[int], bytes] | None = None,
    group: int = 0,
) -> Iterator[tuple[memoryview, np.ndarray, np.ndarray, list[bytes]] | list[bytes]]:
    """Read a stream with ``readinto`` and yield ``(view, starts, lengths, extra)`` per chunk of records.

    ``view`` is the framed part of the read buffer, without a copy: it is valid only until the
    next item is asked for (release it by then). Positions are as in :meth:`Framer.frame`. The
    buffer grows when one record is larger than ``chunk_size``. The first chunks are smaller
    (``FIRST_CHUNK``, growing), so that the first records do not wait for a whole chunk. Raises
    RecordFormatError on bad framing or a truncated last record; after the stream ends, the
    framer's ``finish`` records (TextLine's last unterminated line) come as one more item over a
    separate buffer.

    ``ready(timeout)`` (optional) says whether the stream has bytes to read within ``timeout``
    seconds: when it stalls, the records already buffered are framed at once instead of waiting
    for a whole chunk, so a slow writer does not delay the first record.

    With ``read(n)`` (optional, os.read-like), large records (:meth:`Framer.read_large`) are read
    one by one and come as lists of ``bytes`` instead, in groups of a multiple of ``group``
    records where it can.
    """
    target = min(FIRST_CHUNK, chunk_size // 2)
    buf = bytearray(max(2 * target, 1))  # grows with the target: no 4 MiB to clear before the first read
    filled = 0
    while True:
        # A record whose size is not known (a text line without its newline yet): a chunk more, not a byte.
        want = framer.need if framer.need > filled + 1 else filled + max(target, 1)
        filled, eof = _fill(readinto, buf, filled, max(target, want), framer.need, ready)
        target = min(4 * target, chunk_size // 2)
        filled = yield from _frame_buffered(framer, buf, filled)
        if eof:
            break
        if read is not None and framer.large_record_ahead(buf, filled):
            leftover, eof = yield from framer.read_large(bytes(buf[:filled]), read, ready, group)
            buf[: len(leftover)] = leftover
            filled = len(leftover)
            if eof:
                break
            continue
        # What is left is an incomplete record: never frame it again without at least one more byte.
        framer.need = max(framer.need, filled + 1)
    yield from _finish(framer, buf, filled)


def _fill(readinto, buf: bytearray, filled: int, target: int, need: int, ready) -> tuple[int, bool]:
    """Read into ``buf[filled:target]`` until ``target`` bytes are there (``buf`` grows to hold them).

    Returns ``(filled, end of stream)``. Stops early when the writer is quiet (``ready``) and the
    ``need`` bytes of the next record are already there, so a slow writer does not delay them.
    ``buf`` grows to no more than twice the bytes in it, or READ_STEP: a target is a length the
    stream claims, and a short stream that claims a long record ends before the memory is spent.
    """
    while filled < target:
        if ready is not None and filled and filled >= need and not ready(STALL_SECONDS):
            break  # the writer is quiet: hand over what can be framed now
        if target > len(buf):
            size = min(max(target, 2 * len(buf)), max(2 * filled, READ_STEP))
            if size > len(buf):
                buf.extend(bytes(size - len(buf)))
        with memoryview(buf) as mv:  # no further than the target: the first chunks stay small
            n = readinto(mv[filled : min(target, len(buf))])
        if not n:
            return filled, True
        filled += n
    return filled, False


def _frame_buffered(framer: Framer, buf: bytearray, filled: int):
    """Yield the complete records in ``buf[:filled]`` as :func:`frame_views` items, then move the rest
    to the front of ``buf``; returns how many bytes are left there."""
    while filled:  # frame until no progress: a framer may stop early at a bad record
        starts, lengths, consumed, extra = framer.frame(buf, filled)
        if len(starts):
            with memoryview(buf) as mv:
                view = mv[:consumed]
                yield view, np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64), extra
                view.release()
        framer.advance(consumed, len(starts))
        if not consumed:
            break
        buf[: filled - consumed] = buf[consumed:filled]
        filled -= consumed
    return filled


def _finish(framer: Framer, buf: bytearray, filled: int):
    """The records the framer makes of the bytes left at the end of the stream, as one item (if any)."""
    tail = framer.finish(bytes(buf[:filled]))
    if tail:
        framer.advance(filled, len(tail))
        blob = b"".join(tail)
        lengths = np.asarray([len(t) for t in tail], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        with memoryview(blob) as view:
            yield view, starts, lengths, []


def frame_stream(
    readinto: Callable[[memoryview], int], framer: Framer, chunk_size: int = DEFAULT_CHUNK
) -> Iterator[tuple[bytes, np.ndarray, np.ndarray]]:
    """Read a stream with ``readinto`` and yield ``(blob, starts, lengths)`` per chunk of records.

    Record i of a chunk is ``blob[starts[i]:starts[i]+lengths[i]]`` (a copy that outlives the read
    buffer; see :func:`frame_views`). Raises RecordFormatError on bad framing or a truncated last
    record.
    """
    for view, starts, lengths, extra in frame_views(readinto, framer, chunk_size):
        blob = bytes(view)
        view.release()
        if extra:
            blob += b"".join(extra)
        yield blob, starts, lengths


def iter_records(
    readinto: Callable[[memoryview], int],
    record_format: str,
    channel: str = "?",
    epoch: int = 0,
    max_corrupted_records_to_skip: int = 0,
    chunk_size: int = DEFAULT_CHUNK,
    max_record_bytes: int | None = None,
) -> Iterator[bytes]:
    """Plain-Python record iterator over a stream (no TensorFlow): one ``bytes`` per record."""
    framer = make_framer(record_format, channel, epoch, max_corrupted_records_to_skip, max_record_bytes)
    for blob, starts, lengths in frame_stream(readinto, framer, chunk_size):
        for s, n in zip(starts.tolist(), lengths.tolist()):
            yield blob[s : s + n]


def tar_records(source, max_record_bytes: int | None = None) -> Iterator[bytes]:
    """The sample records of WebDataset shards, one after another as the readers frame a channel: a shard
    read into memory (``bytes``), or a binary file object (anything with ``readinto``: an open file).
    Each is ``framing.tar.parse_sample``'s (or ``sample_decoder``'s) input; errors are the readers' (a
    ``RecordFormatError`` naming the byte offset)."""
    import io

    reader = source if hasattr(source, "readinto") else io.BytesIO(source)
    return iter_records(reader.readinto, "WebDataset", channel="tar", max_record_bytes=max_record_bytes)
