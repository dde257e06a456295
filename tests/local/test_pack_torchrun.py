"""``sagemaker-dist pack`` then a local torchrun job over its WebDataset shards: a folder of real JPEGs
(one sub-folder per class) packed into 8 shards, the shards folder given as ``--train`` (mirrored into the
embedded S3), 2 hosts x 2 ranks each reading its own Pipe-mode FIFO with ``PipeBatches`` and
``sample_decoder``, images decoded with ``decode_jpeg_batch``. The job ends 0 and every image was
trained once, with its own bytes and its class folder's label. Shards written by the ``webdataset``
library and by GNU tar, through the same kind of job, sample by sample. And the raw-objects layout: one
JPEG per S3 object, wrapped in RecordIO by the feeder, read by ``RecordBatches``."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch"),
    pytest.mark.timeout(420),
]

CLI = [sys.executable, "-m", "sagemaker_dist.cli"]
SCRIPTS = Path(__file__).resolve().parents[1] / "helpers" / "local_scripts"
CLASSES = ("bird", "cat", "dog")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}  # the embedded endpoint


def image_folder(root: Path, per_class: int) -> dict[str, int]:
    """JPEGs of 12-20 pixels a side under root/<class>/; sha256 of each -> its label."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1)
    expected = {}
    for label, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 255, (12 + i % 9, 20 - i % 7, 3), dtype=np.uint8)
            out = io.BytesIO()
            Image.fromarray(pixels).save(out, format="JPEG", quality=90)
            (root / name / f"{i:03d}.jpg").write_bytes(out.getvalue())
            expected[hashlib.sha256(out.getvalue()).hexdigest()] = label
    return expected


def test_pack_then_a_2x2_torchrun_job_trains_every_image_once_with_its_label(tmp_path):
    expected = image_folder(tmp_path / "images", per_class=30)
    packed = subprocess.run(
        [*CLI, "pack", str(tmp_path / "images"), str(tmp_path / "packed"), "--shards", "8", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert packed.returncode == 0, packed.stdout + packed.stderr
    index = json.loads((tmp_path / "packed" / "index.json").read_text())
    assert index["records"] == 90 and index["classes"] == list(CLASSES) and len(index["shards"]) == 8
    out = tmp_path / "out"
    out.mkdir()
    argv = [*CLI, "local", "--entry-point", "train_webdataset_torch.py", "--source-dir", str(SCRIPTS)]
    argv += ["--train", str(tmp_path / "packed" / "shards"), "--distribution", "torchrun"]
    argv += ["--hosts", "2", "--processes-per-host", "2", "--epochs", "1", "-p", f"out={out}"]
    argv += ["--s3-state-dir", str(tmp_path / "s3"), "--work-dir", str(tmp_path / "work"), "--timeout", "300"]
    job = subprocess.run(argv, capture_output=True, text=True, timeout=360, env=_env())
    assert job.returncode == 0, job.stdout[-4000:] + job.stderr[-4000:]
    assert "--train: 8 file(s) of" in job.stdout
    rows = [
        json.loads(line)
        for rank in range(4)
        for line in (out / f"samples-rank{rank}.jsonl").read_text().splitlines()
    ]
    assert all((out / f"samples-rank{rank}.jsonl").stat().st_size for rank in range(4))  # every rank read
    assert sorted(r["key"] for r in rows) == [f"{i:06d}" for i in range(90)]  # each sample once
    assert {r["sha256"]: r["label"] for r in rows} == expected  # its own bytes, its class folder's label
    assert "sagemaker-dist-metrics: epoch=1 loss=" in job.stdout


def test_raw_objects_one_jpeg_each_stream_as_recordio_records_and_decode(s3, bucket, tmp_path):
    """The raw-objects layout as its page shows it: JPEG objects under a prefix, the channel's
    RecordWrapperType RecordIO, a torchrun job of 2 ranks reading them with RecordBatches and decoding
    them with decode_jpeg_batch: every object is one record, decoded once."""
    import re

    import numpy as np
    from PIL import Image

    from sagemaker_dist import DistributedEstimator, LocalBackend

    rng = np.random.default_rng(0)
    for i in range(40):
        out = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (20 + i % 5, 24, 3), dtype=np.uint8)).save(out, format="JPEG")
        s3.put_object(Bucket=bucket, Key=f"images/{i:03d}.jpg", Body=out.getvalue())
    estimator = DistributedEstimator(
        "train_raw_images_torch.py",
        source_dir=str(SCRIPTS),
        role="arn:aws:iam::000000000000:role/local",
        instance_type="ml.c5.xlarge",
        instance_count=1,
        processes_per_host=2,
        distribution="torchrun",
        record_wrapper="RecordIO",
        output_path=f"s3://{bucket}/jobs",
    )
    job = estimator.launch({"train": f"s3://{bucket}/images/"}, backend=LocalBackend(work_dir=str(tmp_path)))
    decoded = [
        re.search(r"rank (\d): decoded (\d+) images of shape \(3, 16, 16\)", line) for line in job.output
    ]
    assert sorted(int(m.group(2)) for m in decoded if m) == [20, 20]  # 40 objects, 40 records


