"""Records framed straight into a caller's buffers, a batch at a time: in C where it is built, else Python.

A ``Batch`` is one buffer of bytes (records one after another) and the offsets of its records; a
``StreamFill`` per stream (a FIFO, a file) fills batches from it. The compiled path
(``_record_reader``, built at install where a C compiler is) reads the descriptor, frames and checks
both TFRecord CRCs (or walks tar headers) with the GIL released and copies each record once into the
batch (TFRecords of ``LARGE_RECORD_BYTES`` or more: the kernel's copy out of the pipe is the record's).
The Python path (``frame_views`` and a copy per record) keeps the same contract. Both refuse a record over
``max_record_bytes`` before allocating for it, grow a batch only for bytes that came (a length the
stream claims is trusted up to ``READ_STEP``), and raise the framers' own ``RecordFormatError``\\ s.
No PyTorch here: the caller's ``allocate(nbytes)`` makes the buffers (``runtime.torch.record_batches``
makes tensors, pinned where CUDA is).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from sagemaker_dist.runtime.framing.base import DEFAULT_CHUNK, READ_STEP, Framer
from sagemaker_dist.runtime.framing.stream import frame_views

_NATIVE_API = 3
try:  # the compiled reader (setup.py builds it where it can); StreamFill falls back to Python without it
    import sagemaker_dist.runtime.framing._record_reader as _native
except ImportError:  # pragma: no cover - depends on the install
    _native = None
if _native is not None and getattr(_native, "API", 0) != _NATIVE_API:  # pragma: no cover - a stale build
    _native = None  # rebuilt by pip install -e . (scripts/setup.sh)

_HEADER_BYTES = {"TFRecord": 12, "RecordIO": 8, "TextLine": 0, "WebDataset": 0}  # a frame's start to its data
# The formats the compiled reader frames; any other fills batches through its framer. WebDataset samples:
# the walk of native/tar_core.h, which leaves an unusual entry (an error among them) and the rest of the
# stream to framing/tar.py (FALLBACK)
COMPILED_FORMATS = ("TFRecord", "RecordIO", "TextLine") + (
    ("WebDataset",) if _native is not None and hasattr(_native, "FALLBACK") else ()
)

# The formats whose records a shuffle window can place straight into their batches (StreamFill.place)
PLACEABLE_FORMATS = ("TFRecord", "RecordIO", "TextLine")

# allocate(nbytes) -> (holder, a writable uint8 numpy array of nbytes over the holder's memory)
Allocate = Callable[[int], tuple[Any, np.ndarray]]


def compiled_available() -> bool:
    """Whether the compiled batch reader is built here."""
    return _native is not None


def compiled_module():
    """The compiled batch reader's module (its API checked), None where it is not built: the shuffle
    takes its window order from it."""
    return _native


def _numpy_allocate(nbytes: int) -> tuple[np.ndarray, np.ndarray]:
    array = np.empty(nbytes, dtype=np.uint8)
    return array, array


class Batch:
    """One batch being filled: ``count`` records, ``nbytes`` bytes of ``data`` (``holder`` owns it);
    record i is ``data[offsets[i]:offsets[i + 1]]``. ``size`` records make it full."""

    def __init__(self, size: int, capacity: int, allocate: Allocate = _numpy_allocate):
        self.size = int(size)
        self._allocate = allocate
        self.holder, self.data = allocate(max(int(capacity), 1))
        self.offsets_holder, offsets = allocate(8 * (self.size + 1))
        self.offsets = offsets.view(np.int64)
        self.offsets[0] = 0
        self.count = 0
        self.nbytes = 0
        # records of one size: record i goes to row rows[i] of data (a shuffle window filled in its
        # order); None: one after another
        self.rows: np.ndarray | None = None

    @classmethod
    def over(cls, holder, data: np.ndarray, size: int) -> Batch:
        """A batch of ``size`` records filling ``data`` (a caller's buffer, owned by ``holder``), with
        offsets of its own; it never grows (records of one size, ``size`` rows of them in ``data``)."""
        batch = cls.__new__(cls)
        batch.size, batch._allocate = int(size), None
        batch.holder, batch.data = holder, data
        batch.offsets_holder = batch.offsets = np.empty(batch.size + 1, dtype=np.int64)
        batch.offsets[0] = 0
        batch.count = batch.nbytes = 0
        batch.rows = None
        return batch

    @property
    def full(self) -> bool:
        return self.count >= self.size

    def grow(self, need: int, keep: int) -> None:
        """``data`` at least ``need`` bytes, its first ``keep`` kept: twice ``keep`` (what came), or room for
        the records still to come at the size of those that came, up to READ_STEP more."""
        size = max(need, 2 * keep)
        if self.count:
            estimate = keep // self.count * self.size + keep // 8
            size = max(size, min(estimate, keep + READ_STEP))
        holder, data = self._allocate(size)
        data[:keep] = self.data[:keep]
        self.holder, self.data = holder, data


class StreamFill:
    """Fills batches from one stream: ``reader`` has ``fileno()`` (the compiled path) and ``readinto``
    (the Python path); ``framer`` names the format, the limit and the channel, epoch and offsets errors
    report, and keeps ``records`` and ``offset`` as the read goes. ``record_bytes`` (0: any) is the one
    length every record must have. ``compiled``: None uses the compiled reader where it is built; it
    frames ``COMPILED_FORMATS``, and a stream of another format is framed by its framer either way."""

    def __init__(
        self,
        reader,
        framer: Framer,
        record_bytes: int = 0,
        compiled: bool | None = None,
        chunk_size: int = DEFAULT_CHUNK,
    ):
        self.framer = framer
        self.record_bytes = int(record_bytes or 0)
        if compiled is None:
            compiled = _native is not None
        elif compiled and _native is None:
            raise RuntimeError(
                "the compiled batch reader (sagemaker_dist.runtime.framing._record_reader) is not built: "
                "pip install -e . needs a C compiler"
            )
        self.compiled = bool(compiled) and framer.format_name in COMPILED_FORMATS
        self._source, self._chunk_size = reader, chunk_size
        if self.compiled:
            self._reader = _native.Reader(reader.fileno(), framer.format_name, framer.max_record)
        else:
            self._frame_in_python(reader.readinto)

    def _frame_in_python(self, readinto) -> None:
        ready = getattr(self._source, "ready", None)
        self._items = frame_views(readinto, self.framer, self._chunk_size, ready=ready)
        self._blob = b""
        self._starts: list[int] = []
        self._lengths: list[int] = []
        self._next = 0
        self._base = 0
        self._run_starts = self._run_lengths = np.empty(0, dtype=np.int64)

    def _hand_over(self) -> None:
        """The compiled reader met a tar entry its walk does not take (an error among them): the framer
        frames the rest of the stream, from the bytes the reader holds, and names what is wrong."""
        framer, reader = self.framer, self._reader
        framer.offset, framer.records, framer.need = reader.offset, reader.records, 0
        head = memoryview(reader.take())
        source, at = self._source, 0

        def readinto(buf) -> int:
            nonlocal at
            if at < len(head):
                n = min(len(buf), len(head) - at)
                buf[:n] = head[at : at + n]
                at += n
                return n
            return source.readinto(buf)

        self.compiled = False
        self._frame_in_python(readinto)

    def fill(self, batch: Batch, stop_bytes: int = 0) -> bool:
        """Add records to ``batch`` until it is full, or holds ``stop_bytes`` bytes or more (True), or the
        stream ends (False)."""
        if batch.rows is not None and (not self.record_bytes or len(batch.rows) < batch.size):
            raise ValueError("a batch with rows needs record_bytes and a row for each of its records")
        if self.compiled:
            return self._fill_compiled(batch, int(stop_bytes))
        return self._fill_python(batch, int(stop_bytes))

    def close(self) -> None:
        if not self.compiled:
            self._items.close()

    @property
    def placeable(self) -> bool:
        """Whether ``place`` reads this stream (the compiled reader, a format it frames without the
        Python framer's help)."""
        return self.compiled and self.framer.format_name in PLACEABLE_FORMATS

    def place(self, data, carry, spans, slots, bounds, state, limit: int, stop_bytes: int):
        """A shuffle window's records each straight into its batch's region (``Reader.place``): True once
        ``limit`` records are placed or their bytes reach ``stop_bytes``, False at the stream's end, or
        ``(need, so_far)`` where a record does not fit its region (the end it needs; the end of its bytes
        read so far, from ``state[2]``)."""
        native = _native
        while True:
            before = int(state[0])
            status, count, _, offset, a, b = self._reader.place(
                data, carry, spans, slots, bounds, state, limit, stop_bytes
            )
            done = self._settle(status, count > before, offset, a, b)
            if done is not None:
                return done
            if status == native.ROOM:
                return a, b

    def _settle(self, status: int, added: bool, offset: int, a: int, b: int) -> bool | None:
        """What a compiled fill's status means: True (full), False (the stream ended), None (the caller
        acts: ROOM, FALLBACK, a corrupted record skipped); the errors are raised."""
        native, framer = _native, self.framer
        framer.records = self._reader.records
        if added:
            framer._bad_in_a_row = 0  # good records since the last corrupted one
        if status == native.FULL:
            return True
        if status == native.END:
            framer.offset = self._reader.offset
            return False
        if status in (native.ROOM, native.FALLBACK):
            return None
        framer.offset = offset  # the errors below name the record's offset (pos 0 from it)
        if status == native.CORRUPT:
            framer.corrupted(f"data CRC mismatch in a {a}-byte record", 0)  # raises, or skips it
            return None
        raise self._error(status, a, b)

    def _fill_compiled(self, batch: Batch, stop_bytes: int) -> bool:
        native = _native
        while True:
            before = batch.count
            status, batch.count, batch.nbytes, offset, a, b = self._reader.fill(
                batch.data,
                batch.offsets,
                batch.count,
                batch.nbytes,
                batch.size,
                self.record_bytes,
                batch.rows,
                stop_bytes,
            )
            done = self._settle(status, batch.count > before, offset, a, b)
            if done is not None:
                return done
            if status == native.ROOM:
                batch.grow(a, b)
            elif status == native.FALLBACK:
                self._hand_over()
                return self._fill_python(batch, stop_bytes)

    def _error(self, status: int, a: int, b: int):
        native, framer = _native, self.framer
        if status == native.BAD_HEADER:
            return framer._bad_header(a, 0)
        if status == native.TOO_LONG:
            return framer.too_long(a, 0, at_least=bool(b))
        if status == native.BAD_MAGIC:
            return framer.bad_magic(a, 0)
        if status == native.BAD_FLAG:
            return framer.bad_flag(a, bool(b), 0)
        if status == native.TRUNCATED:
            framer.need = b
            return framer.truncated(a)
        if status == native.WRONG_SIZE:
            return framer.wrong_size(a, self.record_bytes, 0)
        return RuntimeError(f"the compiled batch reader returned status {status}")  # pragma: no cover

    def _fill_python(self, batch: Batch, stop_bytes: int) -> bool:
        framer, fixed, rows = self.framer, self.record_bytes, batch.rows
        while not batch.full and not (stop_bytes and batch.nbytes >= stop_bytes):
            if self._next == len(self._starts):
                item = next(self._items, None)
                if item is None:
                    return False
                view, starts, lengths, extra = item
                self._base = framer.offset  # the stream offset of view[0] (the framer advances after)
                self._blob = view.tobytes() + b"".join(extra) if extra else view.tobytes()
                view.release()
                self._starts, self._lengths, self._next = starts.tolist(), lengths.tolist(), 0
                self._run_starts, self._run_lengths = np.asarray(starts), np.asarray(lengths)
            if not fixed and rows is None and self._copy_run(batch, stop_bytes):
                continue
            start, n = self._starts[self._next], self._lengths[self._next]
            if fixed and n != fixed:
                framer.offset = self._base + max(start - _HEADER_BYTES[framer.format_name], 0)
                raise framer.wrong_size(n, fixed, 0)
            end = batch.nbytes + n
            at = batch.nbytes if rows is None else int(rows[batch.count]) * fixed
            if at + n > len(batch.data):
                batch.grow(end, batch.nbytes)
            if n:
                batch.data[at : at + n] = np.frombuffer(self._blob, np.uint8, n, start)
            batch.nbytes = end
            batch.count += 1
            batch.offsets[batch.count] = end
            self._next += 1
        return True

    def _copy_run(self, batch: Batch, stop_bytes: int) -> bool:
        """Records of any size that lie one after another in the framed bytes (WebDataset samples do) added
        with one copy and one offsets update, as many as the batch takes; False where fewer than two do."""
        i = self._next
        starts = self._run_starts[i : i + batch.size - batch.count]
        lengths = self._run_lengths[i : i + batch.size - batch.count]
        if len(starts) < 2:
            return False
        apart = np.flatnonzero(starts[1:] != starts[:-1] + lengths[:-1])
        k = int(apart[0]) + 1 if len(apart) else len(starts)
        ends = np.cumsum(lengths[:k])
        if stop_bytes:  # as the record loop: a record is added while the batch holds less than stop_bytes
            k = min(k, 1 + int(np.count_nonzero(batch.nbytes + ends[:-1] < stop_bytes)))
        if k < 2:
            return False
        at, total = batch.nbytes, int(ends[k - 1])
        if at + total > len(batch.data):
            batch.grow(at + total, at)
        batch.data[at : at + total] = np.frombuffer(self._blob, np.uint8, total, int(starts[0]))
        batch.offsets[batch.count + 1 : batch.count + 1 + k] = at + ends[:k]
        batch.nbytes = at + total
        batch.count += k
        self._next += k
        return True


def gather(dst: Batch, src: Batch, order: np.ndarray) -> None:
    """Append the records of ``src`` that ``order`` names, in its order, to ``dst`` (which has room)."""
    order = np.ascontiguousarray(order, dtype=np.int64)
    offsets = src.offsets[: src.count + 1]
    if _native is not None:
        dst.count, dst.nbytes = _native.gather(
            dst.data, dst.offsets, dst.count, dst.nbytes, src.data, offsets, order
        )
        return
    at, count = dst.nbytes, dst.count
    for i in order.tolist():
        start, end = int(offsets[i]), int(offsets[i + 1])
        dst.data[at : at + end - start] = src.data[start:end]
        at += end - start
        count += 1
        dst.offsets[count] = at
    dst.count, dst.nbytes = count, at
