"""Crafted tar streams for the tar readers' fuzz tests (the Python framer's and the compiled reader's):
a small WebDataset stream (a pax header of a bad type among its members, an end-of-archive between two
objects) whose header fields hypothesis overwrites, the checksum fixed or not."""

from __future__ import annotations

from hypothesis import strategies as st

from sagemaker_dist.contract.tar_format import BLOCK, CHKSUM, END_OF_ARCHIVE, checksum, tar_header, tar_member

# (offset, length) of the header fields worth breaking: size, checksum, type, name, prefix, magic
FIELD = st.sampled_from([(124, 12), (148, 8), (156, 1), (0, 100), (345, 155), (257, 8)])
# edits: (which header, field, bytes written over it, whether the checksum is made right again)
EDITS = st.lists(
    st.tuples(st.integers(0, 11), FIELD, st.binary(min_size=1, max_size=16), st.booleans()),
    min_size=1,
    max_size=4,
)


def crafted_stream(edits) -> bytes:
    """The base stream with ``edits`` (an ``EDITS`` example) written into its header blocks."""
    base = bytearray(
        tar_member("000.jpg", b"a" * 700)
        + tar_member("000.cls", b"1")
        + tar_header("PaxHeaders/x", 16)[:BLOCK].replace(b"0\x00\x00", b"x\x00\x00", 0)
        + tar_member("001.jpg", b"b" * 1300)
        + END_OF_ARCHIVE
        + tar_member("002.json", b"{}")
    )
    headers = [i * BLOCK for i in range(len(base) // BLOCK)]
    for which, (offset, length), value, fix_checksum in edits:
        at = headers[which % len(headers)]
        base[at + offset : at + offset + min(length, len(value))] = value[:length]
        if fix_checksum:  # a crafted header whose checksum is right: the reader must trust nothing else
            start, n = CHKSUM
            base[at + start : at + start + n] = b"%06o\x00 " % checksum(base[at : at + BLOCK])
    return bytes(base)
