"""decode_jpeg_batch on JPEG records read from a real FIFO: pixels as Pillow decodes them, resizing,
and records that are not JPEGs or claim too many pixels refused by name before anything is decoded,
crafted ones included: a huge frame that one reader of the markers sees and another does not.
(nvJPEG on a GPU is measured by bench/gpu_feed.py, which checks its pixels against this path's.)"""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def segment(marker: int, payload: bytes) -> bytes:
    return bytes([0xFF, marker]) + struct.pack(">H", 2 + len(payload)) + payload


def framed(record: bytes, height: int, width: int) -> bytes:
    """The record with its baseline frame header claiming height x width."""
    out = bytearray(record)
    struct.pack_into(">HH", out, record.index(b"\xff\xc0") + 5, height, width)
    return bytes(out)


def hiding(visible: bytes, hidden: bytes, stuffed: bytes = b"\xff\x00") -> bytes:
    """One JPEG whose frame a reader sees depends on how it reads FF 00 after the SOI.

    libjpeg (and Pillow) drop FF 00 as a stuffed byte, skip 00 06 as garbage, skip the APP1 segment whole
    and read ``hidden``; a reader that takes FF 00 for a marker with a length of 6 jumps over the APP1
    header into its payload and reads ``visible``.
    """
    return b"\xff\xd8" + stuffed + b"\x00\x06" + segment(0xE1, visible[2:]) + hidden[2:]


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


def test_a_frame_hidden_behind_ff_00_counts_whichever_way_a_decoder_reads_it():
    from sagemaker_dist.runtime import decode_jpeg_batch
    from sagemaker_dist.runtime.torch.images import jpeg_size

    small, big = jpeg(8, 8, 0), framed(jpeg(8, 8, 1), 13000, 13000)
    record = hiding(small, big)  # libjpeg reads the 13000x13000 frame, FF 00 as a marker the 8x8 one
    with pytest.warns(Image.DecompressionBombWarning), Image.open(io.BytesIO(record)) as image:
        assert image.size == (13000, 13000)  # what Pillow would set aside memory for
    assert jpeg_size(record) == (13000, 13000)  # first, so that a regression fails before decoding
    with pytest.raises(ImageDecodeError, match="record 1 .*13000x13000 image, over max_pixels=10000"):
        decode_jpeg_batch(ragged([small, record]), device="cpu", max_pixels=10000)
    # the other way round: libjpeg reads the small frame, a reader taking FF 00 for a marker the big one
    assert jpeg_size(hiding(big, small)) == (13000, 13000)
    # FF FF... before FF 00 are fill bytes, and FF 00 is still no marker after them
    assert jpeg_size(hiding(small, big, stuffed=b"\xff\xff\xff\x00")) == (13000, 13000)


def test_a_hidden_20000x20000_frame_is_an_image_decode_error_not_pillows_bomb_error():
    from sagemaker_dist.runtime import decode_jpeg_batch
    from sagemaker_dist.runtime.torch.images import _decode_pillow, jpeg_size

    record = hiding(jpeg(8, 8, 0), framed(jpeg(8, 8, 1), 20000, 20000))
    assert jpeg_size(record) == (20000, 20000)
    with pytest.raises(ImageDecodeError, match="record 0 .*20000x20000 image, over max_pixels=178956970"):
        decode_jpeg_batch(ragged([record]), device="cpu")
    # behind the header check, the Pillow path checks Pillow's own reading of the header before loading
    # pixels, and any exception Pillow raises (here its DecompressionBombError) names the record
    with pytest.raises(ImageDecodeError, match="record 0 .*DecompressionBombError"):
        _decode_pillow([torch.tensor(list(record), dtype=torch.uint8)], max_pixels=10**10)
    record = hiding(jpeg(8, 8, 0), framed(jpeg(8, 8, 1), 200, 300))
    with pytest.raises(ImageDecodeError, match="record 0 .*300x200 image to Pillow, over max_pixels=10000"):
        _decode_pillow([torch.tensor(list(record), dtype=torch.uint8)], max_pixels=10000)


