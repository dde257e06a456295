"""Feeding a GPU from the pipe: training speed on batches from ``RecordBatches`` against batches already
on the GPU, in the same process and run. For a GPU machine (PyTorch and torchvision, no TensorFlow).

Four parts, each printed as a table with the card's name:

1. ``train``: ResNet-18 and ResNet-50 (torchvision, bf16 autocast, channels_last, SGD, batches of 256
   224x224x3 uint8 images and a label: 150,529-byte TFRecords). ``resident``: the same uint8 batch,
   already on the GPU, every step. ``pipe``: a separate writer process streams the records through a FIFO
   (1 MiB writes, 1 MiB pipe buffer); ``RecordBatches(record_bytes=150529)`` frames them into pinned
   ``[256, 150529]`` tensors in its reader thread; ``pipe, device=``: the reader hands out each batch
   on the GPU, copied one batch ahead on a side stream (``device=``); ``pipe``: each step copies its
   pinned batch to the GPU itself (non_blocking, on the loop's stream) and trains. Every arm converts
   and normalises on the GPU. Arms alternate, medians of
   ``--repeats``; the first ``--warmup`` steps of each run are not timed.
2. ``feed``: the reader alone at 150 KB records, 1 rank and ``--ranks`` ranks at once (one FIFO and one
   writer each, every rank's clock started together): ``RecordBatches`` into pinned batches against a raw
   ``os.readv`` of the same pipe (``bench_torch_reader.py``'s child processes), aggregate GB/s.
3. ``jpeg``: ImageNet-like JPEGs (500x375, about 88 KB) as TFRecords through the pipe, read as
   ``RaggedBatch`` and decoded and resized to 224 on the GPU by ``decode_jpeg_batch`` (nvJPEG), training
   ResNet-50, against ResNet-50 on batches already decoded on the GPU; plus decode-only rates: the GPU
   path, and Pillow on one CPU thread. The GPU's pixels are checked against Pillow's.

    python3 bench/gpu_feed.py [--parts train,feed,jpeg,epochs] [--models resnet18,resnet50] [--steps 40]
        [--warmup 8] [--repeats 3] [--ranks 8] [--feed-mb 1024] [--smoke]

4. ``epochs``: epoch after epoch in one process (``--repeats`` + 1 epochs per arm): ResNet-18 fed
   from the pipe, the reader with only a copy to the GPU, the same unpinned, ResNet-18 on batches
   handed out on the GPU (``device=``); images/s per epoch, to see whether later epochs slow down.

``--smoke`` runs every part tiny on the CPU (a small CNN instead of torchvision's ResNets where
torchvision is missing) to check the script before a GPU machine's time is spent on it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bench_pipe_reader import rotated, start_writer  # noqa: E402
from bench_torch_reader import child_result, start_child  # noqa: E402

from sagemaker_dist.contract.record_formats import encode_tfrecord  # noqa: E402

SIDE = 224
MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


def opt_ml(root: Path, channel: str = "bench") -> Path:
    """A container tree with one Pipe channel, as ``ContainerConfig`` reads it."""
    (root / "input" / "data").mkdir(parents=True, exist_ok=True)
    (root / "input" / "config").mkdir(parents=True, exist_ok=True)
    config = {channel: {"TrainingInputMode": "Pipe", "RecordWrapperType": "None"}}
    (root / "input" / "config" / "inputdataconfig.json").write_text(json.dumps(config))
    return root


class Model:
    """One training step on uint8 NHWC (or NCHW) images already on the device."""

    def __init__(self, name: str, device: torch.device, side: int = SIDE, classes: int = 1000):
        try:
            import torchvision

            net = getattr(torchvision.models, name)(num_classes=classes)
        except (ImportError, RuntimeError):  # --smoke without torchvision: a small CNN
            net = torch.nn.Sequential(
                torch.nn.Conv2d(3, 8, 7, stride=4), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                torch.nn.Flatten(), torch.nn.Linear(8, classes),
            )  # fmt: skip
        self.device, self.side = device, side
        self.net = net.to(device, memory_format=torch.channels_last)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.01, momentum=0.9)
        self.mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(STD, device=device).view(1, 3, 1, 1)

    def step(self, images_nchw, labels) -> None:
        x = images_nchw.to(torch.float32, memory_format=torch.channels_last)
        x = (x - self.mean) / self.std
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(self.net(x), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def step_records(self, records) -> None:
        """A ``[n, 150529]`` uint8 batch on the device: NHWC pixels, then the label byte."""
        n, side = records.shape[0], self.side
        images = records[:, : side * side * 3].view(n, side, side, 3).permute(0, 3, 1, 2)
        self.step(images, records[:, side * side * 3].long())


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_steps(batches, step, warmup: int, steps: int, device) -> float:
    """Images per second over ``steps`` steps after ``warmup`` untimed ones; every batch is used."""
    iterator = iter(batches)
    for _ in range(warmup):
        step(next(iterator))
    sync(device)
    start = time.perf_counter()
    images = 0
    for _ in range(steps):
        batch = next(iterator)
        step(batch)
        images += batch_size(batch)
    sync(device)
    elapsed = time.perf_counter() - start
    for _ in iterator:  # the rest of the epoch (none when the stream holds warmup + steps batches)
        pass
    return images / elapsed


def batch_size(batch) -> int:
    return int(batch.offsets.shape[0]) - 1 if hasattr(batch, "offsets") else int(batch.shape[0])


def repeated(x, n: int):
    for _ in range(n):
        yield x


class Pipe:
    """A channel's next epoch through a FIFO: a writer process streams ``src`` ``repeats`` times."""

    def __init__(self, root: Path, channel: str = "bench"):
        from sagemaker_dist.runtime.config import ContainerConfig

        self.root = opt_ml(root, channel)
        self.channel = channel
        self.config = ContainerConfig.load(self.root, {})
        self.epoch = 0

    def reader(self, batch: int, **options):
        """The channel's ``RecordBatches``: each ``iter()`` reads the epoch that ``feed`` fed last."""
        from sagemaker_dist.runtime import RecordBatches

        return RecordBatches(self.channel, batch, config=self.config, **options)

    def feed(self, src: Path, repeats: int):
        fifo = self.root / "input" / "data" / f"{self.channel}_{self.epoch}"
        self.epoch += 1
        return start_writer(src, fifo, repeats)


