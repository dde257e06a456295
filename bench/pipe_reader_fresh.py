"""``bench_pipe_reader.py --fresh``: every measurement in a new process, building the dataset included.

A job's first epoch runs right after its dataset is built in a fresh process, and on short epochs
that start-up is most of what the user waits for. Each run here is one new Python process that
imports TensorFlow (not timed: every reader needs it), then times building the dataset (for ours,
``import sagemaker_dist.runtime`` is inside the clock; for AWS's, loading its op library),
``iter()`` to the first batch, and the rest of one epoch. The writer process is up and about to
open the FIFO before the child starts (SageMaker's agent is already running when training reads).
Arms run interleaved, one process each per repeat; ratios are medians of per-run ratios of the
total (build + epoch) times. ``ours`` is PipeModeDataset on the compiled reader (built before the
runs, not timed: a job finds it in the build cache), ``py`` the same on the Python reader
(``SAGEMAKER_DIST_READER``); ``cpu s/GB`` is the reading process's CPU time (user + system, the
writer's excluded) over the timed part, per GB read.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

BATCH = 256

# One run of one arm. argv: arm, source file, root, fifo (or "-"), batch size.
CHILD = """
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
arm, src, root, fifo, batch = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
if arm != "raw":
    import tensorflow as tf
else:  # the pipe buffer ours asks for
    sys.path.insert(0, BENCH_DIR)
    from raw_pipe import read_to_end
start = time.perf_counter()
cpu = time.process_time()
dirs = dict(pipe_dir=os.path.join(root, "input", "data"), config_dir=os.path.join(root, "input", "config"))
if arm in ("ours", "py"):
    from sagemaker_dist.runtime import PipeModeDataset
    ds = PipeModeDataset("bench", "TFRecord", state_dir=os.path.join(root, "pipe_state"), **dirs).batch(batch)
elif arm == "aws":
    from sagemaker_tensorflow import PipeModeDataset
    ds = PipeModeDataset("aws", record_format="TFRecord", state_dir=os.path.join(root, "aws_state"), **dirs)
    ds = ds.batch(batch)
elif arm == "file":
    ds = tf.data.TFRecordDataset(src).batch(batch)
built = time.perf_counter()
if arm == "raw":
    n, first = read_to_end(fifo)
    version = "-"
else:
    iterator = iter(ds)
    n = int(next(iterator).shape[0])
    first = time.perf_counter()
    for b in iterator:
        n += int(b.shape[0])
    version = tf.__version__
end = time.perf_counter()
cpu = time.process_time() - cpu
print(json.dumps({"cpu": cpu, "build": built - start, "first": first - built, "rest": end - first,
                  "total": end - start, "n": n, "tf": version, "python": sys.version.split()[0]}))
""".replace("BENCH_DIR", repr(str(Path(__file__).resolve().parent)))


def run_child(python: str, arm: str, src: Path, root: Path, fifo: Path | None) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "SAGEMAKER_DIST_READER": "python" if arm == "py" else "compiled",
    }
    argv = [python, "-c", CHILD, arm, str(src), str(root), str(fifo or "-"), str(BATCH)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"{arm} run failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_ratio(runs: dict, a: str, b: str) -> float:
    """Median over runs of b's total / a's total: a's speed relative to b in the same round."""
    return statistics.median(y["total"] / x["total"] for x, y in zip(runs[a], runs[b]))