def test_shards_of_webdataset_and_gnu_tar_stream_through_a_2x2_job_sample_by_sample(tmp_path):
    """Shards written by the webdataset library and by GNU tar (pax, names over 100 bytes), a folder given
    as --train, 2 hosts x 2 ranks reading with a script written from the docs: every sample's key and every
    file's bytes as the webdataset library reads the same shards."""
    import random

    wds = pytest.importorskip("webdataset")
    data = tmp_path / "shards"
    data.mkdir()
    rng = random.Random(9)
    for n in range(2):
        with wds.TarWriter(str(data / f"wds-{n}.tar")) as writer:
            for i in range(25 + 10 * n):
                writer.write(
                    {
                        "__key__": f"w{n}/{i:04d}",
                        "bin": rng.randbytes(rng.randint(0, 3000)),
                        "cls": str(i % 3),
                    }
                )
    for n in range(2):
        tree = tmp_path / f"tree{n}" / ("deep" * 30)
        tree.mkdir(parents=True)
        for i in range(20 + 7 * n):
            stem = f"{'x' * 110}{n}-{i:03d}"
            (tree / f"{stem}.bin").write_bytes(rng.randbytes(rng.randint(1, 3000)))
            (tree / f"{stem}.cls").write_bytes(str(i % 3).encode())
        command = ["tar", "--format=pax", "--sort=name", "-cf", str(data / f"gnu-{n}.tar"), "."]
        subprocess.run(command, cwd=tmp_path / f"tree{n}", check=True)
    expected = {}
    for shard in sorted(data.iterdir()):
        for sample in wds.WebDataset(str(shard), shardshuffle=False):
            row = {ext: hashlib.sha256(sample[ext]).hexdigest() for ext in ("bin", "cls")}
            expected[sample["__key__"]] = row
    out = tmp_path / "out"
    out.mkdir()
    argv = [*CLI, "local", "--entry-point", "read_samples_torch.py", "--source-dir", str(SCRIPTS)]
    argv += ["--train", str(data), "--distribution", "torchrun", "--hosts", "2", "--processes-per-host", "2"]
    argv += ["--epochs", "1", "-p", f"out={out}", "--s3-state-dir", str(tmp_path / "s3")]
    argv += ["--work-dir", str(tmp_path / "work"), "--timeout", "300"]
    job = subprocess.run(argv, capture_output=True, text=True, timeout=360, env=_env())
    assert job.returncode == 0, job.stdout[-4000:] + job.stderr[-4000:]
    rows = [
        json.loads(line)
        for rank in range(4)
        for line in (out / f"samples-rank{rank}.jsonl").read_text().splitlines()
    ]
    got = {row.pop("key"): row for row in rows}
    assert len(rows) == len(got) == len(expected) == 25 + 35 + 20 + 27  # each sample once
    assert got == expected
