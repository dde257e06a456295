"""A ``StreamFill`` read to its end as the batch readers read it, for the framing tests."""

from __future__ import annotations

from sagemaker_dist.runtime.framing import batch_fill as bf
from sagemaker_dist.runtime.framing.base import RecordFormatError


def drain(fill, batch: int) -> tuple[list[list[bytes]], RecordFormatError | None]:
    """(the batches as lists of records, the framing error that ended the stream or None); closes
    ``fill``. Each batch starts small (8 bytes): records past it grow it."""
    batches, error = [], None
    try:
        while True:
            b = bf.Batch(batch, 8)
            more = fill.fill(b)
            if b.count:
                batches.append([b.data[b.offsets[i] : b.offsets[i + 1]].tobytes() for i in range(b.count)])
            if not more:
                break
    except RecordFormatError as exc:
        error = exc
    finally:
        fill.close()
    return batches, error
