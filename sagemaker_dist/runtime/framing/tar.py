"""WebDataset tar framing: a stream of tar archives read as samples, one record per sample.

A Pipe-mode channel of WebDataset shards is the shards' bytes one after another: tar members (a 512-byte
header, the data, zeros to a multiple of 512), and after each shard its end-of-archive zero blocks (two,
or more up to GNU tar's 10 KiB record). The framer reads headers (POSIX ustar, pax extended headers and
GNU long names for long names, GNU's own format, v7), groups the files into samples by key as WebDataset
does (``contract.tar_format.key_and_extension``: ``a/000017.jpg`` and ``a/000017.cls`` are one sample),
and hands out each sample as one record: the sample's bytes as they are in the stream, from its first
file's first header to the end of its last file's data. :func:`parse_sample` turns such a record into a
dict of extension -> bytes (and ``"__key__"``); the decoders of ``runtime.torch.samples`` build on it.

As WebDataset reads a shard: only regular files belong to samples; folders, links and other entries,
files whose last path component has no dot, and WebDataset's metadata files (``__name__``) are read
past; a sample ends where the next file has another key or the archive ends (the zero blocks between
shards); a second file with the same key and extension in one sample is an error.

Bounds: a header's size is known before its data is asked for, so a member or a sample longer than
``max_record_bytes`` is an error before any memory is set aside for it; metadata members (pax records,
long names) are refused past ``MAX_METADATA_BYTES``; the buffer grows only as bytes come
(``framing.stream``). Every header's checksum is checked; a header that is not valid tar is a
``RecordFormatError`` naming its byte offset in the stream.

Where a C compiler was at install, the walk of ``native/tar_core.h`` takes the usual entries in C:
``_tar_scan`` runs it over a buffer for this framer, and the batch reader (``_record_reader``, what
``RecordBatches`` reads a channel with) frames a FIFO's samples with it straight into a batch. At the
first entry it does not take (an error among them) the bytes go to the Python walk, so what is handed
out, and every error's words, are the Python walk's.
"""

from __future__ import annotations

import numpy as np

from sagemaker_dist.contract.tar_format import BLOCK, ZERO_BLOCK
from sagemaker_dist.runtime.framing.base import Framer
from sagemaker_dist.runtime.framing.tar_header import (  # noqa: F401 - re-exported
    CHK_LEN,
    CHK_START,
    MAGIC_START,
    META_TYPES,
    PAX_REFUSED,
    PREFIX_LEN,
    PREFIX_START,
    SIZE_LEN,
    SIZE_START,
    TarEntry,
    TarError,
    TooLong,
    checksum_ok,
    checksums_ok,
    field_text,
    header_number,
    pax_records,
    read_entry,
    sample_member,
)

WEBDATASET = "WebDataset"
_NATIVE_API = 2
try:  # the walk in C (setup.py builds it where it can); it leaves every unusual entry to the Python walk
    import sagemaker_dist.runtime.framing._tar_scan as _native
except ImportError:  # pragma: no cover - depends on the install
    _native = None
if _native is not None and getattr(_native, "API", 0) != _NATIVE_API:  # pragma: no cover - a stale build
    _native = None


