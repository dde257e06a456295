"""This rank's channel as batches of raw records in ``torch.uint8`` tensors, framed in compiled code.

``RecordBatches`` is ``PipeBatches`` without a Python object per record: the reader thread hands the
epoch's FIFO (or a File channel's files) to the compiled batch reader (``framing._record_reader``),
which reads, frames (TFRecord, RecordIO, text lines) and checks both TFRecord CRCs with the GIL
released, and copies each record once into the batch's tensor, allocated in pinned memory where
CUDA is (WebDataset samples are framed by ``framing.tar``, their walk in C, and copied in runs). Records
of one size (``record_bytes=``) come as a ``[n, record_bytes]`` tensor; records of
any size as a ``RaggedBatch``: one data tensor and int64 offsets (``.padded()`` makes a padded
``[n, longest]`` tensor of it). Where the extension is not built, the Python framers fill the same
tensors. Unpinned buffers are reused once no tensor holds them (a batch kept by the script stays as
it is), so an epoch does not fault in fresh pages for every batch.
"""

from __future__ import annotations

import contextlib
import mmap
import threading
import weakref
from collections import deque
from typing import Any, NamedTuple

import numpy as np

from sagemaker_dist.runtime.epoch_reader.reader import read_ahead
from sagemaker_dist.runtime.fifo import DEFAULT_FIFO_TIMEOUT
from sagemaker_dist.runtime.framing.batch_fill import Batch, StreamFill, compiled_available, gather
from sagemaker_dist.runtime.framing.shuffle import (
    HEAD_RECORDS,
    EpochOrder,
    ShuffleWindow,
    StreamHead,
    inverse,
)
from sagemaker_dist.runtime.torch.batches import DEFAULT_PREFETCH, PipeBatches

FIRST_BATCH_BYTES = 1 << 20  # a ragged batch's first buffer; later ones start at the last one's size
POOL_EXTRA = 4  # unpinned buffers kept for reuse past the batches in flight
# Batches the reader thread hands to the loop at once, up to this many bytes, while the stream has bytes
# waiting: each handoff wakes the other thread and moves the GIL, once per group instead of per batch.
GROUP_BYTES = 4 << 20
# numpy asks the kernel for transparent huge pages for arrays from 4 MiB. Where THP's defrag setting is
# "madvise" (the usual default), the first touch of each 2 MiB then waits for memory compaction: a fresh
# process read a 150 KB-record epoch into such arrays at 0.66x the speed of plain pages. Pool arrays this
# large are anonymous maps of plain pages instead.
PLAIN_PAGES_FROM = 4 << 20
# Shuffle windows' buffers kept for reuse (data and offsets each): the window being filled, the one whose
# batches the loop is taking, and one more
WINDOWS_KEPT = 6
# Records shorter than this are put in (fixed) or gathered from (any size: the last window's mean) their
# window's rows in random order: there the window is mapped in huge pages, where the kernel has them (a
# TLB miss per record otherwise: 1 KB records scattered over a 16 MiB window of 4 KiB pages read at
# 0.55-0.75 of their speed in huge pages). Longer records span pages anyway, and faulting in huge pages
# costs compaction.
HUGE_PAGES_BELOW = 16 << 10
# Windows of records of one size an arena holds: the one being filled, the one being handed out, one more
ARENA_WINDOWS = 3


class RaggedBatch(NamedTuple):
    """Records of any length: record i is ``data[offsets[i]:offsets[i + 1]]`` (``offsets``: n + 1 int64)."""

    data: Any
    offsets: Any

    @property
    def lengths(self):
        return self.offsets[1:] - self.offsets[:-1]

    def record(self, i: int):
        return self.data[int(self.offsets[i]) : int(self.offsets[i + 1])]

    def padded(self, value: int = 0, length: int | None = None):
        """A ``[n, length]`` uint8 tensor of the records, each followed by ``value`` up to ``length``
        (default: the longest record's)."""
        import torch

        lengths = self.lengths
        longest = int(lengths.max()) if len(lengths) else 0
        length = longest if length is None else int(length)
        if length < longest:
            raise ValueError(f"length={length} is shorter than the longest record ({longest} bytes)")
        out = torch.full((len(lengths), length), value, dtype=torch.uint8, device=self.data.device)
        out[torch.arange(length, device=self.data.device) < lengths[:, None].to(self.data.device)] = self.data
        return out

    def to(self, *args, **kwargs) -> RaggedBatch:
        return RaggedBatch(self.data.to(*args, **kwargs), self.offsets.to(*args, **kwargs))


