"""WebDataset shards through the PyTorch readers over real FIFOs fed as SageMaker's Pipe mode feeds them (the
objects one after another): ``PipeBatches`` and ``RecordBatches`` with ``record_format="WebDataset"``,
every sample's key and bytes equal to what the ``webdataset`` library reads from the same shards (written
by webdataset and by GNU tar with long names); ``sample_decoder``'s kinds (cls, json, txt, npy, images
through ``decode_jpeg_batch``); the seeded shuffle and a resume inside an epoch; bad bytes named."""

from __future__ import annotations

import io
import os
import random
import subprocess

import numpy as np
import pytest
from helpers.runtime_helpers import FifoFeeder, write_opt_ml

from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.contract.tar_format import END_OF_ARCHIVE, tar_member
from sagemaker_dist.launch.tar_shards import WebDatasetWriter
from sagemaker_dist.runtime.framing.base import RecordFormatError

torch = pytest.importorskip("torch")
wds = pytest.importorskip("webdataset")

pytestmark = pytest.mark.torch


def channel(tmp_path, epochs: list[bytes]):
    from sagemaker_dist.runtime.config import ContainerConfig

    root = write_opt_ml(tmp_path / "opt_ml", ["train_0"], plan_layout(1, 1))
    feeder = FifoFeeder(root / "input" / "data", "train_0", epochs)
    feeder.start()
    return ContainerConfig.load(root, {}), feeder


def reference(paths) -> list[dict]:
    out = []
    for path in paths:
        for sample in wds.WebDataset(str(path), shardshuffle=False):
            out.append({k: v for k, v in sample.items() if k not in ("__url__", "__local_path__")})
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Two shards by webdataset's TarWriter and one by GNU tar --format=pax with names over 100 bytes."""
    tmp = tmp_path_factory.mktemp("wds")
    rng = random.Random(5)
    paths = []
    for n in range(2):
        path = tmp / f"w{n}.tar"
        with wds.TarWriter(str(path)) as w:
            for i in range(30):
                w.write(
                    {"__key__": f"{n}-{i:04d}", "bin": rng.randbytes(rng.randint(0, 5000)), "cls": str(i % 4)}
                )
        paths.append(path)
    tree = tmp / "tree" / ("long" * 30)
    tree.mkdir(parents=True)
    for i in range(8):
        (tree / f"{'x' * 120}{i}.bin").write_bytes(rng.randbytes(rng.randint(1, 3000)))
        (tree / f"{'x' * 120}{i}.cls").write_bytes(str(i).encode())
    command = ["tar", "--format=pax", "--sort=name", "-cf", str(tmp / "gnu.tar"), "."]
    subprocess.run(command, cwd=tmp / "tree", check=True)
    paths.append(tmp / "gnu.tar")
    return paths


def test_pipe_batches_read_every_sample_as_webdataset_does_epoch_after_epoch(tmp_path, shards):
    from sagemaker_dist.runtime import PipeBatches, sample_decoder

    stream = b"".join(p.read_bytes() for p in shards)
    expected = reference(shards)
    config, feeder = channel(tmp_path, [stream, stream])
    decode = sample_decoder(["bin", "cls"], keep_key=True)
    batches = PipeBatches(
        "train_0", 7, record_format="WebDataset", decode=decode, collate=decode.collate, config=config
    )
    for _ in range(2):  # two epochs: two FIFOs
        got = []
        for batch in batches:
            assert batch["cls"].dtype == torch.int64
            got += [
                {"__key__": k, "bin": b, "cls": str(int(c)).encode()}
                for k, b, c in zip(batch["__key__"], batch["bin"], batch["cls"])
            ]
        assert got == expected
    assert batches.records == 2 * 68 and batches.epochs_opened == 2
    feeder.join(10)
    assert feeder.error is None