class TarFramer(Framer):
    """WebDataset shards (tar): one record per sample, the sample's bytes as they are in the stream.

    ``frame`` walks the headers of the buffer; a sample is complete once the next file's header shows
    another key, or the archive ends (zero blocks), or the stream ends (``finish``). The samples known
    complete before a bad header are handed out first (not the one the bad header follows: it could
    have been a file of it); the error comes when the bad header is the next thing to read.
    """

    format_name = WEBDATASET

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._cut_at = 0  # where the entry the last walk found cut short starts

    def frame(self, buf, end):
        if _native is not None:
            room = end // BLOCK + 1
            starts = np.empty(room, dtype=np.int64)
            lengths = np.empty(room, dtype=np.int64)
            count, consumed, need, cut, status = _native.scan(buf, end, starts, lengths, self.max_record)
            if not status:
                self.need, self._cut_at = need, cut
                return starts[:count], lengths[:count], consumed, []
        with memoryview(buf) as view:  # the Python walk: every entry, and the errors' words
            starts, lengths, consumed, self.need = self._walk(view, end, at_end=False)
        return starts, lengths, consumed, []

    def finish(self, leftover: bytes) -> list[bytes]:
        """The samples of the stream's last bytes: the last sample ends with the stream. An entry cut
        short is an error naming where it starts."""
        records: list[bytes] = []
        base, offset = 0, self.offset
        try:
            while base < len(leftover):
                self.offset = offset + base
                with memoryview(leftover) as whole, whole[base:] as part:
                    starts, lengths, consumed, need = self._walk(part, len(part), at_end=True)
                records += [leftover[base + s : base + s + n] for s, n in zip(starts, lengths)]
                if need:
                    self.need = need
                    cut = len(leftover) - base - self._cut_at
                    raise self.error(
                        f"stream ended inside a tar entry: {cut} byte(s) of it (the writer stopped mid-file, "
                        f"or an object is not a whole tar; {self.records + len(records)} complete sample(s) "
                        "were read)",
                        self._cut_at,
                    )
                if not consumed:  # pragma: no cover - every walk at the end consumes or raises
                    break
                base += consumed
        finally:
            self.offset = offset
        return records

    def _walk(self, buf, end: int, at_end: bool):
        """``(starts, lengths, consumed, need)`` of the complete samples in ``buf[:end]``; ``need`` is the
        buffer size (from ``consumed``) that the next step needs, 0 where nothing is cut short."""
        starts: list[int] = []
        lengths: list[int] = []
        headers: list[bytes] = []  # the walked entries' own headers, checked at the end in one numpy call
        positions: list[int] = []
        max_size = self.max_record
        pos = consumed = need = 0
        open_start, open_end, open_key = -1, 0, None
        open_exts: set[str] = set()
        try:
            while pos < end:
                entry = read_entry(buf, pos, end, max_size)
                if isinstance(entry, int):  # cut short by the buffer's end
                    need, self._cut_at = entry, pos
                    break
                if entry is None:  # a zero block: the archive ended, and so did its open sample
                    if open_start >= 0:
                        starts.append(open_start)
                        lengths.append(open_end - open_start)
                        open_start, open_key = -1, None
                    pos += BLOCK
                    consumed = pos
                    continue
                headers.append(entry.header)
                positions.append(entry.data - BLOCK)
                if entry.end > end:  # its data is not all here yet
                    need, self._cut_at = entry.end + BLOCK, entry.start
                    break
                member = sample_member(entry.name) if entry.name is not None else None
                if member is not None:
                    key, ext = member
                    if open_start < 0 or key != open_key:
                        if open_start >= 0:
                            starts.append(open_start)
                            lengths.append(open_end - open_start)
                        open_start, open_key, open_exts = entry.start, key, set()
                        consumed = open_start
                    elif ext in open_exts:
                        raise TarError(
                            f"sample {key!r} has two files with extension {ext!r} ({entry.name!r} again)",
                            entry.start,
                        )
                    open_exts.add(ext)
                    open_end = entry.end
                    if open_end - open_start > max_size:
                        raise TooLong(open_end - open_start, open_start)
                elif open_start < 0:
                    consumed = entry.end  # read past, between samples
                pos = entry.end
        except TarError as exc:
            return self._bad(starts, lengths, headers, positions, buf, exc)
        bad = checksums_ok(headers, positions)
        if bad >= 0:
            return self._bad(starts, lengths, headers, positions, buf, None, positions[bad])
        if open_start >= 0:
            if at_end and not need:
                starts.append(open_start)
                lengths.append(open_end - open_start)
                consumed = end
            else:
                if not need:
                    self._cut_at = open_end
                consumed = open_start
                need = max(need, open_end + BLOCK)
        elif not need:
            consumed = pos
        return starts, lengths, consumed, need - consumed if need else 0

    def _bad(self, starts, lengths, headers, positions, buf, exc: TarError | None, at: int = 0):
        """A bad entry (``exc``, or a wrong checksum at ``at``): the samples wholly before it are handed out
        first (the error comes on the next call, when it is the first thing to read); else the error,
        naming its stream offset. A wrong checksum in a header before it is the error instead: that
        header's size, which led here, could not be trusted."""
        if exc is not None:
            at = exc.offset
        before = [i for i, p in enumerate(positions) if p < at]
        bad = checksums_ok([headers[i] for i in before], [positions[i] for i in before])
        if bad >= 0:
            at, exc = positions[before[bad]], None
        elif exc is not None and not isinstance(exc, TooLong):  # a field of the header at `at` itself
            header = bytes(buf[at : at + BLOCK])
            if len(header) == BLOCK and header != ZERO_BLOCK:
                try:
                    checksum_ok(header, at)
                except TarError as checked:
                    exc = checked
        kept = [(s, n) for s, n in zip(starts, lengths) if s + n < at]  # not one the entry at `at` closed
        if kept:
            return [s for s, _ in kept], [n for _, n in kept], kept[-1][0] + kept[-1][1], 0
        if exc is None:
            try:
                checksum_ok(bytes(buf[at : at + BLOCK]), at)
            except TarError as checked:
                exc = checked
            else:  # pragma: no cover - checksums_ok and checksum_ok agree
                exc = TarError("bad header", at)
        if isinstance(exc, TooLong):
            raise self.too_long(exc.size, at)
        raise self.error(exc.reason, at)