class _Slot:
    """A buffer lent out as one numpy view at a time. The view handed to ``torch.from_numpy`` lives as long
    as any tensor over its memory (the tensor's storage holds it, and so does every slice or ``.numpy()``
    of it), so a weak reference to the view says when nothing uses the buffer any more: then it may be
    refilled (a batch the script keeps is never written over)."""

    __slots__ = ("array", "in_use", "_ref")

    def __init__(self, array: np.ndarray):
        self.array = array
        self.in_use = False
        self._ref = None

    def lend(self, start: int, end: int) -> np.ndarray:
        view = self.array[start:end]
        self.in_use = True
        self._ref = weakref.ref(view, self._release)  # its callback runs as the view goes
        return view

    def _release(self, ref) -> None:
        if ref is self._ref:
            self.in_use = False


class _Buffers:
    """Allocates the batches' tensors: pinned (torch's caching host allocator reuses them), or from a
    pool of arrays reused once nothing uses them any more (no fresh pages to fault in per batch).
    ``tensors=False``: numpy arrays only (buffers the reader keeps to itself, never pinned)."""

    def __init__(self, pinned: bool, keep: int, huge_pages: bool = False, tensors: bool = True):
        self.pinned = pinned and tensors
        self.tensors = tensors
        self.keep = keep
        self.huge_pages = huge_pages
        self.pool: list[_Slot] = []
        self.lock = threading.Lock()  # an epoch left early may still be filling while the next one starts

    def __call__(self, nbytes: int):
        if self.pinned:
            torch = _torch()
            tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            return tensor, tensor.numpy()
        with self.lock:
            for slot in self.pool:
                if not slot.in_use and nbytes <= len(slot.array) <= 2 * nbytes:
                    break
            else:
                slot = _Slot(_plain_array(nbytes, self.huge_pages))
                self.pool.append(slot)
                if len(self.pool) > self.keep:
                    self.pool.pop(0)  # its memory goes once its views do
            view = slot.lend(0, nbytes)
        return (_torch().from_numpy(view) if self.tensors else view), view


class _Arena:
    """Shuffle windows of records of one size, placed one after another in one buffer (back to its start
    where the next does not fit), so that a batch across two windows is one span of rows: a view, not a
    copy. Every span handed out is a tensor of its own over a numpy view of its rows, tracked as a lent
    view of the arena (``_Slot``); a window is only placed over rows no live view covers (``place`` says
    None otherwise: the reader takes a new arena)."""

    def __init__(self, rows: int, row_bytes: int, pinned: bool, huge_pages: bool):
        self.rows, self.row_bytes = int(rows), int(row_bytes)
        if pinned:
            torch = _torch()
            self._tensor = torch.empty(self.rows * self.row_bytes, dtype=torch.uint8, pin_memory=True)
            self.array = self._tensor.numpy()
        else:
            self.array = _plain_array(self.rows * self.row_bytes, huge_pages)
        self.end = 0  # the row after the last window placed
        self.handed: deque = deque()  # (first row, end row, the _Slot its view was lent by)

    def place(self, n: int) -> int | None:
        """The first row of a window of ``n`` rows: after the last one, or at the start."""
        start = self.end if self.end + n <= self.rows else 0
        self.handed = deque(h for h in self.handed if h[2].in_use)
        if n > self.rows or any(a < start + n and start < b for a, b, _ in self.handed):
            return None
        self.end = start + n
        return start

    def window(self, start: int, n: int) -> Batch:
        """A batch of ``n`` records to fill rows ``start .. start + n`` with (straight into their rows)."""
        rb = self.row_bytes
        return Batch.over(self, self.array[start * rb : (start + n) * rb], n)

    def span(self, first: int, end: int):
        """Rows ``first .. end`` as a ``[end - first, row_bytes]`` tensor, tracked while it lives."""
        slot = _Slot(self.array)
        view = slot.lend(first * self.row_bytes, end * self.row_bytes)
        self.handed.append((first, end, slot))
        return _torch().from_numpy(view).view(end - first, self.row_bytes)


