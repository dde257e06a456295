"""Pipe-mode reader throughput: PipeModeDataset on a FIFO vs TFRecordDataset on a file vs the raw pipe.

For each record size, the same TFRecord bytes are (a) streamed through a FIFO by a separate writer
process and read by sagemaker_dist's PipeModeDataset, (b) read from a regular file by
tf.data.TFRecordDataset, (c) streamed through a FIFO and only counted (raw pipe, no framing).
Consumers batch by 256 as a training input pipeline would. Each dataset is built once per record
size and each run is one iteration of it (one epoch, as Keras ``fit`` does; for ours, the next
FIFO); ``--build-per-run`` builds them for every run instead. Prints MB/s and the two ratios, and
the reader's CPU seconds per GB (this process: TensorFlow's threads and the consumer's loop) and,
for the pipe arms, the writer's.

PipeModeDataset runs the reader ``SAGEMAKER_DIST_READER`` picks (default: the compiled one where it
builds); ``--fresh`` measures both, the compiled reader as ``ours`` and the Python one as ``py``.

``--fresh`` runs every measurement in a new process instead, the way a job's first epoch runs:
TensorFlow is imported first (not timed), then the clock covers building the dataset (for ours,
importing ``sagemaker_dist.runtime`` too; for AWS's, loading its op library), ``iter()`` to the
first batch, and the rest of the epoch; start-up is printed apart from throughput. ``--aws`` adds
AWS's own PipeModeDataset (``sagemaker_tensorflow``) as an arm: run it with the interpreter that
``bench/aws_reader_env.sh`` builds (``--python``).

    .venv/bin/python bench/bench_pipe_reader.py [--mb 256] [--repeats 5] [--sizes 100,1000,100000]
        [--build-per-run]
    .venv/bin/python bench/bench_pipe_reader.py --fresh --mb 100 --repeats 7 [--python PY] [--aws]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from any Python: the child processes of --fresh too

from sagemaker_dist.contract.record_formats import encode_tfrecord  # noqa: E402
from sagemaker_dist.runtime.fifo import F_SETPIPE_SZ, PIPE_BUFFER_BYTES  # noqa: E402

tf = PipeModeDataset = None  # imported in main(): the --fresh parent runs without TensorFlow

BATCH = 256
# The writer: a separate process that copies a file into the FIFO in 1 MiB writes (``repeats`` times).
WRITER = """
import os, sys
src, dst, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
print("ready", flush=True)
out = os.open(dst, os.O_WRONLY)
for _ in range(repeats):
    with open(src, "rb", buffering=0) as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                break
            view = memoryview(block)
            while view:
                view = view[os.write(out, view):]
os.close(out)
"""


def _tfrecord_scan_is_compiled() -> bool:
    from sagemaker_dist.runtime.framing import tfrecord

    return tfrecord._native is not None


def rotated(arms, round_: int) -> list:
    """``arms`` in round ``round_``'s order: rotated by one each round, so no arm always runs first."""
    arms = list(arms)
    shift = round_ % len(arms)
    return arms[shift:] + arms[:shift]


