"""Small generated datasets, so local mode needs no download: CIFAR-10-shaped TFRecords, and token records.

SDK side: no TensorFlow. Records are ``tf.train.Example``s written by ``launch.records.encode_example``
and framed as TFRecord with a C-backed CRC32C. Images get a label-dependent colour under
strong noise, and a share of the labels is drawn at random (``LABEL_NOISE``): the demo model learns
in a few epochs, about 22 % of the labels are wrong for any model (so a few hundred validation
records score about 0.78 at best, give or take sampling), and the learning rate visibly moves where a
run gets (the tuning demo's trials differ).

The token data (``write_token_data``, the ``--model gpt`` demo) is a token stream cut into records of
``TOKEN_RECORD`` little-endian uint16 tokens each (``RecordBatches(record_bytes=...)`` reads them
straight into tensors), drawn from a fixed language: each token is followed by one of 4 tokens of its
own, with probabilities 0.5, 0.25, 0.15 and 0.1. A model that knows nothing scores ln(512) = 6.24 nats
a token; one that learned the successors about 1.2.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from sagemaker_dist.aws.s3_objects import s3_client
from sagemaker_dist.contract.record_formats import encode_tfrecord
from sagemaker_dist.contract.s3_uri import parse_s3_uri
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.launch.records import encode_example

IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = 10
PALETTE_SEED = 10
GENERATOR = 3  # in dataset.json: data written by an older generator is written again
LABEL_NOISE = 0.25  # the share of records whose label is drawn at random, not from their colour
PIXEL_NOISE = 96  # +- per channel around the class colour
IMAGE_KEY = "image"
LABEL_KEY = "label"
DEFAULT_PREFIX = "s3://sagemaker-dist-demo/cifar10-demo/"
DATASET_FILE = "dataset.json"  # under the prefix: files and records per file, for exact per-rank counts
TOKEN_VOCAB = 512
TOKEN_CONTEXT = 64  # tokens a model sees; a record holds one more, the last one's target
TOKEN_RECORD = TOKEN_CONTEXT + 1
TOKEN_BYTES = TOKEN_RECORD * 2  # uint16 tokens
TOKEN_GENERATOR = "tokens-1"
SUCCESSOR_P = (0.5, 0.25, 0.15, 0.1)


class DemoDataError(ConfigurationError):
    """The demo data cannot be written where asked (names the bucket and what to do)."""


tfrecord_frame = encode_tfrecord  # one TFRecord frame: the runtime's own encoder (one implementation)


def generate_examples(count: int, seed: int = 0):
    """Yield ``count`` (image_bytes, label) pairs: noise plus a per-class colour; ``LABEL_NOISE`` of
    the labels random (so the best accuracy is about 1 - 0.9 * LABEL_NOISE)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    # one palette for the whole dataset (a per-file palette gave every file its own colour for a
    # label, so the demo model stayed at chance)
    palette = np.random.default_rng(PALETTE_SEED).integers(0, 256, size=(NUM_CLASSES, 3))
    for _ in range(count):
        colour = int(rng.integers(0, NUM_CLASSES))
        noise = rng.integers(-PIXEL_NOISE, PIXEL_NOISE + 1, size=IMAGE_SHAPE)
        image = np.clip(palette[colour] + noise, 0, 255).astype(np.uint8)
        label = int(rng.integers(0, NUM_CLASSES)) if rng.random() < LABEL_NOISE else colour
        yield image.tobytes(), label


def tfrecord_file(count: int, seed: int) -> bytes:
    """The bytes of one TFRecord file of ``count`` CIFAR-10-shaped examples."""
    return b"".join(
        tfrecord_frame(encode_example({IMAGE_KEY: image, LABEL_KEY: label}))
        for image, label in generate_examples(count, seed)
    )


@dataclass(frozen=True)
class DemoDataset:
    """Where ``write_demo_data`` put the data, and how much."""

    train_uri: str
    validation_uri: str
    files: int
    records: int
    bytes: int


