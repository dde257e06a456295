"""The memory ``RecordBatches``' batches and shuffle windows live in: a pool of buffers reused once no
tensor holds them (``BufferPool``, its lent views tracked by ``Slot``), arenas that hold shuffle windows
of records of one size one after another (``Arena``, its windows' rows handed out as ``ArenaSpan``
views), a window of records of any size bounded by its bytes (``BoundedWindow``), and arrays of plain
or huge pages (``plain_array``). PyTorch loads only where a tensor is made."""

from __future__ import annotations

import mmap
import threading
import weakref
from collections import deque
from typing import NamedTuple

import numpy as np

from sagemaker_dist.runtime.framing.batch_fill import Batch

# numpy asks the kernel for transparent huge pages for arrays from 4 MiB. Where THP's defrag setting is
# "madvise" (the usual default), the first touch of each 2 MiB then waits for memory compaction: a fresh
# process read a 150 KB-record epoch into such arrays at 0.66x the speed of plain pages. Pool arrays this
# large are anonymous maps of plain pages instead.
PLAIN_PAGES_FROM = 4 << 20


class Slot:
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


class BufferPool:
    """Allocates the batches' tensors: pinned (torch's caching host allocator reuses them), or from a
    pool of arrays reused once nothing uses them any more (no fresh pages to fault in per batch).
    ``tensors=False``: numpy arrays only (buffers the reader keeps to itself, never pinned).
    ``same_size``: every buffer is as large as the largest asked for so far, so any free one serves any
    request (requests that vary by a batch or two: no fresh memory once the pool holds enough)."""

    def __init__(
        self, pinned: bool, keep: int, huge_pages: bool = False, tensors: bool = True, same_size: bool = False
    ):
        self.pinned = pinned and tensors
        self.tensors = tensors
        self.keep = keep
        self.huge_pages = huge_pages
        self.same_size = same_size
        self.largest = 0
        self.pool: list[Slot] = []
        self.lock = threading.Lock()  # an epoch left early may still be filling while the next one starts

    def __call__(self, nbytes: int):
        if self.same_size:
            nbytes = self.largest = max(nbytes, self.largest)
        if self.pinned:
            torch = torch_module()
            tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            return tensor, tensor.numpy()
        with self.lock:
            for slot in self.pool:
                if not slot.in_use and nbytes <= len(slot.array) <= 2 * nbytes:
                    break
            else:
                slot = Slot(plain_array(nbytes, self.huge_pages))
                self.pool.append(slot)
                if len(self.pool) > self.keep:
                    self.pool.pop(0)  # its memory goes once its views do
            view = slot.lend(0, nbytes)
        return (torch_module().from_numpy(view) if self.tensors else view), view


