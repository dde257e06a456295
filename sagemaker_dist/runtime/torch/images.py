"""JPEG records decoded where the model trains, a batch at a time.

``decode_jpeg_batch`` takes a ``RaggedBatch`` of JPEG records (``RecordBatches`` without
``record_bytes``) and returns one ``[n, 3, H, W]`` uint8 tensor. On a CUDA device torchvision decodes
the whole batch with nvJPEG, so an image job needs no pool of CPU decoders feeding each GPU; elsewhere
(or without torchvision) Pillow decodes on the CPU. Every record's header is read before anything is
decoded: a record that is not a JPEG, or that has any frame over ``max_pixels``, is an
``ImageDecodeError`` naming it, before any memory is set aside for its pixels. torchvision has no call
that reads only a header, so ``jpeg_size`` is its only guard: it reads markers as libjpeg does and
counts every frame header any decoder might use, not just the first it meets.
"""

from __future__ import annotations

import bisect
import io
import re
import struct

from sagemaker_dist.errors import DataError


class ImageDecodeError(DataError):
    """A record of the batch is not an image this can decode, or claims more pixels than allowed."""


# Pillow's own refusal threshold for a decompression bomb (Image.MAX_IMAGE_PIXELS * 2).
DEFAULT_MAX_PIXELS = 178_956_970
# Start-of-frame markers (baseline, extended, progressive, lossless, arithmetic): C4, C8, CC are not.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Where a marker with a length (C0-CF, EOI, SOS, DQT, DNL, DRI, APPn, COM) follows FF: the last FF of the
# run, fill bytes being FF too. libjpeg's next_marker, from any point, stops at the first of these: what
# lies before it is entropy-coded data, FF 00 (a stuffed byte, no marker), RSTn and TEM (no length, the
# scan goes on) or garbage it skips with a warning. Other markers are errors to libjpeg or, in a scan
# with restarts, skipped like garbage: skipped here too.
_MARKER = re.compile(rb"\xff(?=[\xc0-\xcf\xd9-\xdd\xe0-\xef\xfe])")


def jpeg_size(record) -> tuple[int, int]:
    """(height, width) of the largest frame any decoder might read in a JPEG, from its markers only.

    A crafted record can show one reader a small frame and another a huge one (FF 00 read as a marker
    with a length, a second frame after the first scan, a frame behind garbage), so this counts every
    frame header libjpeg meets and every well-formed one anywhere else, which a reader of markers unlike
    libjpeg (nvJPEG's) may meet. ValueError if libjpeg would find none, or if one has no height (left to
    a DNL marker) or no width.
    """
    data = memoryview(record).cast("B")
    if bytes(data[:2]) != b"\xff\xd8":
        raise ValueError("it does not start with a JPEG start-of-image marker")
    markers = [found.start() for found in _MARKER.finditer(data)]  # one pass over the bytes
    frames = list(_frames_libjpeg_reads(data, markers))
    if not frames:
        raise ValueError("it has no frame header")
    frames += _frames_anywhere(data, markers)
    for at, height, width in frames:
        if not height or not width:
            raise ValueError(f"its frame header at byte {at} is {width}x{height}: no size to check")
    _, height, width = max(frames, key=lambda frame: frame[1] * frame[2])
    return height, width


def _frames_libjpeg_reads(data, markers: list):
    """(offset, height, width) of each frame header libjpeg's reader meets, segment by segment to the EOI."""
    end = len(data)
    i = bisect.bisect_left(markers, 2)
    while i < len(markers):
        at = markers[i] + 2
        marker = data[at - 1]
        if marker == 0xD9 or at + 2 > end:  # libjpeg reads nothing after an EOI
            return
        if marker in _SOF_MARKERS:
            if at + 7 > end:
                raise ValueError(f"its frame header at byte {at - 2} is cut short")
            yield (at - 2, *struct.unpack_from(">HH", data, at + 3))
        (length,) = struct.unpack_from(">H", data, at)
        at += max(length, 2)  # a length under 2: libjpeg skips no more than the length itself
        i = bisect.bisect_left(markers, at, i + 1)


def _frames_anywhere(data, markers: list) -> list:
    """(offset, height, width) of every frame header as libjpeg would accept it, in a segment or not."""
    frames = []
    for at in markers:
        if data[at + 1] in _SOF_MARKERS and at + 10 <= len(data):
            length, _, height, width, components = struct.unpack_from(">HBHHB", data, at + 2)
            if components and length == 8 + 3 * components:
                frames.append((at, height, width))
    return frames


def _records(batch) -> list:
    """The batch's records as CPU tensors: the header checks read them there, and torchvision's
    ``decode_jpeg`` takes its input on the CPU whatever device decodes (a batch that RecordBatches put
    on the GPU is copied back once)."""
    offsets = batch.offsets.tolist()
    data = batch.data.cpu()
    return [data[start:stop] for start, stop in zip(offsets[:-1], offsets[1:])]


def _checked(records: list, max_pixels: int) -> list:
    for i, record in enumerate(records):
        try:
            height, width = jpeg_size(record.numpy())
        except ValueError as e:
            raise ImageDecodeError(f"record {i} of the batch is not a JPEG this can decode: {e}") from None
        if height * width > max_pixels:
            raise ImageDecodeError(
                f"record {i} of the batch claims a {width}x{height} image, over max_pixels={max_pixels}"
                " (pass a larger max_pixels if such images are expected)"
            )
    return records


def _decode_torchvision(records: list, device) -> list:
    import torchvision.io

    mode = torchvision.io.ImageReadMode.RGB
    try:
        return torchvision.io.decode_jpeg(records, mode=mode, device=device)
    except Exception as e:  # whatever the decoder raises (RuntimeError, MemoryError, ...): name the record
        failure = e
    for i, record in enumerate(records):
        try:
            torchvision.io.decode_jpeg(record, mode=mode, device=device)
        except Exception as e:
            raise ImageDecodeError(f"record {i} of the batch could not be decoded as a JPEG: {e}") from None
    raise ImageDecodeError(f"the batch could not be decoded, though each record decodes alone: {failure}")


def _decode_pillow(records: list, max_pixels: int) -> list:
    import numpy as np
    import torch
    from PIL import Image

    images = []
    for i, record in enumerate(records):
        pixels = None
        try:
            with Image.open(io.BytesIO(record.numpy()), formats=["JPEG"]) as image:
                width, height = image.size  # Pillow's own reading of the header, before any pixels
                if width * height <= max_pixels:
                    pixels = np.array(image.convert("RGB"))
        except Exception as e:  # anything from the decoder: OSError, SyntaxError, DecompressionBombError, ...
            raise ImageDecodeError(
                f"record {i} of the batch could not be decoded as a JPEG: {type(e).__name__}: {e}"
            ) from None
        if pixels is None:
            raise ImageDecodeError(
                f"record {i} of the batch is a {width}x{height} image to Pillow, over max_pixels={max_pixels}"
            )
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
        images = _decode_pillow(records, max_pixels)
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