@pytest.mark.parametrize("compiled", [None, False])
def test_record_batches_hand_out_sample_records_that_decode_to_the_same_batches(tmp_path, shards, compiled):
    from sagemaker_dist.runtime import RaggedBatch, RecordBatches, sample_decoder

    stream = b"".join(p.read_bytes() for p in shards)
    expected = reference(shards)
    config, feeder = channel(tmp_path, [stream])
    batches = RecordBatches(
        "train_0", 16, record_format="WebDataset", compiled=compiled, config=config, pin_memory=False
    )
    decode = sample_decoder(keep_key=True)  # every file, by its extension's kind
    got = []
    for batch in batches:
        assert isinstance(batch, RaggedBatch)
        decoded = decode.decode_batch(batch)
        got += [
            {"__key__": k, "bin": b, "cls": str(int(c)).encode()}
            for k, b, c in zip(decoded["__key__"], decoded["bin"], decoded["cls"])
        ]
    assert got == expected
    feeder.join(10)


def test_a_shuffled_epoch_is_the_same_samples_in_a_seeded_order_and_resumes_inside_the_epoch(
    tmp_path, shards
):
    from sagemaker_dist.runtime import PipeBatches, sample_decoder

    stream = b"".join(p.read_bytes() for p in shards)
    keys = [s["__key__"] for s in reference(shards)]
    decode = sample_decoder(["cls"], keep_key=True)

    def reader(config):
        return PipeBatches(
            "train_0", 5, record_format="WebDataset", decode=decode, collate=decode.collate, config=config,
            shuffle=11,
        )  # fmt: skip

    config, feeder = channel(tmp_path / "a", [stream])
    whole = [k for b in reader(config) for k in b["__key__"]]
    feeder.join(10)
    assert sorted(whole) == sorted(keys) and whole != keys
    config, feeder = channel(tmp_path / "b", [stream])
    first = reader(config)
    handed = []
    for batch in first:
        handed += batch["__key__"]
        if len(handed) == 20:
            break
    state = first.state_dict()
    feeder.join(10)
    config, feeder = channel(tmp_path / "c", [stream])
    second = reader(config)
    second.load_state_dict(state)
    rest = [k for b in second for k in b["__key__"]]
    feeder.join(10)
    assert handed + rest == whole


def test_images_decode_through_decode_jpeg_batch_and_the_other_kinds_decode(tmp_path):
    from PIL import Image

    from sagemaker_dist.runtime import PipeBatches, decode_jpeg_batch, sample_decoder

    rng = np.random.default_rng(0)
    pixels, samples = [], []
    for i in range(6):
        array = rng.integers(0, 255, (8 + 2 * i, 10, 3), dtype=np.uint8)
        out = io.BytesIO()
        Image.fromarray(array).save(out, format="JPEG", quality=95)
        pixels.append(np.array(Image.open(io.BytesIO(out.getvalue())).convert("RGB")))
        samples.append(
            {
                "__key__": f"{i:03d}",
                "jpg": out.getvalue(),
                "cls": i,
                "json": {"i": i},
                "txt": f"image {i}",
                "npy": np.full((2, 3), i, dtype=">i4"),
            }
        )
    blob = io.BytesIO()
    with WebDatasetWriter(blob) as out:
        for sample in samples:
            out.write(sample)
    config, feeder = channel(tmp_path, [blob.getvalue()])
    decode = sample_decoder(["jpg", "cls", "json", "txt", "npy"])
    (batch,) = list(
        PipeBatches(
            "train_0", 6, record_format="WebDataset", decode=decode, collate=decode.collate, config=config
        )
    )
    feeder.join(10)
    assert batch["cls"].tolist() == list(range(6)) and batch["json"] == [{"i": i} for i in range(6)]
    assert batch["txt"] == [f"image {i}" for i in range(6)]
    assert batch["npy"].shape == (6, 2, 3) and batch["npy"][:, 0, 0].tolist() == list(range(6))
    images = decode_jpeg_batch(batch["jpg"], device="cpu", size=(8, 10))
    assert images.shape == (6, 3, 8, 10) and images.dtype == torch.uint8
    first = torch.from_numpy(pixels[0]).permute(2, 0, 1)
    assert (images[0].int() - first.int()).abs().float().mean() < 8  # the same picture, decoded


