"""The readers' seeded shuffle window: which order a window of a stream's records comes out in.

Every reader (``PipeBatches``, ``RecordBatches``, ``PipeModeDataset`` and ``rank_dataset``, compiled or
Python) cuts an epoch's stream into windows as the records come. A window's record count is fixed when it
starts (``window_records``): enough records of the last window's mean size (the first window: of its first
record's) to fill ``ShuffleWindow.bytes``, and at most ``ShuffleWindow.records``. It closes after that
many records, or where its record bytes reach its cap first (``window_cap``: the bytes and an eighth), or at
the stream's end. A count known at the start is what lets a reader put each record straight where the
window's order sends it, as it arrives (records of one size: their row; of any size: their batch), instead
of copying the window into its order afterwards. Each window's records come out in an order drawn from its
key alone (``native/shuffle_core.h`` in C, the same arithmetic here): the stream key (the seed, the rank,
the channel), the epoch, the window's index. So the order is a pure function of (seed, epoch, rank,
stream): equal seeds give equal orders in every reader, another epoch another order, and a stream that
replays the same records replays the same order, so a resume that drops the records already trained drops
exactly those. A window holds at most ``records`` records and its cap plus one record's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sagemaker_dist.runtime.framing.batch_fill import compiled_module

_native = (
    compiled_module()
)  # the compiled reader's copy of native/shuffle_core.h; the arithmetic below without it

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
DEFAULT_WINDOW_RECORDS = 4096  # larger windows of short records outgrow the caches (docs/benchmarks.md)
DEFAULT_WINDOW_BYTES = 64 << 20
MAX_WINDOW_RECORDS = 1 << 24  # a window's order takes 8 bytes of scratch a record
HEAD_RECORDS = 16  # a stream's head: its first records, whose digest says whether it replays (sd_head_fold)


def mix64(z: int) -> int:
    """splitmix64's finaliser (``sd_mix64``)."""
    z &= M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def epoch_key(stream: int, epoch: int) -> int:
    return mix64(stream + GOLDEN * (int(epoch) + 1))


def window_key(epoch_key_: int, window: int) -> int:
    return mix64(epoch_key_ ^ mix64(GOLDEN * (int(window) + 1)))


def stream_key(seed: int, rank: int, channel: str) -> int:
    """The key of one rank's stream of one channel under ``seed``."""
    key = mix64(GOLDEN * (int(seed) + 1))
    for byte in channel.encode():
        key = mix64(key ^ byte)
    return mix64(key + GOLDEN * (int(rank) + 1))


