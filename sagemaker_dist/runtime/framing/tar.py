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

from typing import NamedTuple

import numpy as np

from sagemaker_dist.contract.tar_format import (
    BLOCK,
    CHKSUM,
    GNU_LONGLINK,
    GNU_LONGNAME,
    MAGIC,
    MAX_METADATA_BYTES,
    META_NAME,
    PAX_GLOBAL,
    PAX_HEADER,
    PAX_PATH,
    PAX_SIZE,
    PREFIX,
    REFUSED_TYPES,
    REGULAR_TYPES,
    SIZE,
    TYPEFLAG,
    USTAR_MAGIC,
    ZERO_BLOCK,
    key_and_extension,
)
from sagemaker_dist.errors import DataError
from sagemaker_dist.runtime.framing.base import Framer

WEBDATASET = "WebDataset"
_NATIVE_API = 2
try:  # the walk in C (setup.py builds it where it can); it leaves every unusual entry to the Python walk
    import sagemaker_dist.runtime.framing._tar_scan as _native
except ImportError:  # pragma: no cover - depends on the install
    _native = None
if _native is not None and getattr(_native, "API", 0) != _NATIVE_API:  # pragma: no cover - a stale build
    _native = None
_META_TYPES = frozenset((GNU_LONGNAME, GNU_LONGLINK, PAX_HEADER, PAX_GLOBAL))
_CHK_START, _CHK_LEN = CHKSUM
_SIZE_START, _SIZE_LEN = SIZE
_PREFIX_START, _PREFIX_LEN = PREFIX
_MAGIC_START = MAGIC[0]
_PAX_REFUSED = ("GNU.sparse.",)


class TarError(DataError):
    """Bytes that are not a valid tar sample; ``offset`` is where in them (a record, a buffer)."""

    def __init__(self, message: str, offset: int):
        super().__init__(f"byte offset {offset}: {message}")
        self.reason = message
        self.offset = offset


class _TooLong(TarError):
    """A member (or a sample) longer than the limit."""

    def __init__(self, size: int, at: int):
        super().__init__(f"a member of {size} bytes", at)
        self.size = size


class _Entry(NamedTuple):
    """One tar entry: ``start`` its first header (a pax or long-name header before its own included),
    ``data`` where its data starts (its own header is the block before), ``size`` its length, ``end``
    after its padding; ``name`` its path for a regular file, None for anything else (a folder, a link,
    ...); ``header`` its own header's bytes."""

    start: int
    data: int
    size: int
    end: int
    name: str | None
    header: bytes


def _field_text(raw: bytes) -> bytes:
    """A header's text field: up to its first NUL."""
    cut = raw.find(b"\0")
    return raw if cut < 0 else raw[:cut]


def _number(raw: bytes, what: str, at: int) -> int:
    """A numeric header field: octal digits (spaces and NULs around them), or GNU's base-256 (top bit)."""
    if raw[0] & 0x80:
        if raw[0] == 0xFF:
            raise TarError(f"the header's {what} field is negative (base-256)", at)
        return int.from_bytes(bytes([raw[0] & 0x7F]) + raw[1:], "big")
    text = _field_text(raw).strip(b" ")
    if not text:
        return 0
    if text.strip(b"01234567"):  # only octal digits (int() would take signs, "_" and other spaces too)
        raise TarError(f"the header's {what} field {text[:16]!r} is not an octal number", at)
    return int(text, 8)