def test_a_second_frame_after_the_first_scan_counts():
    from sagemaker_dist.runtime import decode_jpeg_batch
    from sagemaker_dist.runtime.torch.images import jpeg_size

    small = jpeg(8, 8, 0)
    record = small[:-2] + framed(jpeg(8, 8, 1), 13000, 13000)[2:]  # the first scan's data, then a frame
    assert jpeg_size(record) == (13000, 13000)
    with pytest.raises(ImageDecodeError, match="record 0 .*13000x13000 image, over max_pixels=10000"):
        decode_jpeg_batch(ragged([record]), device="cpu", max_pixels=10000)
    # a second frame with no height (left to a DNL marker) is refused like a first one
    dnl = small[:-2] + framed(jpeg(8, 8, 1), 0, 8)[2:]
    with pytest.raises(ImageDecodeError, match="record 0 .*8x0: no size to check"):
        decode_jpeg_batch(ragged([dnl]), device="cpu")


def test_restart_markers_and_stuffed_bytes_in_a_scan_do_not_end_the_reading():
    from sagemaker_dist.runtime import decode_jpeg_batch
    from sagemaker_dist.runtime.torch.images import jpeg_size

    out = io.BytesIO()
    pixels = np.random.default_rng(3).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(out, format="JPEG", quality=90, restart_marker_blocks=1)
    record = out.getvalue()
    scan = record[record.index(b"\xff\xda") :]
    if not any(bytes([0xFF, 0xD0 + n]) in scan for n in range(8)):
        pytest.skip("this Pillow writes no restart markers")
    assert b"\xff\x00" in scan
    assert jpeg_size(record) == (64, 64)
    assert decode_jpeg_batch(ragged([record]), device="cpu").shape == (1, 3, 64, 64)
    hidden = record[:-2] + framed(jpeg(8, 8, 1), 13000, 13000)[2:]
    assert jpeg_size(hidden) == (13000, 13000)
    with pytest.raises(ImageDecodeError, match="record 0 .*13000x13000 image"):
        decode_jpeg_batch(ragged([hidden]), device="cpu", max_pixels=10000)


def test_garbage_and_fill_bytes_before_a_marker_are_skipped_as_libjpeg_skips_them():
    from sagemaker_dist.runtime import decode_jpeg_batch
    from sagemaker_dist.runtime.torch.images import jpeg_size

    clean = jpeg(16, 8, 2)
    at = clean.index(b"\xff\xc0")
    for extra in (b"\x00\x11\x22", b"\xff\xff\xff", b"\x00\x11\xff\x00\xff\xff"):
        record = clean[:at] + extra + clean[at:]  # libjpeg: "N extraneous bytes before marker 0xc0"
        assert jpeg_size(record) == (8, 16)
        images = decode_jpeg_batch(ragged([record, clean]), device="cpu")
        assert torch.equal(images[0], images[1])
    # garbage hides no frame either: the big one behind it still counts
    hidden = clean[:-2] + b"\x00\x11\x22" + framed(jpeg(8, 8, 1), 13000, 13000)[2:]
    assert jpeg_size(hidden) == (13000, 13000)


@settings(max_examples=40, deadline=None)
@given(
    width=st.integers(1, 80),
    height=st.integers(1, 80),
    quality=st.integers(1, 100),
    progressive=st.booleans(),
    subsampling=st.sampled_from([0, 1, 2]),
    grey=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_jpeg_size_is_the_size_pillow_reads(width, height, quality, progressive, subsampling, grey, seed):
    from sagemaker_dist.runtime.torch.images import jpeg_size

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    image = Image.fromarray(pixels).convert("L" if grey else "RGB")
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality, progressive=progressive, subsampling=subsampling)
    with Image.open(io.BytesIO(out.getvalue())) as read:
        assert jpeg_size(out.getvalue()) == (read.size[1], read.size[0]) == (height, width)


@pytest.mark.gpu
def test_a_batch_the_reader_put_on_the_gpu_decodes(tmp_path):
    """RecordBatches(device="cuda") hands out batches already on the GPU; the header checks and
    torchvision's decode_jpeg read their records on the CPU."""
    from test_record_batches import pipe_channel

    from sagemaker_dist.runtime import RecordBatches, decode_jpeg_batch

    records = [jpeg(40, 30, seed) for seed in range(5)]
    config, feeder = pipe_channel(tmp_path, [b"".join(encode_tfrecord(r) for r in records)])
    (batch,) = list(RecordBatches("train_0", 8, config=config, device="cuda"))
    feeder.join(10)
    assert batch.data.is_cuda
    images = decode_jpeg_batch(batch, device="cuda")
    assert images.is_cuda and images.shape == (5, 3, 30, 40)