def test_samples_that_do_not_hold_what_the_decoder_expects_are_named(tmp_path):
    from sagemaker_dist.runtime import sample_decoder
    from sagemaker_dist.runtime.torch.samples import SampleDecodeError

    decode = sample_decoder(["jpg", "cls"])
    with pytest.raises(SampleDecodeError, match="sample 'a' has no 'jpg' file .it has: cls."):
        decode(tar_member("a.cls", b"1"))
    with pytest.raises(SampleDecodeError, match="sample 'a': 'cls' is not a decimal integer"):
        sample_decoder(["cls"])(tar_member("a.cls", b"one"))
    huge = b"\x93NUMPY\x01\x00" + (70).to_bytes(2, "little")
    huge += b"{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }".ljust(70) + b"\0" * 16
    with pytest.raises(SampleDecodeError, match=r"claims \(1000000000000,\) of float64 .* in 16 bytes"):
        sample_decoder(["npy"])(tar_member("a.npy", huge))
    with pytest.raises(SampleDecodeError, match="a record is not a WebDataset sample"):
        decode(b"\0" * 10)
    with pytest.raises(ValueError, match="kind 'jpeg2000' is not one of"):
        sample_decoder({"jpg": "jpeg2000"})


def test_a_bad_header_in_the_pipe_fails_the_epoch_naming_the_channel_and_offset(tmp_path):
    from sagemaker_dist.runtime import PipeBatches

    good = b"".join(tar_member(f"{i}.bin", os.urandom(100)) for i in range(4)) + END_OF_ARCHIVE
    bad = bytearray(tar_member("9.bin", b"x"))
    bad[0] ^= 1
    config, feeder = channel(tmp_path, [good + bytes(bad)])
    batches = PipeBatches("train_0", 2, record_format="WebDataset", config=config, prefetch=1)
    got = []
    with pytest.raises(RecordFormatError) as caught:
        for batch in batches:
            got += batch
    assert len(got) == 4
    assert caught.value.channel == "train_0" and caught.value.offset == len(good)
    assert "WebDataset: header checksum mismatch" in str(caught.value)
    feeder.join(10)


def test_record_batches_shuffle_samples_into_the_batches_pipe_batches_make(tmp_path, shards):
    """Sample records lie one after another in the stream: RecordBatches copies runs of them at once, into
    batches and into shuffle windows cut by bytes; the batches hold the samples PipeBatches' do."""
    from sagemaker_dist.runtime import PipeBatches, RecordBatches, ShuffleWindow, sample_decoder

    stream = b"".join(p.read_bytes() for p in shards)
    decode = sample_decoder(["cls"], keep_key=True)
    window = ShuffleWindow(5, records=1000, bytes=40_000)  # windows cut by bytes, inside runs
    config, feeder = channel(tmp_path / "a", [stream])
    pipe = PipeBatches(
        "train_0", 9, record_format="WebDataset", decode=decode, collate=decode.collate, config=config,
        shuffle=window,
    )  # fmt: skip
    expected = [k for b in pipe for k in b["__key__"]]
    feeder.join(10)
    config, feeder = channel(tmp_path / "b", [stream])
    raw = RecordBatches(
        "train_0", 9, record_format="WebDataset", config=config, pin_memory=False, shuffle=window
    )
    got = [k for b in raw for k in decode.decode_batch(b)["__key__"]]
    feeder.join(10)
    # the same samples in each batch, RecordBatches' in stream order
    position = {s["__key__"]: i for i, s in enumerate(reference(shards))}
    batches = [sorted(expected[a : a + 9], key=position.get) for a in range(0, len(expected), 9)]
    assert got == [k for b in batches for k in b] and sorted(got) == sorted(position)
