"""Balance S3 objects into one shard per worker by bytes: a pure planning core (no I/O, no AWS).

The algorithm is LPT (longest processing time first): objects sorted by size, largest first, each
goes to the shard with the fewest bytes so far. The largest shard exceeds total / shards by at most
the object placed on it last, and LPT is within 4/3 of the best possible split; with many objects
per shard it lands within a millionth of the lower bound max(total / shards, largest object).

The plan does not depend on input order: objects are taken in name order (equal sizes go out by
name, and each shard lists its keys by name). The sorts run in numpy, the keys' as integers made of
8 bytes at a time, and the greedy loop keeps each shard's load and index packed in one Python int,
so the heap compares plain integers: a million objects in any order plan in about a second on two
cores (bench/bench_sharding.py)."""

from __future__ import annotations

import heapq
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import NoReturn

import numpy as np

from sagemaker_dist.contract.layout import SHARDED_BY_S3_KEY
from sagemaker_dist.errors import ConfigurationError


class ShardingError(ConfigurationError):
    """Objects that cannot be split into the wanted shards."""


class NotEnoughObjectsError(ShardingError):
    """Fewer objects than shards: some worker would get no data and stall the others."""


@dataclass(frozen=True, repr=False)
class ShardPlan:
    """Which keys each shard holds; ``shards[i]`` feeds worker ``i``'s channel."""

    shards: list[list[str]]
    sizes: list[list[int]]  # parallel to ``shards``: bytes of each key
    # parallel to ``shards``: records of each key, where a pack's index gives them (launch.pack_index)
    records: list[list[int]] | None = None

    def __repr__(self) -> str:  # a million keys would drown a traceback
        if self.num_objects <= 20:
            return f"ShardPlan(shards={self.shards!r}, sizes={self.sizes!r})"
        return (
            f"ShardPlan({self.num_shards} shards, {self.num_objects} objects, {self.total_bytes} bytes, "
            f"imbalance {self.imbalance:.6f})"
        )

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def bytes_per_shard(self) -> list[int]:
        return [sum(s) for s in self.sizes]

    @property
    def objects_per_shard(self) -> list[int]:
        return [len(s) for s in self.shards]

    @property
    def records_per_shard(self) -> list[int] | None:
        """Records each worker reads, where known (a pack's index); else None."""
        return None if self.records is None else [sum(r) for r in self.records]

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_per_shard)

    @property
    def num_objects(self) -> int:
        return sum(self.objects_per_shard)

    @property
    def lower_bound(self) -> float:
        """No split can have a smaller largest shard than this."""
        largest = max((max(s) for s in self.sizes if s), default=0)
        return max(self.total_bytes / max(self.num_shards, 1), largest)

    @property
    def imbalance(self) -> float:
        """Largest shard divided by the lower bound (1.0 is perfect)."""
        bound = self.lower_bound
        return max(self.bytes_per_shard) / bound if bound else 1.0

    def items(self) -> Iterable[tuple[int, str, int]]:
        """Every (shard, key, size) of the plan."""
        for index, (keys, sizes) in enumerate(zip(self.shards, self.sizes)):
            for key, size in zip(keys, sizes):
                yield index, key, size

    def table(self) -> list[tuple[int, int, int, float]]:
        """Rows (shard, objects, bytes, share of total) for printing."""
        total = self.total_bytes
        return [
            (i, n, b, (b / total) if total else 1.0 / self.num_shards)
            for i, (n, b) in enumerate(zip(self.objects_per_shard, self.bytes_per_shard))
        ]


