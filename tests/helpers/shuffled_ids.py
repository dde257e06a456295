"""Streams of records with ids for the shuffle tests, and the order the readers' window gives them: the
reference a test compares what was trained with (``framing/shuffle.py``'s arithmetic, window by window)."""

from __future__ import annotations

import random

from sagemaker_dist.runtime.framing import shuffle as sh


def fifo_ids(
    rank: int, fifo: int, records: int, object_records: int, shuffle_config_seed: int | None
) -> list[int]:
    """The ids FIFO ``fifo`` of rank ``rank`` carries, in stream order: ``records`` ids ``rank * 1000 + i``
    in objects of ``object_records``, in key order, or (``shuffle_config_seed``) in the permutation a
    ShuffleConfig draws for that FIFO (as the local feeder draws it)."""
    objects = [
        list(range(rank * 1000 + o, rank * 1000 + o + object_records))
        for o in range(0, records, object_records)
    ]
    if shuffle_config_seed is not None:
        random.Random(f"{shuffle_config_seed}:{fifo}").shuffle(objects)
    return [i for obj in objects for i in obj]


def expected_windows(sizes: list[int], window: sh.ShuffleWindow) -> list[range]:
    """The windows the readers cut a stream of records of ``sizes`` bytes into: each window's count fixed
    at its start, from the mean record of the window before (the first: its first record)."""
    out, start, nbytes = [], 0, 0
    cap = window.bytes + window.bytes // 8
    count = None
    for i, n in enumerate(sizes):
        nbytes += n
        if count is None:
            count = min(window.records, -(-window.bytes // max(n, 1)))
        if i + 1 - start >= count or nbytes >= cap:
            mean = max(nbytes // (i + 1 - start), 1)
            count = min(window.records, -(-window.bytes // mean))
            out.append(range(start, i + 1))
            start, nbytes = i + 1, 0
    if start < len(sizes):
        out.append(range(start, len(sizes)))
    return out


def window_order(
    items: list,
    sizes: list[int],
    window: sh.ShuffleWindow,
    rank: int,
    channel: str,
    epoch: int,
    batch: int | None = None,
):
    """``items`` (a stream's records, or their ids; ``sizes`` their bytes) in the order the readers give
    them in ``epoch`` for ``rank``'s stream of ``channel``; ``batch``: as ``RecordBatches`` of records of
    any size gives them in batches of that many, each batch's records in stream order."""
    order = sh.EpochOrder(window, window.stream_key(rank, channel), epoch)
    positions = [
        w[i]
        for w in expected_windows(sizes, window)
        for i in order.order(len(w), sum(sizes[w.start : w.stop])).tolist()
    ]
    if batch is not None:
        positions = [p for a in range(0, len(positions), batch) for p in sorted(positions[a : a + batch])]
    return [items[p] for p in positions]
