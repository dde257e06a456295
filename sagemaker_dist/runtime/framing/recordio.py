"""SageMaker/MXNet RecordIO framing (the stream of a channel whose RecordWrapperType is RecordIO)."""

from __future__ import annotations

import struct

from sagemaker_dist.contract.record_formats import (
    RECORDIO_END,
    RECORDIO_LENGTH_BITS,
    RECORDIO_LENGTH_MASK,
    RECORDIO_MAGIC,
    RECORDIO_START,
    RECORDIO_WHOLE,
)
from sagemaker_dist.runtime.framing.base import Framer, RecordFormatError

_unpack_from = struct.unpack_from


class NotRecordIOError(RecordFormatError):
    """A frame without RecordIO's magic number: the stream is not RecordIO (or is corrupt there).

    PipeModeDataset raises it as ``tf.errors.InternalError``, the class AWS's reader raises for it.
    """


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
        pos = 0
        self.need = 0
        while pos + 8 <= end:
            parts, scan, complete, bad = self._record_parts(buf, pos, end)
            if bad is not None:
                if not starts:
                    raise bad
                self.need = 0
                break
            if not complete:
                if not self.need:
                    self.need = scan + 8 - pos
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

    def bad_magic(self, magic: int, pos: int) -> NotRecordIOError:
        return NotRecordIOError(
            f"{self.format_name}: bad magic number 0x{magic:08X} (expected 0x{RECORDIO_MAGIC:08X}); "
            "the stream is corrupt or not RecordIO (check record_format and RecordWrapperType)",
            channel=self.channel,
            epoch=self.epoch,
            offset=self.offset + pos,
        )

    def bad_flag(self, flag: int, expect_first: bool, pos: int) -> RecordFormatError:
        return self.error(
            f"multipart flag {flag} out of sequence "
            f"({'a record must start with flag 0 or 1' if expect_first else 'expected 2 or 3'})",
            pos,
        )

    def _record_parts(self, buf, record_start: int, end: int):
        """The parts of the record at ``record_start``: ``(parts, scan, complete, bad)``.

        ``parts`` are ``(payload position, length)``, ``scan`` is where the next record starts,
        ``complete`` says whether its last part is in ``buf[:end]`` (if not, ``self.need`` may say
        how much it needs) and ``bad`` is the error for a bad frame, or None.
        """
        unpack = _unpack_from
        parts = []
        size = 0  # the parts' payloads so far
        scan = record_start
        while scan + 8 <= end:
            magic, word = unpack("<II", buf, scan)
            if magic != RECORDIO_MAGIC:
                return parts, scan, False, self.bad_magic(magic, scan)
            flag = word >> RECORDIO_LENGTH_BITS
            n = word & RECORDIO_LENGTH_MASK
            expect_first = not parts
            if flag > RECORDIO_END or (flag in (RECORDIO_WHOLE, RECORDIO_START)) != expect_first:
                return parts, scan, False, self.bad_flag(flag, expect_first, scan)
            size += n
            if size > self.max_record:  # the parts so far: the record is at least this long
                at_least = bool(parts) or flag != RECORDIO_WHOLE
                return parts, scan, False, self.too_long(size, record_start, at_least)
            payload = scan + 8
            padded = payload + n + (-n % 4)
            if padded > end:
                self.need = padded - record_start
                break
            parts.append((payload, n))
            scan = padded
            if flag in (RECORDIO_WHOLE, RECORDIO_END):
                return parts, scan, True, None
        return parts, scan, False, None