def write_demo_data(
    prefix: str = DEFAULT_PREFIX,
    files: int = 8,
    records_per_file: int | Sequence[int] = 64,
    validation_files: int = 2,
    seed: int = 0,
    client=None,
    create_bucket: bool = False,
) -> DemoDataset:
    """Write ``files`` train and ``validation_files`` validation TFRecord files under ``prefix``.

    ``records_per_file`` is one count for every file, or one count per train file (files of
    different sizes, as real datasets have; validation files then get the mean count).

    ``create_bucket`` creates a missing bucket: only for a local endpoint (the embedded one starts
    empty), never on real S3, where a missing bucket is an error.
    """
    counts = [records_per_file] * files if isinstance(records_per_file, int) else list(records_per_file)
    if len(counts) != files:
        raise ConfigurationError(f"records_per_file has {len(counts)} count(s) for {files} train file(s)")
    if files < 1 or min(counts) < 1 or validation_files < 0:
        raise ConfigurationError(
            f"demo data needs files >= 1 and records per file >= 1 (got files={files}, "
            f"records_per_file={records_per_file}, validation_files={validation_files})"
        )
    info = {"files": files, "validation_files": validation_files, "records_per_file": records_per_file,
            "generator": GENERATOR}  # fmt: skip
    return _write_files(prefix, counts, validation_files, tfrecord_file, seed, info, client, create_bucket)


def _write_files(prefix: str, counts, validation_files: int, make_file, seed, info, client, create_bucket):
    """Upload ``make_file(count, seed + i)`` for each train count and ``validation_files`` files of their mean
    under ``prefix`` (``train/``, ``validation/``), then ``dataset.json`` (``info``), last."""
    bucket, key_prefix = parse_s3_uri(prefix)
    if key_prefix and not key_prefix.endswith("/"):
        key_prefix += "/"
    client = client or s3_client()
    try:
        client.head_bucket(Bucket=bucket)
    except client.exceptions.ClientError as exc:
        if not create_bucket:
            raise DemoDataError(
                f"bucket {bucket} not found or not accessible ({exc}); create it first (sagemaker-dist "
                "never creates buckets on real S3) or check your credentials and region"
            ) from exc
        client.create_bucket(Bucket=bucket)
    total = records = 0
    mean = round(sum(counts) / len(counts))
    for role, sizes, offset in (("train", counts, 0), ("validation", [mean] * validation_files, 10_000)):
        for i, size in enumerate(sizes):
            body = make_file(size, seed + offset + i)
            client.put_object(Bucket=bucket, Key=f"{key_prefix}{role}/part-{i:05d}.tfrecord", Body=body)
            total += len(body)
            records += size
    client.put_object(Bucket=bucket, Key=key_prefix + DATASET_FILE, Body=json.dumps(info).encode())
    base = f"s3://{bucket}/{key_prefix}"
    return DemoDataset(
        train_uri=base + "train/",
        validation_uri=base + "validation/",
        files=len(counts) + validation_files,
        records=records,
        bytes=total,
    )


def successors():
    """The token language: ``[TOKEN_VOCAB, 4]`` tokens that may follow each token (fixed by its seed)."""
    import numpy as np

    rng = np.random.default_rng(PALETTE_SEED)
    return np.stack(
        [rng.choice(TOKEN_VOCAB, size=len(SUCCESSOR_P), replace=False) for _ in range(TOKEN_VOCAB)]
    )


def token_file(count: int, seed: int) -> bytes:
    """One TFRecord file of ``count`` records, each ``TOKEN_RECORD`` uint16 tokens of the language."""
    import numpy as np

    rng = np.random.default_rng(seed)
    table = successors()
    tokens = np.empty((count, TOKEN_RECORD), dtype="<u2")
    tokens[:, 0] = rng.integers(0, TOKEN_VOCAB, size=count)
    picks = rng.choice(len(SUCCESSOR_P), size=(count, TOKEN_RECORD - 1), p=SUCCESSOR_P)
    for i in range(1, TOKEN_RECORD):
        tokens[:, i] = table[tokens[:, i - 1], picks[:, i - 1]]
    return b"".join(tfrecord_frame(row.tobytes()) for row in tokens)


def write_token_data(
    prefix: str,
    files: int = 16,
    records_per_file: int = 64,
    seed: int = 0,
    client=None,
    create_bucket: bool = False,
) -> DemoDataset:
    """Write ``files`` TFRecord files of ``records_per_file`` token records each under ``prefix`` +
    ``train/`` (see the module's docstring), and ``dataset.json``."""
    if files < 1 or records_per_file < 1:
        raise ConfigurationError(
            f"token data needs files >= 1 and records per file >= 1 (got files={files}, "
            f"records_per_file={records_per_file})"
        )
    info = {"files": files, "validation_files": 0, "records_per_file": records_per_file,
            "generator": TOKEN_GENERATOR, "record_bytes": TOKEN_BYTES, "vocab": TOKEN_VOCAB}  # fmt: skip
    counts = [records_per_file] * files
    return _write_files(prefix, counts, 0, token_file, seed, info, client, create_bucket)