def make_file(path: Path, record_size: int, total_bytes: int, vary: bool = False) -> int:
    """Write about ``total_bytes`` of TFRecords of ``record_size`` bytes; return the record count.

    With ``vary``, sizes are uniform in [size/2, 3*size/2] (seed 0), as serialised tf.Examples vary.
    """
    count = max(1, (1 << 20) // record_size)
    rng = random.Random(0)
    sizes = [
        rng.randint(record_size // 2, record_size * 3 // 2) if vary else record_size for _ in range(count)
    ]
    distinct = [encode_tfrecord(os.urandom(n)) for n in sizes]
    block = b"".join(distinct)
    repeats = max(1, total_bytes // len(block))
    with open(path, "wb") as f:
        for _ in range(repeats):
            f.write(block)
    return repeats * len(distinct)


def start_writer(src: Path, fifo: Path, repeats: int = 1) -> subprocess.Popen:
    """The writer of ``src`` (``repeats`` times), up and about to open the FIFO (its start-up is not
    timed: SageMaker's is running)."""
    if not fifo.exists():
        os.mkfifo(fifo)
    argv = [sys.executable, "-c", WRITER, str(src), str(fifo), str(repeats)]
    writer = subprocess.Popen(argv, stdout=subprocess.PIPE)
    assert writer.stdout.readline() == b"ready\n"
    return writer


def cpu_seconds() -> tuple[float, float]:
    """CPU time (user + system) of this process (the reader, TensorFlow's threads included) and of its
    finished children (the writers)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def timed(fn, *args) -> tuple[float, float, float, int]:
    """(wall seconds, reader CPU seconds, writer CPU seconds, result) of fn(*args)."""
    reader, writer = cpu_seconds()
    start = time.perf_counter()
    result = fn(*args)
    wall = time.perf_counter() - start
    reader_after, writer_after = cpu_seconds()
    return wall, reader_after - reader, writer_after - writer, result


def count_batches(ds) -> int:
    n = 0
    for batch in ds:
        n += int(batch.shape[0])
    return n


def pipe_dataset(root: Path, batch_option: bool):
    """Drop-in use, ``PipeModeDataset(...).batch(256)``, or the ``batch_size=256`` option (rebatch)."""
    data = root / "input" / "data"
    ds = PipeModeDataset(
        "bench",
        "TFRecord",
        state_dir=root / "pipe_state",
        pipe_dir=data,
        config_dir=root / "input" / "config",
        batch_size=BATCH if batch_option else None,
    )
    return ds if batch_option else ds.batch(BATCH)


def run_pipe_dataset(ds, writer: subprocess.Popen) -> int:
    """One iteration (one epoch: the next FIFO) of a PipeModeDataset."""
    n = count_batches(ds)
    writer.wait()
    return n


def file_dataset(src: Path):
    return tf.data.TFRecordDataset(str(src)).batch(BATCH)


def run_raw_pipe(writer: subprocess.Popen, fifo: Path) -> int:
    buf = bytearray(1 << 20)
    total = 0
    fd = os.open(fifo, os.O_RDONLY)
    fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BUFFER_BYTES)  # the same pipe buffer as PipeModeDataset's
    try:
        while True:
            n = os.readv(fd, [buf])
            if not n:
                break
            total += n
    finally:
        os.close(fd)
    writer.wait()
    return total


def ratio(runs: dict, a: str, b: str) -> float:
    """Median over runs of (b's wall time / a's wall time): a's speed relative to b in the same run."""
    return statistics.median(y[0] / x[0] for x, y in zip(runs[a], runs[b]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=256, help="stream size per record size (MiB)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per reader; medians are reported")
    parser.add_argument("--sizes", default="100,1000,100000", help="record sizes in bytes")
    parser.add_argument(
        "--build-per-run",
        action="store_true",
        help="build every dataset anew for each run (timing includes building it, about 26 ms for ours "
        "and 1 ms for the file reader), instead of once per size and one iteration (epoch) per run",
    )
    parser.add_argument("--vary", action="store_true", help="record sizes vary within +-50%% of each size")
    parser.add_argument("--fresh", action="store_true", help="each run in a new process, build included")
    parser.add_argument("--python", help="--fresh: the interpreter of the runs (default: this one)")
    parser.add_argument(
        "--aws", action="store_true", help="--fresh: add AWS's PipeModeDataset (sagemaker_tensorflow)"
    )
    args = parser.parse_args(argv)
    if args.fresh:
        import pipe_reader_fresh

        return pipe_reader_fresh.main(args, make_file, start_writer)
    global tf, PipeModeDataset
    import tensorflow as tf

    from sagemaker_dist.runtime import PipeModeDataset
    from sagemaker_dist.runtime.tensorflow.data.native_build import compiled_op

    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        f"TensorFlow {tf.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPU(s), "
        f"{args.mb} MiB per size, consumer .batch({BATCH}), median of {args.repeats} interleaved runs "
        f"(ratios are medians of per-run ratios), load average {os.getloadavg()[0]:.1f}, "
        + ("datasets built for each run" if args.build_per_run else "datasets built once, one epoch per run")
        + (", record sizes vary +-50%" if args.vary else "")
        + f", TFRecord scan: {'C' if _tfrecord_scan_is_compiled() else 'numpy'}"
        + f", reader: {'compiled' if compiled_op() is not None else 'Python'}"
    )
    print(
        "ours = PipeModeDataset(...).batch(256) (drop-in); opt = PipeModeDataset(..., batch_size=256);\n"
        "file = TFRecordDataset(file).batch(256);\n"
        "raw = the pipe read and counted, no framing (1 MiB pipe buffer, as ours)"
    )
    print(
        f"{'record':>8} {'ours MB/s':>10} {'opt MB/s':>9} {'file MB/s':>10} {'raw MB/s':>9} {'ours/file':>10}"
        f" {'opt/file':>9} {'ours/raw':>9} {'opt/raw':>8}   reader cpu s/GB ours/opt/file/raw"
        f"   writer cpu s/GB ours/opt/raw"
    )
    with tempfile.TemporaryDirectory(prefix="bench-pipe-") as tmp:
        root = Path(tmp)
        (root / "input" / "data").mkdir(parents=True)
        (root / "input" / "config").mkdir(parents=True)
        (root / "input" / "config" / "inputdataconfig.json").write_text(
            json.dumps({"bench": {"TrainingInputMode": "Pipe", "RecordWrapperType": "None"}})
        )
        epoch = 0
        for size in sizes:
            src = root / f"records-{size}.tfrecord"
            records = make_file(src, size, args.mb << 20, args.vary)
            nbytes = src.stat().st_size
            runs = {"ours": [], "opt": [], "file": [], "raw": []}
            built = {"ours": pipe_dataset(root, False), "opt": pipe_dataset(root, True)}
            built["file"] = file_dataset(src)
            for _ in range(args.repeats):
                for name in ("ours", "opt"):
                    if args.build_per_run:
                        built[name] = pipe_dataset(root, name == "opt")
                    writer = start_writer(src, root / "input" / "data" / f"bench_{epoch}")
                    wall, cpu, wcpu, n = timed(run_pipe_dataset, built[name], writer)
                    epoch += 1
                    assert n == records, f"PipeModeDataset read {n} records, expected {records}"
                    runs[name].append((wall, cpu, wcpu))
                if args.build_per_run:
                    built["file"] = file_dataset(src)
                wall, cpu, wcpu, n = timed(count_batches, built["file"])
                assert n == records, f"TFRecordDataset read {n} records, expected {records}"
                runs["file"].append((wall, cpu, wcpu))
                fifo = root / "input" / "data" / f"raw_{size}"
                wall, cpu, wcpu, n = timed(run_raw_pipe, start_writer(src, fifo), fifo)
                assert n == nbytes, f"raw pipe read {n} bytes, expected {nbytes}"
                runs["raw"].append((wall, cpu, wcpu))
            mbps = {k: statistics.median(nbytes / r[0] / 1e6 for r in v) for k, v in runs.items()}
            cpu = {k: statistics.median(r[1] / (nbytes / 1e9) for r in v) for k, v in runs.items()}
            pipes = ("ours", "opt", "raw")
            wcpu = {k: statistics.median(r[2] / (nbytes / 1e9) for r in runs[k]) for k in pipes}

            r = {(a, b): ratio(runs, a, b) for a, b in (("ours", "file"), ("opt", "file"), ("ours", "raw"))}
            r["opt", "raw"] = ratio(runs, "opt", "raw")
            print(
                f"{size:>8} {mbps['ours']:>10.0f} {mbps['opt']:>9.0f} {mbps['file']:>10.0f} "
                f"{mbps['raw']:>9.0f} {r['ours', 'file']:>9.2f}x {r['opt', 'file']:>8.2f}x "
                f"{r['ours', 'raw']:>8.0%} {r['opt', 'raw']:>7.0%}   "
                f"{cpu['ours']:.2f} / {cpu['opt']:.2f} / {cpu['file']:.2f} / {cpu['raw']:.2f}   "
                f"{wcpu['ours']:.2f} / {wcpu['opt']:.2f} / {wcpu['raw']:.2f}",
                flush=True,
            )
            src.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