class _Cutter:
    """Cuts a shuffled epoch's windows into batches, in their order. A window is a ``[n, record_bytes]``
    tensor already in its order (its batches are views of it), ``(tensor, rows)`` (records of one size at
    those rows, a window the stream's end cut short) or ``(window, order)`` (records of any size as they
    came, a ``Batch``). A batch that is not a view (across two windows, of rows, of records of any size)
    is copied into buffers of its own. Drops the first ``skip`` records."""

    def __init__(self, reader: RecordBatches, allocate, skip: int):
        self.reader, self.allocate, self.skip = reader, allocate, int(skip)
        self.size = reader.batch_size
        self.carry: list = []  # pieces of the next batch: row tensors, (tensor, rows), (window, order)
        self.carried = 0
        self.first = True
        self.gathered = allocate  # the buffers of a window's gathered batches

    def add(self, window):
        if isinstance(window, _Span):
            yield from self._groups(self._add_span(window))
            return
        if isinstance(window, tuple) and not self.reader.record_bytes:
            yield from self._groups(self._add_ragged(*window))
            return
        if isinstance(window, tuple):
            source, order = window
            n = len(order)
        else:
            source, order, n = window, None, window.shape[0]
        i = min(self.skip, n)
        self.skip -= i
        batches = []
        while i < n:
            take = min(self.size - self.carried, n - i)
            piece = source[i : i + take] if order is None else (source, order[i : i + take])
            i += take
            if not self.carried and take == self.size and order is None:
                batches.append((piece, take))  # a view of the window: no copy
                continue
            self.carry.append(piece)
            self.carried += take
            if self.carried == self.size:
                batches.append(self._join())
        yield from self._groups(batches)

    def _add_ragged(self, window: Batch, order: np.ndarray) -> list:
        """The batches of a window of records of any size: the one carried from the window before
        completed, then the whole batches of this one, a group's worth at a time gathered in one call
        (GIL released) into one buffer, each batch a view of it; the rest carried. Every record is copied
        once, out of the window."""
        n, size, batches = len(order), self.size, []
        i = min(self.skip, n)
        self.skip -= i
        if self.carried and i < n:
            take = min(size - self.carried, n - i)
            self.carry.append((window, order[i : i + take]))
            self.carried += take
            i += take
            if self.carried == size:
                batches.append(self._join())
        whole = (n - i) // size
        # a buffer per group's worth of batches (GROUP_BYTES at the window's mean record): buffers come
        # back to the pool as the loop drops each group, not once it dropped a whole window's batches
        per = max(1, GROUP_BYTES * window.count // max(window.nbytes * size, 1))
        while whole:
            k = min(per, whole)
            batches.extend(self._gathered(window, order[i : i + k * size], k))
            i, whole = i + k * size, whole - k
        if i < n:
            self.carry.append((window, order[i:]))
            self.carried += n - i
        return batches

    def _gathered(self, window: Batch, order: np.ndarray, count: int) -> list:
        """``count`` whole batches of ``window``'s records in ``order``, as views of one buffer (and of one
        buffer of their offsets, each batch's from 0)."""
        torch, size = _torch(), self.size
        holder, data = self.gathered(int(_lengths(window)[order].sum()))
        out = Batch.over(holder, data, len(order))
        gather(out, window, order)
        ends = out.offsets
        starts = ends[:-1:size]  # each batch's first byte
        offsets_holder, offsets = self.gathered(8 * count * (size + 1))
        offsets = offsets.view(np.int64).reshape(count, size + 1)
        np.subtract(ends[:-1].reshape(count, size), starts[:, None], out=offsets[:, :size])
        np.subtract(ends[size::size], starts, out=offsets[:, size])
        offsets = offsets_holder.view(torch.int64).view(count, size + 1)
        bounds = ends[::size].tolist()
        return [(RaggedBatch(holder[bounds[j] : bounds[j + 1]], offsets[j]), size) for j in range(count)]

    def _add_span(self, span: _Span) -> list:
        """The batches of a window whose rows are in order in an arena: views of its rows, and of the
        rows before them where the batch began in the window before (one span of the arena)."""
        first, n, batches = span.first, span.n, []
        drop = min(self.skip, n)
        self.skip -= drop
        first, n = first + drop, n - drop
        if not n:
            return batches
        if self.carried:
            pending = self.carry[-1] if len(self.carry) == 1 and isinstance(self.carry[-1], _Span) else None
            take = min(self.size - self.carried, n)
            if pending is not None and pending.arena is span.arena and pending.first + pending.n == first:
                self.carry = [_Span(span.arena, pending.first, pending.n + take)]  # on into this window
            else:
                self.carry.append(_Span(span.arena, first, take))
            self.carried += take
            first, n = first + take, n - take
            if self.carried == self.size:
                batches.append(self._join())
        while n >= self.size:
            batches.append((span.arena.span(first, first + self.size), self.size))
            first, n = first + self.size, n - self.size
        if n:
            self.carry, self.carried = [_Span(span.arena, first, n)], n
        return batches

    def finish(self):
        if self.carried and not self.reader.drop_last:
            yield from self._groups([self._join()])

    def _groups(self, batches):
        """The batches in groups: the epoch's first alone, then up to GROUP_BYTES each."""
        group, group_bytes = [], 0
        for tensors, count in batches:
            group.append((tensors, count))
            group_bytes += _nbytes(tensors)
            if self.first or group_bytes >= GROUP_BYTES:
                yield group, sum(c for _, c in group)
                group, group_bytes, self.first = [], 0, False
        if group:
            yield group, sum(c for _, c in group)

    def _join(self):
        pieces, count = self.carry, self.carried
        self.carry, self.carried = [], 0
        fixed = self.reader.record_bytes
        if len(pieces) == 1 and isinstance(pieces[0], _Span):  # one span of an arena: a view
            span = pieces[0]
            return span.arena.span(span.first, span.first + span.n), count
        if fixed:
            batch = Batch(count, count * fixed, self.allocate)
            out = batch.holder[: count * fixed].view(count, fixed)
            at = 0
            for piece in pieces:
                if isinstance(piece, _Span):
                    rows = piece.arena.array[piece.first * fixed : (piece.first + piece.n) * fixed]
                    out[at : at + piece.n].copy_(_torch().from_numpy(rows).view(piece.n, fixed))
                    at += piece.n
                elif isinstance(piece, tuple):  # rows of a window: memcpy each (index_select: 1 GB/s)
                    window, rows = piece
                    batch.count, batch.nbytes = at, at * fixed
                    gather(batch, window, rows)
                    at += len(rows)
                else:
                    out[at : at + piece.shape[0]].copy_(piece)
                    at += piece.shape[0]
            return out, count
        nbytes = sum(int(_lengths(w)[idx].sum()) for w, idx in pieces)
        batch = Batch(count, nbytes, self.allocate)
        for window, idx in pieces:
            gather(batch, window, idx)
        return self.reader._tensors(batch), count


def with_slack(nbytes: int) -> int:
    """``nbytes`` and an eighth: what a shuffle window's buffer is sized to, so that the record that
    crosses its byte bound still fits without doubling the buffer (fresh memory and a copy of it)."""
    return nbytes + nbytes // 8


class _Window(Batch):
    """A shuffle window of records of any size being read: it grows as a batch does, but to no more than
    its byte bound and an eighth (``with_slack``) where its records fit there."""

    def __init__(self, size: int, capacity: int, allocate, limit: int):
        super().__init__(size, capacity, allocate)
        self.cap = with_slack(limit)

    def grow(self, need: int, keep: int) -> None:
        if need > self.cap:
            super().grow(need, keep)
            return
        size = max(need, 2 * keep)
        if self.count:
            size = max(size, keep // self.count * self.size + keep // 8)
        holder, data = self._allocate(min(size, self.cap))
        data[:keep] = self.data[:keep]
        self.holder, self.data = holder, data


class _HeadOf:
    """The stream head of a shuffled epoch, fed each window as it is read (in stream order)."""

    def __init__(self, reader: RecordBatches, skip: int):
        self.reader, self.skip, self.head = reader, skip, StreamHead()
        self.noted = False

    def feed(self, window: Batch | None, end: bool = False) -> None:
        if not self.noted and (window is not None or end):
            self.reader._feed_head(self.head, window, self.skip, end)
            self.noted = self.head.done or end


class _Span(NamedTuple):
    """Rows ``first .. first + n`` of an arena, records in their order."""

    arena: _Arena
    first: int
    n: int


def _torch():
    import torch

    return torch


def _lengths(window: Batch):
    """The window's record lengths (worked out once a window)."""
    lengths = getattr(window, "lengths", None)
    if lengths is None or len(lengths) != window.count:
        offsets = window.offsets[: window.count + 1]
        lengths = window.lengths = offsets[1:] - offsets[:-1]
    return lengths


def _nbytes(tensors) -> int:
    if isinstance(tensors, RaggedBatch):
        return int(tensors.data.numel())
    return int(tensors.numel())


def _plain_array(nbytes: int, huge_pages: bool = False):
    """An uninitialised uint8 array of ``nbytes``; from PLAIN_PAGES_FROM over an anonymous map of plain
    pages, populated when mapped (one call, not a page fault per 4 KiB: a fresh process's 150 KB-record
    epoch read at 0.71-0.75 of the raw pipe so, at 0.68-0.70 faulting)."""
    if nbytes < PLAIN_PAGES_FROM:
        return np.empty(nbytes, dtype=np.uint8)
    if huge_pages and hasattr(mmap, "MADV_HUGEPAGE"):
        area = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        area.madvise(mmap.MADV_HUGEPAGE)
        array = np.frombuffer(area, dtype=np.uint8)
        array[::4096] = 0  # faulted in now, in huge pages where the kernel has them
        return array
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=flags), dtype=np.uint8)