def parse_sample(record, *, keep_key: bool = True) -> dict:
    """One sample record (``TarFramer``'s: the sample's tar members) as ``{"__key__": key, ext: bytes}``.

    Raises ``TarError`` (naming the byte offset in the record) where the bytes are not one sample's tar
    members: a bad header, files of two keys, a repeated extension, a member cut short.
    """
    if _native is not None:  # the usual record in C; anything else (an error too) here, below
        found = _native.sample(record)
        if found is not None:
            raw_key, members = found
            if isinstance(record, bytes):
                out = {ext.decode("ascii"): record[at : at + n] for ext, at, n in members}
            else:
                with memoryview(record) as whole, whole.cast("B") as view:
                    out = {ext.decode("ascii"): view[at : at + n].tobytes() for ext, at, n in members}
            if keep_key:
                out["__key__"] = raw_key.decode("utf-8", "surrogateescape")
            return out
    with memoryview(record) as whole, whole.cast("B") as view:
        end = len(view)
        out: dict = {}
        key = None
        pos = 0
        while pos < end:
            try:
                entry = read_entry(view, pos, end, end - pos)
            except TooLong as exc:
                raise TarError(f"the record ends inside a member of {exc.size} bytes", exc.offset) from None
            if isinstance(entry, int):
                raise TarError(f"the record ends inside a tar header ({end - pos} byte(s) of it)", pos)
            if entry is None:
                raise TarError("the record holds an end-of-archive block; a sample record has none", pos)
            checksum_ok(entry.header, entry.data - BLOCK)
            if entry.end > end:
                raise TarError(f"the record ends inside a member of {entry.size} bytes", entry.start)
            member = sample_member(entry.name) if entry.name is not None else None
            if member is not None:
                k, ext = member
                if key is None:
                    key = k
                elif k != key:
                    raise TarError(f"the record holds files of two samples ({key!r}, {k!r})", entry.start)
                if ext in out:
                    raise TarError(f"sample {key!r} has two files with extension {ext!r}", entry.start)
                out[ext] = view[entry.data : entry.data + entry.size].tobytes()
            pos = entry.end
    if key is None:
        raise TarError("the record holds no file of a sample", 0)
    if keep_key:
        out["__key__"] = key
    return out