def main(args, make_file, start_writer) -> int:
    """Interleaved fresh-process runs per record size; prints start-up, totals and ratios."""
    arms = ["ours", "py", "file", "raw"] + (["aws"] if args.aws else [])
    python = args.python or sys.executable
    sizes = [int(s) for s in args.sizes.split(",")]
    # As pip does at install: byte-compiled modules (this machine sets PYTHONDONTWRITEBYTECODE, and
    # compiling our modules on import would add about 10 ms to every start-up measured).
    package = Path(__file__).resolve().parent.parent / "sagemaker_dist"
    subprocess.run([python, "-m", "compileall", "-q", str(package)], check=True)
    # The compiled reader, built (or found) in the build cache before the runs, as a job finds it.
    subprocess.run(
        [python, "-m", "sagemaker_dist.runtime.tensorflow.data.native_build"],
        check=True,
        env={**os.environ, "PYTHONPATH": str(package.parent), "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    print(
        f"fresh processes of {python}, {os.cpu_count()} CPU(s), {args.mb} MiB per epoch, .batch({BATCH}), "
        f"median of {args.repeats} interleaved runs, load average {os.getloadavg()[0]:.1f}"
        + (", record sizes vary +-50%" if args.vary else "")
    )
    print(
        "times in ms: build (ours: import sagemaker_dist.runtime included; aws: its op library loaded), "
        "first = iter() to the first batch, total = build + whole epoch;\n"
        "x = the arm's total / ours in the same round (above 1: ours is faster)"
    )
    with tempfile.TemporaryDirectory(prefix="bench-pipe-fresh-") as tmp:
        root = Path(tmp)
        data = root / "input" / "data"
        data.mkdir(parents=True)
        (root / "input" / "config").mkdir(parents=True)
        pipe = {"TrainingInputMode": "Pipe", "RecordWrapperType": "None"}
        (root / "input" / "config" / "inputdataconfig.json").write_text(
            json.dumps({"bench": pipe, "aws": pipe})
        )
        epochs = {"ours": 0, "aws": 0, "raw": 0}  # py and ours read the same channel's epochs
        versions = set()
        for size in sizes:
            src = root / f"records-{size}.tfrecord"
            records = make_file(src, size, args.mb << 20, args.vary)
            nbytes = src.stat().st_size
            runs: dict[str, list[dict]] = {arm: [] for arm in arms}
            for _ in range(args.repeats):
                for arm in arms:
                    fifo = writer = None
                    if arm != "file":
                        channel = "ours" if arm in ("ours", "py") else arm
                        fifo = data / f"{'bench' if channel == 'ours' else arm}_{epochs[channel]}"
                        epochs[channel] += 1
                        writer = start_writer(src, fifo)
                    result = run_child(python, arm, src, root, fifo)
                    if writer is not None:
                        writer.wait()
                    expected = nbytes if arm == "raw" else records
                    assert result["n"] == expected, f"{arm} read {result['n']}, expected {expected}"
                    versions.add((result["tf"], result["python"]))
                    runs[arm].append(result)
            report(size, nbytes, runs, arms)
            src.unlink()
        print("TensorFlow, Python: " + ", ".join(f"{tf} {py}" for tf, py in sorted(versions) if tf != "-"))
    return 0


def report(size: int, nbytes: int, runs: dict, arms: list[str]) -> None:
    def ms(arm, key):
        return 1000 * statistics.median(r[key] for r in runs[arm])

    print(f"-- {size} B records, {nbytes / 1e6:.0f} MB")
    print(
        f"{'arm':>6} {'build':>8} {'first':>8} {'rest':>8} {'total':>8} {'MB/s':>7} {'cpu s/GB':>9} "
        f"{'ours vs it':>10} {'py vs it':>9}"
    )
    for arm in arms:
        total = statistics.median(r["total"] for r in runs[arm])
        cpu = statistics.median(r["cpu"] for r in runs[arm]) / (nbytes / 1e9)
        versus = "" if arm == "ours" else f"{median_ratio(runs, 'ours', arm):.2f}x"
        py_versus = "" if arm == "py" else f"{median_ratio(runs, 'py', arm):.2f}x"
        print(
            f"{arm:>6} {ms(arm, 'build'):>8.1f} {ms(arm, 'first'):>8.1f} {ms(arm, 'rest'):>8.1f} "
            f"{ms(arm, 'total'):>8.1f} {nbytes / total / 1e6:>7.0f} {cpu:>9.2f} {versus:>10} {py_versus:>9}",
            flush=True,
        )