def _check_objects(
    objects: Sequence[tuple[str, int]], num_shards: int
) -> tuple[list[str], np.ndarray, np.ndarray | None]:
    """Validate; return keys and sizes in input order and the indices that put them in name order.

    The name order is the canonical, order-free input. It comes back as indices (None when the input
    is in name order already, as S3 listings are) so the keys are gathered once, into the shards.
    """
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
        raise ShardingError(f"number of shards is {num_shards!r}; it must be a whole number >= 1")
    if len(objects) < num_shards:
        raise NotEnoughObjectsError(
            f"{len(objects)} object(s) for {num_shards} shard(s): every worker needs at least one object. "
            f"Use at most {len(objects)} worker(s) (fewer instances or --processes-per-host), or split "
            f"the data into at least {num_shards} files."
        )
    try:
        keys = [k for k, _ in objects]
        raw_sizes = [n for _, n in objects]
    except (TypeError, ValueError) as exc:
        raise ShardingError(f"objects must be (key, size_bytes) pairs ({exc})") from exc
    try:
        joined = "\0".join(keys)  # checks every key is a string in one pass in C; sorted below
    except TypeError:
        bad = next(k for k in keys if not isinstance(k, str))
        raise ShardingError(f"key {bad!r} is not a string; objects must be (key, size_bytes) pairs") from None
    sizes = np.asarray(raw_sizes)
    if sizes.dtype.kind not in "iu":
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in raw_sizes):
            bad = next(x for x in raw_sizes if not isinstance(x, int) or isinstance(x, bool))
            raise ShardingError(f"size {bad!r} is not a whole number of bytes")
        sizes = np.asarray(raw_sizes, dtype=object)  # beyond int64: keep Python ints
    if sizes.min() < 0:
        i = int(np.argmin(sizes))
        raise ShardingError(f"object {keys[i]!r} has a negative size ({raw_sizes[i]}); sizes are bytes >= 0")
    return keys, sizes, _name_order(keys, joined)


def _name_order(keys: list[str], joined: str) -> np.ndarray | None:
    """Indices that sort ``keys`` by name, or None when they are sorted already; refuses duplicates."""
    if all(map(operator.lt, keys, islice(keys, 1, None))):  # O(n), and fails fast on other input
        return None
    order = _bytes_order(keys, joined)
    if order is not None:
        return order
    # Python's sort takes over a second for a million keys: only for keys _bytes_order leaves.
    by_name = sorted(range(len(keys)), key=keys.__getitem__)
    ranked = list(map(keys.__getitem__, by_name))
    if any(map(operator.eq, ranked, islice(ranked, 1, None))):
        _refuse_duplicates({a for a, b in zip(ranked, ranked[1:]) if a == b})
    return np.array(by_name, dtype=np.int64)


def _refuse_duplicates(dupes: set[str]) -> NoReturn:
    first = min(dupes)
    raise ShardingError(
        f"{len(dupes)} key(s) appear more than once (first: {first!r}); list each object once"
    )


# _TAIL_MASKS[r] keeps the first r bytes of a big-endian 64-bit word and zeroes the others.
_TAIL_MASKS = np.array([(1 << 64) - (1 << (64 - 8 * r)) for r in range(9)], dtype=np.uint64)


