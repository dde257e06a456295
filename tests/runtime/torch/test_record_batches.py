"""RecordBatches over real FIFOs and File channels: uint8 batches from the compiled reader and from the
Python framers, fixed-size and ragged, epochs, batches kept while later ones are read."""

from __future__ import annotations

import os

import pytest
from helpers.runtime_helpers import FifoFeeder, write_opt_ml

from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.contract.record_formats import encode_recordio, encode_tfrecord
from sagemaker_dist.runtime.framing.base import RecordFormatError

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

PATHS = [True, False]  # compiled, Python


def pipe_channel(tmp_path, epochs: list[bytes], wrapper: str = "None"):
    from sagemaker_dist.runtime.config import ContainerConfig

    root = write_opt_ml(tmp_path / "opt_ml", ["train_0"], plan_layout(1, 1), wrapper=wrapper)
    feeder = FifoFeeder(root / "input" / "data", "train_0", epochs)
    feeder.start()
    return ContainerConfig.load(root, {}), feeder


@pytest.mark.parametrize("compiled", PATHS)
def test_records_of_one_size_come_as_uint8_batches_and_stay_valid_while_more_are_read(tmp_path, compiled):
    from sagemaker_dist.runtime import RecordBatches

    records = [os.urandom(1000) for _ in range(50)]
    stream = b"".join(encode_tfrecord(r) for r in records)
    config, feeder = pipe_channel(tmp_path, [stream, stream])
    batches = RecordBatches(
        "train_0", 8, record_bytes=1000, compiled=compiled, config=config, pin_memory=False
    )
    kept = list(batches)  # every batch held while the next ones are filled: no buffer is reused under it
    assert [tuple(b.shape) for b in kept] == [(8, 1000)] * 6 + [(2, 1000)]
    assert all(b.dtype == torch.uint8 for b in kept)
    assert [bytes(row.numpy()) for b in kept for row in b] == records
    again = [bytes(row.numpy()) for b in batches for row in b]  # the next epoch: the next FIFO
    assert again == records and batches.records == 100 and batches.epochs_opened == 2
    feeder.join(10)
    assert feeder.error is None


@pytest.mark.parametrize("compiled", PATHS)
def test_records_of_any_size_come_as_data_and_offsets_and_pad(tmp_path, compiled):
    from sagemaker_dist.runtime import RaggedBatch, RecordBatches

    records = [os.urandom(n) for n in (3, 0, 70_000, 5, 200_000, 12, 1, 40_000)]
    stream = b"".join(encode_recordio(r, max_part=30_000) for r in records)
    config, feeder = pipe_channel(tmp_path, [stream], wrapper="RecordIO")
    batches = RecordBatches("train_0", 3, compiled=compiled, config=config, pin_memory=False)
    assert batches.record_format == "RecordIO"  # the channel's RecordWrapperType
    kept = list(batches)
    assert all(isinstance(b, RaggedBatch) for b in kept) and [len(b.lengths) for b in kept] == [3, 3, 2]
    assert [bytes(b.record(i).numpy()) for b in kept for i in range(len(b.lengths))] == records
    assert kept[0].offsets.dtype == torch.int64 and kept[0].offsets.tolist() == [0, 3, 3, 70_003]
    padded = kept[2].padded(value=7)
    assert padded.shape == (2, 40_000)
    assert bytes(padded[0, :1].numpy()) == records[6] and padded[0, 1:].eq(7).all()
    assert bytes(padded[1].numpy()) == records[7]
    with pytest.raises(ValueError, match="shorter than the longest record"):
        kept[2].padded(length=10)
    feeder.join(10)


@pytest.mark.parametrize("compiled", PATHS)
def test_a_file_channel_batch_spans_two_files_and_a_bad_record_fails_the_epoch(tmp_path, compiled):
    from sagemaker_dist.runtime import RecordBatches
    from sagemaker_dist.runtime.config import ContainerConfig

    root = write_opt_ml(tmp_path / "opt_ml", {"train_0": "File"}, plan_layout(1, 1, input_mode="File"))
    channel = root / "input" / "data" / "train_0"
    channel.mkdir(parents=True)
    lines = [f"line {i}".encode() for i in range(7)]
    (channel / "a").write_bytes(b"\n".join(lines[:3]) + b"\n")
    (channel / "b").write_bytes(b"\r\n".join(lines[3:]))  # CRLF, and no newline at the end
    config = ContainerConfig.load(root, {})
    batches = RecordBatches(
        "train_0", 2, record_format="TextLine", record_bytes=6, compiled=compiled, config=config
    )
    got = [[bytes(r.numpy()) for r in b] for b in batches]
    assert got == [lines[0:2], lines[2:4], lines[4:6], lines[6:]]
    (channel / "b").write_bytes(b"too long\n")
    with pytest.raises(
        RecordFormatError, match="a record of 8 bytes where every record is to be record_bytes=6"
    ):
        list(batches)


def test_an_iteration_left_early_closes_the_fifo_and_the_next_reads_the_next_one(tmp_path):
    from sagemaker_dist.runtime import RecordBatches

    stream = b"".join(encode_tfrecord(bytes([i]) * 100_000) for i in range(40))  # more than the pipe holds
    config, feeder = pipe_channel(tmp_path, [stream, stream])
    batches = RecordBatches("train_0", 4, record_bytes=100_000, config=config, prefetch=1)
    for batch in batches:
        assert batch[0, 0] == 0
        break
    assert batches.records == 4  # the batches handed out, not those the reader thread made ahead
    assert sum(len(b) for b in batches) == 40 and batches.records == 44
    feeder.join(10)
    assert feeder.served == 2 and feeder.error is None


def _vm_flags(address: int) -> list[str]:
    """The kernel's VmFlags of the mapping that holds ``address`` in this process."""
    mapping = None
    for line in open("/proc/self/smaps").read().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(part, 16) for part in head.split("-"))
            mapping = start <= address < end
        elif mapping and line.startswith("VmFlags:"):
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's /proc/self/smaps")
def test_large_batches_use_plain_pages_and_are_reused_once_released(tmp_path):
    """numpy advises huge pages for its large arrays; where the kernel then compacts memory on first touch,
    a fresh reader's epoch slowed to 0.66x. Batches from PLAIN_PAGES_FROM are maps without that advice."""
    import numpy as np

    from sagemaker_dist.runtime import RecordBatches
    from sagemaker_dist.runtime.torch.batch_buffers import PLAIN_PAGES_FROM

    records = [bytes([i]) * 200_000 for i in range(60)]
    stream = b"".join(encode_tfrecord(r) for r in records)
    config, feeder = pipe_channel(tmp_path, [stream, stream])
    batches = RecordBatches("train_0", 30, record_bytes=200_000, config=config, pin_memory=False)
    kept = list(batches)  # 6 MB batches, both held
    assert [bytes(row.numpy()) for b in kept for row in b] == records
    assert all(b.untyped_storage().nbytes() >= PLAIN_PAGES_FROM for b in kept)
    assert all("hg" not in _vm_flags(b.data_ptr() + b.nbytes // 2) for b in kept)
    if np.core.multiarray._get_madvise_hugepage():  # the check sees numpy's advice where numpy gives it
        assert "hg" in _vm_flags(np.empty(PLAIN_PAGES_FROM, np.uint8).ctypes.data + PLAIN_PAGES_FROM // 2)
    pointers = {b.data_ptr() for b in kept}
    del kept
    assert {b.data_ptr() for b in batches} <= pointers  # the next epoch refills the released buffers
    feeder.join(10)
    assert feeder.error is None


def test_record_bytes_and_compiled_are_checked():
    from sagemaker_dist.runtime import RecordBatches

    with pytest.raises(ValueError, match="record_bytes=0"):
        RecordBatches("train_0", 4, record_bytes=0, config=object())


def _device_epoch(tmp_path, device, records, batch_size=8):
    """One epoch of ``records`` read with ``device=``, the records counted as each batch is handed out."""
    from sagemaker_dist.runtime import RecordBatches

    stream = b"".join(encode_tfrecord(r) for r in records)
    config, feeder = pipe_channel(tmp_path, [stream])
    batches = RecordBatches("train_0", batch_size, record_bytes=len(records[0]), config=config, device=device)
    seen = []
    for batch in batches:
        seen.append((batch, batches.records))
    feeder.join(10)
    assert feeder.error is None
    return seen


def test_device_hands_out_each_batch_there_and_counts_records_as_handed_out(tmp_path):
    records = [os.urandom(300) for _ in range(20)]
    seen = _device_epoch(tmp_path, "meta", records)
    # one batch is copied ahead, but ``records`` counts only what the loop has been given
    assert [(tuple(b.shape), n) for b, n in seen] == [((8, 300), 8), ((8, 300), 16), ((4, 300), 20)]
    assert all(b.device.type == "meta" for b, _ in seen)
    cpu = _device_epoch(tmp_path / "cpu", "cpu", records)
    assert [bytes(row.numpy()) for b, _ in cpu for row in b] == records


@pytest.mark.gpu
def test_device_copies_on_a_side_stream_and_the_loop_sees_whole_batches(tmp_path):
    # Each step keeps the loop's stream busy before it reads the batch: a copy the loop's stream did not
    # wait for, or GPU memory reused under it, would show as wrong sums.
    records = [os.urandom(1 << 20) for _ in range(24)]
    expected = [sum(r) for r in records]
    busy = torch.randn(2048, 2048, device="cuda")
    sums = []
    for batch, _ in _device_epoch(tmp_path, "cuda", records, batch_size=4):
        assert batch.is_cuda
        for _ in range(20):
            busy = busy @ busy / 2048
        sums += batch.sum(dim=1, dtype=torch.int64).tolist()
    assert sums == expected


def test_a_device_that_cannot_be_used_is_refused_when_the_reader_is_made(tmp_path):
    from sagemaker_dist.runtime import PipeBatches, RecordBatches
    from sagemaker_dist.runtime.config import ContainerConfig

    root = write_opt_ml(tmp_path / "opt_ml", ["train_0"], plan_layout(1, 1))
    config = ContainerConfig.load(root, {})
    with pytest.raises(ValueError, match="is not a device torch knows.*give job.device"):
        RecordBatches("train_0", 8, config=config, device="gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available here; give job.device"):
            PipeBatches("train_0", 8, config=config, device="cuda")
    assert PipeBatches("train_0", 8, config=config, device="cpu").device == torch.device("cpu")