def write_records(path: Path, records: list[bytes]) -> int:
    with open(path, "wb") as f:
        for record in records:
            f.write(encode_tfrecord(record))
    return path.stat().st_size


def train_part(args, device, tmp: Path, card: str) -> list[dict]:
    batch, side = args.batch, args.side
    image_bytes = side * side * 3
    record_bytes = image_bytes + 1
    src = tmp / "images.tfrecord"  # one batch of distinct records, streamed warmup + steps times
    write_records(src, [os.urandom(record_bytes) for _ in range(batch)])
    resident = torch.randint(0, 256, (batch, record_bytes), dtype=torch.uint8, device=device)
    resident[:, image_bytes] %= 100
    pipe = Pipe(tmp / "train")
    in_loop = pipe.reader(batch, record_bytes=record_bytes, prefetch=args.prefetch)
    on_device = pipe.reader(batch, record_bytes=record_bytes, prefetch=args.prefetch, device=device)
    rows = []
    for name in args.models.split(","):
        model = Model(name, device, side)

        def copied(b, model=model):
            model.step_records(b.to(device, non_blocking=True))

        arms = {"resident": None, "pipe, device=": (on_device, model.step_records), "pipe": (in_loop, copied)}
        runs = {arm: [] for arm in arms}
        total = args.warmup + args.steps
        for round_ in range(args.repeats):
            for arm in rotated(arms, round_):
                if arm == "resident":
                    batches, step = repeated(resident, total), model.step_records
                    runs[arm].append(timed_steps(batches, step, args.warmup, args.steps, device))
                else:
                    writer = pipe.feed(src, total)
                    runs[arm].append(timed_steps(*arms[arm], args.warmup, args.steps, device))
                    assert writer.wait(60) == 0
        for arm in ("pipe, device=", "pipe"):
            label = f"{name} b{batch}, {'copied on a side stream' if arm != 'pipe' else 'copied in the loop'}"
            row = summary(label, {k: runs[k] for k in ("resident", arm)}, "resident", arm, record_bytes)
            rows.append(row)
            print_row(row, card)
        del model
    return rows


