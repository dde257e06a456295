"""PyTorch batch reader throughput: RecordBatches on a FIFO against the raw pipe, a fresh process per run.

For each record size, the same TFRecord bytes are streamed through a FIFO by a separate writer process
(``bench_pipe_reader.py``'s: 1 MiB writes, up before the clock starts) and read in a new Python process
by (a) ``RecordBatches(..., record_bytes=size)``: the compiled reader framing the FIFO into
``[256, size]`` uint8 tensors (``ours``), (b) the same with ``record_bytes=None``: a ``RaggedBatch``
of data and offsets per batch (``ragged``), (c) only ``os.readv`` into one preallocated 1 MiB buffer
(the compiled reader's read size) with the same 1 MiB pipe buffer, no framing (``raw``), (d) the same
reads into four batch-sized buffers of fresh pages in turn (``raw-batches``: the memory any batch reader
must fill, and the most a reader that hands out such batches can reach in a fresh process), (e) the same
into four buffers populated before the clock (``raw-warm``: batch-sized memory without the cost of fresh
pages), (f) ``ours`` on its second epoch, the first read before the clock (``ours-2nd``: every epoch
after a process's first, its buffers reused); ``--py`` adds
``RecordBatches(..., compiled=False)``, the Python framing fallback (``py``). PyTorch is imported
before the clock (every training script has it); the clock covers building the reader, ``iter()`` to
the first batch and the rest of one epoch. The consumer only counts records. Arms run interleaved
(the order rotated each round), one process each per round; "x raw" is the median over rounds of raw's
time over the arm's in the same round (the arm's throughput as a share of the raw pipe's).

    .venv/bin/python bench/bench_torch_reader.py [--mb 1024] [--repeats 3] [--sizes 1000,150000] [--py]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pipe_reader import make_file, rotated, start_writer  # noqa: E402

BATCH = 256
CHUNK = 1 << 20  # the compiled reader's read size (its buffer), and so the raw arm's

# One run of one arm. argv: arm, opt_ml root, fifo, record size, batch size, and "go" to print "ready" and
# wait for a line on stdin before the clock starts (several ranks started together).
CHILD = """
import json, sys, time
arm, root, fifo, size, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
sys.path.insert(0, BENCH_DIR)
from raw_pipe import batch_buffers, read_into_batches, read_to_end
if arm == "raw-warm":  # populated before the clock: no fresh memory to pay for
    views = batch_buffers(batch * size, 4, populated=True)
if not arm.startswith("raw"):
    import torch  # not timed: every PyTorch script imports it, and a GPU job has CUDA up before its data
    if torch.cuda.is_available():
        torch.empty(1, pin_memory=True)
if arm == "ours-2nd":  # the steady state: the clock on the second epoch, the first (its fresh memory) before
    from sagemaker_dist.runtime import RecordBatches
    from sagemaker_dist.runtime.config import ContainerConfig

    warm = RecordBatches("bench", batch, record_bytes=size, config=ContainerConfig.load(root, {}))
    for _ in warm:
        pass
if sys.argv[6:] == ["go"]:
    print("ready", flush=True)
    sys.stdin.readline()
cpu = time.process_time()
began = time.monotonic()
start = time.perf_counter()
if arm == "raw":
    n, first = read_to_end(fifo, CHUNK_BYTES)
    compiled = None
elif arm.startswith("raw-"):
    views = batch_buffers(batch * size, 4) if arm == "raw-batches" else views
    n, first = read_into_batches(fifo, views, CHUNK_BYTES)
    compiled = None
else:
    fixed = size if arm in ("ours", "ours-2nd", "py") else None
    if arm == "ours-2nd":
        batches = warm
    else:
        from sagemaker_dist.runtime import RecordBatches
        from sagemaker_dist.runtime.config import ContainerConfig

        config = ContainerConfig.load(root, {})
        batches = RecordBatches("bench", batch, record_bytes=fixed, compiled=arm != "py", config=config)
    compiled = batches.compiled
    count = (lambda b: int(b.shape[0])) if fixed else (lambda b: int(b.offsets.shape[0]) - 1)
    iterator = iter(batches)
    n = count(next(iterator))
    first = time.perf_counter()
    for b in iterator:
        n += count(b)
end = time.perf_counter()
print(json.dumps({"cpu": time.process_time() - cpu, "first": first - start, "total": end - start, "n": n,
                  "began": began, "ended": time.monotonic(),
                  "compiled": compiled, "torch": getattr(sys.modules.get("torch"), "__version__", "-")}))
