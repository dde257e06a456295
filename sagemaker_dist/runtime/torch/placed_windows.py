"""Shuffle windows of records of any size read with each record straight into its batch.

A window's record count is fixed when it starts (``framing.shuffle``), so its order is known before its
records come, and so is the batch each record goes to. ``WindowPlacer`` gives every batch a window starts
a region of one buffer (room for its records at the last window's mean size, and an eighth), and the
compiled reader (``StreamFill.place``) reads each record into its batch's region, after the batch's records
that came before it: a batch's records are in stream order; which records share a batch is the window's
order. The batch a window leaves open is completed in its region by the next window. Each region is then
a batch as it is, a view of its buffer: every record is copied once, as unshuffled, where the window
before it copied it twice (read into the window, then gathered into its batch).

A window its byte cap or the stream's end cuts short has the order of the records that came, not the
one its batches were placed for: ``BatchCutter`` gathers its batches from where its records lie
(``settle``). A record that does not fit its region sends its window the usual way (``spill``): the
records so far, and the bytes of that one, are copied into a window of the usual kind and read on.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from sagemaker_dist.runtime.framing.batch_fill import Batch, gather
from sagemaker_dist.runtime.framing.shuffle import EpochOrder
from sagemaker_dist.runtime.torch.batch_buffers import torch_module
from sagemaker_dist.runtime.torch.batch_cutter import RaggedBatch

# Windows of records this long or longer (by the last window's mean) are placed. Shorter ones are read
# the usual way: at 1 KB, a window's Python work per batch (its region, its view) cost more than the
# copy it saves (a first version read them placed at 0.77 of the unshuffled speed; read into the window
# and gathered, 0.96-1.02: docs/benchmarks.md)
PLACE_FROM = 16 << 10


class Spans:
    """A placed window's records in one of its buffers, as ``gather`` takes a window: record i is
    ``data[offsets[2i]:offsets[2i + 1]]``, so an order names record i as ``2i``."""

    def __init__(self, data: np.ndarray, spans: np.ndarray, count: int, nbytes: int):
        self.data, self.offsets, self.count, self.nbytes = data, spans, max(2 * count - 1, 0), nbytes


class SplitSpans(Spans):
    """A placed window's records in its own buffer and, those of the batch carried into it, in the
    window before's (``carry``): ``gather_into`` takes each run of an order from its buffer."""

    def __init__(self, data, carry, spans, count: int, nbytes: int, in_carry: np.ndarray):
        super().__init__(data, spans, count, nbytes)
        self.parts = (Spans(data, spans, count, nbytes), Spans(carry, spans, count, nbytes))
        self.in_carry = np.repeat(in_carry, 2)  # by the order's names (2i)

    def gather_into(self, dst, order: np.ndarray) -> None:
        part = self.in_carry[order]
        cuts = [0, *(np.flatnonzero(part[1:] != part[:-1]) + 1).tolist(), len(order)]
        for a, b in zip(cuts, cuts[1:]):
            if a < b:
                gather(dst, self.parts[int(part[a])], order[a:b])


class Views(NamedTuple):
    """A placed window's batches that are views of its buffers: the batch carried into it, completed in
    its region of the window before's buffer (None where it is gathered or still open), and its whole
    batches, in order. ``carried_from``: the records it put in that region (None: all in its own buffer)."""

    carried: Any
    whole: list
    carried_from: Spans | None


class Tail(NamedTuple):
    """The batch a placed window leaves open, all of its records so far in one region: the region's
    buffer, first byte, next free byte and end, and its records' starts."""

    holder: Any
    data: np.ndarray
    start: int
    free: int
    end: int
    starts: np.ndarray


class Placing:
    """One window being placed: ``t`` records, record i to region ``slots[i]``; ``bounds``: each region's
    buffer (0: ``data``, 1: the open batch's, ``carry``), next free byte and end, as ``Reader.place`` takes
    them; ``firsts``: each region's first byte; ``layout``: the records, first out first."""

    def __init__(self, t: int, carried: int, layout, slots, bounds, firsts, carry: Tail | None):
        self.t, self.carried, self.layout, self.slots = t, carried, layout, slots
        self.bounds, self.firsts, self.carry = bounds, firsts, carry
        self.spans = np.zeros(2 * t, dtype=np.int64)
        self.state = np.array([0, 0, -1], dtype=np.int64)  # placed, their bytes, the record under way
        self.holder = self.data = None

    @property
    def count(self) -> int:
        return int(self.state[0])

    @property
    def nbytes(self) -> int:
        return int(self.state[1])

    def buffer_of(self, region: int) -> np.ndarray:
        return self.carry.data if self.bounds[region, 0] == 1 else self.data


