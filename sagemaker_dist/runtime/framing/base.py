"""What every record framer shares: the size limits of the read path, the error, the ``Framer`` base.

Framers are incremental: they are handed a buffer of bytes read from a FIFO and return where the
complete records in it start and how long they are, so that the bytes can cross into TensorFlow in
one piece (one tensor per chunk, records cut out in C++) instead of one Python object per record.
"""

from __future__ import annotations

import logging

from sagemaker_dist.contract.record_formats import MAX_RECORD_BYTES_ENV, check_corrupted_skip
from sagemaker_dist.contract.record_formats import max_record_bytes as _max_record_bytes
from sagemaker_dist.errors import DataError

log = logging.getLogger(__name__)

# TFRecords this large are read one by one straight from the stream (Framer.read_large); smaller
# ones in chunks. Measured: at 100 KB, one copy less per byte; a few syscalls per record cost
# little next to copying 32 KiB.
LARGE_RECORD_BYTES = 32 << 10
DEFAULT_CHUNK = 4 << 20  # bytes handed to TensorFlow per step: amortises its per-call cost
# The first chunks of a stream are smaller, growing 4x a chunk up to the chunk size: the first
# batch then waits for about a batch of bytes, not a whole chunk framed in Python.
FIRST_CHUNK = 64 << 10
STALL_SECONDS = 0.05  # a stream quiet this long hands over the records it has, not a full chunk
MAX_GROUP_BYTES = 64 << 20  # at most this much in one list of large records (memory in flight)
# A record's claimed length is trusted this far: buffers for a longer one grow only as its bytes come
# (never past twice what came), so a short stream that claims 1 GiB costs no more than this.
READ_STEP = 64 << 20


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

    A record longer than ``max_record_bytes`` (default ``$SAGEMAKER_DIST_MAX_RECORD_BYTES``, else
    ``contract.record_formats.MAX_RECORD_BYTES``) is an error as soon as its length is known, before
    anything is allocated for it.
    """

    format_name = ""

    def __init__(
        self,
        channel: str = "?",
        epoch: int = 0,
        max_corrupted_records_to_skip: int = 0,
        max_record_bytes: int | None = None,
    ):
        check_corrupted_skip(self.format_name, max_corrupted_records_to_skip)
        self.channel = channel
        self.epoch = epoch
        self.max_skip = max_corrupted_records_to_skip
        self.max_record = _max_record_bytes(max_record_bytes)
        self.offset = 0
        self.records = 0
        self.skipped = 0
        self.need = 0
        self._bad_in_a_row = 0

    def error(self, message: str, pos: int) -> RecordFormatError:
        return RecordFormatError(
            f"{self.format_name}: {message}", channel=self.channel, epoch=self.epoch, offset=self.offset + pos
        )

    def too_long(self, length: int, pos: int, at_least: bool = False) -> RecordFormatError:
        """The error for a record of ``length`` bytes (``at_least``: or more) at ``pos``, over the limit."""
        size = f"at least {length}" if at_least else str(length)
        return self.error(
            f"a record of {size} bytes is longer than max_record_bytes={self.max_record} (the stream is "
            f"corrupt or not {self.format_name}; if the records are this long, raise max_record_bytes= or "
            f"${MAX_RECORD_BYTES_ENV})",
            pos,
        )

    def wrong_size(self, length: int, record_bytes: int, pos: int) -> RecordFormatError:
        """The error for a record of ``length`` bytes in a stream read as records of ``record_bytes`` each."""
        return self.error(
            f"a record of {length} bytes where every record is to be record_bytes={record_bytes} long "
            "(leave record_bytes out for records of varying length)",
            pos,
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

    def warn_skipped(self) -> None:
        """At an epoch's end: how many corrupted records it skipped, if any."""
        if self.skipped:
            log.warning(
                "channel %r, epoch %d: skipped %d corrupted record(s), read %d",
                self.channel,
                self.epoch,
                self.skipped,
                self.records,
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
