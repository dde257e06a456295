"""Epochs that end on the same step on every rank, without record counts.

Uneven shards are the rule in Pipe mode (nobody counts the records of a channel), and under DDP a rank
that runs out stops calling the allreduce while the others wait for it. So before every step each rank
says whether it has a batch and whether it wants to stop (SIGTERM), and the ranks take the minimum of
``[has, -wants]`` in one allreduce on the CPU (Gloo), started while the step before trains (it
costs no measurable step time: ``bench/bench_torch_agreement.py``): the epoch ends on every rank at
the first step where some rank has none ("shortest": the records the others still hold are not
trained this epoch, and their FIFOs are closed unread), and a stop any rank asked for ends it on every
rank before the same step. At the epoch's end one allgather says which ranks ran out (rank 0 logs it).

With ``join=[model, ...]`` every record is trained instead: ``torch.distributed.algorithms.Join``
shadows the collectives of the ranks that finished until the last one has (no custom collectives in
the forward pass, e.g. SyncBatchNorm); a stop is then agreed at the epoch's end only.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.runtime.training_session import EpochReport

log = logging.getLogger(__name__)

_END = object()


def _initialised() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def records_in(batch) -> int | None:
    """Records in one batch, where its structure says so unambiguously: a ``RaggedBatch``'s count, a
    ``PackedSequence``'s sequences, a tensor's (or array's) first dimension, a mapping's first value's, a
    tuple's or list's fields' common first dimension, a list of anything else's length (records,
    samples, tensors of different lengths); None otherwise (the epoch's line then leaves counts out)."""
    try:
        return _records_in(batch)
    except Exception:  # noqa: BLE001 - a report must never stop a step (nested tensors, odd objects)
        return None


def _records_in(batch) -> int | None:
    from sagemaker_dist.runtime.torch.batch_cutter import RaggedBatch

    if isinstance(batch, RaggedBatch):
        return len(batch.offsets) - 1
    if hasattr(batch, "batch_sizes") and hasattr(batch, "sorted_indices"):  # a PackedSequence
        return int(batch.batch_sizes[0])
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 1
    if isinstance(batch, Mapping) and batch:
        return _records_in(next(iter(batch.values())))
    if isinstance(batch, tuple | list) and batch:
        shaped = [getattr(item, "shape", None) for item in batch]
        if all(shape is not None and len(shape) for shape in shaped):
            firsts = {int(shape[0]) for shape in shaped}
            if len(firsts) == 1:  # fields of one batch: (inputs, labels), default_collate's lists
                return firsts.pop()
            return len(batch) if isinstance(batch, list) else None  # a list of samples of their own lengths
        if isinstance(batch, list):  # records, samples, scalars
            return len(batch)
        return _records_in(batch[0]) if isinstance(batch[0], Mapping | RaggedBatch) else None
    return None


def _steps_to_skip(skip) -> int:
    """``skip`` as a whole number >= 0 (a ``ConfigurationError`` otherwise)."""
    try:
        steps = operator.index(skip)
    except TypeError:
        steps = -1
    if isinstance(skip, bool) or steps < 0:
        raise ConfigurationError(f"skip={skip!r}: give the batches to drop first, a whole number >= 0")
    return steps


class AgreedEpoch:
    """One epoch of ``batches`` that ends by agreement; iterate it once. After the iteration:
    ``steps`` (batches yielded), ``skipped`` (batches dropped at the start, see ``skip``), ``stopped``
    (the ranks agreed on a stop), ``ran_out`` (the ranks that had no batch at the last step)."""

    def __init__(
        self,
        batches: Iterable,
        *,
        group=None,
        stop=None,
        skip: int = 0,
        join: Sequence | None = None,
        what: str = "train",
        records: Callable[[Any], int] | None = None,
    ):
        if records is not None and not callable(records):
            raise ConfigurationError(
                f"records={records!r}: give a function of a batch that returns its records"
            )
        self.batches = batches
        self.records_of = records or records_in
        self.group = group
        self.stop = stop
        self.skip = _steps_to_skip(skip)
        self.join = list(join) if join else None
        self.what = what
        self.steps = 0
        self.skipped = 0
        self.stopped = False
        self.exhausted = False  # the epoch's data was used up (set with a stop in join mode too)
        self.ran_out: tuple[int, ...] = ()
        self.records: int | None = 0  # records in the batches yielded (None: a batch's count unknown)
        self.agreements = 0  # collectives made: one per step, one for the step that ends it, one at the end

    def _wants(self) -> int:
        return 1 if self.stop is not None and self.stop.wanted() else 0

    def __iter__(self):
        iterator = iter(self.batches)
        try:
            while self.skipped < self.skip and next(iterator, _END) is not _END:
                self.skipped += 1  # read, not trained: the steps trained before a stop
            if self.join is not None:
                yield from self._joined(iterator)
            else:
                yield from self._agreed(iterator)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()  # the rest of the FIFO unread: the reader thread stops and closes it

    def _agreed(self, iterator):
        """Each step's agreement is started (``async_op``) when the step before it is handed out, with
        the next batch already read, so it runs while that step trains: a stop asked for during step
        ``k`` ends the epoch after step ``k + 1`` on every rank."""
        distributed = _initialised()
        pending = self._ask(iterator, distributed)
        while True:
            batch, flag, work = pending
            if work is not None:
                work.wait()
            everyone, stopping = flag.tolist()
            if stopping < 0:
                self.stopped = True
                self.exhausted = everyone <= 0  # the stop came with the epoch's end: the epoch is done
                return
            if everyone <= 0:
                self._note_end(batch, distributed)
                return
            self.steps += 1
            self._count(batch)
            pending = self._ask(iterator, distributed)  # the next step's agreement, while this one trains
            yield batch

    def _ask(self, iterator, distributed: bool):
        """Read the next batch and start the min-allreduce of ``[has a batch, -wants to stop]``."""
        import torch
        import torch.distributed as dist

        batch = next(iterator, _END)
        flag = torch.tensor([int(batch is not _END), -self._wants()], dtype=torch.int64)
        work = None
        if distributed:
            work = dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group, async_op=True)
            self.agreements += 1
        return batch, flag, work

    def _joined(self, iterator):
        import torch
        import torch.distributed as dist
        from torch.distributed.algorithms import Join

        distributed = _initialised()
        if distributed:
            with Join(self.join):
                for batch in iterator:
                    self.steps += 1
                    yield batch
        else:
            for batch in iterator:
                self.steps += 1
                yield batch
        if distributed:
            wants = torch.tensor([self._wants()], dtype=torch.int64)
            dist.all_reduce(wants, op=dist.ReduceOp.MAX, group=self.group)
            self.agreements += 1
            self.stopped = bool(wants.item())
        self.exhausted = True

    def _records_of(self, batch) -> int | None:
        """``batch``'s records as ``records=`` counts them (``records_in`` by default); None where the
        count fails or is no whole number >= 0: a report must never stop a step."""
        try:
            n = operator.index(self.records_of(batch))
        except Exception:  # noqa: BLE001 - a raising rank would leave the others waiting in the agreement
            return None
        return n if 0 <= n < 2**62 else None  # the counts travel as int64, summed over the epoch

    def _count(self, batch) -> None:
        if self.records is not None:
            n = self._records_of(batch)
            self.records = None if n is None else self.records + n

    def _note_end(self, batch, distributed: bool) -> None:
        """One allgather of each rank's ``[ran out, records trained, records read ahead]`` (-1: not
        known); rank 0 prints the epoch's end with them, as the Keras helpers do."""
        import torch
        import torch.distributed as dist

        has = batch is not _END
        if not distributed:
            self.ran_out = (0,)
            return
        read_ahead = self._records_of(batch) if has else 0
        counts = [-1 if n is None else n for n in (self.records, read_ahead)]
        mine = torch.tensor([0 if has else 1, *counts], dtype=torch.int64)
        everyone = [torch.zeros(3, dtype=torch.int64) for _ in range(dist.get_world_size(self.group))]
        dist.all_gather(everyone, mine, group=self.group)
        self.agreements += 1
        rows = [t.tolist() for t in everyone]
        self.ran_out = tuple(r for r, row in enumerate(rows) if row[0])
        if dist.get_rank() == 0:
            known = all(n >= 0 for row in rows for n in row[1:])  # every batch's records could be counted
            trained = tuple(row[1] for row in rows) if known else None
            left = tuple(row[2] for row in rows)  # read only where known
            line = EpochReport(self.what, self.steps, trained, left, self.ran_out).line()
            if self.skipped:
                line += f" (after skipping {self.skipped} batch(es) trained before a stop)"
            print(f"sagemaker-dist: {line}", flush=True)


def agreed_batches(
    batches: Iterable,
    *,
    group=None,
    stop=None,
    skip: int = 0,
    join: Sequence | None = None,
    what: str = "train",
    records: Callable[[Any], int] | None = None,
) -> AgreedEpoch:
    """``batches`` (one epoch: a ``PipeBatches`` iteration, or any iterable) ended at the same step on
    every rank: the first step where some rank has no batch, or a stop (``stop``: a
    ``runtime.stop.StopRequest``-like object with ``wanted()``) that any rank asked for. Call it on
    every rank, the same number of times; ``group``: the process group of the agreement (the job's
    ``agreement_group``). ``skip``: batches to read and drop first (a resume inside the epoch).
    ``join``: the ``Joinable`` objects (the DDP model) to train every record with ``Join`` instead.
    ``records``: a batch's record count, for rank 0's line at the epoch's end, where ``records_in``
    cannot tell it (a list of same-shaped per-sample tensors reads as one batch of fields).
    The next batch is read while a step trains: an iterable that reuses one buffer for every batch
    must hand out copies."""
    return AgreedEpoch(batches, group=group, stop=stop, skip=skip, join=join, what=what, records=records)