def summary(label: str, runs: dict, reference: str, arm: str, bytes_per_image: int = 0) -> dict:
    ratios = [a / r for a, r in zip(runs[arm], runs[reference])]
    return {
        "case": label,
        reference: statistics.median(runs[reference]),
        arm: statistics.median(runs[arm]),
        "ratio": statistics.median(ratios),
        "GB/s": statistics.median(runs[arm]) * bytes_per_image / 1e9,
        "runs": runs,
    }


def number(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3f}"


def print_row(row: dict, card: str) -> None:
    shown = [f"{k} {number(v)}" for k, v in row.items() if k not in ("case", "runs", "ratio", "GB/s")]
    each = {k: [number(x) for x in v] for k, v in row["runs"].items()}
    print(
        f"[{card}] {row['case']}: {'  '.join(shown)}  ratio {row['ratio']:.3f}  {row['GB/s']:.2f} GB/s  "
        f"runs {each}",
        flush=True,
    )


def feed_part(args, device, tmp: Path, card: str) -> list[dict]:
    """The reader alone (pinned batches, no GPU work) against raw reads, 1 rank and ``--ranks`` at once."""
    from bench_pipe_reader import make_file

    size = 150_000
    src = tmp / "feed.tfrecord"
    records = make_file(src, size, args.feed_mb << 20)
    nbytes = src.stat().st_size
    roots = [opt_ml(tmp / f"feed{r}") for r in range(args.ranks)]
    epochs = [0] * args.ranks
    rows = []
    for ranks in sorted({1, args.ranks}):
        runs = {arm: [] for arm in FEED_ARMS}
        for round_ in range(args.repeats):
            for arm in rotated(FEED_ARMS, round_):
                results = run_ranks(arm, ranks, roots, epochs, src, size)
                if not arm.startswith("raw"):
                    epochs[:ranks] = [e + 1 for e in epochs[:ranks]]
                expected = nbytes if arm.startswith("raw") else records
                assert all(r["n"] == expected for r in results), [r["n"] for r in results]
                wall = max(r["ended"] for r in results) - min(r["began"] for r in results)
                runs[arm].append(ranks * nbytes / wall / 1e9)
        for arm in FEED_ARMS:
            if arm != "raw":
                row = summary(f"feed {ranks} rank(s) 150 KB, GB/s in aggregate", runs, "raw", arm)
                row["runs"] = {k: row["runs"][k] for k in ("raw", arm)}
                rows.append(row)
                print_row(row, card)
    return rows


# The feed part's arms: the raw pipe; raw reads into four batch-sized buffers of fresh pages in turn (the
# memory a batch reader must fill in a fresh process), and into four populated before the clock (that
# memory without fresh pages); RecordBatches into pinned batches with torch's
# defaults, and with the host allocator pinning by cudaHostRegister from 8 threads.
REGISTER = "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"
FEED_ARMS = {
    "raw": {},
    "raw-batches": {},
    "raw-warm": {},
    "ours": {},
    "ours, host register": {"PYTORCH_CUDA_ALLOC_CONF": REGISTER},
}


def run_ranks(arm: str, ranks: int, roots: list, epochs: list, src: Path, size: int) -> list[dict]:
    """One run of ``arm`` on ``ranks`` FIFOs at once, every clock started together; on a failure the
    other processes are ended (no writer left waiting on its FIFO)."""
    children, writers = [], []
    child_arm = arm.split(",")[0]
    try:
        for r in range(ranks):
            data = roots[r] / "input" / "data"
            fifo = data / (f"raw_{epochs[r]}" if arm.startswith("raw") else f"bench_{epochs[r]}")
            children.append(start_child(child_arm, roots[r], fifo, size, go=True, env=FEED_ARMS[arm]))
            writers.append(start_writer(src, fifo))
        for child in children:  # every rank up (PyTorch imported, CUDA started) before any clock
            assert child.stdout.readline() == "ready\n", f"{arm} did not start"
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        results = [child_result(arm, child) for child in children]
        for writer in writers:
            assert writer.wait(60) == 0
        return results
    finally:
        for process in children + writers:
            if process.poll() is None:
                process.kill()