class Arena:
    """Shuffle windows of records of one size, placed one after another in one buffer, so that a batch
    across two windows is one span of rows: a view, not a copy. A window that does not fit before the
    end goes on there for as many whole batches as fit (into ``batch_rows`` rows kept past the end: the
    batch the window before began, completed) and from the start for the rest, so no batch is cut in two
    (only one across two arenas is copied). Every span handed out is a tensor of its own over a numpy
    view of its rows, tracked as a lent view of the arena (``Slot``), and so is a window being read into
    (``reserve``); a window is only placed over rows none of them covers (``place`` says None otherwise:
    the reader takes a new arena).

    Windows go round the first ``lean_rows`` rows (what a loop that keeps up with the stream holds) until
    one finds its rows held; then round all ``rows``. Only the rows in use are mapped: fresh memory is
    what a shuffled first epoch pays for (the kernel clears it), and the rows a slower loop needs cost
    more than reading a 512 MiB epoch of 150 KB records."""

    def __init__(
        self,
        rows: int,
        row_bytes: int,
        pinned: bool,
        huge_pages: bool,
        lean_rows: int | None = None,
        batch_rows: int = 0,
    ):
        self.rows, self.row_bytes, self.batch_rows = int(rows), int(row_bytes), int(batch_rows)
        self.limit = self.rows if pinned or lean_rows is None else min(int(lean_rows), self.rows)
        nbytes = (self.rows + self.batch_rows) * self.row_bytes
        if pinned:
            torch = torch_module()
            self._tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            self.array = self._tensor.numpy()
        else:
            self.array = plain_array(nbytes, huge_pages, (self.limit + self.batch_rows) * self.row_bytes)
        self.end = 0  # the row after the last window placed
        self.handed: deque = deque()  # (first row, end row, the Slot its view was lent by)

    def place(self, n: int, head: int | None = None) -> list[tuple[int, int]] | None:
        """Where a window of ``n`` rows goes, as ``(first row, rows)`` pieces in the window's order: after
        the last window; where it does not fit before the end, its first ``head`` rows (those that
        complete the batch carried into it) and whole batches after them as far as the rows kept past
        the end, the rest from the start; all from the start where ``head`` is None (batches not known)."""
        end = self.end
        if end + n <= self.limit:
            pieces = [(end, n)]
        else:
            room = self.limit + self.batch_rows - end
            cut = 0
            if head is not None and self.batch_rows and head <= room:
                cut = min(n, head + (room - head) // self.batch_rows * self.batch_rows)
            pieces = [(end, cut), (0, n - cut)] if 0 < cut < n else [(end, n)] if cut == n else [(0, n)]
        self.handed = deque(h for h in self.handed if h[2].in_use)
        held = any(a < first + k and first < b for first, k in pieces for a, b, _ in self.handed)
        if n > self.limit or held:
            if self.limit < self.rows:  # held: the rest of the rows, after the last window
                rb = self.row_bytes
                populate(self.array, (self.limit + self.batch_rows) * rb, (self.rows + self.batch_rows) * rb)
                self.limit = self.rows
                return self.place(n, head)
            return None
        self.end = pieces[-1][0] + pieces[-1][1]
        return pieces

    def reserve(self, pieces: list[tuple[int, int]]) -> Slot:
        """Holds ``pieces`` (a window being read into) until the Slot's ``in_use`` is set False."""
        slot = Slot(self.array)
        slot.in_use = True
        self.handed.extend((first, first + n, slot) for first, n in pieces)
        return slot

    def window(self, pieces: list[tuple[int, int]], places: np.ndarray) -> Batch:
        """A batch to read a window into, straight into its rows: record i, at ``places[i]`` in the
        window's order, goes to that place's row in ``pieces`` (``rows``, from the batch's first)."""
        rb = self.row_bytes
        base = min(first for first, _ in pieces)
        top = max(first + k for first, k in pieces)
        batch = Batch.over(self, self.array[base * rb : top * rb], len(places))
        (first, k), *rest = pieces
        rows = places + (first - base)
        if rest:
            rows = np.where(places < k, rows, places - k + (rest[0][0] - base))
        batch.rows = rows
        return batch

    def span(self, first: int, end: int):
        """Rows ``first .. end`` as a ``[end - first, row_bytes]`` tensor, tracked while it lives."""
        slot = Slot(self.array)
        view = slot.lend(first * self.row_bytes, end * self.row_bytes)
        self.handed.append((first, end, slot))
        return torch_module().from_numpy(view).view(end - first, self.row_bytes)


def with_slack(nbytes: int) -> int:
    """``nbytes`` and an eighth: what a shuffle window's buffer is sized to, so that the record that
    crosses its byte bound still fits without doubling the buffer (fresh memory and a copy of it)."""
    return nbytes + nbytes // 8


class BoundedWindow(Batch):
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


class ArenaSpan(NamedTuple):
    """Rows ``first .. first + n`` of an arena, records in their order."""

    arena: Arena
    first: int
    n: int


def torch_module():
    import torch

    return torch


def plain_array(nbytes: int, huge_pages: bool = False, populate_bytes: int | None = None):
    """An uninitialised uint8 array of ``nbytes``; from PLAIN_PAGES_FROM over an anonymous map, its first
    ``populate_bytes`` (all by default) populated when mapped (one call, not a page fault per 4 KiB: a
    fresh process's 150 KB-record epoch read at 0.71-0.75 of the raw pipe so, at 0.68-0.70 faulting)."""
    if nbytes < PLAIN_PAGES_FROM:
        return np.empty(nbytes, dtype=np.uint8)
    populate_bytes = nbytes if populate_bytes is None else min(populate_bytes, nbytes)
    whole = populate_bytes == nbytes and not huge_pages
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (getattr(mmap, "MAP_POPULATE", 0) if whole else 0)
    area = mmap.mmap(-1, nbytes, flags=flags)
    if huge_pages and hasattr(mmap, "MADV_HUGEPAGE"):
        area.madvise(mmap.MADV_HUGEPAGE)  # then populated in huge pages where the kernel has them
    array = np.frombuffer(area, dtype=np.uint8)
    if not whole:
        populate(array, 0, populate_bytes)
    return array


# madvise(2)'s MADV_POPULATE_WRITE (Linux 5.14; Python names it from 3.13): pages mapped writable in one call
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


def populate(array: np.ndarray, start: int, end: int) -> None:
    """Map bytes ``start .. end`` of ``plain_array``'s ``array``, never written yet, now rather than a
    fault at a time (first writes: a kernel without MADV_POPULATE_WRITE)."""
    area = getattr(array.base, "obj", array.base)  # np.frombuffer's base: a memoryview of the map
    if isinstance(area, mmap.mmap) and end > start:
        page = start - start % mmap.PAGESIZE
        try:
            area.madvise(MADV_POPULATE_WRITE, page, end - page)
            return
        except OSError:
            pass
    array[start : end : mmap.PAGESIZE] = 0