class RecordBatches(PipeBatches):
    """Iterable over batches of raw records of one channel; every ``iter()`` reads the next epoch.

    ``job``, ``role``, ``record_format``, ``drop_last``, ``prefetch``, ``pin_memory``, ``device``,
    ``timeout``, ``max_corrupted_records_to_skip``, ``max_record_bytes`` and ``config`` are
    ``PipeBatches``'.
    ``record_bytes``: every record is this long, and batches are ``[n, record_bytes]`` uint8 tensors
    (a record of another length is a ``RecordFormatError``); None: ``RaggedBatch(data, offsets)``.
    ``compiled``: None uses the compiled reader where it is built (``compiled_available()``), False the
    Python framers, True requires the compiled reader.
    ``shuffle``, ``set_epoch``, ``state_dict`` and ``load_state_dict`` are ``PipeBatches``'; the window's
    order is the same as theirs. Records of one size are put straight into the rows the window's order
    gives them (one copy each, as unshuffled); records of any size are gathered out of the window in
    its order (a second copy, in C, while a thread of its own reads the next window), a group of
    batches at a time into one buffer, each batch a view of it. A shuffled reader of records of any size
    holds three windows (``ShuffleWindow.bytes`` each, plus an eighth): the one being read, the one read
    ahead, the one being gathered from.
    """

    def __init__(
        self,
        job,
        batch_size: int,
        *,
        record_bytes: int | None = None,
        role: str = "train",
        record_format: str | None = None,
        drop_last: bool = False,
        prefetch: int = DEFAULT_PREFETCH,
        pin_memory: bool | None = None,
        timeout: float = DEFAULT_FIFO_TIMEOUT,
        max_corrupted_records_to_skip: int = 0,
        max_record_bytes: int | None = None,
        compiled: bool | None = None,
        device=None,
        config=None,
        shuffle: ShuffleWindow | int | None = None,
    ):
        if record_bytes is not None and (isinstance(record_bytes, bool) or int(record_bytes) < 1):
            raise ValueError(f"record_bytes={record_bytes!r}: give a whole number >= 1, or None")
        super().__init__(
            job,
            batch_size,
            role=role,
            record_format=record_format,
            drop_last=drop_last,
            prefetch=prefetch,
            pin_memory=pin_memory,
            timeout=timeout,
            max_corrupted_records_to_skip=max_corrupted_records_to_skip,
            max_record_bytes=max_record_bytes,
            device=device,
            config=config,
            shuffle=shuffle,
        )
        self.record_bytes = None if record_bytes is None else int(record_bytes)
        if compiled and not compiled_available():
            raise RuntimeError(
                "compiled=True, but the compiled batch reader (sagemaker_dist.runtime.framing."
                "_record_reader) is not built: pip install -e . needs a C compiler"
            )
        self.compiled = compiled_available() if compiled is None else bool(compiled)
        self._buffers: dict = {}  # pinned or not (and windows' apart) -> the buffers, kept over epochs
        self._window_capacity = FIRST_BATCH_BYTES  # a shuffle window's buffer of records of any size

    def _epoch(self, *args):
        # The reader thread hands over groups of (batch, records) pairs; they go on one by one.
        with contextlib.closing(super()._epoch(*args)) as groups:
            for group, _ in groups:
                yield from group

    def _allocator(self, pinned: bool, capacity: int):
        allocate = self._buffers.get(pinned)
        if allocate is None:  # data and offsets per batch, for the groups in flight
            keep = 2 * (self.prefetch + POOL_EXTRA) * max(1, GROUP_BYTES // max(capacity, 1))
            allocate = self._buffers[pinned] = _Buffers(pinned, min(keep, 256))
        return allocate

    def _fills(self, epoch: int, streams: list):
        """``(fill, ready)`` per stream of the epoch, in turn (each stream open while it is its turn)."""
        from sagemaker_dist.runtime.framing import make_framer

        fixed = self.record_bytes or 0
        for stream in streams:
            limit = self.max_record_bytes
            framer = make_framer(self.record_format, self.channel, epoch, self.max_skip, limit)
            with stream() as reader:
                fill = StreamFill(reader, framer, fixed, compiled=self.compiled, chunk_size=self.chunk_size)
                try:
                    yield fill, getattr(reader, "ready", None)  # a FIFO's; a file always has its bytes
                finally:
                    fill.close()
            framer.warn_skipped()

    def _batches(self, epoch: int, streams: list, skip: int = 0):
        """``(group, records in it)`` of one epoch's streams, made in the reader thread: a group is a list
        of ``(batch, records in it)``, the epoch's first batch alone, then up to GROUP_BYTES while the
        stream has bytes waiting; a batch may span two files. The first ``skip`` records are read and
        dropped."""
        import torch

        pinned = torch.cuda.is_available() if self.pin_memory is None else bool(self.pin_memory)
        if self.shuffle is not None:
            yield from self._shuffled_batches(epoch, streams, skip, pinned)
            return
        fixed = self.record_bytes or 0
        capacity = self.batch_size * fixed if fixed else FIRST_BATCH_BYTES
        allocate = self._allocator(pinned, capacity)
        group: list = []
        group_bytes, first = 0, True
        batch = None
        head, dropped = StreamHead(), skip
        fills = self._fills(epoch, streams)
        try:
            for fill, ready in fills:
                while True:
                    if group and (first or group_bytes >= GROUP_BYTES or (ready and not ready(0))):
                        yield group, sum(count for _, count in group)
                        group, group_bytes, first = [], 0, False
                    if batch is None:
                        size = min(skip, self.batch_size) if skip else self.batch_size
                        batch = Batch(size, capacity, allocate)
                    if not fill.fill(batch):
                        break
                    if not head.done:
                        self._feed_head(head, batch, dropped)
                    if not fixed:
                        capacity = batch.nbytes + batch.nbytes // 8
                    if skip:  # records trained before a stop: read, dropped (their buffer reused)
                        skip -= batch.count
                    else:
                        group.append((self._tensors(batch), batch.count))
                        group_bytes += batch.nbytes
                    batch = None
        finally:
            fills.close()
        if not head.done:
            self._feed_head(head, batch, dropped, end=True)
        if batch is not None and batch.count and not skip and not self.drop_last:
            group.append((self._tensors(batch), batch.count))
        if group:
            yield group, sum(count for _, count in group)

    def _shuffled_batches(self, epoch: int, streams: list, skip: int, pinned: bool):
        """The groups of a shuffled epoch: each window read whole, then cut into batches in its order
        (the first ``skip`` records dropped)."""
        order = EpochOrder(self.shuffle, self._stream_key, epoch)
        fixed = self.record_bytes or 0
        allocate = self._allocator(pinned, self.batch_size * fixed if fixed else FIRST_BATCH_BYTES)
        cut = _Cutter(self, allocate, skip)
        head = _HeadOf(self, skip)
        if fixed:
            windows = self._fixed_windows(epoch, streams, order, pinned, head)
        else:
            # the windows' buffers, the reader's own: the one being filled, the one read ahead, the one
            # being gathered from, the one the carried batch is gathered from
            windows_pool = self._buffers.get("window")
            if windows_pool is None:
                windows_pool = self._buffers["window"] = _Buffers(
                    False, 2 * WINDOWS_KEPT, True, tensors=False
                )
            # the gathered batches' buffers (data and offsets of a group's worth each): the groups in flight
            gathered = self._buffers.get(("gathered", pinned))
            if gathered is None:
                keep = 2 * (self.prefetch + POOL_EXTRA)
                gathered = self._buffers[("gathered", pinned)] = _Buffers(pinned, keep)
            cut.gathered = gathered
            # The next window is read (a thread of its own, in C with the GIL released) while this one is
            # gathered into batches: the FIFO is drained while the records are copied out of the window.
            windows = read_ahead(
                self._ragged_windows(epoch, streams, order, windows_pool, head),
                1,
                f"{self.channel} windows",
                reader=type(self).__name__,
            )
        try:
            for window in windows:
                yield from cut.add(window)
        finally:
            windows.close()
        yield from cut.finish()

    def _fixed_windows(self, epoch: int, streams: list, order: EpochOrder, pinned: bool, head):
        """Each window of records of one size as a ``_Span`` of an arena, its rows in its order: every
        record read straight into its row; a window the stream's end cut short keeps the rows that came
        (``(window, rows)``, gathered batch by batch)."""
        fixed = self.record_bytes
        size = order.fixed_size(fixed)
        window = arena = None
        for fill, _ in self._fills(epoch, streams):
            while True:
                if window is None:
                    arena, start = self._arena(pinned, size)
                    window = arena.window(start, size)
                    window.rows = inverse(order.order(size))
                if not fill.fill(window):
                    break
                head.feed(window)
                yield _Span(arena, start, size)
                window = None
        head.feed(window, end=True)
        if window is not None and window.count:  # its records' rows, in order: gathered batch by batch
            rows = np.sort(window.rows[: window.count])
            window.count = size  # every row a record of record_bytes, for gather
            window.offsets[: size + 1] = np.arange(0, (size + 1) * fixed, fixed, dtype=np.int64)
            yield window, rows

    def _arena(self, pinned: bool, size: int) -> tuple[_Arena, int]:
        """The arena the next window of ``size`` rows goes into, and its first row there (a new arena
        where the reader's holds rows still in use)."""
        key = ("arena", pinned)
        arena = self._buffers.get(key)
        start = arena.place(size) if arena is not None and arena.row_bytes == self.record_bytes else None
        if start is None:
            rows = ARENA_WINDOWS * size + self.batch_size
            huge = self.record_bytes < HUGE_PAGES_BELOW
            arena = self._buffers[key] = _Arena(rows, self.record_bytes, pinned, huge)
            start = arena.place(size)
        return arena, start

    def _ragged_windows(self, epoch: int, streams: list, order: EpochOrder, allocate, head):
        """Each window of records of any size as ``(window, order)``: the records as they came, and the
        order they go out in. A window's buffer starts at the size the last whole one needed (kept over
        epochs): growing it again each epoch took fresh memory for every step."""
        window = None
        limit = self.shuffle.bytes
        for fill, _ in self._fills(epoch, streams):
            while True:
                if window is None:
                    window = _Window(order.window.records, self._window_capacity, allocate, limit)
                if not fill.fill(window, stop_bytes=limit):
                    break
                head.feed(window)
                self._window_capacity = min(with_slack(window.nbytes), with_slack(limit))
                allocate.huge_pages = window.nbytes < HUGE_PAGES_BELOW * window.count  # by the mean record
                yield window, order.order(window.count)
                window = None
        head.feed(window, end=True)
        if window is not None and window.count:
            yield window, order.order(window.count)

    def _feed_head(self, head: StreamHead, batch: Batch | None, skip: int, end: bool = False) -> None:
        """Add ``batch``'s records, in stream order, to the stream's head; note it once known."""
        if batch is not None:
            fixed, rows, data = self.record_bytes, batch.rows, batch.data
            for i in range(min(batch.count, HEAD_RECORDS - head.count)):
                if rows is not None:  # a window of records of one size: record i is at its row
                    row = int(rows[i])
                    head.add(data[row * fixed : (row + 1) * fixed])
                else:
                    head.add(data[int(batch.offsets[i]) : int(batch.offsets[i + 1])])
        if head.done or end:
            self._note_head(head, skip)

    def _tensors(self, batch: Batch):
        """The batch as a [n, record_bytes] tensor, or a RaggedBatch, over its own buffers (no copy)."""
        if self.record_bytes:
            return batch.holder[: batch.nbytes].view(batch.count, self.record_bytes)
        import torch

        offsets = batch.offsets_holder[: 8 * (batch.count + 1)].view(torch.int64)
        return RaggedBatch(batch.holder[: batch.nbytes], offsets)