def jpeg_images(count: int, width: int = 500, height: int = 375, target: int = 88_000) -> list[bytes]:
    """Distinct JPEGs of about ``target`` bytes: smooth gradients with noise (as photographs compress)."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:height, 0:width]

    def encode(i: int, noise: float) -> bytes:
        r = np.random.default_rng(i)
        phase = r.uniform(0, 6.3, 3)
        base = np.stack(
            [127 + 100 * np.sin(x / (23 + 7 * c) + y / (31 + 5 * c) + phase[c]) for c in range(3)], -1
        )
        pixels = np.clip(base + r.normal(0, noise, base.shape), 0, 255).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format="JPEG", quality=90)
        return out.getvalue()

    low, high = 0.0, 64.0  # the noise that gives about ``target`` bytes, found on the first image
    for _ in range(12):
        mid = (low + high) / 2
        low, high = (mid, high) if len(encode(0, mid)) < target else (low, mid)
    return [encode(i, low) for i in range(count)]


def jpeg_part(args, device, tmp: Path, card: str) -> list[dict]:
    import numpy as np
    from PIL import Image

    from sagemaker_dist.runtime import decode_jpeg_batch

    batch, side = args.batch, args.side
    width, height = (500, 375) if not args.smoke else (100, 75)
    jpegs = jpeg_images(batch, width, height, 88_000 if not args.smoke else 4_000)
    src = tmp / "jpegs.tfrecord"
    write_records(src, jpegs)
    mean_kb = statistics.mean(len(j) for j in jpegs) / 1e3
    pipe = Pipe(tmp / "jpeg")
    reader = pipe.reader(batch, prefetch=args.prefetch)
    labels = torch.randint(0, 1000, (batch,), device=device)
    decoded = torch.randint(0, 256, (batch, 3, side, side), dtype=torch.uint8, device=device)
    model = Model("resnet50", device, side)

    def pipe_step(ragged):
        model.step(decode_jpeg_batch(ragged, device=device, size=(side, side)), labels[: batch_size(ragged)])

    def decode_only(ragged):
        decode_jpeg_batch(ragged, device=device, size=(side, side))

    total = args.warmup + args.steps
    runs = {"decoded": [], "pipe+decode": [], "decode only": []}
    for round_ in range(args.repeats):
        for arm in rotated(runs, round_):
            if arm == "decoded":
                step = lambda images: model.step(images, labels)  # noqa: E731
                rate = timed_steps(repeated(decoded, total), step, args.warmup, args.steps, device)
            else:
                writer = pipe.feed(src, total)
                rate = timed_steps(reader, pipe_step if arm == "pipe+decode" else decode_only,
                                   args.warmup, args.steps, device)  # fmt: skip
                assert writer.wait(60) == 0
            runs[arm].append(rate)
    row = summary(
        f"jpeg resnet50 b{batch} ({mean_kb:.0f} KB JPEGs, {width}x{height})", runs, "decoded", "pipe+decode"
    )
    rows = [row]
    print_row(row, card)
    # Pillow on one CPU thread: decode and resize (the CPU pool a GPU would otherwise need), images/s
    sample = jpegs[: min(64, batch)]
    start = time.perf_counter()
    for data in sample:
        with Image.open(io.BytesIO(data)) as image:
            np.asarray(image.convert("RGB").resize((side, side), Image.BILINEAR))
    pillow = len(sample) / (time.perf_counter() - start)
    # the GPU's pixels against Pillow's decode of the same records (no resize)
    writer = pipe.feed(src, 1)
    ragged = list(reader)[0]
    assert writer.wait(60) == 0
    gpu = decode_jpeg_batch(ragged, device=device).cpu().numpy()
    cpu = np.stack([np.asarray(Image.open(io.BytesIO(j)).convert("RGB")).transpose(2, 0, 1) for j in jpegs])
    diff = float(np.abs(gpu.astype(int) - cpu.astype(int)).mean())
    info = {"case": "jpeg decode", "pillow 1 thread images/s": pillow,
            "gpu decode+resize images/s": statistics.median(runs["decode only"]),
            "mean |gpu - pillow| per pixel": diff}  # fmt: skip
    assert diff < 3, f"the GPU's decode differs from Pillow's by {diff} per pixel on average"
    print(f"[{card}] {json.dumps(info)}", flush=True)
    rows.append(info)
    return rows


def epochs_part(args, device, tmp: Path, card: str) -> list[dict]:
    """Epoch after epoch in one process: ResNet-18 fed from the pipe, then the reader alone (a copy to the
    GPU per batch), then unpinned, then ResNet-18 on batches the reader hands out on the GPU (``device=``);
    images/s per epoch."""
    batch, side = args.batch, args.side
    record_bytes = side * side * 3 + 1
    src = tmp / "epochs.tfrecord"
    write_records(src, [os.urandom(record_bytes) for _ in range(batch)])
    pipe = Pipe(tmp / "epochs")
    model = Model(args.models.split(",")[0], device, side)
    total = args.warmup + args.steps
    rows = []
    arms = [("model", True, None), ("copy only", True, None), ("unpinned copy", False, None),
            ("model, device=", True, device), ("model", True, None)]  # fmt: skip
    for arm, pinned, to in arms:
        pinned = pinned and device.type == "cuda"
        reader = pipe.reader(batch, record_bytes=record_bytes, prefetch=args.prefetch, pin_memory=pinned,
                             device=to)  # fmt: skip
        if to is not None:
            step = model.step_records
        elif arm.startswith("model"):
            step = lambda b: model.step_records(b.to(device, non_blocking=True))  # noqa: E731
        else:
            step = lambda b: b.to(device, non_blocking=True)  # noqa: E731
        rates = []
        for _ in range(args.repeats + 1):
            writer = pipe.feed(src, total)
            rates.append(timed_steps(reader, step, args.warmup, args.steps, device))
            assert writer.wait(60) == 0
        row = {"case": f"epochs: {arm}", "images/s per epoch": [round(r) for r in rates]}
        print(f"[{card}] {json.dumps(row)}", flush=True)
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="train,feed,jpeg,epochs")
    parser.add_argument("--models", default="resnet18,resnet50")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--feed-mb", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--side", type=int, default=SIDE)
    parser.add_argument("--prefetch", type=int, default=4)
    parser.add_argument("--json", help="write every row here")
    parser.add_argument("--smoke", action="store_true", help="tiny, on the CPU: check the script")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.warmup, args.repeats, args.batch, args.side = 2, 1, 2, 4, 32
        args.ranks, args.feed_mb = 2, 16
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
        card = torch.cuda.get_device_name(device)
    else:
        card = "CPU, no GPU"
    print(
        f"{card}, torch {torch.__version__}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"steps {args.steps} after {args.warmup}, median of {args.repeats} alternating runs",
        flush=True,
    )
    rows = []
    parts = {"train": train_part, "feed": feed_part, "jpeg": jpeg_part, "epochs": epochs_part}
    with tempfile.TemporaryDirectory(
        prefix="gpu-feed-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None
    ) as tmp:
        failed = []
        for part in args.parts.split(","):
            try:  # one part's failure leaves the others' figures
                rows += parts[part](args, device, Path(tmp), card)
            except Exception:  # noqa: BLE001 - printed, and the exit status says so
                traceback.print_exc()
                failed.append(part)
            if args.json:
                report = {"card": card, "torch": torch.__version__, "args": vars(args), "rows": rows}
                Path(args.json).write_text(json.dumps(report, indent=1))
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
