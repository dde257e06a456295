"""A small generated CIFAR-10-shaped TFRecord dataset, so local mode needs no download.

SDK side: no TensorFlow. Records are ``tf.train.Example``s written by ``launch.records.encode_example``
and framed as TFRecord with a C-backed CRC32C. Images get a label-dependent colour under
strong noise, and a share of the labels is drawn at random (``LABEL_NOISE``): the demo model learns
in a few epochs, about 22 % of the labels are wrong for any model (so a few hundred validation
records score about 0.78 at best, give or take sampling), and the learning rate visibly moves where a
run gets (the tuning demo's trials differ).
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
    mean = round(sum(counts) / files)
    for role, sizes, offset in (("train", counts, 0), ("validation", [mean] * validation_files, 10_000)):
        for i, size in enumerate(sizes):
            body = tfrecord_file(size, seed + offset + i)
            client.put_object(Bucket=bucket, Key=f"{key_prefix}{role}/part-{i:05d}.tfrecord", Body=body)
            total += len(body)
            records += size
    info = {"files": files, "validation_files": validation_files, "records_per_file": records_per_file,
            "generator": GENERATOR}  # fmt: skip
    client.put_object(Bucket=bucket, Key=key_prefix + DATASET_FILE, Body=json.dumps(info).encode())
    base = f"s3://{bucket}/{key_prefix}"
    return DemoDataset(
        train_uri=base + "train/",
        validation_uri=base + "validation/",
        files=files + validation_files,
        records=records,
        bytes=total,
    )
