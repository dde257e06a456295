"""A shuffled epoch's windows cut into batches in their order (``BatchCutter``), with the batch type of
records of any size (``RaggedBatch``) and a filled ``Batch`` as tensors over its own buffers
(``tensors_of``). A batch that is a span of a window is a view of it; any other is copied once."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from sagemaker_dist.runtime.framing.batch_fill import Batch, gather
from sagemaker_dist.runtime.framing.shuffle import stream_order_within_batches
from sagemaker_dist.runtime.torch.batch_buffers import ArenaSpan, torch_module

# Batches the reader thread hands to the loop at once, up to this many bytes, while the stream has bytes
# waiting: each handoff wakes the other thread and moves the GIL, once per group instead of per batch.
GROUP_BYTES = 4 << 20


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


class BatchCutter:
    """Cuts a shuffled epoch's windows into batches, in their order. A window is an ``ArenaSpan`` (records
    of one size, in their order: its batches, and one across two adjacent spans, are views of the arena)
    or ``(window, order)`` (records of any size as they came, a ``Batch``). A batch that is not a view
    (across two arenas, of records of any size) is copied into buffers of its own. Drops the first
    ``skip`` records."""

    def __init__(self, batch_size: int, record_bytes: int | None, drop_last: bool, allocate, skip: int):
        self.size, self.record_bytes, self.drop_last = int(batch_size), record_bytes, drop_last
        self.allocate, self.skip = allocate, int(skip)
        self.carry: list = []  # pieces of the next batch: ArenaSpans, or (window, order) of any size
        self.carried = 0
        self.first = True
        self.gathered = allocate  # the buffers of a window's gathered batches

    def add(self, window):
        """The groups of batches ``window`` completes: an ``ArenaSpan`` (records of one size, in their
        order) or ``(window, order)`` (records of any size as they came, a ``Batch``)."""
        if isinstance(window, ArenaSpan):
            yield from self._groups(self._add_span(window))
        else:
            yield from self._groups(self._add_ragged(*window))

    def _add_ragged(self, window, order: np.ndarray, views=None) -> list:
        """The batches of a window of records of any size, each batch's records in stream order: the one
        carried from the window before completed, then the whole batches of this one, a group's worth at
        a time gathered in one call (GIL released) into one buffer, each batch a view of it; the rest
        carried. Every record is copied once, out of the window. ``views``: a placed window's
        (``placed_windows.Views``), whose batches are views of its buffers already."""
        n, size, batches = len(order), self.size, []
        if views is None:
            order = stream_order_within_batches(order, self.skip, self.carried, size)
        i = min(self.skip, n)
        self.skip -= i
        if self.carried and i < n:
            take = min(size - self.carried, n - i)
            source = window if views is None or views.carried_from is None else views.carried_from
            self.carry.append((source, order[i : i + take]))
            self.carried += take
            i += take
            if self.carried == size:
                if views is not None and views.carried is not None:  # completed in place: a view
                    self.carry, self.carried = [], 0
                    batches.append((views.carried, size))
                else:
                    batches.append(self._join())
        if views is not None:
            batches.extend((batch, size) for batch in views.whole)
            i += len(views.whole) * size
        whole = (n - i) // size
        # a buffer per group's worth of batches (GROUP_BYTES at the window's mean record): buffers come
        # back to the pool as the loop drops each group, not once it dropped a whole window's batches
        per = max(1, GROUP_BYTES * n // max(int(record_lengths(window)[order].sum()) * size, 1))
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
        torch, size = torch_module(), self.size
        holder, data = self.gathered(int(record_lengths(window)[order].sum()))
        out = Batch.over(holder, data, len(order))
        gather_from(out, window, order)
        ends = out.offsets
        starts = ends[:-1:size]  # each batch's first byte
        offsets_holder, offsets = self.gathered(8 * count * (size + 1))
        offsets = offsets.view(np.int64).reshape(count, size + 1)
        np.subtract(ends[:-1].reshape(count, size), starts[:, None], out=offsets[:, :size])
        np.subtract(ends[size::size], starts, out=offsets[:, size])
        offsets = offsets_holder.view(torch.int64).view(count, size + 1)
        bounds = ends[::size].tolist()
        return [(RaggedBatch(holder[bounds[j] : bounds[j + 1]], offsets[j]), size) for j in range(count)]

    def _add_span(self, span: ArenaSpan) -> list:
        """The batches of a window whose rows are in order in an arena: views of its rows, and of the
        rows before them where the batch began in the window before (one span of the arena)."""
        first, n, batches = span.first, span.n, []
        drop = min(self.skip, n)
        self.skip -= drop
        first, n = first + drop, n - drop
        if not n:
            return batches
        if self.carried:
            pending = (
                self.carry[-1] if len(self.carry) == 1 and isinstance(self.carry[-1], ArenaSpan) else None
            )
            take = min(self.size - self.carried, n)
            if pending is not None and pending.arena is span.arena and pending.first + pending.n == first:
                self.carry = [ArenaSpan(span.arena, pending.first, pending.n + take)]  # on into this window
            else:
                self.carry.append(ArenaSpan(span.arena, first, take))
            self.carried += take
            first, n = first + take, n - take
            if self.carried == self.size:
                batches.append(self._join())
        while n >= self.size:
            batches.append((span.arena.span(first, first + self.size), self.size))
            first, n = first + self.size, n - self.size
        if n:
            self.carry, self.carried = [ArenaSpan(span.arena, first, n)], n
        return batches

    def finish(self):
        if self.carried and not self.drop_last:
            yield from self._groups([self._join()])

    def _groups(self, batches):
        """The batches in groups: the epoch's first alone, then up to GROUP_BYTES each."""
        group, group_bytes = [], 0
        for tensors, count in batches:
            group.append((tensors, count))
            group_bytes += tensor_nbytes(tensors)
            if self.first or group_bytes >= GROUP_BYTES:
                yield group, sum(c for _, c in group)
                group, group_bytes, self.first = [], 0, False
        if group:
            yield group, sum(c for _, c in group)

    def _join(self):
        pieces, count = self.carry, self.carried
        self.carry, self.carried = [], 0
        fixed = self.record_bytes
        if len(pieces) == 1 and isinstance(pieces[0], ArenaSpan):  # one span of an arena: a view
            span = pieces[0]
            return span.arena.span(span.first, span.first + span.n), count
        if fixed:  # spans of two arenas (the reader took another): numpy's memcpy (torch's copy_ wakes
            # its OpenMP threads, which spin on after it on cores the FIFO's writer needs)
            batch = Batch(count, count * fixed, self.allocate)
            at = 0
            for piece in pieces:
                n = piece.n * fixed
                batch.data[at : at + n] = piece.arena.array[piece.first * fixed :][:n]
                at += n
            return batch.holder[: count * fixed].view(count, fixed), count
        nbytes = sum(int(record_lengths(w)[idx].sum()) for w, idx in pieces)
        batch = Batch(count, nbytes, self.allocate)
        for window, idx in pieces:
            gather_from(batch, window, idx)
        return tensors_of(batch, self.record_bytes), count


def tensors_of(batch: Batch, record_bytes: int | None):
    """The batch as a [n, record_bytes] tensor, or a RaggedBatch, over its own buffers (no copy)."""
    if record_bytes:
        return batch.holder[: batch.nbytes].view(batch.count, record_bytes)
    torch = torch_module()
    offsets = batch.offsets_holder[: 8 * (batch.count + 1)].view(torch.int64)
    return RaggedBatch(batch.holder[: batch.nbytes], offsets)


def gather_from(dst: Batch, window, order: np.ndarray) -> None:
    """``gather``, or a window's own where its records lie in more than one buffer
    (``placed_windows.SplitSpans``)."""
    own = getattr(window, "gather_into", None)
    if own is not None:
        own(dst, order)
    else:
        gather(dst, window, order)


def record_lengths(window: Batch):
    """The window's record lengths (worked out once a window)."""
    lengths = getattr(window, "lengths", None)
    if lengths is None or len(lengths) != window.count:
        offsets = window.offsets[: window.count + 1]
        lengths = window.lengths = offsets[1:] - offsets[:-1]
    return lengths


def tensor_nbytes(tensors) -> int:
    if isinstance(tensors, RaggedBatch):
        return int(tensors.data.numel())
    return int(tensors.numel())
