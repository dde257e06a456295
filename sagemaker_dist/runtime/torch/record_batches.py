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
it is), so an epoch does not fault in fresh pages for every batch. The buffers are
``batch_buffers``'; a shuffled epoch is cut into batches by ``batch_cutter``, and its windows of large
records are read straight into their batches by ``placed_windows``.
"""

from __future__ import annotations

import contextlib
import ctypes

import numpy as np

from sagemaker_dist.runtime.epoch_reader.reader import read_ahead
from sagemaker_dist.runtime.fifo import DEFAULT_FIFO_TIMEOUT
from sagemaker_dist.runtime.framing.batch_fill import Batch, StreamFill, compiled_available
from sagemaker_dist.runtime.framing.shuffle import (
    HEAD_RECORDS,
    EpochOrder,
    ShuffleWindow,
    StreamHead,
    inverse,
)
from sagemaker_dist.runtime.torch.batch_buffers import (
    PLAIN_PAGES_FROM,
    Arena,
    ArenaSpan,
    BoundedWindow,
    BufferPool,
    with_slack,
)
from sagemaker_dist.runtime.torch.batch_cutter import GROUP_BYTES, BatchCutter, RaggedBatch, tensors_of
from sagemaker_dist.runtime.torch.batches import DEFAULT_PREFETCH, PipeBatches
from sagemaker_dist.runtime.torch.placed_windows import WindowPlacer

__all__ = ["GROUP_BYTES", "PLAIN_PAGES_FROM", "RaggedBatch", "RecordBatches", "with_slack"]

FIRST_BATCH_BYTES = 1 << 20  # a ragged batch's first buffer; later ones start at the last one's size
POOL_EXTRA = 4  # unpinned buffers kept for reuse past the batches in flight
# Shuffle windows' buffers kept for reuse (data and offsets each): the window being filled, the one whose
# batches the loop is taking, and one more
WINDOWS_KEPT = 6
# Records shorter than this are put in (fixed) or gathered from (any size: the last window's mean) their
# window's rows in random order: there the window is mapped in huge pages, where the kernel has them (a
# TLB miss per record otherwise: 1 KB records scattered over a 16 MiB window of 4 KiB pages read at
# 0.55-0.75 of their speed in huge pages). Longer records span pages anyway, and faulting in huge pages
# costs compaction.
HUGE_PAGES_BELOW = 16 << 10
# A window cut short is moved up a run of rows at a time (a memmove each) where its runs average this many
# bytes or more; else by numpy's copy and scatter, GROUP_BYTES of records at a time (a Python call per run
# would cost more than its bytes)
RUN_BYTES = 64 << 10
# Windows of records of one size an arena holds besides the rows its batches in flight hold (``_rows_held``):
# the one being filled and the one being cut into batches
ARENA_WINDOWS = 2


def short_window(arena: Arena, pieces: list[tuple[int, int]], window: Batch, places: np.ndarray):
    """A window the stream's end cut short, as ``ArenaSpan`` s: its records moved up to its first places,
    in its order, so its batches are views of the arena too. Records keep their order, and each goes to a
    place before its own (never to one a record still to move is at), a run of adjacent rows at a time
    (memmove), or through a copy of GROUP_BYTES of records at a time where the runs are short."""
    count, fixed = window.count, arena.row_bytes
    row_of = np.empty(len(places), dtype=np.int64)  # each place's row, from the window's first
    row_of[places] = window.rows
    src, dst = row_of[np.sort(places[:count])], row_of[:count]
    breaks = np.flatnonzero((np.diff(src) != 1) | (np.diff(dst) != 1)) + 1
    if len(breaks) * RUN_BYTES > count * fixed:  # short runs (small records): numpy's copy, then its scatter,
        rows = window.data.reshape(-1, fixed)  # GROUP_BYTES of records at a time
        step = max(1, GROUP_BYTES // fixed)
        for a in range(0, count, step):
            rows[dst[a : a + step]] = rows[src[a : a + step]]
    else:
        base = window.data.ctypes.data
        for a, b in zip([0, *breaks.tolist()], [*breaks.tolist(), count]):
            if src[a] != dst[a]:
                ctypes.memmove(base + int(dst[a]) * fixed, base + int(src[a]) * fixed, (b - a) * fixed)
    for first, n in pieces:
        if count > 0:
            yield ArenaSpan(arena, first, min(n, count))
        count -= n


class _HeadOf:
    """The stream head of a shuffled epoch, fed each window as it is read (in stream order)."""

    def __init__(self, reader: RecordBatches, skip: int):
        self.reader, self.skip, self.head = reader, skip, StreamHead()
        self.noted = False

    def feed(self, window: Batch | None, end: bool = False) -> None:
        if not self.noted and (window is not None or end):
            self.reader._feed_head(self.head, window, self.skip, end)
            self.noted = self.head.done or end


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
    order is the same as theirs, except that a ``RaggedBatch`` holds its records in stream order (the
    same records as theirs in each batch). Records of one size are put straight into the rows the
    window's order gives them (one copy each, as unshuffled). Records of any size from 16 KB (by the
    last window's mean, ``placed_windows.PLACE_FROM``; TFRecord, RecordIO, TextLine, compiled) are
    read straight into their batches (one copy each), each batch a view of its window's buffer; a
    reader of them holds the buffers of the windows its batches in flight come from (each the window's
    bytes and an eighth, and room for the batch it leaves open). Shorter ones (and WebDataset samples)
    are read into the window, then gathered out of it in its order (a second copy, in C, while a thread
    of its own reads the next window), a group of batches at a time into one buffer, each batch a view
    of it; such a reader holds three windows (``ShuffleWindow.bytes`` each, plus an eighth): the one
    being read, the one read ahead, the one being gathered from.
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
            allocate = self._buffers[pinned] = BufferPool(pinned, min(keep, 256))
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
                        group.append((tensors_of(batch, self.record_bytes), batch.count))
                        group_bytes += batch.nbytes
                    batch = None
        finally:
            fills.close()
        if not head.done:
            self._feed_head(head, batch, dropped, end=True)
        if batch is not None and batch.count and not skip and not self.drop_last:
            group.append((tensors_of(batch, self.record_bytes), batch.count))
        if group:
            yield group, sum(count for _, count in group)

    def _shuffled_batches(self, epoch: int, streams: list, skip: int, pinned: bool):
        """The groups of a shuffled epoch: each window read whole, then cut into batches in its order
        (the first ``skip`` records dropped)."""
        order = EpochOrder(self.shuffle, self._stream_key, epoch)
        fixed = self.record_bytes or 0
        allocate = self._allocator(pinned, self.batch_size * fixed if fixed else FIRST_BATCH_BYTES)
        cut = BatchCutter(self.batch_size, self.record_bytes, self.drop_last, allocate, skip)
        head = _HeadOf(self, skip)
        if fixed:
            windows = self._fixed_windows(epoch, streams, order, pinned, head, cut)
        else:
            # the windows' buffers, the reader's own: the one being filled, the one read ahead, the one
            # being gathered from, the one the carried batch is gathered from
            windows_pool = self._buffers.get("window")
            if windows_pool is None:
                windows_pool = self._buffers["window"] = BufferPool(
                    False, 2 * WINDOWS_KEPT, True, tensors=False
                )
            # the gathered batches' buffers (data and offsets of a group's worth each): the groups in flight
            gathered = self._buffers.get(("gathered", pinned))
            if gathered is None:
                keep = 2 * (self.prefetch + POOL_EXTRA)
                gathered = self._buffers[("gathered", pinned)] = BufferPool(pinned, keep)
            cut.gathered = gathered
            placed = self._buffers.get(("placed", pinned))
            if placed is None:  # placed windows' buffers: their batches are views of them
                placed = BufferPool(pinned, 2 * WINDOWS_KEPT, same_size=True)
                self._buffers[("placed", pinned)] = placed
            placer = WindowPlacer(self.batch_size, order, skip, placed, gathered)
            # The next window is read (a thread of its own, in C with the GIL released) while this one is
            # cut into batches: the FIFO is drained while a window not placed is copied out.
            windows = read_ahead(
                self._ragged_windows(epoch, streams, order, windows_pool, head, placer),
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

    def _fixed_windows(self, epoch: int, streams: list, order: EpochOrder, pinned: bool, head, cut):
        """Each window of records of one size as ``ArenaSpan`` s of an arena (one, or two where it goes on
        from the arena's start), its rows in its order: every record read straight into its row; a window
        the stream's end cut short as the places its records were moved up to (``short_window``)."""
        fixed = self.record_bytes
        size = order.fixed_size(fixed)
        window = arena = filling = None
        try:
            for fill, _ in self._fills(epoch, streams):
                while True:
                    if window is None:
                        # the rows that complete the batch the cutter carries (unknown while it drops
                        # records)
                        rest = None if cut.skip else -cut.carried % self.batch_size
                        arena, pieces = self._arena(pinned, size, rest)
                        filling = arena.reserve(pieces)
                        places = inverse(order.order(size, size * fixed))
                        window = arena.window(pieces, places)
                    if not fill.fill(window):
                        break
                    head.feed(window)
                    for first, n in pieces:
                        yield ArenaSpan(arena, first, n)
                    window, filling.in_use = None, False
            head.feed(window, end=True)
            if window is not None and window.count:
                yield from short_window(arena, pieces, window, places)
        finally:  # its rows no longer being read into: a reader thread left behind an epoch holds them
            if filling is not None:
                filling.in_use = False

    def _arena(self, pinned: bool, size: int, head: int | None) -> tuple[Arena, list[tuple[int, int]]]:
        """The arena the next window of ``size`` rows goes into, and its pieces there (``Arena.place``;
        a new arena where the reader's holds rows still in use). Its windows go round the rows a loop
        that keeps up with the stream needs until a window finds them held (``Arena``): the window being
        filled, the one cut into batches, the loop's group and a carried batch."""
        key = ("arena", pinned)
        arena = self._buffers.get(key)
        same = arena is not None and arena.row_bytes == self.record_bytes
        pieces = arena.place(size, head) if same else None
        if pieces is None:
            rows = ARENA_WINDOWS * size + self._rows_held(size, self.prefetch + 2)
            lean = ARENA_WINDOWS * size + self._rows_held(size, 1)
            huge = self.record_bytes < HUGE_PAGES_BELOW
            arena = Arena(rows, self.record_bytes, pinned, huge, lean, self.batch_size)
            self._buffers[key] = arena
            pieces = arena.place(size, head)
        return arena, pieces

    def _rows_held(self, size: int, groups: int) -> int:
        """Rows of an arena the batches handed out may still hold while the next window (``size`` rows)
        is placed: ``groups`` groups of batches (where the loop is slower than the stream: the loop's,
        the ``prefetch`` groups queued and the one being queued) and a batch carried into the next
        window. A group is GROUP_BYTES of batches (one batch where that is more), from one window at
        most. An arena smaller than that is left for a fresh one (new memory) every few windows whenever
        the loop is slower than the stream."""
        batch_bytes = self.batch_size * self.record_bytes
        group_rows = max(1, -(-GROUP_BYTES // batch_bytes)) * self.batch_size
        return groups * min(group_rows, size + self.batch_size) + self.batch_size

    def _ragged_windows(self, epoch: int, streams: list, order: EpochOrder, allocate, head, placer):
        """Each window of records of any size: placed straight into its batches (``placed_windows``) where
        it can be, as ``(records, order, views)``; else as ``(window, order)``: the records as they came,
        and the order they go out in. A window's buffer starts at the size the last whole one needed
        (kept over epochs): growing it again each epoch took fresh memory for every step."""
        window = placing = None
        limit = self.shuffle.bytes

        def usual() -> BoundedWindow:
            out = BoundedWindow(order.window.records, self._window_capacity, allocate, limit)
            out.size = order.records or 1  # the epoch's first record sets the first count
            return out

        for fill, _ in self._fills(epoch, streams):
            while True:
                if window is None and placing is None:
                    placing = placer.start() if fill.placeable and order.records is not None else None
                    if placing is None:
                        window = usual()
                if placing is not None:
                    carry = placing.carry.data if placing.carry is not None else None
                    got = fill.place(
                        placing.data, carry, placing.spans, placing.slots, placing.bounds, placing.state,
                        placing.t, order.cap,
                    )
                    if got is False:
                        break
                    if got is True:  # placed whole, or cut short by its cap
                        if not head.noted:
                            head.feed(placer.first_records(placing, HEAD_RECORDS))
                        whole = placing.count == placing.t
                        yield placer.finish(placing) if whole else placer.settle(placing)
                        placing = None
                        continue
                    window = usual()  # a record that does not fit its region: read on the usual way
                    placer.spill(placing, window, got)
                    placing = None
                    continue
                elif not fill.fill(window, stop_bytes=order.cap):
                    break
                if order.records is None:  # the epoch's first record: it sets the first window's count
                    order.closes(window.count, window.nbytes)
                    window.size = order.records
                    if fill.placeable:
                        placing = placer.start(window.data[: window.nbytes])
                        if placing is not None:
                            window = None
                            continue
                    if not window.full and window.nbytes < order.cap:
                        continue
                allocate.huge_pages = window.nbytes < HUGE_PAGES_BELOW * window.count  # by the mean record
                yield self._usual_window(window, order, head, placer, limit)
                window = None
        if placing is not None and placing.count:  # the stream ended inside a placed window
            if not head.noted:
                head.feed(placer.first_records(placing, HEAD_RECORDS))
            head.feed(None, end=True)
            yield placer.settle(placing)
            return
        head.feed(window, end=True)
        if window is not None and window.count:
            yield window, order.order(window.count, window.nbytes)

    def _usual_window(self, window: BoundedWindow, order: EpochOrder, head, placer, limit: int):
        """``(window, order)`` of a window read whole (not placed)."""
        head.feed(window)
        self._window_capacity = min(with_slack(window.nbytes), with_slack(limit))
        placer.done(window.count, window.nbytes)
        return window, order.order(window.count, window.nbytes)

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
