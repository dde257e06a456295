"""WebDataset shards against TFRecords: the readers over the same samples, and ``pack`` against webdataset's
own ``ShardWriter`` writing the same files.

**Readers.** The same samples (an image of ``size`` random bytes and a class) as a stream of tar shards
(``<key>.jpg``, ``<key>.cls``; 64 MB each, end-of-archive blocks between) and as a stream of TFRecords
(``tf.train.Example`` with ``image`` and ``label``), each streamed through a FIFO by a separate writer
process (``bench_pipe_reader.py``'s, up before the clock) and read in a new Python process (PyTorch
imported before the clock), arms interleaved and rotated each round:

- ``tar-raw`` / ``tfr-raw``: ``RecordBatches`` (a ``RaggedBatch`` of 256 records: a sample's tar members,
  or an Example) - the framing, both in the compiled batch reader where it is built;
- ``tar-dec`` / ``tfr-dec``: ``PipeBatches`` of 256 decoded samples, the image's bytes and the class as
  an int64 tensor (``sample_decoder`` and its collate, ``example_decoder`` and a collate to the same) -
  what a training loop gets;
- ``tar-pipe`` / ``tfr-pipe``: the FIFO drained in 1 MiB reads, nothing framed - the most any reader
  of that stream gets through the pipe (its samples/s are the stream's samples over the drain's time);
- ``wds``: the ``webdataset`` library reading the same samples as one tar from the FIFO
  (``WebDataset(fifo)``, its tar reader and grouping, samples counted; no batches) - the peer. Given the
  stream of shards it stops at the first end-of-archive blocks, after the first shard.

"tar / tfr" is the median over rounds of the TFRecord arm's time over the tar arm's, in the same round
(samples/s); "per byte" the same ratio of MB/s (a 1 KB image in a tar shard is 2.4 times its bytes in
TFRecords: a 512-byte header per file, each file padded to 512). "tar-pipe / tfr-raw" is the highest
"tar / tfr" any tar reader can reach: the tar stream drained without framing against the TFRecord reader.

**Writers.** An ImageFolder of ``--files`` images of ``size`` bytes (3 classes) packed into shards of
about 64 MB in a local folder by ``pack_dataset`` (``--workers`` at once) and by ``webdataset.ShardWriter``
(one process, reading each file and writing ``{"__key__", "jpg", "cls"}``, the loop its documentation
shows), interleaved; files/s and MB/s of image bytes.

    .venv/bin/python bench/bench_webdataset.py [--mb 256] [--repeats 3] [--sizes 1000,150000]
        [--files 20000] [--workers 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pipe_reader import rotated, start_writer  # noqa: E402

BATCH = 256
SHARD_BYTES = 64 << 20
DISTINCT = 512  # distinct samples, repeated to the stream's size

CHILD = """
import json, sys, time
arm, root, fifo, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
import torch  # not timed: every PyTorch script imports it
from sagemaker_dist.runtime.config import ContainerConfig
start = time.perf_counter()
n = 0
if arm.endswith("pipe"):  # the FIFO drained, nothing framed: what any reader of this stream can reach
    import os
    fd, buf = os.open(fifo, os.O_RDONLY), bytearray(1 << 20)
    while got := os.readv(fd, [buf]):
        n += got
    os.close(fd)
elif arm == "wds":
    import webdataset as wds
    for sample in wds.WebDataset(fifo, shardshuffle=False):
        n += 1
else:
    from sagemaker_dist.runtime import PipeBatches, RecordBatches, example_decoder, sample_decoder
    config = ContainerConfig.load(root, {})
    fmt = "WebDataset" if arm.startswith("tar") else "TFRecord"
    if arm.endswith("raw"):
        batches = RecordBatches("bench", batch, record_format=fmt, config=config)
        count = lambda b: int(b.offsets.shape[0]) - 1
    elif fmt == "WebDataset":
        decode = sample_decoder({"jpg": "bytes", "cls": "int"})
        batches = PipeBatches(
            "bench", batch, record_format=fmt, decode=decode, collate=decode.collate, config=config
        )
        count = lambda b: len(b["jpg"])
    else:
        example = example_decoder({"image": "bytes", "label": "int64"})
        decode = lambda r: (lambda e: (e["image"], int(e["label"])))(example(r))
        collate = lambda items: {"jpg": [i[0] for i in items], "cls": torch.tensor([i[1] for i in items])}
        batches = PipeBatches(
            "bench", batch, record_format=fmt, decode=decode, collate=collate, config=config
        )
        count = lambda b: len(b["jpg"])
    for b in batches:
        n += count(b)