class WindowPlacer:
    """Places a shuffled epoch's windows of records of any size into their batches' regions (after its
    first, whose count its first record sets). ``buffers(nbytes)`` and ``offsets(nbytes)`` allocate
    ``(tensor, numpy view)`` pairs; ``skip``: the records the epoch drops first (a window with any of
    them is read the usual way)."""

    def __init__(self, size: int, order: EpochOrder, skip: int, buffers, offsets):
        self.size, self.order, self.skip = int(size), order, int(skip)
        self.buffers, self.offsets = buffers, offsets
        self.before = 0  # records of the epoch's windows so far
        self.mean = 0  # the last window's mean record
        self.tail: Tail | None = None

    def done(self, count: int, nbytes: int, tail: Tail | None = None) -> None:
        """A window of ``count`` records and ``nbytes`` bytes went on; ``tail``: the batch it left open
        where all its records are in one region."""
        self.before += count
        self.mean = max(nbytes // max(count, 1), 1)
        self.tail = tail

    def start(self, first: np.ndarray | None = None) -> Placing | None:
        """The next window's placing; None where it is read the usual way (a window with records to
        drop). ``first``: the window's first record, read already (the epoch's first window, whose count
        it set), placed now."""
        t = self.order.records
        mean = self.mean if first is None else max(len(first), 1)
        if t is None or self.before < self.skip or mean < PLACE_FROM:
            return None
        size = self.size
        carried = (self.before - self.skip) % size
        order = self.order.ahead(t)
        slots = np.empty(t, dtype=np.int64)
        slots[order] = (np.arange(t, dtype=np.int64) + carried) // size
        regions = int(slots[order[-1]]) + 1
        members = np.bincount(slots, minlength=regions)
        members[-1] = size  # every batch's region has room for a whole batch (the last one stays open)
        if carried:
            members[0] = size - carried
        room = members * mean + members * mean // 8 + 2 * mean
        tail = self.tail if carried and self.tail is not None and len(self.tail.starts) == carried else None
        bounds = np.zeros((regions, 3), dtype=np.int64)
        own = 0  # the first region in this window's buffer
        if tail is not None:  # the batch carried in, completed in its region of the window before's buffer
            bounds[0] = (1, tail.free, tail.end)
            own = 1
        ends = np.cumsum(room[own:])
        bounds[own:, 1] = ends - room[own:]
        bounds[own:, 2] = ends
        firsts = bounds[:, 1].copy()
        if tail is not None:
            firsts[0] = tail.start
        # each batch's records in stream order: by batch, then as they come (a radix sort where it can)
        layout = np.argsort(slots.astype(np.uint16) if regions < 1 << 16 else slots, kind="stable")
        placing = Placing(t, carried, layout, slots, bounds, firsts, tail)
        placing.holder, placing.data = self.buffers(max(int(ends[-1]) if len(ends) else 0, 1))
        if first is not None:  # into its region, as Reader.place would have put it
            region = placing.bounds[slots[0]]
            at, n = int(region[1]), len(first)
            placing.buffer_of(int(slots[0]))[at : at + n] = first
            placing.spans[:2] = (at, at + n)
            region[1] = at + n
            placing.state[:2] = (1, n)
        return placing

    def finish(self, placing: Placing) -> tuple[Spans, np.ndarray, Views]:
        """A window placed whole: ``(its records, their order, its batches that are views)``, as
        ``BatchCutter.add`` takes it; the window's order moves on."""
        size, t, carried, layout = self.size, placing.t, placing.carried, placing.layout
        bounds, firsts, carry = placing.bounds, placing.firsts, placing.carry
        starts = placing.spans[0::2]
        self.order.passed(t, placing.nbytes)
        views = []  # (holder, first byte, end, its records' starts)
        tail, region, i, completed = None, 0, 0, False
        if carried:
            i = min(size - carried, t)
            if carry is not None:
                held = np.concatenate([carry.starts, starts[layout[:i]]])
                completed = carried + i == size
                if completed:
                    views.append((carry.holder, carry.start, int(bounds[0, 1]), held))
                else:
                    tail = carry._replace(free=int(bounds[0, 1]), starts=held)
            region = 1
        while i + size <= t:
            first, end = int(firsts[region]), int(bounds[region, 1])
            views.append((placing.holder, first, end, starts[layout[i : i + size]]))
            region, i = region + 1, i + size
        if i < t:
            first, free, end = int(firsts[region]), int(bounds[region, 1]), int(bounds[region, 2])
            tail = Tail(placing.holder, placing.data, first, free, end, starts[layout[i:]])
        batches = self._views(views)
        carried_view = batches.pop(0) if completed else None
        self.done(t, placing.nbytes, tail)
        window = Spans(placing.data, placing.spans, t, placing.nbytes)
        carried_from = Spans(carry.data, placing.spans, t, placing.nbytes) if carry is not None else None
        return window, 2 * layout, Views(carried_view, batches, carried_from)

    def settle(self, placing: Placing) -> tuple[Spans, np.ndarray]:
        """A window cut short (by its byte cap or the stream's end) as ``(its records, their order)``:
        the order of the records that came, its batches gathered from where they were placed."""
        n, nbytes = placing.count, placing.nbytes
        order = self.order.order(n, nbytes)
        self.done(n, nbytes)
        if placing.carry is None:
            return Spans(placing.data, placing.spans, n, nbytes), 2 * order
        in_carry = placing.bounds[placing.slots[:n], 0] == 1
        window = SplitSpans(placing.data, placing.carry.data, placing.spans, n, nbytes, in_carry)
        return window, 2 * order

    def first_records(self, placing: Placing, count: int) -> Batch:
        """The window's first ``count`` records (at most), in stream order, copied into a batch of their own
        (the stream's head is their digest)."""
        spans, n = placing.spans, min(count, placing.count)
        out = Batch(max(n, 1), int((spans[1 : 2 * n : 2] - spans[0 : 2 * n : 2]).sum()) or 1)
        self._copy_placed(placing, out, n)
        return out

    def _views(self, views: list) -> list:
        """Each ``(holder, first byte, end, its records' starts)`` as a ``RaggedBatch`` view, their offsets
        in one buffer."""
        if not views:
            return []
        torch, size = torch_module(), self.size
        holder, offsets = self.offsets(8 * len(views) * (size + 1))
        offsets = offsets.view(np.int64).reshape(len(views), size + 1)
        typed = holder.view(torch.int64).view(len(views), size + 1)
        out = []
        for row, (data, first, end, record_starts) in enumerate(views):
            np.subtract(record_starts, first, out=offsets[row, :size])
            offsets[row, size] = end - first
            out.append(RaggedBatch(data[first:end], typed[row]))
        return out

    def spill(self, placing: Placing, window, so_far: tuple[int, int] | None) -> None:
        """The records placed so far, in stream order, into ``window`` (a ``Batch``), and the bytes of the
        record under way (``so_far``: ``place``'s (need, end)) after them, for ``fill`` to go on with."""
        self._copy_placed(placing, window, placing.count)
        if so_far is not None:
            need, end = so_far
            start, at = int(placing.state[2]), window.nbytes
            if at + need - start > len(window.data):
                window.grow(at + need - start, at)
            src = placing.buffer_of(int(placing.slots[placing.count]))
            window.data[at : at + end - start] = src[start:end]

    @staticmethod
    def _copy_placed(placing: Placing, window: Batch, count: int) -> None:
        """The window's first ``count`` placed records, in stream order, appended to ``window`` (grown
        where they do not fit)."""
        spans = placing.spans
        for i in range(count):
            src = placing.buffer_of(int(placing.slots[i]))
            a, b = int(spans[2 * i]), int(spans[2 * i + 1])
            at = window.nbytes
            if at + b - a > len(window.data):
                window.grow(at + b - a, at)
            window.data[at : at + b - a] = src[a:b]
            window.nbytes = at + b - a
            window.count += 1
            window.offsets[window.count] = window.nbytes