""".replace("CHUNK_BYTES", str(CHUNK)).replace("BENCH_DIR", repr(str(Path(__file__).resolve().parent)))


def start_child(
    arm: str, root: Path, fifo: Path, size: int, go: bool = False, env: dict | None = None
) -> subprocess.Popen:
    """One run of ``arm`` in a new process (``env``: variables added to its environment); with ``go``, it
    prints "ready" once set up and starts its clock at the line written to its stdin."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, **(env or {}), "PYTHONPATH": path}
    argv = [sys.executable, "-c", CHILD, arm, str(root), str(fifo), str(size), str(BATCH)] + ["go"] * go
    return subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def child_result(arm: str, child: subprocess.Popen) -> dict:
    out, _ = child.communicate(timeout=600)
    if child.returncode != 0:
        raise SystemExit(f"{arm} run failed ({child.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def run_child(arm: str, root: Path, fifo: Path, size: int) -> dict:
    return child_result(arm, start_child(arm, root, fifo, size))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=1024, help="stream size per record size (MiB)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per arm; medians are reported")
    parser.add_argument("--sizes", default="1000,150000", help="record sizes in bytes")
    parser.add_argument("--py", action="store_true", help="add the Python framing fallback as an arm")
    args = parser.parse_args()
    arms = ["ours", "ours-2nd", "ragged", "raw-batches", "raw-warm", "raw"] + (["py"] if args.py else [])
    # As pip does at install: byte-compiled modules, so that no run compiles them on import.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "sagemaker_dist")], check=True)
    print(
        f"fresh processes, {os.cpu_count()} CPU(s), {args.mb} MiB epochs of TFRecords through a FIFO, "
        f"batches of {BATCH}, median of {args.repeats} interleaved runs"
    )
    with tempfile.TemporaryDirectory(prefix="bench-torch-reader-") as tmp:
        root = Path(tmp)
        data = root / "input" / "data"
        data.mkdir(parents=True)
        (root / "input" / "config").mkdir(parents=True)
        (root / "input" / "config" / "inputdataconfig.json").write_text(
            json.dumps({"bench": {"TrainingInputMode": "Pipe", "RecordWrapperType": "None"}})
        )
        epoch = raw_epoch = 0
        for size in [int(s) for s in args.sizes.split(",")]:
            src = root / f"records-{size}.tfrecord"
            records = make_file(src, size, args.mb << 20)
            nbytes = src.stat().st_size
            runs: dict[str, list[dict]] = {arm: [] for arm in arms}
            for round_ in range(args.repeats):
                for arm in rotated(arms, round_):
                    if arm.startswith("raw"):
                        fifo, raw_epoch = data / f"raw_{raw_epoch}", raw_epoch + 1
                    else:  # RecordBatches takes the channel's next epoch: bench_0, bench_1, ...
                        fifo, epoch = data / f"bench_{epoch}", epoch + 1
                    writers = [start_writer(src, fifo)]
                    if arm == "ours-2nd":  # its clock is on the next epoch
                        fifo, epoch = data / f"bench_{epoch}", epoch + 1
                        writers.append(start_writer(src, fifo))
                    result = run_child(arm, root, fifo, size)
                    for writer in writers:
                        writer.wait()
                    expected = nbytes if arm.startswith("raw") else records
                    assert result["n"] == expected, f"{arm} read {result['n']}, expected {expected}"
                    assert result["compiled"] in (None, arm != "py"), result
                    runs[arm].append(result)
            report(size, nbytes, runs, arms)
            src.unlink()
        print(f"torch {next(r['torch'] for r in runs['ours'])}, Python {sys.version.split()[0]}")
    return 0


def report(size: int, nbytes: int, runs: dict, arms: list[str]) -> None:
    print(f"-- {size} B records, {nbytes / 1e6:.0f} MB, load average {os.getloadavg()[0]:.1f} after")
    print(f"{'arm':>11} {'MB/s':>7} {'x raw':>6} {'1st batch ms':>12} {'cpu s/GB':>9}   per-run MB/s")
    for arm in arms:
        total = statistics.median(r["total"] for r in runs[arm])
        ratio = statistics.median(raw["total"] / r["total"] for r, raw in zip(runs[arm], runs["raw"]))
        first = 1000 * statistics.median(r["first"] for r in runs[arm])
        cpu = statistics.median(r["cpu"] for r in runs[arm]) / (nbytes / 1e9)
        each = " ".join(f"{nbytes / r['total'] / 1e6:.0f}" for r in runs[arm])
        print(
            f"{arm:>11} {nbytes / total / 1e6:>7.0f} {ratio:>6.2f} {first:>12.1f} {cpu:>9.2f}   {each}",
            flush=True,
        )


if __name__ == "__main__":
    raise SystemExit(main())
