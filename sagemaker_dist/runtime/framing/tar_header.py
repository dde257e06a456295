"""WebDataset tar headers read one entry at a time: the header fields (octal or base-256 numbers,
names), pax extended headers and GNU long names, checksums, and ``read_entry``, the walk step that
``framing.tar``'s framer and ``parse_sample`` build on; ``TarError`` is the error of both."""

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

META_TYPES = frozenset((GNU_LONGNAME, GNU_LONGLINK, PAX_HEADER, PAX_GLOBAL))
CHK_START, CHK_LEN = CHKSUM
SIZE_START, SIZE_LEN = SIZE
PREFIX_START, PREFIX_LEN = PREFIX
MAGIC_START = MAGIC[0]
PAX_REFUSED = ("GNU.sparse.",)


class TarError(DataError):
    """Bytes that are not a valid tar sample; ``offset`` is where in them (a record, a buffer)."""

    def __init__(self, message: str, offset: int):
        super().__init__(f"byte offset {offset}: {message}")
        self.reason = message
        self.offset = offset


class TooLong(TarError):
    """A member (or a sample) longer than the limit."""

    def __init__(self, size: int, at: int):
        super().__init__(f"a member of {size} bytes", at)
        self.size = size


class TarEntry(NamedTuple):
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


def field_text(raw: bytes) -> bytes:
    """A header's text field: up to its first NUL."""
    cut = raw.find(b"\0")
    return raw if cut < 0 else raw[:cut]


def header_number(raw: bytes, what: str, at: int) -> int:
    """A numeric header field: octal digits (spaces and NULs around them), or GNU's base-256 (top bit)."""
    if raw[0] & 0x80:
        if raw[0] == 0xFF:
            raise TarError(f"the header's {what} field is negative (base-256)", at)
        return int.from_bytes(bytes([raw[0] & 0x7F]) + raw[1:], "big")
    text = field_text(raw).strip(b" ")
    if not text:
        return 0
    if text.strip(b"01234567"):  # only octal digits (int() would take signs, "_" and other spaces too)
        raise TarError(f"the header's {what} field {text[:16]!r} is not an octal number", at)
    return int(text, 8)


def pax_records(data: bytes, at: int) -> dict[str, str]:
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


def checksum_ok(header: bytes, at: int) -> None:
    """Raise unless the header's stored checksum is the sum of its bytes (unsigned, or signed as some old
    writers summed them), the checksum field read as spaces."""
    try:
        stored: int | str = header_number(header[CHK_START : CHK_START + CHK_LEN], "checksum", at)
    except TarError:
        stored = "not a number"
    total = sum(header) - sum(header[CHK_START : CHK_START + CHK_LEN]) + 32 * CHK_LEN
    if stored != total and stored != total - 256 * sum(1 for b in header if b >= 128):
        raise TarError(
            f"header checksum mismatch (stored {stored}, computed {total}); the stream is corrupt or not "
            "tar (check record_format)",
            at,
        )


def checksums_ok(headers: list[bytes], positions: list[int]) -> int:
    """The index of the first header whose checksum is wrong, or -1: one numpy sum for all of them."""
    if not headers:
        return -1
    blocks = np.frombuffer(b"".join(headers), dtype=np.uint8).reshape(len(headers), BLOCK)
    total = blocks.sum(axis=1, dtype=np.int64) - blocks[:, CHK_START : CHK_START + CHK_LEN].sum(
        axis=1, dtype=np.int64
    )
    total += 32 * CHK_LEN
    for i, header in enumerate(headers):
        raw = header[CHK_START : CHK_START + CHK_LEN]
        text = field_text(raw).strip(b" ")
        stored = int(text, 8) if text and not raw[0] & 0x80 and not text.strip(b"01234567") else -1
        if stored != total[i]:
            try:
                checksum_ok(header, positions[i])  # the signed sum, and the named error
            except TarError:
                return i
    return -1


def read_entry(buf, pos: int, end: int, max_size: int) -> TarEntry | int | None:
    """The tar entry whose first header is at ``pos`` in ``buf[:end]``: an ``TarEntry``; None for a zero
    block (an end-of-archive marker, 512 bytes); or, where ``buf[:end]`` ends before the entry does, the
    buffer end it needs (an int). A member longer than ``max_size`` is a TarError, before its data is
    read; so is a header that is not tar. Checksums are not checked here (see ``checksums_ok``), except
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
        size = header_number(header[SIZE_START : SIZE_START + SIZE_LEN], "size", pos)
        if PAX_SIZE in pax and kind not in META_TYPES:
            try:
                size = int(pax[PAX_SIZE])
            except ValueError:
                raise TarError(f"the pax size record {pax[PAX_SIZE][:32]!r} is not a number", pos) from None
        data = pos + BLOCK
        stop = data + size + (-size % BLOCK)
        if kind in META_TYPES:
            checksum_ok(header, pos)  # its data is read now: trust its size only once it is a header
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
                long_name = field_text(body).decode("utf-8", "surrogateescape")
            elif kind == PAX_HEADER:
                pax.update(pax_records(body, pos))
                refused = [k for k in pax if k.startswith(PAX_REFUSED)]
                if refused:
                    raise TarError(f"a sparse file (pax {refused[0]}); shards hold whole files only", pos)
            elif kind == PAX_GLOBAL:
                glob = pax_records(body, pos)
                if PAX_PATH in glob or PAX_SIZE in glob:
                    raise TarError("a pax global header sets a path or size for every member after it", pos)
            pos = stop
            continue
        if kind in REFUSED_TYPES:
            raise TarError(f"{REFUSED_TYPES[kind]} (type {chr(kind)!r}); shards hold whole files only", pos)
        if size > max_size:  # whatever its type: its bytes would have to be read past, or held
            checksum_ok(header, pos)  # (a size is only news once the header is one)
            raise TooLong(size, pos)
        if kind not in REGULAR_TYPES:  # a folder, a link, a device, an unknown type: read past
            return TarEntry(start, data, size, stop, None, header)
        if PAX_PATH in pax:
            name = pax[PAX_PATH]
        elif long_name is not None:
            name = long_name
        else:
            raw = field_text(header[:100])
            if header[MAGIC_START : MAGIC_START + 8] == USTAR_MAGIC and header[PREFIX_START] != 0:
                raw = field_text(header[PREFIX_START : PREFIX_START + PREFIX_LEN]) + b"/" + raw
            name = raw.decode("utf-8", "surrogateescape")
        return TarEntry(start, data, size, stop, name, header)


def sample_member(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a regular file that belongs to a sample, None for one WebDataset skips."""
    if META_NAME.match(name):
        return None
    return key_and_extension(name)