def _bytes_order(keys: list[str], joined: str) -> np.ndarray | None:
    """Name order of ASCII keys without NULs (``joined``: the keys joined by NULs), sorted in numpy.

    A key's bytes, read 8 at a time as big-endian integers padded with zero bytes, compare as Python
    compares the key. All keys are sorted by their first 8 bytes after the prefix they all share
    (``data/part-``), then each run still tied by its next 8 bytes, and so on: a few numpy sorts of
    integers instead of Python comparing a million strings. None when the keys are not such keys.
    """
    if not joined.isascii():
        return None
    n, encoded = len(keys), joined.encode("ascii")
    ends = np.flatnonzero(np.frombuffer(encoded, dtype=np.uint8) == 0)
    if len(ends) != n - 1:
        return None  # a key holds a NUL: the separators are ambiguous
    starts = np.append(0, ends + 1)
    lengths = np.append(ends, len(encoded)) - starts
    longest = int(lengths.max())
    raw = encoded + bytes(longest + 8)  # padded: reading past the last key stays inside
    # window[q] is bytes q..q+7 as one big-endian integer: an overlapping, unaligned view of raw.
    window = np.ndarray(shape=(len(raw) - 7,), dtype=">u8", buffer=raw, strides=(1,))

    def word(rows: np.ndarray, offset: int) -> np.ndarray:
        """Bytes offset..offset+7 of keys ``rows``, zero past each key's end."""
        return (
            window[starts[rows] + offset].astype(np.uint64)
            & _TAIL_MASKS[np.clip(lengths[rows] - offset, 0, 8)]
        )

    everyone, offset = np.arange(n), 0
    while True:  # skip the prefix all keys share
        column = word(everyone, offset)
        spread = int(np.bitwise_or.reduce(column ^ column[0]))
        if spread or offset + 8 >= longest:
            break
        offset += 8
    if spread and spread.bit_length() <= 56:  # the first byte or more of this word is shared as well
        offset += (64 - spread.bit_length()) // 8
        column = word(everyone, offset)
    order = np.argsort(column)
    column = column[order]
    new_run = np.ones(n, dtype=bool)  # where a run of keys equal so far begins
    new_run[1:] = column[1:] != column[:-1]
    while not new_run.all():
        tied = np.zeros(n, dtype=bool)
        tied[1:] = ~new_run[1:]
        tied[:-1] |= tied[1:]
        at = np.flatnonzero(tied)
        if lengths[order[at]].max() <= offset + 8:  # no bytes left to tell them apart
            _refuse_duplicates({keys[i] for i in order[at].tolist()})
        offset += 8
        column = word(order[at], offset)
        resort = np.lexsort((column, np.cumsum(new_run)[at]))  # by run, then by the next 8 bytes
        order[at] = order[at][resort]
        column = column[resort]
        new_run[at[1:]] |= column[1:] != column[:-1]
    return order


def _lpt_assign(sizes: np.ndarray, num_shards: int) -> np.ndarray:
    """Shard index of every object by LPT greedy over a heap of packed ints."""
    # Largest first; ties keep name order, so the plan is deterministic.
    order = np.argsort(-sizes, kind="stable")
    bits = max(num_shards - 1, 1).bit_length()
    mask = (1 << bits) - 1
    # Heap entries are (load << bits) | shard: the smallest int is the lightest shard, the lowest
    # index on ties. Adding (size << bits) to an entry adds size to that shard's load.
    ordered = sizes[order]
    if ordered.dtype != object and int(ordered[0]) < 1 << (62 - bits):  # shift in numpy: no overflow
        steps = (ordered << bits).tolist()
    else:
        steps = [int(s) << bits for s in ordered.tolist()]
    # The largest num_shards objects open one shard each (what LPT does anyway for positive sizes);
    # this keeps every shard non-empty even when objects have zero bytes.
    picked = list(range(num_shards))
    heap = [step | i for i, step in enumerate(steps[:num_shards])]
    heapq.heapify(heap)
    append = picked.append
    replace = heapq.heapreplace
    for step in islice(steps, num_shards, None):
        top = heap[0]
        append(top)
        replace(heap, top + step)
    try:
        chosen = np.array(picked, dtype=np.int64) & mask
    except OverflowError:  # loads beyond int64 (exabytes): unpack in Python
        chosen = np.array([p & mask for p in picked], dtype=np.int64)
    shard_of = np.empty(len(sizes), dtype=np.int64)
    shard_of[order] = chosen
    return shard_of


