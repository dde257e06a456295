"""Record framing for Pipe-mode streams: TFRecord, SageMaker RecordIO and text lines.

Framers are incremental: they are handed a buffer of bytes read from a FIFO and return where the
complete records in it start and how long they are, so that the bytes can cross into TensorFlow in
one piece (one tensor per chunk, records cut out in C++) instead of one Python object per record.
Pure Python plus the C-backed ``crc32c`` package; no TensorFlow here.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Generator, Iterator

import crc32c
import numpy as np

from sagemaker_dist.contract.record_formats import (  # noqa: F401 - encoders re-exported for old imports
    CRC_MASK_DELTA,
    RECORD_FORMATS,
    RECORDIO_END,
    RECORDIO_LENGTH_BITS,
    RECORDIO_LENGTH_MASK,
    RECORDIO_MAGIC,
    RECORDIO_MIDDLE,
    RECORDIO_START,
    RECORDIO_WHOLE,
    U32,
    encode_recordio,
    encode_tfrecord,
    masked_crc32c,
)
from sagemaker_dist.errors import ConfigurationError, DataError

log = logging.getLogger(__name__)

_HEADER_CRC_CACHE_LIMIT = 4096
# TFRecords this large are read one by one straight from the stream (Framer.read_large); smaller
# ones in chunks. Measured: at 100 KB, one copy less per byte; a few syscalls per record cost
# little next to copying 32 KiB.
LARGE_RECORD_BYTES = 32 << 10
DEFAULT_CHUNK = 4 << 20  # bytes handed to TensorFlow per step: amortises its per-call cost
STALL_SECONDS = 0.05  # a stream quiet this long hands over the records it has, not a full chunk
MAX_GROUP_BYTES = 64 << 20  # at most this much in one list of large records (memory in flight)

_crc32c = crc32c.crc32c
_unpack_from = struct.unpack_from


class RecordFormatError(DataError):
    """A stream that is not valid in its record format; says where (channel, epoch, byte offset)."""

    def __init__(self, message: str, *, channel: str, epoch: int, offset: int):
        super().__init__(f"channel {channel!r}, epoch {epoch}, byte offset {offset}: {message}")
        self.channel = channel
        self.epoch = epoch
        self.offset = offset


class Framer:
    """Base of the incremental framers.

    ``frame(buf, end)`` looks at ``buf[:end]`` (the unconsumed bytes of the stream, which start at
    stream offset ``self.offset``) and returns ``(starts, lengths, consumed, extra)``: records are
    ``buf[s:s+n]``, except that positions at or past ``consumed`` index into ``b"".join(extra)``
    appended after ``buf[:consumed]`` (records that are not contiguous in the stream, e.g. RecordIO
    multipart records). The caller then drops the first ``consumed`` bytes and calls
    :meth:`advance`. ``need`` is the buffer size the next incomplete record requires.
    """

    format_name = ""

    def __init__(self, channel: str = "?", epoch: int = 0, max_corrupted_records_to_skip: int = 0):
        if max_corrupted_records_to_skip < 0:
            raise ConfigurationError(
                f"max_corrupted_records_to_skip is {max_corrupted_records_to_skip}; use 0 or more"
            )
        self.channel = channel
        self.epoch = epoch
        self.max_skip = max_corrupted_records_to_skip
        self.offset = 0
        self.records = 0
        self.skipped = 0
        self.need = 0
        self._bad_in_a_row = 0

    def error(self, message: str, pos: int) -> RecordFormatError:
        return RecordFormatError(
            f"{self.format_name}: {message}", channel=self.channel, epoch=self.epoch, offset=self.offset + pos
        )

    def corrupted(self, message: str, pos: int) -> None:
        """Skip a corrupted record if the limit allows it (as AWS's reader does), else raise."""
        self._bad_in_a_row += 1
        if self._bad_in_a_row > self.max_skip:
            hint = (
                f" ({self._bad_in_a_row} corrupted records in a row, over "
                f"max_corrupted_records_to_skip={self.max_skip})"
                if self.max_skip
                else "; pass max_corrupted_records_to_skip=N to skip up to N corrupted records in a row"
            )
            raise self.error(message + hint, pos)
        self.skipped += 1
        log.warning(
            "channel %r, epoch %d, byte offset %d: skipped corrupted %s record (%s); "
            "%d skipped so far this epoch",
            self.channel,
            self.epoch,
            self.offset + pos,
            self.format_name,
            message,
            self.skipped,
        )

    def frame(self, buf, end: int) -> tuple[list[int], list[int], int, list[bytes]]:
        raise NotImplementedError

    def advance(self, consumed: int, records: int) -> None:
        self.offset += consumed
        self.records += records

    def finish(self, leftover: bytes) -> list[bytes]:
        """End of stream with ``leftover`` unconsumed bytes: a truncated record is an error."""
        if leftover:
            raise self.truncated(len(leftover))
        return []

    def truncated(self, nbytes: int) -> RecordFormatError:
        """The error for a stream that ended ``nbytes`` into a record (``self.need`` bytes long, if known)."""
        frame = f" of a {self.need}-byte frame" if self.need > nbytes else ""
        return self.error(
            f"stream ended inside a record: {nbytes} byte(s){frame} after the last complete "
            f"record (the writer stopped mid-record; {self.records} complete record(s) were read)",
            0,
        )

    def large_record_ahead(self, buf, end: int) -> bool:
        """Whether ``buf[:end]`` starts a record that :meth:`read_large` should read (none do here)."""
        return False

    def read_large(self, pending: bytes, read, ready=None, group: int = 0):
        raise NotImplementedError


class TFRecordFramer(Framer):
    """TFRecord: uint64 length, masked CRC32C of the length, data, masked CRC32C of the data.

    Two passes per buffer: a scan that only follows the length fields (vectorised with a strided
    numpy view while records keep the same length), then vectorised checks of both CRCs, with the
    data CRCs computed by crc32c's C code. A bad record ends the batch before it, so the records
    ahead of it are still delivered and the error (or skip) happens when it comes first.
    """

    format_name = "TFRecord"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._header_crcs: dict[int, int] = {}  # length -> masked CRC32C of its 8 bytes

    def _header_crc(self, n: int) -> int:
        value = self._header_crcs.get(n)
        if value is None:
            if len(self._header_crcs) >= _HEADER_CRC_CACHE_LIMIT:
                self._header_crcs.clear()
            value = self._header_crcs[n] = masked_crc32c(struct.pack("<Q", n))
        return value

    def large_record_ahead(self, buf, end: int) -> bool:
        return end >= 12 and _unpack_from("<Q", buf, 0)[0] >= LARGE_RECORD_BYTES

    def read_large(
        self, pending: bytes, read: Callable[[int], bytes], ready=None, group: int = 0
    ) -> Generator[list[bytes], None, tuple[bytes, bool]]:
        """Read records of LARGE_RECORD_BYTES or more with one ``read`` each, straight into their own bytes.

        The chunk path copies each byte from the kernel into a buffer and then into a ``bytes`` per
        record; here the kernel's copy is the record. ``pending`` holds the stream's next bytes (a
        header, perhaps part of its record). Yields lists of records: at every multiple of ``group``
        records read (batch boundaries, so TensorFlow's rebatch passes them through), else every
        DEFAULT_CHUNK bytes, at MAX_GROUP_BYTES, and when the writer has been quiet for
        STALL_SECONDS. Returns ``(unconsumed bytes, end of stream)`` at the first small record or
        the end; errors and skips follow the chunk path's (records before a bad one come first).
        """
        records: list[bytes] = []
        size = 0
        limit = MAX_GROUP_BYTES if group else DEFAULT_CHUNK
        while True:
            if len(pending) < 12:
                pending += _read_exact(read, 12 - len(pending))
                if len(pending) < 12:  # the end (finish() reports a partial header)
                    if records:
                        yield records
                    return pending, True
            n = _unpack_from("<Q", pending, 0)[0]
            if n < LARGE_RECORD_BYTES or _unpack_from("<I", pending, 8)[0] != self._header_crc(n):
                if records:  # the chunk path takes over (and reports a bad header)
                    yield records
                return pending, False
            if records and ready is not None and not ready(STALL_SECONDS):
                yield records  # the writer is quiet: hand over what was read
                records, size = [], 0
            self.need = n + 16
            have = pending[12 : 12 + n]
            data = have + _read_exact(read, n - len(have)) if have else _read_exact(read, n)
            rest = pending[12 + n :]
            tail = rest + _read_exact(read, 16 - len(rest))  # data CRC, then the next header
            if len(data) < n or len(tail) < 4:
                if records:
                    yield records
                raise self.truncated(12 + len(data) + len(tail))
            if _unpack_from("<I", tail, 0)[0] == masked_crc32c(data):
                self._bad_in_a_row = 0
                records.append(data)
                size += n
                self.advance(n + 16, 1)
            else:
                if records:
                    yield records
                    records, size = [], 0
                self.corrupted(f"data CRC mismatch in a {n}-byte record", 0)
                self.advance(n + 16, 0)
            self.need = 0
            pending = tail[4:]
            if records and ((group and self.records % group == 0) or size >= limit):
                yield records
                records, size = [], 0

    def _bad_header(self, n: int, pos: int) -> RecordFormatError:
        return self.error(
            f"length CRC mismatch (length field {n}); the stream is corrupt or not TFRecord "
            "(check record_format and RecordWrapperType)",
            pos,
        )

    def _scan(self, buf, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Positions and lengths of the complete records in buf[:end], following length fields only."""
        blocks_pos, blocks_len = [], []
        single_pos, single_len = [], []
        unpack = _unpack_from
        pos = 0
        while pos + 12 <= end:
            n = unpack("<Q", buf, pos)[0]
            stride = n + 16
            if pos + stride > end:
                if unpack("<I", buf, pos + 8)[0] != self._header_crc(n):
                    if single_pos or blocks_pos:
                        break  # deliver the records before it first
                    raise self._bad_header(n, pos)
                self.need = stride
                break
            run = (end - pos) // stride
            if run >= 16:
                lens = np.ndarray((run,), dtype="<u8", buffer=buf, offset=pos, strides=(stride,))
                differ = np.flatnonzero(lens != n)
                del lens
                if len(differ):
                    run = max(int(differ[0]), 1)
                if run >= 16:
                    if single_pos:
                        blocks_pos.append(np.asarray(single_pos, dtype=np.int64))
                        blocks_len.append(np.asarray(single_len, dtype=np.int64))
                        single_pos, single_len = [], []
                    blocks_pos.append(np.arange(pos, pos + run * stride, stride, dtype=np.int64))
                    blocks_len.append(np.full(run, n, dtype=np.int64))
                    pos += run * stride
                    continue
            single_pos.append(pos)
            single_len.append(n)
            pos += stride
        if single_pos:
            blocks_pos.append(np.asarray(single_pos, dtype=np.int64))
            blocks_len.append(np.asarray(single_len, dtype=np.int64))
        if not blocks_pos:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        if len(blocks_pos) == 1:
            return blocks_pos[0], blocks_len[0]
        return np.concatenate(blocks_pos), np.concatenate(blocks_len)

    def frame(self, buf, end):
        self.need = 0
        positions, lengths = self._scan(buf, end)
        if not len(positions):
            return [], [], 0, []
        arr = np.frombuffer(buf, dtype=np.uint8, count=end)
        try:
            stored_header = _gather_u32(arr, positions + 8)
            if lengths[0] == lengths[-1] and (lengths == lengths[0]).all():
                header_ok = stored_header == self._header_crc(int(lengths[0]))
            else:
                uniq, inverse = np.unique(lengths, return_inverse=True)
                expected = np.asarray([self._header_crc(int(n)) for n in uniq.tolist()], dtype=np.uint32)
                header_ok = stored_header == expected[inverse]
            starts = positions + 12
            stops = starts + lengths
            stored_data = _gather_u32(arr, stops)
            with memoryview(buf) as mv:
                crc = _crc32c
                computed = np.array(
                    [crc(mv[a:b]) for a, b in zip(starts.tolist(), stops.tolist())], dtype=np.uint64
                )
            masked = (((computed >> 15) | (computed << 17)) + CRC_MASK_DELTA) & U32
            ok = header_ok & (masked == stored_data)
        finally:
            del arr
        if ok.all():
            self._bad_in_a_row = 0
            return starts, lengths, int(stops[-1]) + 4, []
        bad = int(np.flatnonzero(~ok)[0])
        if bad:
            self._bad_in_a_row = 0
            return starts[:bad], lengths[:bad], int(positions[bad]), []
        if not header_ok[0]:
            raise self._bad_header(int(lengths[0]), 0)
        self.corrupted(f"data CRC mismatch in a {int(lengths[0])}-byte record", 0)
        return [], [], int(stops[0]) + 4, []


def _read_exact(read: Callable[[int], bytes], n: int) -> bytes:
    """``n`` bytes from ``read`` (fewer only at the end of the stream); one call, so no copy, when it can."""
    if n <= 0:
        return b""
    first = read(n)
    if len(first) == n or not first:
        return first
    parts = [first]
    got = len(first)
    while got < n:
        more = read(n - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _gather_u32(arr: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Little-endian uint32 values at arbitrary (unaligned) byte offsets of a uint8 array."""
    b = arr[offsets[:, None] + np.arange(4)].astype(np.uint32)
    return b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24)


class RecordIOFramer(Framer):
    """SageMaker/MXNet RecordIO: magic, 29-bit length + 3-bit multipart flag, payload, 4-byte padding.

    Multipart records are joined by concatenating their parts' payloads (as AWS's reader does).
    A bad frame ends the batch before it, so the records ahead of it are still delivered.
    """

    format_name = "RecordIO"

    def frame(self, buf, end):
        starts: list[int] = []
        lengths: list[int] = []
        extra: list[bytes] = []
        extra_at = 0  # length of b"".join(extra)
        unpack = _unpack_from
        pos = 0
        self.need = 0
        bad: RecordFormatError | None = None
        while pos + 8 <= end and bad is None:
            record_start = pos
            parts = []
            scan = pos
            complete = False
            while scan + 8 <= end:
                magic, word = unpack("<II", buf, scan)
                if magic != RECORDIO_MAGIC:
                    bad = self.error(
                        f"bad magic number 0x{magic:08X} (expected 0x{RECORDIO_MAGIC:08X}); the stream "
                        "is corrupt or not RecordIO (check record_format and RecordWrapperType)",
                        scan,
                    )
                    break
                flag = word >> RECORDIO_LENGTH_BITS
                n = word & RECORDIO_LENGTH_MASK
                expect_first = not parts
                if flag > RECORDIO_END or (flag in (RECORDIO_WHOLE, RECORDIO_START)) != expect_first:
                    bad = self.error(
                        f"multipart flag {flag} out of sequence "
                        f"({'a record must start with flag 0 or 1' if expect_first else 'expected 2 or 3'})",
                        scan,
                    )
                    break
                payload = scan + 8
                padded = payload + n + (-n % 4)
                if padded > end:
                    self.need = padded - record_start
                    break
                parts.append((payload, n))
                scan = padded
                if flag in (RECORDIO_WHOLE, RECORDIO_END):
                    complete = True
                    break
            if bad is not None:
                if not starts:
                    raise bad
                self.need = 0
                break
            if not complete:
                if not self.need:
                    self.need = scan + 8 - record_start
                break
            if len(parts) == 1:
                starts.append(parts[0][0])
                lengths.append(parts[0][1])
            else:
                joined = b"".join(bytes(buf[p : p + n]) for p, n in parts)
                starts.append(-1 - extra_at)  # placeholder, resolved once `consumed` is known
                lengths.append(len(joined))
                extra.append(joined)
                extra_at += len(joined)
            pos = scan
        starts = [s if s >= 0 else pos + (-1 - s) for s in starts]
        return starts, lengths, pos, extra


class TextLineFramer(Framer):
    """Text lines split on b"\\n" (a trailing b"\\r" is dropped); the last line may lack its newline."""

    format_name = "TextLine"

    def frame(self, buf, end):
        arr = np.frombuffer(buf, dtype=np.uint8, count=end)
        newlines = np.flatnonzero(arr == 10)
        if not len(newlines):
            self.need = end + 1
            return [], [], 0, []
        starts = np.empty(len(newlines), dtype=np.int64)
        starts[0] = 0
        starts[1:] = newlines[:-1] + 1
        stops = newlines.copy()
        has_cr = stops > starts
        has_cr[has_cr] = arr[stops[has_cr] - 1] == 13
        stops -= has_cr
        self.need = 0
        return starts, stops - starts, int(newlines[-1]) + 1, []

    def finish(self, leftover: bytes) -> list[bytes]:
        if not leftover:
            return []
        return [leftover[:-1] if leftover.endswith(b"\r") else leftover]


FRAMERS: dict[str, type[Framer]] = {
    "TFRecord": TFRecordFramer,
    "RecordIO": RecordIOFramer,
    "TextLine": TextLineFramer,
}


def check_record_format(record_format: str) -> str:
    if record_format not in FRAMERS:
        raise ConfigurationError(f"record_format {record_format!r} is not one of {', '.join(RECORD_FORMATS)}")
    return record_format


def make_framer(record_format: str, channel: str = "?", epoch: int = 0, max_corrupted_records_to_skip=0):
    return FRAMERS[check_record_format(record_format)](channel, epoch, max_corrupted_records_to_skip)




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
    buffer grows when one record is larger than ``chunk_size``. Raises RecordFormatError on bad
    framing or a truncated last record; after the stream ends, the framer's ``finish`` records
    (TextLine's last unterminated line) come as one more item over a separate buffer.

    ``ready(timeout)`` (optional) says whether the stream has bytes to read within ``timeout``
    seconds: when it stalls, the records already buffered are framed at once instead of waiting
    for a whole chunk, so a slow writer does not delay the first record.

    With ``read(n)`` (optional, os.read-like), large records (:meth:`Framer.read_large`) are read
    one by one and come as lists of ``bytes`` instead, in groups of a multiple of ``group``
    records where it can.
    """
    buf = bytearray(chunk_size)
    filled = 0
    eof = False
    while True:
        target = max(chunk_size // 2, framer.need)
        if target > len(buf):
            buf.extend(bytes(max(target, 2 * len(buf)) - len(buf)))
        while filled < target and not eof:
            if ready is not None and filled and filled >= framer.need and not ready(STALL_SECONDS):
                break  # the writer is quiet: hand over what can be framed now
            with memoryview(buf) as mv:
                n = readinto(mv[filled:])
            if n:
                filled += n
            else:
                eof = True
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
) -> Iterator[bytes]:
    """Plain-Python record iterator over a stream (no TensorFlow): one ``bytes`` per record."""
    framer = make_framer(record_format, channel, epoch, max_corrupted_records_to_skip)
    for blob, starts, lengths in frame_stream(readinto, framer, chunk_size):
        for s, n in zip(starts.tolist(), lengths.tolist()):
            yield blob[s : s + n]