def _mix64_array(z: np.ndarray) -> np.ndarray:
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _permutation_python(key: int, size: int) -> np.ndarray:
    """``sd_window_permutation``: the draws in numpy, the swaps in Python."""
    q = list(range(size))
    if size < 2:
        return np.array(q, dtype=np.int64)
    i = np.arange(1, size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        r = _mix64_array(np.uint64(key) + np.uint64(GOLDEN) * i)
        n = i + np.uint64(1)
        hi = (r >> np.uint64(32)) * n
        lo = (r & np.uint64(0xFFFFFFFF)) * n
        draws = ((hi + (lo >> np.uint64(32))) >> np.uint64(32)).tolist()
    for k in range(size - 1, 0, -1):
        j = draws[k - 1]
        q[k], q[j] = q[j], q[k]
    return np.array(q, dtype=np.int64)


def window_order(key: int, size: int, n: int, scratch: np.ndarray | None = None) -> np.ndarray:
    """The order of a window's ``n`` records (``n <= size``): an int64 array of their indexes, first out
    first (``sd_window_order``). ``scratch``: ``size`` int64 entries to reuse."""
    if not 0 <= n <= size < MAX_WINDOW_RECORDS:
        raise ValueError(f"n={n}, size={size}: need 0 <= n <= size < {MAX_WINDOW_RECORDS}")
    out = np.empty(n, dtype=np.int64)
    if _native is not None:
        if scratch is None or len(scratch) < size:
            scratch = np.empty(size, dtype=np.int64)
        _native.window_order(key & M64, size, n, out, scratch)
        return out
    q = _permutation_python(key & M64, size)
    return q[q < n] if n < size else q


def window_records(window: ShuffleWindow, count: int, nbytes: int) -> int:
    """The record count of a window that follows one of ``count`` records and ``nbytes`` bytes (the first
    window: its first record, ``count`` 1): ``window.bytes`` of records of that window's mean size
    (rounded down, at least a byte), at most ``window.records``."""
    mean = max(int(nbytes) // max(int(count), 1), 1)
    return min(window.records, -(-window.bytes // mean))


def window_cap(window: ShuffleWindow) -> int:
    """The record bytes that close a window before its count: its bound and an eighth (a window of
    records a little longer than the last one's still closes at its count)."""
    return window.bytes + window.bytes // 8


def stream_order_within_batches(order: np.ndarray, skip: int, carried: int, size: int) -> np.ndarray:
    """``order`` (a window's records, first out first) with each batch's records in stream order: the
    first ``skip`` records (dropped) first, then the ``size - carried`` that complete the batch carried
    into the window, then each ``size`` after them. Which records share a batch does not change."""
    n = len(order)
    out = order.copy()
    first = min(skip, n)
    cuts = [0, first, min(first + (size - carried if carried else 0), n)]
    whole = (n - cuts[-1]) // size
    end = cuts[-1] + whole * size
    if whole:  # the whole batches, a row each
        out[cuts[-1] : end] = np.sort(order[cuts[-1] : end].reshape(whole, size), axis=1).ravel()
    for a, b in (*zip(cuts, cuts[1:]), (end, n)):
        out[a:b] = np.sort(order[a:b])
    return out


def inverse(order: np.ndarray) -> np.ndarray:
    """Where each record goes: ``rows[order[k]] = k``."""
    rows = np.empty(len(order), dtype=np.int64)
    rows[order] = np.arange(len(order), dtype=np.int64)
    return rows


@dataclass(frozen=True)
class ShuffleWindow:
    """A seeded shuffle window: ``seed`` (a whole number), at most ``records`` records and ``bytes`` bytes
    of records (plus one record) in a window. Give it (or just the seed) as ``shuffle=`` to a reader."""

    seed: int
    records: int = DEFAULT_WINDOW_RECORDS
    bytes: int = DEFAULT_WINDOW_BYTES

    def __post_init__(self):
        for name, low, high in (
            ("seed", 0, M64),
            ("records", 1, MAX_WINDOW_RECORDS - 1),
            ("bytes", 1, 1 << 62),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"ShuffleWindow {name}={value!r}: give a whole number from {low} to {high}")

    @classmethod
    def of(cls, shuffle) -> ShuffleWindow | None:
        """``shuffle=`` as a reader takes it: None or False (no shuffle), a seed, or a ShuffleWindow."""
        if shuffle is None or shuffle is False:
            return None
        if isinstance(shuffle, ShuffleWindow):
            return shuffle
        if isinstance(shuffle, bool) or not isinstance(shuffle, int):
            raise ValueError(
                f"shuffle={shuffle!r}: give a seed (a whole number), a ShuffleWindow(seed, records, bytes), "
                "or None"
            )
        return cls(shuffle)

    def stream_key(self, rank: int, channel: str) -> int:
        return stream_key(self.seed, rank, channel)


class EpochOrder:
    """The windows of one epoch of one stream, in turn: ``closes(count, nbytes)`` (after each record)
    says whether a window of that many records and bytes is complete; ``order(n, nbytes)`` is the next
    window's order (and moves on). ``records`` is the window's count where known (None before the
    epoch's first record)."""

    def __init__(self, window: ShuffleWindow, stream: int, epoch: int):
        self.window = window
        self.epoch = int(epoch)
        self.key = epoch_key(stream, epoch)
        self.index = 0  # the next window's
        self.cap = window_cap(window)
        self.records: int | None = None
        self._scratch = np.empty(window.records, dtype=np.int64) if _native is not None else None

    def closes(self, count: int, nbytes: int) -> bool:
        if self.records is None:  # the epoch's first record: its length sets the first window's count
            self.records = window_records(self.window, count, nbytes)
        return count >= self.records or nbytes >= self.cap

    def fixed_size(self, record_bytes: int) -> int:
        """Records in every window where every record is ``record_bytes`` long."""
        return window_records(self.window, 1, record_bytes)

    def ahead(self, n: int) -> np.ndarray:
        """The next window's order if it has ``n`` records (it does not move on)."""
        return window_order(window_key(self.key, self.index), self.window.records, n, self._scratch)

    def order(self, n: int, nbytes: int) -> np.ndarray:
        """The order of the window of ``n`` records and ``nbytes`` bytes just read; the next one's count
        follows from them."""
        out = self.ahead(n)
        self.passed(n, nbytes)
        return out

    def passed(self, n: int, nbytes: int) -> None:
        """Moves on past a window of ``n`` records and ``nbytes`` bytes whose order is known (``ahead``)."""
        self.index += 1
        self.records = window_records(self.window, n, nbytes)


def shuffled(records, order: EpochOrder, size=len):
    """``records`` (an iterable) in the window order: each window's records as they came, reordered. The
    records read before an error come out first, in their window's order, then the error (as the
    compiled reader's do)."""
    window: list = []
    nbytes = 0
    error = None
    try:
        for record in records:
            window.append(record)
            nbytes += size(record)
            if order.closes(len(window), nbytes):
                yield from (window[i] for i in order.order(len(window), nbytes).tolist())
                window, nbytes = [], 0
    except Exception as exc:
        error = exc
    if window:
        yield from (window[i] for i in order.order(len(window), nbytes).tolist())
    if error is not None:
        raise error


class StreamHead:
    """The digest of a stream's first HEAD_RECORDS records (``sd_head_fold``): ``add`` each record in
    stream order; ``value`` once ``done`` (or at the stream's end, of the records it had)."""

    def __init__(self):
        self.value = 0
        self.count = 0

    @property
    def done(self) -> bool:
        return self.count >= HEAD_RECORDS

    def add(self, record) -> None:
        from crc32c import crc32c

        if self.count < HEAD_RECORDS:
            length = len(record) if not hasattr(record, "nbytes") else record.nbytes
            self.value = mix64(self.value ^ ((crc32c(record) << 32) | (length & 0xFFFFFFFF)))
            self.count += 1
