"""Protobuf's wire format written by hand, for tests that build crafted ``tf.train.Example`` records."""

from __future__ import annotations


def varint(value: int) -> bytes:
    """``value`` as a base-128 varint."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field ``number`` holding ``payload``."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload
