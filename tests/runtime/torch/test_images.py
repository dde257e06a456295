"""decode_jpeg_batch on JPEG records read from a real FIFO: pixels as Pillow decodes them, resizing,
and records that are not JPEGs or claim too many pixels refused by name before anything is decoded.
(nvJPEG on a GPU is measured by bench/gpu_feed.py, which checks its pixels against this path's.)"""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

from sagemaker_dist.contract.record_formats import encode_tfrecord
from sagemaker_dist.runtime.torch.images import ImageDecodeError

torch = pytest.importorskip("torch")
Image = pytest.importorskip("PIL.Image")

pytestmark = pytest.mark.torch


def jpeg(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def ragged(records: list[bytes]):
    from sagemaker_dist.runtime import RaggedBatch

    offsets = np.cumsum([0] + [len(r) for r in records])
    data = torch.tensor(list(b"".join(records)), dtype=torch.uint8)
    return RaggedBatch(data, torch.from_numpy(offsets.astype(np.int64)))


def test_jpeg_records_from_a_fifo_decode_to_the_pixels_pillow_gives(tmp_path):
    from test_record_batches import pipe_channel

    from sagemaker_dist.runtime import RecordBatches, decode_jpeg_batch

    records = [jpeg(40, 30, seed) for seed in range(5)]
    config, feeder = pipe_channel(tmp_path, [b"".join(encode_tfrecord(r) for r in records)])
    (batch,) = list(RecordBatches("train_0", 8, config=config, pin_memory=False))
    images = decode_jpeg_batch(batch, device="cpu")
    feeder.join(10)
    assert images.shape == (5, 3, 30, 40) and images.dtype == torch.uint8
    for image, record in zip(images, records):
        expected = np.asarray(Image.open(io.BytesIO(record)).convert("RGB"))
        # libjpeg-turbo (torchvision) and Pillow's libjpeg may round an IDCT step differently
        assert np.abs(image.permute(1, 2, 0).numpy().astype(int) - expected).max() <= 2


def test_images_of_several_sizes_need_a_size_and_are_resized_to_it():
    from sagemaker_dist.runtime import decode_jpeg_batch

    batch = ragged([jpeg(40, 30, 0), jpeg(20, 50, 1), jpeg(40, 30, 2)])
    with pytest.raises(ImageDecodeError, match="3 sizes|2 sizes.*pass size="):
        decode_jpeg_batch(batch, device="cpu")
    images = decode_jpeg_batch(batch, device="cpu", size=(16, 24))
    assert images.shape == (3, 3, 16, 24) and images.dtype == torch.uint8
    same = decode_jpeg_batch(ragged([jpeg(40, 30, 0)] * 2), device="cpu", size=(16, 24))
    assert torch.equal(same[0], images[0])  # one resize for a batch of one size, the same pixels


def test_a_record_that_is_not_a_jpeg_is_named():
    from sagemaker_dist.runtime import decode_jpeg_batch

    batch = ragged([jpeg(8, 8, 0), b"\x89PNG\r\n\x1a\n" + bytes(40), jpeg(8, 8, 1)])
    with pytest.raises(ImageDecodeError, match="record 1 of the batch is not a JPEG"):
        decode_jpeg_batch(batch, device="cpu")
    truncated = jpeg(8, 8, 0)[:20]
    with pytest.raises(ImageDecodeError, match="record 0 .*no frame header"):
        decode_jpeg_batch(ragged([truncated]), device="cpu")


def test_a_header_claiming_too_many_pixels_is_refused_before_decoding():
    from sagemaker_dist.runtime import decode_jpeg_batch
    from sagemaker_dist.runtime.torch.images import jpeg_size

    record = bytearray(jpeg(16, 8, 0))
    assert jpeg_size(bytes(record)) == (8, 16)
    start = bytes(record).index(b"\xff\xc0")  # the baseline frame header: height, then width at +5
    struct.pack_into(">HH", record, start + 5, 60000, 60000)
    with pytest.raises(ImageDecodeError, match="record 0 .*60000x60000 image, over max_pixels"):
        decode_jpeg_batch(ragged([bytes(record)]), device="cpu")
    with pytest.raises(ImageDecodeError, match="over max_pixels=100"):
        decode_jpeg_batch(ragged([jpeg(16, 8, 0)]), device="cpu", max_pixels=100)


def test_an_empty_batch_is_an_empty_tensor():
    from sagemaker_dist.runtime import decode_jpeg_batch

    assert decode_jpeg_batch(ragged([]), device="cpu", size=(4, 5)).shape == (0, 3, 4, 5)