def plan_shards(
    objects: Sequence[tuple[str, int]], num_shards: int, order_seed: int | None = None
) -> ShardPlan:
    """Split ``objects`` (``(key, size_bytes)`` pairs) into ``num_shards`` shards balanced by bytes.

    Deterministic: the same objects (in any order) give the same plan. Every object lands in exactly
    one shard; within a shard keys keep name order, or, with ``order_seed``, an order drawn from the
    seed and the shard's number (``seeded_order``): objects laid out by class, day or source, whose
    names run in that order, are spread over the shard's stream instead of coming one class after
    another every epoch. Raises NotEnoughObjectsError when there are fewer objects than shards.
    """
    keys, sizes, by_name = _check_objects(objects, num_shards)
    if by_name is not None:
        sizes = sizes[by_name]
    shard_of = _lpt_assign(sizes, num_shards)  # of each object in name order
    # Group by shard; a stable sort keeps name order inside each shard.
    grouped = np.argsort(shard_of, kind="stable")
    bounds = np.searchsorted(shard_of[grouped], np.arange(num_shards + 1)).tolist()
    if order_seed is not None:
        for shard, (start, end) in enumerate(zip(bounds, bounds[1:])):
            grouped[start:end] = grouped[start:end][seeded_order(end - start, order_seed, shard)]
    picks = (grouped if by_name is None else by_name[grouped]).tolist()
    size_list = sizes[grouped].tolist()  # Python ints (object arrays hold them already)
    spans = list(zip(bounds, bounds[1:]))
    shards = [_pick(keys, picks[start:end]) for start, end in spans]
    shard_sizes = [size_list[start:end] for start, end in spans]
    return ShardPlan(shards=shards, sizes=shard_sizes)


def with_records(plan: ShardPlan, records: Mapping[str, int]) -> ShardPlan:
    """``plan`` with each key's record count (``records[key]``) beside its size."""
    return replace(plan, records=[[records[k] for k in keys] for keys in plan.shards])


def seeded_order(count: int, seed: int, shard: int) -> np.ndarray:
    """A permutation of ``range(count)`` drawn from ``seed`` and ``shard`` alone (numpy's PCG64): the
    order of a shard's objects, in name order, in its manifest."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ShardingError(f"order seed {seed!r}: give a whole number >= 0")
    return np.random.Generator(np.random.PCG64([seed, shard])).permutation(count)


def _pick(items: list[str], indices: list[int]) -> list[str]:
    """``[items[i] for i in indices]``, by itemgetter: the loop runs in C, about twice as fast."""
    if len(indices) < 2:  # itemgetter of one index returns the item, not a tuple
        return [items[i] for i in indices]
    return list(operator.itemgetter(*indices)(items))


def check_host_split(plan: ShardPlan, hosts: int, distribution: str, channel_base: str = "train") -> None:
    """Refuse a ShardedByS3Key plan that would leave a host of some channel with no objects.

    SageMaker splits a ShardedByS3Key channel's objects across the hosts by object count, so a shard
    with fewer objects than hosts gives at least one host an empty FIFO and its rank stalls the job.
    FullyReplicated channels and single-host jobs are never split, so they always pass.
    """
    if distribution != SHARDED_BY_S3_KEY or hosts <= 1:
        return
    short = [(i, n) for i, n in enumerate(plan.objects_per_shard) if n < hosts]
    if not short:
        return
    shown = ", ".join(f"{channel_base}_{i} has {n}" for i, n in short[:5])
    more = f" and {len(short) - 5} more" if len(short) > 5 else ""
    raise NotEnoughObjectsError(
        f"{plan.num_objects} object(s) in {plan.num_shards} shard(s), each ShardedByS3Key across {hosts} "
        f"hosts: every shard needs at least {hosts} objects (one per host), but {shown}{more}. SageMaker "
        "splits each channel's objects across hosts by count, so some host would get none and its rank "
        "would stall the job. Use the per-rank strategy (--strategy per-rank, strategy='per-rank'), "
        f"or split the data into more or smaller files (at least {hosts * plan.num_shards} in all)."
    )


def round_robin_by_name(objects: Sequence[tuple[str, int]], num_shards: int) -> ShardPlan:
    """The naive reference split (keys in name order, dealt out in turn); used by the benchmark."""
    keys, sizes, by_name = _check_objects(objects, num_shards)
    if by_name is not None:
        keys, sizes = list(map(keys.__getitem__, by_name.tolist())), sizes[by_name]
    size_list = sizes.tolist()
    return ShardPlan(
        shards=[keys[i::num_shards] for i in range(num_shards)],
        sizes=[size_list[i::num_shards] for i in range(num_shards)],
    )
