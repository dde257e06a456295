"""The tar format of WebDataset shards, written once: header layout, limits, and the encoder.

A WebDataset shard is a POSIX tar whose files are grouped into samples by key: the name up to the first
dot of its last path component (``train/000017.jpg`` and ``train/000017.cls`` are one sample, key
``train/000017``, with the extensions ``jpg`` and ``cls``). Writers (``sagemaker-dist pack``,
``WebDatasetWriter``, tests and benchmarks) encode members with :func:`tar_member`; the reader
(``runtime.framing.tar``) parses headers with the layout and limits below. Stdlib only.

A member is a 512-byte header (name, octal size, checksum, type, the ``ustar`` magic), its data, and
zeros up to the next multiple of 512. A name that does not fit the header's 100 bytes (or a ``prefix``
of 155 and a name of 100), or that is not ASCII, gets a POSIX pax extended header before it (type ``x``,
a ``path=`` record), as GNU tar's ``--format=pax`` and Python's ``tarfile`` write it. An archive ends
with two zero blocks; GNU tar pads it further with zeros to a multiple of 10240 bytes.
"""

from __future__ import annotations

import functools
import re

BLOCK = 512
END_OF_ARCHIVE = bytes(2 * BLOCK)
ZERO_BLOCK = bytes(BLOCK)

# (offset, length) of the header fields the reader and writer use (POSIX ustar; GNU's old format keeps
# name, size, checksum, type and magic at the same places, and puts other fields where ustar has prefix)
NAME = (0, 100)
MODE = (100, 8)
UID = (108, 8)
GID = (116, 8)
SIZE = (124, 12)
MTIME = (136, 12)
CHKSUM = (148, 8)
TYPEFLAG = 156
LINKNAME = (157, 100)
MAGIC = (257, 8)  # magic (6) and version (2) read together
UNAME = (265, 32)
GNAME = (297, 32)
PREFIX = (345, 155)

USTAR_MAGIC = b"ustar\x0000"  # POSIX: "ustar\0" then version "00"
GNU_MAGIC = b"ustar  \x00"  # GNU tar's own format: "ustar " then version " \0"

# Type flags. Regular files hold a sample's data; the others are read past.
REGULAR_TYPES = frozenset(b"0\x007")  # '0', the old NUL, and '7' (contiguous file, read as regular)
GNU_LONGNAME = ord("L")  # the data is the next member's name
GNU_LONGLINK = ord("K")  # the data is the next member's link target
PAX_HEADER = ord("x")  # pax records for the next member: "path", "size", ...
PAX_GLOBAL = ord("g")  # pax records for every member after it
# Types whose data is not a file's but the archive's own (sparse maps, multi-volume continuations,
# volume labels): a WebDataset shard has none, and reading past them would misread their data.
REFUSED_TYPES = {ord("S"): "a GNU sparse file", ord("M"): "a GNU multi-volume continuation"}

# The largest metadata member (long name, pax records) read into memory: names are at most a few KiB;
# the bound is what a crafted header can make the reader hold for one.
MAX_METADATA_BYTES = 1 << 20
MAX_OCTAL_SIZE = 8**11 - 1  # what an 11-digit octal size field holds (8 GiB - 1)

