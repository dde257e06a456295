"""The Python half of PipeModeDataset: a thread per iteration reads the next FIFO ahead of TensorFlow.

``EpochReader`` opens the epoch's FIFO, frames it (``framing.frame_views``) and hands out chunks of
records: small records as one blob plus offsets (cut out later in C++), large ones as a list of
``bytes`` each. ``read_ahead`` runs that in a thread, so reading and CRC checks (which release the
GIL) overlap TensorFlow's work on the chunks before.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

import numpy as np

from sagemaker_dist.contract.paths import fifo_name
from sagemaker_dist.runtime.epoch_reader.epochs import next_epoch_fifo
from sagemaker_dist.runtime.fifo import FifoReader
from sagemaker_dist.runtime.framing import frame_views, make_framer
from sagemaker_dist.runtime.framing.shuffle import HEAD_RECORDS, EpochOrder, StreamHead

# Chunks whose records average at least this many bytes cross as one bytes object per record (one
# copy less than a chunk blob cut up by tf.strings.substr); smaller records cross as a blob.
PER_RECORD_MIN_BYTES = 4096
NO_OFFSETS = np.empty(0, dtype=np.int64)
READ_AHEAD_CHUNKS = 2  # chunks a reader thread frames ahead of TensorFlow (0: frame in TensorFlow's call)


STOP_JOIN_S = 5.0  # a consumer that stops early waits this long at most for its reader thread to end


def read_ahead(items, depth: int, name: str, reader: str = "PipeModeDataset"):
    """Yield ``items``, produced by a thread up to ``depth`` items ahead; its errors are raised here.

    The thread is named ``<reader>-<name>`` (the reader class and the FIFO), as a stack dump shows it.

    The thread reads the FIFO while TensorFlow converts and batches the chunks before: readv and
    crc32c release the GIL. When the consumer stops early, the thread stops at its next item.
    The first item is made in the consumer's own call and the thread starts after it: on the way
    to the first batch that saves the thread's start and a GIL handoff (measured in fresh
    processes, 1 KB records: ``next()`` to the first batch 8.5 -> 6.1 ms).
    """
    done = object()
    ahead: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                ahead.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def produce():
        try:
            for item in items:
                if not put((item, None)):
                    break
            else:
                put((done, None))
        except BaseException as exc:  # handed to the consumer, after the chunks ahead of it
            put((None, exc))
        finally:
            items.close()

    try:
        first = next(items)
    except StopIteration:
        return
    thread = threading.Thread(target=produce, name=f"{reader}-{name}", daemon=True)
    thread.start()
    try:
        yield first
        # the loop holds it now; this frame must not (for the whole epoch): the buffer under it, a batch
        # or a row span of a shuffle window, is reused once the loop lets it go
        first = None
        while True:
            item, exc = ahead.get()
            if exc is not None:
                raise exc
            if item is done:
                break
            yield item
            item = None
        thread.join()
    finally:
        stop.set()
        # Wait (bounded) for the thread to end at its next item: a daemon thread still inside PyTorch's
        # or TensorFlow's C++ when the interpreter exits is stopped there, and that aborts the process
        # ("terminate called without an active exception"), as after an agreed stop mid-epoch.
        thread.join(STOP_JOIN_S)


class EpochReader:
    """The Python half: one call per iteration yields (blob, starts, lengths, records) from the next FIFO.

    A chunk of records is either a blob with offsets (records cut out in C++) or, for large
    records, a list of the records themselves.
    """

    def __init__(
        self,
        channel,
        record_format,
        state_dir,
        pipe_dir,
        benchmark,
        interval,
        max_skip,
        timeout,
        chunk_size,
        max_record_bytes=None,
        shuffle=None,
        stream_key=0,
    ):
        self.channel = channel
        self.record_format = record_format
        self.state_dir = Path(state_dir)
        self.pipe_dir = Path(pipe_dir)
        self.benchmark = benchmark
        self.interval = interval
        self.max_skip = max_skip
        self.timeout = timeout
        self.chunk_size = chunk_size
        self.max_record_bytes = max_record_bytes  # None: the variable's, else the default
        self.shuffle, self.stream_key = shuffle, stream_key  # a ShuffleWindow, or None

    def __call__(self, group: int = 0, convert=None):
        """Chunks of the next epoch's FIFO; ``group`` and ``convert`` as in :meth:`_chunks`."""
        epoch, path = next_epoch_fifo(self.state_dir, self.pipe_dir, self.channel, self.timeout)
        chunks = self._chunks(epoch, path, group, convert)
        if READ_AHEAD_CHUNKS:
            yield from read_ahead(chunks, READ_AHEAD_CHUNKS, fifo_name(self.channel, epoch))
        else:
            yield from chunks

    def _chunks(self, epoch, path, group=0, convert=None):
        """``(blob, starts, lengths, records)`` per chunk, passed through ``convert`` (in the reader thread).

        Large records come in lists of a multiple of ``group`` records where they can (the batch
        size: TensorFlow's rebatch then passes them through without a copy).
        """
        framer = make_framer(self.record_format, self.channel, epoch, self.max_skip, self.max_record_bytes)
        started = time.perf_counter()
        next_report = self.interval
        records = 0  # handed over so far (the framer counts a chunk once it is taken)
        convert = convert or _as_is
        with FifoReader(path) as reader:
            chunks = frame_views(
                reader.readinto, framer, self.chunk_size, ready=reader.ready, read=reader.read, group=group
            )
            chunks = self._headed(chunks, epoch)
            if self.shuffle is not None:  # whole windows, already (blob, starts, lengths, records)
                from sagemaker_dist.runtime.epoch_reader.order import epoch_base

                base = epoch_base(self.state_dir, self.channel)
                order = EpochOrder(self.shuffle, self.stream_key, epoch + base)
                chunks = shuffled_chunks(chunks, order)
            for chunk in chunks:
                if self.shuffle is None:
                    chunk = _as_blob_or_records(chunk)
                records += len(chunk[1]) + len(chunk[3])
                # Reported before the chunk is handed over, as the compiled reader does per record:
                # the line is out before the records it counts (with or without ``benchmark``, as AWS's).
                if self.interval and records >= next_report:
                    self._report(framer.epoch, records, reader, started, progress=True)
                    next_report = records - records % self.interval + self.interval
                yield convert(*chunk)
            framer.warn_skipped()
            if self.benchmark:
                self._report(framer.epoch, framer.records, reader, started, progress=False)

    def _headed(self, chunks, fifo: int):
        """``chunks`` as they are; the head of their records noted (``order.write_head``) once known."""
        from sagemaker_dist.runtime.epoch_reader.order import write_head

        head = StreamHead()
        for chunk in chunks:
            if not head.done:
                if isinstance(chunk, list):
                    records = chunk
                else:  # a copy of the first chunk's bytes (no export of the framer's buffer kept)
                    view, starts, lengths, extra = chunk
                    blob = view.tobytes() + b"".join(extra)
                    wanted = HEAD_RECORDS - head.count
                    records = [
                        blob[s : s + n] for s, n in zip(starts[:wanted].tolist(), lengths[:wanted].tolist())
                    ]
                for record in records:
                    head.add(record)
                    if head.done:
                        write_head(self.state_dir, self.channel, fifo, head.value)
                        break
            yield chunk
        if not head.done:
            write_head(self.state_dir, self.channel, fifo, head.value)

    def _report(self, epoch, records, reader, started, progress: bool):
        """``<channel>_<epoch> Iterator records: N, ...`` every ``interval`` records (the words AWS's
        reader prints), ``<channel>_<epoch> epoch end: N records, ...`` at the end with ``benchmark``."""
        seconds = max(time.perf_counter() - started, 1e-9)
        count = f"Iterator records: {records}" if progress else f"epoch end: {records} records"
        print(
            f"PipeModeDataset {self.channel}_{epoch} {count}, "
            f"{reader.bytes_read} bytes in {seconds:.3f} s ({records / seconds:.0f} records/s, "
            f"{reader.bytes_read / seconds / 1e6:.1f} MB/s)",
            flush=True,
        )


