"""RecordBatches' buffers over real FIFOs: a batch the script keeps (or only a slice, or a numpy view of
it) keeps its bytes while later batches and epochs are read, and buffers nothing holds are refilled."""

from __future__ import annotations

import gc

import pytest
from helpers.runtime_helpers import FifoFeeder, write_opt_ml

from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.contract.record_formats import encode_tfrecord

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

SIZE = 2000
COUNT = 600
BATCH = 32
# (record_bytes or None, shuffle window or None): fixed and ragged, in stream order and shuffled (windows
# of 100 records: batches across windows, and gathered ones)
KINDS = {
    "fixed": (SIZE, None),
    "ragged": (None, None),
    "fixed-shuffled": (SIZE, 100),
    "ragged-shuffled": (None, 100),
}


def record(i: int) -> bytes:
    return i.to_bytes(4, "little") * (SIZE // 4)


def reader(tmp_path, kind: str, epochs: int):
    from sagemaker_dist.runtime import RecordBatches, ShuffleWindow
    from sagemaker_dist.runtime.config import ContainerConfig

    stream = b"".join(encode_tfrecord(record(i)) for i in range(COUNT))
    root = write_opt_ml(tmp_path / "opt_ml", ["train_0"], plan_layout(1, 1))
    feeder = FifoFeeder(root / "input" / "data", "train_0", [stream] * epochs)
    feeder.start()
    fixed, window = KINDS[kind]
    shuffle = None if window is None else ShuffleWindow(3, records=window)
    config = ContainerConfig.load(root, {})
    batches = RecordBatches(
        "train_0", BATCH, record_bytes=fixed, config=config, pin_memory=False, shuffle=shuffle
    )
    return batches, feeder


def rows(batch) -> list[bytes]:
    from sagemaker_dist.runtime import RaggedBatch

    if isinstance(batch, RaggedBatch):
        return [bytes(batch.record(i).numpy()) for i in range(len(batch.lengths))]
    return [bytes(r.numpy()) for r in batch]


def data_of(batch):
    from sagemaker_dist.runtime import RaggedBatch

    return batch.data if isinstance(batch, RaggedBatch) else batch


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_kept_batch_slice_or_numpy_view_keeps_its_bytes_while_later_epochs_are_read(tmp_path, kind):
    batches, feeder = reader(tmp_path, kind, 3)
    first = iter(batches)
    whole = next(first)
    expected_whole = rows(whole)
    kept_slice = data_of(next(first))[3 : 3 + SIZE]  # a slice only: the batch's own tensor is gone
    expected_slice = bytes(kept_slice.numpy())
    kept_numpy = data_of(next(first)).numpy()  # a numpy view only
    expected_numpy = kept_numpy.tobytes()
    seen = sum(1 for _ in first)  # the rest of the epoch, each batch dropped at once
    gc.collect()
    for _ in range(2):  # two more epochs through the same buffers
        seen += sum(1 for _ in batches)
    assert seen == 3 * -(-COUNT // BATCH) - 3
    assert rows(whole) == expected_whole
    assert bytes(kept_slice.numpy()) == expected_slice
    assert kept_numpy.tobytes() == expected_numpy
    feeder.join(10)
    assert feeder.error is None


@pytest.mark.parametrize("kind", list(KINDS))
def test_batches_held_together_never_share_memory_and_buffers_are_refilled_once_dropped(tmp_path, kind):
    batches, feeder = reader(tmp_path, kind, 2)
    held = list(batches)  # the whole epoch held
    assert sorted(int.from_bytes(r[:4], "little") for b in held for r in rows(b)) == list(range(COUNT))
    spans = sorted((data_of(b).data_ptr(), data_of(b).data_ptr() + data_of(b).nbytes) for b in held)
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))  # no two overlap
    del held
    # the next epoch, each batch dropped at once: its batches come from the memory released above (a
    # pool's buffers, or rows of a shuffle window's arena once it wraps round)
    again = [(data_of(b).data_ptr(), data_of(b).data_ptr() + data_of(b).nbytes) for b in batches]
    assert any(a < end and start < b for a, b in again for start, end in spans)
    feeder.join(10)
    assert feeder.error is None