PAX_PATH = "path"
PAX_SIZE = "size"
# WebDataset skips files whose name starts with __ and ends with __ (its metadata), and names such as
# __meta__/x in a folder of that form
META_NAME = re.compile(r"__[^/]*__($|/)")
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def key_and_extension(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name as WebDataset splits it: the key is the name up to the first
    dot of its last path component, the extension the rest (lower-cased, as WebDataset does by default);
    None where the last component has no dot (such a file belongs to no sample). WebDataset's own rule,
    to the letter: a last component that starts with its dot (``a/.x``) splits before the slash."""
    match = _KEY_EXT.match(name)
    if match is None:
        return None
    return match.group(1), match.group(2).lower()


def padding(size: int) -> int:
    """The zeros after ``size`` bytes of data, to the next multiple of 512."""
    return -size % BLOCK


def member_bytes(name: str, size: int) -> int:
    """The bytes :func:`tar_member` writes for a member of ``size`` bytes named ``name``, data included."""
    if 0 < len(name) <= NAME[1] and name.isascii() and "\0" not in name and 0 <= size <= MAX_OCTAL_SIZE:
        return BLOCK + size + padding(size)  # one ustar header
    return len(tar_header(name, size)) + size + padding(size)


def checksum(header: bytes | bytearray | memoryview) -> int:
    """A header's checksum: the sum of its bytes with the checksum field read as spaces."""
    start, length = CHKSUM
    return sum(header[:start]) + 32 * length + sum(header[start + length : BLOCK])


def _octal(value: int, length: int) -> bytes:
    """``value`` as ``length - 1`` octal digits and a NUL (the ustar numeric fields)."""
    return b"%0*o\x00" % (length - 1, value)


def _pax_record(key: str, value: str) -> bytes:
    """One pax record, ``"<length> <key>=<value>\\n"``, the length counting its own digits."""
    body = f" {key}={value}\n".encode()
    length = len(body) + 1
    while len(str(length)) + len(body) != length:
        length = len(str(length)) + len(body)
    return str(length).encode() + body


def _split_ustar(name: bytes) -> tuple[bytes, bytes] | None:
    """``(prefix, name)`` fields for a name that fits ustar's two fields, else None."""
    if len(name) <= NAME[1]:
        return b"", name
    for cut in range(min(len(name) - 1, PREFIX[1]), 0, -1):
        if name[cut : cut + 1] == b"/" and len(name) - cut - 1 <= NAME[1] and cut <= PREFIX[1]:
            return name[:cut], name[cut + 1 :]
    return None


def _header_block(name: bytes, prefix: bytes, size: int, mtime: int, typeflag: bytes, mode: int) -> bytes:
    block = bytearray(BLOCK)
    block[0 : len(name)] = name
    block[MODE[0] : MODE[0] + 8] = _octal(mode, 8)
    block[UID[0] : UID[0] + 8] = _octal(0, 8)
    block[GID[0] : GID[0] + 8] = _octal(0, 8)
    block[SIZE[0] : SIZE[0] + 12] = _octal(size, 12)
    block[MTIME[0] : MTIME[0] + 12] = _octal(mtime, 12)
    block[TYPEFLAG] = typeflag[0]
    block[MAGIC[0] : MAGIC[0] + 8] = USTAR_MAGIC
    block[PREFIX[0] : PREFIX[0] + len(prefix)] = prefix
    block[CHKSUM[0] : CHKSUM[0] + 8] = b"%06o\x00 " % checksum(block)
    return bytes(block)


@functools.lru_cache(maxsize=16)
def _template(mtime: int, mode: int) -> tuple[bytes, int]:
    """A regular file's header with no name and size 0, and the checksum of all but those two fields."""
    block = _header_block(b"", b"", 0, mtime, b"0", mode)
    size_start, size_length = SIZE
    return block, checksum(block) - sum(block[size_start : size_start + size_length])


def tar_header(name: str, size: int, mtime: int = 0, mode: int = 0o644) -> bytes:
    """The header block(s) of a regular file: a ustar header, after a pax header where the name is not
    ASCII or does not fit ustar's fields, or the size is over 8 GiB - 1."""
    if 0 < len(name) <= NAME[1] and name.isascii() and "\0" not in name and 0 <= size <= MAX_OCTAL_SIZE:
        template, base = _template(max(0, min(int(mtime), 8**11 - 1)), mode)  # the usual member: fast
        raw = name.encode("ascii")
        size_field = b"%011o\x00" % size
        total = base + sum(raw) + sum(size_field)
        return b"".join(
            (raw, bytes(NAME[1] - len(raw)), template[NAME[1] : SIZE[0]], size_field,
             template[SIZE[0] + SIZE[1] : CHKSUM[0]], b"%06o\x00 " % total, template[CHKSUM[0] + CHKSUM[1] :])
        )  # fmt: skip
    if not name or "\0" in name:
        raise ValueError(f"a tar member name must be non-empty, without NUL bytes: {name!r}")
    if size < 0:
        raise ValueError(f"a tar member's size cannot be negative ({size})")
    mtime = max(0, min(int(mtime), 8**11 - 1))
    raw = name.encode("utf-8", "surrogateescape")
    split = _split_ustar(raw) if raw.isascii() else None
    records = b""
    if split is None:
        records += _pax_record(PAX_PATH, name)
        split = (b"", raw.decode("ascii", "replace").encode("ascii", "replace")[: NAME[1]])
    if size > MAX_OCTAL_SIZE:
        records += _pax_record(PAX_SIZE, str(size))
    prefix, short = split
    # a size the octal field cannot hold is the pax record's alone (the field says 0, as GNU tar writes)
    header = _header_block(short, prefix, 0 if size > MAX_OCTAL_SIZE else size, mtime, b"0", mode)
    if not records:
        return header
    pax_name = b"PaxHeaders/" + short[: NAME[1] - len(b"PaxHeaders/")]
    pax = _header_block(pax_name, b"", len(records), mtime, b"x", 0o644)
    return pax + records + bytes(padding(len(records))) + header


def tar_member(name: str, data: bytes | bytearray | memoryview, mtime: int = 0, mode: int = 0o644) -> bytes:
    """One regular file as tar bytes: header(s), data, zeros to a multiple of 512."""
    return tar_header(name, len(data), mtime, mode) + bytes(data) + bytes(padding(len(data)))