def _as_is(*chunk):
    return chunk


def _as_blob_or_records(chunk) -> tuple:
    """``(blob, starts, lengths, records)`` of an item of ``frame_views``: large records as they
    came (a list), records averaging PER_RECORD_MIN_BYTES as one ``bytes`` each, others as a blob."""
    if isinstance(chunk, list):  # large records, read one by one
        return b"", NO_OFFSETS, NO_OFFSETS, chunk
    view, starts, lengths, extra = chunk
    if not extra and int(lengths.sum()) >= PER_RECORD_MIN_BYTES * len(lengths):
        records = [view[s : s + n].tobytes() for s, n in zip(starts.tolist(), lengths.tolist())]
        view.release()
        return b"", NO_OFFSETS, NO_OFFSETS, records
    blob = view.tobytes()
    view.release()
    if extra:
        blob += b"".join(extra)
    return blob, starts, lengths, []


def shuffled_chunks(items, order: EpochOrder):
    """The items of ``frame_views`` (blobs with offsets, or lists of large records) as one chunk per
    shuffle window, its records in the window's order: a blob with offsets (the window's blobs joined
    where it spans several), or the large records themselves. The records read before an error come
    out first, in their window's order, then the error (as the compiled reader's do)."""
    pieces: list = []  # (blob, starts, lengths) or a large record's bytes
    count = nbytes = 0
    error = None
    try:
        for item in items:
            if isinstance(item, list):
                for record in item:
                    pieces.append(record)
                    count += 1
                    nbytes += len(record)
                    if order.closes(count, nbytes):
                        yield _window_chunk(pieces, order.order(count, nbytes))
                        pieces, count, nbytes = [], 0, 0
                continue
            view, starts, lengths, extra = item
            blob = view.tobytes()
            view.release()
            if extra:
                blob += b"".join(extra)
            while len(lengths):
                if order.records is None:  # the epoch's first record sets the first window's count
                    order.closes(1, int(lengths[0]))
                total = np.cumsum(lengths)
                by_bytes = int(np.searchsorted(total, order.cap - nbytes))  # the first at the cap
                last = min(order.records - count - 1, by_bytes)
                if last >= len(lengths):  # the window goes on past this chunk
                    pieces.append((blob, starts, lengths))
                    count += len(lengths)
                    nbytes += int(total[-1])
                    break
                pieces.append((blob, starts[: last + 1], lengths[: last + 1]))
                count += last + 1
                yield _window_chunk(pieces, order.order(count, nbytes + int(total[last])))
                pieces, count, nbytes = [], 0, 0
                starts, lengths = starts[last + 1 :], lengths[last + 1 :]
    except Exception as exc:  # the records read before an error come out first, then the error
        error = exc
    if count:
        yield _window_chunk(pieces, order.order(count, nbytes))
    if error is not None:
        raise error


def _window_chunk(pieces: list, order: np.ndarray) -> tuple:
    """``(blob, starts, lengths, records)`` of one window, in ``order``."""
    if all(isinstance(p, bytes) for p in pieces):
        return b"", NO_OFFSETS, NO_OFFSETS, [pieces[i] for i in order.tolist()]
    if len(pieces) == 1:
        blob, starts, lengths = pieces[0]
        return blob, starts[order], lengths[order], []
    blobs, all_starts, all_lengths, at = [], [], [], 0
    for piece in pieces:
        if isinstance(piece, bytes):
            blob, starts, lengths = piece, np.zeros(1, np.int64), np.array([len(piece)], np.int64)
        else:
            blob, starts, lengths = piece
        blobs.append(blob)
        all_starts.append(starts + at)
        all_lengths.append(lengths)
        at += len(blob)
    starts, lengths = np.concatenate(all_starts), np.concatenate(all_lengths)
    return b"".join(blobs), starts[order], lengths[order], []
