"""Record framing for Pipe-mode streams and File-mode files: TFRecord, SageMaker RecordIO, text lines,
WebDataset tar shards (a record per sample).

- ``base``: ``Framer`` (the incremental framer contract), ``RecordFormatError``, the read-path limits;
- ``tfrecord``, ``recordio``, ``textline``, ``tar``: one framer per format (``tar.parse_sample`` reads a
  sample record as a dict of extension -> bytes);
- ``stream``: a framer by format name and the read loops (``frame_views``, ``frame_stream``,
  ``iter_records``, and ``tar_records`` for WebDataset shards in memory or a file).

The byte formats themselves (constants, encoders) are ``sagemaker_dist.contract.record_formats``:
writers share them. Pure Python plus the C-backed ``crc32c`` package and numpy; no TensorFlow here.
"""

from __future__ import annotations

from sagemaker_dist.runtime.framing.base import (
    DEFAULT_CHUNK,
    LARGE_RECORD_BYTES,
    MAX_GROUP_BYTES,
    STALL_SECONDS,
    Framer,
)
from sagemaker_dist.runtime.framing.recordio import RecordIOFramer
from sagemaker_dist.runtime.framing.stream import (
    FRAMERS,
    check_record_format,
    frame_stream,
    frame_views,
    iter_records,
    make_framer,
)
from sagemaker_dist.runtime.framing.tar import TarError, TarFramer
from sagemaker_dist.runtime.framing.textline import TextLineFramer
from sagemaker_dist.runtime.framing.tfrecord import TFRecordFramer

__all__ = [
    "DEFAULT_CHUNK",
    "FRAMERS",
    "LARGE_RECORD_BYTES",
    "MAX_GROUP_BYTES",
    "STALL_SECONDS",
    "Framer",
    "RecordIOFramer",
    "TarError",
    "TarFramer",
    "TFRecordFramer",
    "TextLineFramer",
    "check_record_format",
    "frame_stream",
    "frame_views",
    "iter_records",
    "make_framer",
]
