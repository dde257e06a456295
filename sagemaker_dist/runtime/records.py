"""The old import path of record framing, kept so existing imports work: the code is in
``sagemaker_dist.runtime.framing``; the format constants and encoders in
``sagemaker_dist.contract.record_formats``."""

from __future__ import annotations

from sagemaker_dist.contract.record_formats import (  # noqa: F401 - re-exported for old imports
    CRC_MASK_DELTA,
    RECORD_FORMATS,
    RECORDIO_END,
    RECORDIO_LENGTH_BITS,
    RECORDIO_LENGTH_MASK,
    RECORDIO_MAGIC,
    RECORDIO_MIDDLE,
    RECORDIO_START,
    RECORDIO_WHOLE,
    U32,
    encode_recordio,
    encode_tfrecord,
    masked_crc32c,
)
from sagemaker_dist.runtime.framing import (  # noqa: F401 - re-exported for old imports
    DEFAULT_CHUNK,
    FRAMERS,
    LARGE_RECORD_BYTES,
    MAX_GROUP_BYTES,
    STALL_SECONDS,
    Framer,
    RecordFormatError,
    RecordIOFramer,
    TextLineFramer,
    TFRecordFramer,
    check_record_format,
    frame_stream,
    frame_views,
    iter_records,
    make_framer,
)
