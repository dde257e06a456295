"""JPEG records decoded where the model trains, a batch at a time.

``decode_jpeg_batch`` takes a ``RaggedBatch`` of JPEG records (``RecordBatches`` without
``record_bytes``) and returns one ``[n, 3, H, W]`` uint8 tensor. On a CUDA device torchvision decodes
the whole batch with nvJPEG, so an image job needs no pool of CPU decoders feeding each GPU; elsewhere
(or without torchvision) Pillow decodes on the CPU. Every record's header is read before anything is
decoded: a record that is not a JPEG, or that claims more than ``max_pixels``, is a
``ImageDecodeError`` naming it, before any memory is set aside for its pixels.
"""

from __future__ import annotations

import io
import struct

from sagemaker_dist.errors import DataError


class ImageDecodeError(DataError):
    """A record of the batch is not an image this can decode, or claims more pixels than allowed."""


# Pillow's own refusal threshold for a decompression bomb (Image.MAX_IMAGE_PIXELS * 2).
DEFAULT_MAX_PIXELS = 178_956_970
# Start-of-frame markers (baseline, extended, progressive, lossless, arithmetic): C4, C8, CC are not.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers that stand alone, without a length: TEM, RSTn, SOI, EOI.
_STANDALONE = frozenset([0x01, *range(0xD0, 0xDA)])


def jpeg_size(record) -> tuple[int, int]:
    """(height, width) from a JPEG's frame header, reading its markers only; ValueError if it has none."""
    data = memoryview(record).cast("B")
    if bytes(data[:2]) != b"\xff\xd8":
        raise ValueError("it does not start with a JPEG start-of-image marker")
    at, end = 2, len(data)
    while at + 4 <= end:
        if data[at] != 0xFF:
            raise ValueError(f"no marker at byte {at}")
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte before a marker
            at += 1
            continue
        if marker in _STANDALONE:
            at += 2
            continue
        (length,) = struct.unpack_from(">H", data, at + 2)
        if marker in _SOF_MARKERS:
            if at + 9 > end:
                break
            height, width = struct.unpack_from(">HH", data, at + 5)
            return height, width
        if marker == 0xDA or length < 2:  # image data before any frame header, or a broken length
            break
        at += 2 + length
    raise ValueError("it has no frame header")


def _records(batch) -> list:
    offsets = batch.offsets.tolist()
    return [batch.data[start:stop] for start, stop in zip(offsets[:-1], offsets[1:])]


def _checked(records: list, max_pixels: int) -> list:
    for i, record in enumerate(records):
        try:
            height, width = jpeg_size(record.numpy())
        except ValueError as e:
            raise ImageDecodeError(f"record {i} of the batch is not a JPEG: {e}") from None
        if height * width > max_pixels or not height or not width:
            raise ImageDecodeError(
                f"record {i} of the batch claims a {width}x{height} image, over max_pixels={max_pixels}"
                " (pass a larger max_pixels if such images are expected)"
            )
    return records


def _decode_torchvision(records: list, device) -> list:
    import torchvision.io

    try:
        return torchvision.io.decode_jpeg(records, mode=torchvision.io.ImageReadMode.RGB, device=device)
    except RuntimeError as e:
        raise ImageDecodeError(f"a record of the batch could not be decoded as a JPEG: {e}") from None


def _decode_pillow(records: list) -> list:
    import numpy as np
    import torch
    from PIL import Image

    images = []
    for i, record in enumerate(records):
        try:
            with Image.open(io.BytesIO(record.numpy())) as image:
                pixels = np.array(image.convert("RGB"))
        except (OSError, SyntaxError) as e:
            raise ImageDecodeError(f"record {i} of the batch could not be decoded as a JPEG: {e}") from None
        images.append(torch.from_numpy(pixels).permute(2, 0, 1))
    return images


def _resized(images: list, size):
    import torch
    import torch.nn.functional as F

    def resize(x):
        y = F.interpolate(x.float(), size=tuple(size), mode="bilinear", antialias=True, align_corners=False)
        return y.round_().clamp_(0, 255).to(torch.uint8)

    if len({tuple(image.shape) for image in images}) == 1:  # one size: one resize for the batch
        return resize(torch.stack(images))
    return torch.cat([resize(image[None]) for image in images])


def decode_jpeg_batch(batch, *, device="cuda", size=None, max_pixels: int = DEFAULT_MAX_PIXELS):
    """The batch's JPEG records as one ``[n, 3, H, W]`` uint8 RGB tensor on ``device``.

    ``size``: ``(H, W)`` to resize every image to (bilinear, antialiased); without it the images must all
    have one size. With torchvision, nvJPEG decodes the batch on a CUDA device (libjpeg-turbo on the
    CPU otherwise); without it, Pillow decodes on the CPU and the result moves to ``device``.
    """
    import torch

    device = torch.device(device)
    records = _checked(_records(batch), max_pixels)
    if not records:
        height, width = size if size is not None else (0, 0)
        return torch.empty((0, 3, height, width), dtype=torch.uint8, device=device)
    if _has_torchvision():  # nvJPEG on a CUDA device, libjpeg-turbo on the CPU
        images = _decode_torchvision(records, device if device.type == "cuda" else "cpu")
    else:
        images = _decode_pillow(records)
    images = [image.to(device) for image in images]
    if size is not None:
        return _resized(images, size)
    shapes = {tuple(image.shape) for image in images}
    if len(shapes) > 1:
        raise ImageDecodeError(
            f"the batch's images have {len(shapes)} sizes ({sorted(shapes)[:3]}...): pass size=(H, W)"
        )
    return torch.stack(images)


def _has_torchvision() -> bool:
    try:
        import torchvision.io  # noqa: F401
    except (ImportError, RuntimeError):  # RuntimeError: a torchvision built for another torch
        return False
    return True