def _pax_records(data: bytes, at: int) -> dict[str, str]:
    """The records of a pax extended header, ``"<length> <key>=<value>\\n"`` each."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if data[pos] == 0:  # zeros after the records (some writers pad the data)
            if data[pos:].strip(b"\0"):
                raise TarError("the pax header has bytes after a NUL", at)
            break
        space = data.find(b" ", pos, pos + 24)
        digits = data[pos:space] if space > pos else b""
        if not digits.isdigit():
            raise TarError(f"a pax record at byte {pos} of its header does not start with a length", at)
        length = int(digits)
        record = data[pos : pos + length]
        if length <= len(digits) + 1 or len(record) < length or not record.endswith(b"\n"):
            raise TarError(f"the pax record at byte {pos} of its header has a wrong length ({length})", at)
        key, eq, value = record[len(digits) + 1 : -1].partition(b"=")
        if not eq:
            raise TarError(f"the pax record at byte {pos} of its header has no '='", at)
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def _checksum_ok(header: bytes, at: int) -> None:
    """Raise unless the header's stored checksum is the sum of its bytes (unsigned, or signed as some old
    writers summed them), the checksum field read as spaces."""
    try:
        stored: int | str = _number(header[_CHK_START : _CHK_START + _CHK_LEN], "checksum", at)
    except TarError:
        stored = "not a number"
    total = sum(header) - sum(header[_CHK_START : _CHK_START + _CHK_LEN]) + 32 * _CHK_LEN
    if stored != total and stored != total - 256 * sum(1 for b in header if b >= 128):
        raise TarError(
            f"header checksum mismatch (stored {stored}, computed {total}); the stream is corrupt or not "
            "tar (check record_format)",
            at,
        )


def _checksums_ok(headers: list[bytes], positions: list[int]) -> int:
    """The index of the first header whose checksum is wrong, or -1: one numpy sum for all of them."""
    if not headers:
        return -1
    blocks = np.frombuffer(b"".join(headers), dtype=np.uint8).reshape(len(headers), BLOCK)
    total = blocks.sum(axis=1, dtype=np.int64) - blocks[:, _CHK_START : _CHK_START + _CHK_LEN].sum(
        axis=1, dtype=np.int64
    )
    total += 32 * _CHK_LEN
    for i, header in enumerate(headers):
        raw = header[_CHK_START : _CHK_START + _CHK_LEN]
        text = _field_text(raw).strip(b" ")
        stored = int(text, 8) if text and not raw[0] & 0x80 and not text.strip(b"01234567") else -1
        if stored != total[i]:
            try:
                _checksum_ok(header, positions[i])  # the signed sum, and the named error
            except TarError:
                return i
    return -1


def read_entry(buf, pos: int, end: int, max_size: int) -> _Entry | int | None:
    """The tar entry whose first header is at ``pos`` in ``buf[:end]``: an ``_Entry``; None for a zero
    block (an end-of-archive marker, 512 bytes); or, where ``buf[:end]`` ends before the entry does, the
    buffer end it needs (an int). A member longer than ``max_size`` is a TarError, before its data is
    read; so is a header that is not tar. Checksums are not checked here (see ``_checksums_ok``), except
    those of metadata headers, whose data is read here."""
    start = pos
    long_name: str | None = None
    pax: dict[str, str] = {}
    while True:
        if pos + BLOCK > end:
            return pos + BLOCK
        header = bytes(buf[pos : pos + BLOCK])
        if header == ZERO_BLOCK:
            if pos != start:
                raise TarError("a pax or long-name header is followed by the end of the archive", pos)
            return None
        kind = header[TYPEFLAG]
        size = _number(header[_SIZE_START : _SIZE_START + _SIZE_LEN], "size", pos)
        if PAX_SIZE in pax and kind not in _META_TYPES:
            try:
                size = int(pax[PAX_SIZE])
            except ValueError:
                raise TarError(f"the pax size record {pax[PAX_SIZE][:32]!r} is not a number", pos) from None
        data = pos + BLOCK
        stop = data + size + (-size % BLOCK)
        if kind in _META_TYPES:
            _checksum_ok(header, pos)  # its data is read now: trust its size only once it is a header
            if size > MAX_METADATA_BYTES:
                raise TarError(
                    f"a {chr(kind)!r} metadata member of {size} bytes (over {MAX_METADATA_BYTES}); the "
                    "stream is corrupt or not a WebDataset shard",
                    pos,
                )
            if stop > end:
                return stop
            body = bytes(buf[data : data + size])
            if kind == GNU_LONGNAME:
                long_name = _field_text(body).decode("utf-8", "surrogateescape")
            elif kind == PAX_HEADER:
                pax.update(_pax_records(body, pos))
                refused = [k for k in pax if k.startswith(_PAX_REFUSED)]
                if refused:
                    raise TarError(f"a sparse file (pax {refused[0]}); shards hold whole files only", pos)
            elif kind == PAX_GLOBAL:
                glob = _pax_records(body, pos)
                if PAX_PATH in glob or PAX_SIZE in glob:
                    raise TarError("a pax global header sets a path or size for every member after it", pos)
            pos = stop
            continue
        if kind in REFUSED_TYPES:
            raise TarError(f"{REFUSED_TYPES[kind]} (type {chr(kind)!r}); shards hold whole files only", pos)
        if size > max_size:  # whatever its type: its bytes would have to be read past, or held
            _checksum_ok(header, pos)  # (a size is only news once the header is one)
            raise _TooLong(size, pos)
        if kind not in REGULAR_TYPES:  # a folder, a link, a device, an unknown type: read past
            return _Entry(start, data, size, stop, None, header)
        if PAX_PATH in pax:
            name = pax[PAX_PATH]
        elif long_name is not None:
            name = long_name
        else:
            raw = _field_text(header[:100])
            if header[_MAGIC_START : _MAGIC_START + 8] == USTAR_MAGIC and header[_PREFIX_START] != 0:
                raw = _field_text(header[_PREFIX_START : _PREFIX_START + _PREFIX_LEN]) + b"/" + raw
            name = raw.decode("utf-8", "surrogateescape")
        return _Entry(start, data, size, stop, name, header)


def sample_member(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a regular file that belongs to a sample, None for one WebDataset skips."""
    if META_NAME.match(name):
        return None
    return key_and_extension(name)


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
                        raise _TooLong(open_end - open_start, open_start)
                elif open_start < 0:
                    consumed = entry.end  # read past, between samples
                pos = entry.end
        except TarError as exc:
            return self._bad(starts, lengths, headers, positions, buf, exc)
        bad = _checksums_ok(headers, positions)
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
        bad = _checksums_ok([headers[i] for i in before], [positions[i] for i in before])
        if bad >= 0:
            at, exc = positions[before[bad]], None
        elif exc is not None and not isinstance(exc, _TooLong):  # a field of the header at `at` itself
            header = bytes(buf[at : at + BLOCK])
            if len(header) == BLOCK and header != ZERO_BLOCK:
                try:
                    _checksum_ok(header, at)
                except TarError as checked:
                    exc = checked
        kept = [(s, n) for s, n in zip(starts, lengths) if s + n < at]  # not one the entry at `at` closed
        if kept:
            return [s for s, _ in kept], [n for _, n in kept], kept[-1][0] + kept[-1][1], 0
        if exc is None:
            try:
                _checksum_ok(bytes(buf[at : at + BLOCK]), at)
            except TarError as checked:
                exc = checked
            else:  # pragma: no cover - _checksums_ok and _checksum_ok agree
                exc = TarError("bad header", at)
        if isinstance(exc, _TooLong):
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
            except _TooLong as exc:
                raise TarError(f"the record ends inside a member of {exc.size} bytes", exc.offset) from None
            if isinstance(entry, int):
                raise TarError(f"the record ends inside a tar header ({end - pos} byte(s) of it)", pos)
            if entry is None:
                raise TarError("the record holds an end-of-archive block; a sample record has none", pos)
            _checksum_ok(entry.header, entry.data - BLOCK)
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