total = time.perf_counter() - start
print(json.dumps({"n": n, "total": total}))
"""


def samples(size: int) -> list[tuple[bytes, int]]:
    return [(os.urandom(size), i % 10) for i in range(DISTINCT)]


def write_streams(root: Path, size: int, total: int) -> tuple[Path, Path, Path, int]:
    """The tar stream (shards of SHARD_BYTES, concatenated), the same samples as one tar (webdataset's
    reader stops at the first end-of-archive blocks: it reads one archive a stream) and the TFRecord
    stream of the same samples."""
    from sagemaker_dist.contract.record_formats import encode_tfrecord
    from sagemaker_dist.contract.tar_format import END_OF_ARCHIVE, tar_member
    from sagemaker_dist.launch.records import encode_example

    distinct = samples(size)
    tar_path, tfr_path, one_path = root / f"s{size}.tar", root / f"s{size}.tfrecord", root / f"s{size}-1.tar"
    n = 0
    with open(tar_path, "wb") as tar, open(tfr_path, "wb") as tfr, open(one_path, "wb") as one:
        shard = 0
        while tar.tell() < total:
            image, label = distinct[n % DISTINCT]
            key = f"{n:09d}"
            data = tar_member(f"{key}.jpg", image) + tar_member(f"{key}.cls", str(label).encode())
            tar.write(data)
            one.write(data)
            shard += len(data)
            if shard >= SHARD_BYTES:
                tar.write(END_OF_ARCHIVE)
                shard = 0
            tfr.write(encode_tfrecord(encode_example({"image": image, "label": label})))
            n += 1
        tar.write(END_OF_ARCHIVE)
        one.write(END_OF_ARCHIVE)
    return tar_path, tfr_path, one_path, n


def readers(args, root: Path) -> None:
    data = root / "input" / "data"
    data.mkdir(parents=True)
    (root / "input" / "config").mkdir(parents=True)
    (root / "input" / "config" / "inputdataconfig.json").write_text(
        json.dumps({"bench": {"TrainingInputMode": "Pipe", "RecordWrapperType": "None"}})
    )
    arms = ["tar-raw", "tfr-raw", "tar-dec", "tfr-dec", "wds", "tar-pipe", "tfr-pipe"]
    epoch = other = 0
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    for size in [int(s) for s in args.sizes.split(",")]:
        tar_path, tfr_path, one_path, count = write_streams(root, size, args.mb << 20)
        sources = {"wds": one_path, "tar-raw": tar_path, "tar-dec": tar_path, "tar-pipe": tar_path}
        runs: dict[str, list[dict]] = {arm: [] for arm in arms}
        for round_ in range(args.repeats):
            for arm in rotated(arms, round_):
                if arm == "wds" or arm.endswith("pipe"):  # not the readers' epochs: FIFOs of their own
                    fifo, other = data / f"other_{other}", other + 1
                else:
                    fifo, epoch = data / f"bench_{epoch}", epoch + 1
                writer = start_writer(sources.get(arm, tfr_path), fifo)
                argv = [sys.executable, "-c", CHILD, arm, str(root), str(fifo), str(BATCH)]
                done = subprocess.run(
                    argv, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path}
                )
                writer.wait()
                if done.returncode:
                    raise SystemExit(f"{arm} failed: {done.stderr[-2000:]}")
                result = json.loads(done.stdout.strip().splitlines()[-1])
                want = sources.get(arm, tfr_path).stat().st_size if arm.endswith("pipe") else count
                assert result["n"] == want, (arm, result["n"], want)
                runs[arm].append(result)
        tar_mb, tfr_mb = tar_path.stat().st_size / 1e6, tfr_path.stat().st_size / 1e6
        print(
            f"-- {size} B images, {count} samples: tar {tar_mb:.0f} MB, TFRecord {tfr_mb:.0f} MB, "
            f"load average {os.getloadavg()[0]:.1f} after"
        )
        print(f"{'arm':>8} {'samples/s':>10} {'MB/s':>7}   per-run samples/s")
        for arm in arms:
            total = statistics.median(r["total"] for r in runs[arm])
            mb = tfr_mb if arm.startswith("tfr") else tar_mb
            each = " ".join(f"{count / r['total']:,.0f}" for r in runs[arm])
            print(f"{arm:>8} {count / total:>10,.0f} {mb / total:>7.0f}   {each}")
        for tar_arm, tfr_arm in (("tar-raw", "tfr-raw"), ("tar-dec", "tfr-dec"), ("tar-pipe", "tfr-raw")):
            ratio = statistics.median(b["total"] / a["total"] for a, b in zip(runs[tar_arm], runs[tfr_arm]))
            print(f"{tar_arm} / {tfr_arm}: {ratio:.2f} (per byte {ratio * tar_mb / tfr_mb:.2f})")
        for path in (tar_path, tfr_path, one_path):
            path.unlink()


def shard_writer(folder: Path, out: Path) -> int:
    """webdataset's ShardWriter over the ImageFolder: what its documentation's loop does."""
    import webdataset as wds

    classes = sorted(p.name for p in folder.iterdir())
    files = [(p, label) for label, c in enumerate(classes) for p in sorted((folder / c).iterdir())]
    n = 0
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=SHARD_BYTES, verbose=0) as sink:
        for path, label in files:
            sink.write({"__key__": f"{n:08d}", "jpg": path.read_bytes(), "cls": label})
            n += 1
    return n


def writers(args, root: Path) -> None:
    from sagemaker_dist import pack_dataset

    for size in [int(s) for s in args.sizes.split(",")]:
        files = max(30, min(args.files, (args.mb << 20) // size))
        folder = root / f"images-{size}"
        for c in range(3):
            (folder / f"c{c}").mkdir(parents=True)
        for i in range(files):  # JPEG's magic, then random bytes: pack checks the magic only
            (folder / f"c{i % 3}" / f"{i:07d}.jpg").write_bytes(b"\xff\xd8\xff" + os.urandom(size - 3))
        image_mb = files * size / 1e6
        arms = ["pack", "ShardWriter"]
        runs: dict[str, list[float]] = {a: [] for a in arms}
        for round_ in range(args.repeats):
            for arm in rotated(arms, round_):
                out = root / f"out-{arm}-{round_}"
                out.mkdir()
                start = time.perf_counter()
                if arm == "pack":
                    pack_dataset(folder, out, shard_size=SHARD_BYTES, workers=args.workers, progress=False)
                else:
                    shard_writer(folder, out)
                runs[arm].append(time.perf_counter() - start)
                subprocess.run(["rm", "-rf", str(out)], check=True)
        print(
            f"-- {files} files of {size} B ({image_mb:.0f} MB), pack --workers {args.workers}, "
            f"load average {os.getloadavg()[0]:.1f} after"
        )
        for arm in arms:
            t = statistics.median(runs[arm])
            each = " ".join(f"{files / r:,.0f}" for r in runs[arm])
            print(f"{arm:>12} {files / t:>10,.0f} files/s {image_mb / t:>7.0f} MB/s   per-run files/s {each}")
        subprocess.run(["rm", "-rf", str(folder)], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--mb", type=int, default=256, help="stream (and image set) size per sample size, MiB"
    )
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds; medians are reported")
    parser.add_argument("--sizes", default="1000,150000", help="image sizes in bytes")
    parser.add_argument("--files", type=int, default=20000, help="at most this many files for the writers")
    parser.add_argument("--workers", type=int, default=4, help="pack's shards written at once")
    parser.add_argument("--only", choices=("readers", "writers"), help="one half only")
    args = parser.parse_args()
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "sagemaker_dist")], check=True)
    from sagemaker_dist.runtime.framing import batch_fill, tar

    compiled = "WebDataset" in batch_fill.COMPILED_FORMATS
    print(
        f"{os.cpu_count()} CPU(s); tar walk in {'C' if tar._native is not None else 'Python'}, "
        f"RecordBatches' tar framing {'compiled' if compiled else 'Python'}; "
        f"medians of {args.repeats} interleaved rounds"
    )
    with tempfile.TemporaryDirectory(prefix="bench-webdataset-") as tmp:
        if args.only != "writers":
            readers(args, Path(tmp) / "readers")
        if args.only != "readers":
            writers(args, Path(tmp) / "writers")
    import torch
    import webdataset

    print(f"torch {torch.__version__}, webdataset {webdataset.__version__}, Python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
