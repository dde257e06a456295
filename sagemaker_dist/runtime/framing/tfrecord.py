"""TFRecord framing: uint64 length, masked CRC32C of the length, data, masked CRC32C of the data.

The hot path of reading TFRecords: one C call per chunk that follows the length fields and checks
both CRCs (``_tfrecord_scan``, built at install where a C compiler is), else vectorised length scans
and CRC checks in numpy and crc32c; and large records read one by one straight from the stream into
their own bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Generator

import crc32c
import numpy as np

from sagemaker_dist.contract.record_formats import CRC_MASK_DELTA, U32, masked_crc32c
from sagemaker_dist.runtime.framing.base import (
    DEFAULT_CHUNK,
    LARGE_RECORD_BYTES,
    MAX_GROUP_BYTES,
    READ_STEP,
    STALL_SECONDS,
    Framer,
    RecordFormatError,
)

_NATIVE_API = 2  # scan() takes the record length limit (a build from before it is not used)
try:  # the compiled scan (setup.py builds it where it can); the numpy path below is the same contract
    import sagemaker_dist.runtime.framing._tfrecord_scan as _native
except ImportError:  # pragma: no cover - depends on the install
    _native = None
if _native is not None and getattr(_native, "API", 1) != _NATIVE_API:  # pragma: no cover - a stale build
    _native = None  # rebuilt by pip install -e . (scripts/setup.sh)

_HEADER_CRC_CACHE_LIMIT = 4096
_RUN_LOOKAHEAD = 4096  # records of one length checked per numpy call
_crc32c = crc32c.crc32c
_unpack_from = struct.unpack_from


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
            if n > self.max_record:
                if records:
                    yield records
                raise self.too_long(n, 0)
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

    def _over_limit(self, buf, pos: int) -> RecordFormatError:
        """The error for the length field at ``pos``, over the limit: too long where its CRC matches
        (checked here: the limit is checked before it), else a bad header."""
        n = _unpack_from("<Q", buf, pos)[0]
        if _unpack_from("<I", buf, pos + 8)[0] == self._header_crc(n):
            return self.too_long(n, pos)
        return self._bad_header(n, pos)

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
        max_record = self.max_record
        pos = 0
        while pos + 12 <= end:
            n = unpack("<Q", buf, pos)[0]
            if n > max_record:
                if single_pos or blocks_pos:
                    break  # deliver the records before it first
                raise self._over_limit(buf, pos)
            stride = n + 16
            if pos + stride > end:
                if unpack("<I", buf, pos + 8)[0] != self._header_crc(n):
                    if single_pos or blocks_pos:
                        break  # deliver the records before it first
                    raise self._bad_header(n, pos)
                self.need = stride
                break
            run = (end - pos) // stride
            # A vectorised look ahead only where the next record has the same length: with lengths
            # that vary it would cost a numpy call per record (and it once looked at the whole rest).
            if run >= 16 and unpack("<Q", buf, pos + stride)[0] == n:
                run = min(run, _RUN_LOOKAHEAD)
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
        if _native is not None:
            checked = self._scan_native(buf, end)
        else:
            checked = self._scan_numpy(buf, end)
        if checked is None:
            return [], [], 0, []
        positions, lengths, header_ok, ok = checked
        starts = positions + 12
        stops = starts + lengths
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

    def _scan_native(self, buf, end):
        """(positions, lengths, length CRC ok, both CRCs ok) of the frames in buf[:end], in C, or None."""
        room = end // 16 + 1
        positions = np.empty(room, dtype=np.int64)
        lengths = np.empty(room, dtype=np.int64)
        codes = np.empty(room, dtype=np.uint8)
        count, self.need = _native.scan(buf, end, positions, lengths, codes, self.max_record)
        if not count:
            if not self.need and end >= 12:  # a frame that does not fit and whose length CRC is wrong,
                raise self._over_limit(buf, 0)  # or a length over the limit
            return None
        codes = codes[:count]
        return positions[:count], lengths[:count], codes != 2, codes == 1

    def _scan_numpy(self, buf, end):
        """The same as :meth:`_scan_native`, with numpy and the crc32c package."""
        positions, lengths = self._scan(buf, end)
        if not len(positions):
            return None
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
            return positions, lengths, header_ok, header_ok & (masked == stored_data)
        finally:
            del arr


def _read_exact(read: Callable[[int], bytes], n: int) -> bytes:
    """``n`` bytes from ``read`` (fewer only at the end of the stream); one call, so no copy, when it can.

    No call asks for more than READ_STEP bytes or the bytes already read: ``n`` is what the stream
    claims, and ``read(n)`` (``os.read``) allocates all ``n`` at once, before any of them came.
    """
    if n <= 0:
        return b""
    first = read(min(n, READ_STEP))
    if len(first) == n or not first:
        return first
    parts = [first]
    got = len(first)
    while got < n:
        more = read(min(n - got, max(got, READ_STEP)))
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _gather_u32(arr: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Little-endian uint32 values at arbitrary (unaligned) byte offsets of a uint8 array."""
    b = arr[offsets[:, None] + np.arange(4)].astype(np.uint32)
    return b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16) | (b[:, 3] << 24)
