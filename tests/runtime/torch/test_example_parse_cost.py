"""``parse_example``'s cost on crafted records: time linear in the record's size, memory a small
multiple of it (security finding 3: one crafted record of many repeated sub-messages stalled a rank
for minutes, quadratic in its size, while the other ranks waited on the collective).

No test of absolute seconds: each shape is parsed at N and 4N bytes, and the ratio of the CPU times
(median of interleaved repeats, the GC off) must stay well under a quadratic's 16 (linear is 4).
Memory is tracemalloc's peak during the parse, over the record's size.
"""

from __future__ import annotations

import gc
import itertools
import statistics
import time
import tracemalloc

import pytest
from helpers.protobuf_wire import field, varint

from sagemaker_dist.runtime.torch.records import parse_example

N = 128 << 10  # and 4N = 512 KiB: about 0.05 s a parse; 3 to 20 s for the quadratic parser
REPEATS = 5
MEMORY_RECORD = 512 << 10
FIXED = 1 << 20  # the vectorised varint decoder's temporaries, whatever the record's size


def entry(key: bytes, feature: bytes) -> bytes:
    return field(1, field(1, key) + field(2, feature))


def example(*entries: bytes) -> bytes:
    return field(1, b"".join(entries))


INT_LIST = b"\x1a\x02\x08\x05"  # a Feature field: int64_list [5]


def packed(varints: bytes, n: int) -> bytes:
    """An Example of one int64 feature: these varints, repeated to about ``n`` bytes, packed."""
    return example(entry(b"x", field(3, field(1, varints * (n // len(varints) + 1)))))


def short_names(count: int) -> list[bytes]:
    return [bytes(t) for t in itertools.islice(itertools.product(range(0x21, 0x7F), repeat=3), count)]


# shape -> (a record of about n bytes, the memory bound in record sizes)
SHAPES = {
    # Feature fields of one kind repeated: protobuf concatenates them (the quadratic case)
    "repeated int64_list sub-messages": (lambda n: example(entry(b"x", INT_LIST * (n // 4))), 6),
    "repeated bytes_list sub-messages": (lambda n: example(entry(b"x", b"\x0a\x03\x0a\x01A" * (n // 5))), 4),
    "repeated float_list sub-messages": (
        lambda n: example(entry(b"x", b"\x12\x05\x0d\0\0\xc0\x3f" * (n // 7))),
        4,
    ),
    "repeated Feature values in one entry": (
        lambda n: example(field(1, field(1, b"x") + field(2, INT_LIST) * (n // 6))),
        6,
    ),
    # long lists: the values themselves
    "a long packed int64 list": (lambda n: packed(b"".join(varint(v) for v in range(128, 16384)), n), 8),
    "a long packed int64 list of one-byte varints": (lambda n: packed(b"\x05", n), 12),
    "a long packed int64 list of negatives": (lambda n: packed(varint(2**64 - 1), n), 4),
    "many unpacked int64 values": (lambda n: example(entry(b"x", field(3, b"\x08\x05" * (n // 2)))), 8),
    "many bytes values": (lambda n: example(entry(b"x", field(1, b"\x0a\x02ab" * (n // 4)))), 14),
    # many features: the result's Python objects (a name, a list or array, a dict slot each) dominate
    "many small features": (lambda n: example(*(entry(b"%06d" % i, INT_LIST) for i in range(n // 14))), 20),
    "many features of short names and no value": (
        lambda n: example(*(field(1, field(1, name)) for name in short_names(n // 7))),
        24,
    ),
    # what is replaced is let go
    "one key in many entries": (lambda n: example(*[entry(b"k", INT_LIST)] * (n // 12)), 2),
    "many Example.features fields": (lambda n: example(entry(b"k", INT_LIST)) * (n // 14), 2),
}


def cpu_seconds(record: bytes) -> float:
    start = time.process_time()
    parse_example(record)
    return time.process_time() - start


@pytest.mark.parametrize("shape", SHAPES)
def test_parse_time_grows_linearly_with_the_record(shape):
    make = SHAPES[shape][0]
    small, large = make(N), make(4 * N)
    times: dict[bytes, list[float]] = {small: [], large: []}
    enabled = gc.isenabled()
    gc.disable()
    try:
        parse_example(small)  # warm up
        for _ in range(REPEATS):  # interleaved: a burst of load hits both sizes alike
            for record in (small, large):
                times[record].append(cpu_seconds(record))
    finally:
        if enabled:
            gc.enable()
    ratio = statistics.median(times[large]) / max(statistics.median(times[small]), 1e-6)
    assert ratio < 8, (
        f"{shape}: {len(large)} bytes took {ratio:.1f} times as long as {len(small)} "
        f"(linear: 4, quadratic: 16): {times[small]} vs {times[large]}"
    )


@pytest.mark.parametrize("shape", SHAPES)
def test_parse_memory_is_a_small_multiple_of_the_record(shape):
    make, bound = SHAPES[shape]
    record = make(MEMORY_RECORD)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        parsed = parse_example(record)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert parsed
    assert peak <= bound * len(record) + FIXED, (
        f"{shape}: parsing {len(record)} bytes took {peak} bytes at its peak, "
        f"{peak / len(record):.1f} times the record (bound {bound})"
    )
