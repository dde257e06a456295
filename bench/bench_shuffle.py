"""What the readers' seeded shuffle window costs: shuffled against unshuffled read speed, in one run.

For each record size, the same TFRecord bytes stream through FIFOs from a separate writer process
(``bench_pipe_reader.py``'s: 1 MiB writes) into a new process per run, which reads two epochs (two
FIFOs) with one reader: ``RecordBatches(record_bytes=size)`` (``fixed``: ``[256, size]`` uint8 batches,
each record read straight into its row of the window), ``RecordBatches()`` (``ragged``: data and
offsets, the records gathered out of the window a group of batches at a time, while a thread of their
own reads the next window) and ``PipeModeDataset(batch_size=256)``
(``pmd``: the compiled op, records moved out of the window), each without and with
``shuffle=ShuffleWindow(seed)`` (the default window: 4096 records, 64 MiB; ``--window-records N``: N
records). The framework is imported before the clock; the first epoch's clock covers building the
reader, the first epoch (fresh memory for the window) and its second epoch (``2nd``) the steady state.
The consumer only counts records. Arms run interleaved, the order rotated each round; ``wall ratio`` is
the median over rounds of the unshuffled arm's time over the shuffled arm's in the same round (the
shuffled read speed as a share of the unshuffled), ``CPU ratio`` the same of the process's CPU time
(user + system, every thread: what the read costs, less moved by other work on the machine than the wall
time); ``90%`` a bootstrap interval of each median (how far it can be trusted: single rounds on a shared
VM spread widely).

``--baseline DIR``: a checkout of another build (its compiled readers built in place) whose shuffled
readers run as arms of their own in the same rounds, so a change is measured against the build before
it under the same load (``shuffled@baseline`` lines: the same ratios, of that build's shuffled arm).

    .venv/bin/python bench/bench_shuffle.py [--mb 512] [--repeats 5] [--sizes 1000,150000] \\
        [--readers fixed,ragged,pmd] [--baseline DIR] [--window-records N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
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
SEED = 7

# One run: argv arm, opt_ml root (its own pipe dir and state), record size. Prints one JSON line.
CHILD = """
import json, os, sys, time
arm, root, size, batch, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
window = int(sys.argv[6])  # records a window, 0: the default
from sagemaker_dist.runtime.framing.shuffle import ShuffleWindow
shuffle = (ShuffleWindow(seed, records=window) if window else seed) if "-shuf" in arm else None
kind = arm.split("-")[0]
if kind == "pmd":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # not timed: the script imports it
    from sagemaker_dist.runtime import PipeModeDataset
else:
    import torch  # not timed
    from sagemaker_dist.runtime import RecordBatches
    from sagemaker_dist.runtime.config import ContainerConfig
times = []
start = time.perf_counter()
if kind == "pmd":
    dirs = dict(state_dir=root + "/pipe_state", pipe_dir=root + "/input/data",
                config_dir=root + "/input/config")
    reader = PipeModeDataset("bench", "TFRecord", **dirs, batch_size=batch, shuffle=shuffle, rank=0)
    count = lambda b: int(b.shape[0])
else:
    fixed = size if kind == "fixed" else None
    reader = RecordBatches("bench", batch, record_bytes=fixed, config=ContainerConfig.load(root, {}),
                           shuffle=shuffle)
    count = (lambda b: int(b.shape[0])) if fixed else (lambda b: int(b.offsets.shape[0]) - 1)
ns, cpus = [], []
cpu = time.process_time()
for epoch in range(2):
    n = 0
    for b in reader:
        n += count(b)
    end, cpu_end = time.perf_counter(), time.process_time()
    times.append(end - start)
    cpus.append(cpu_end - cpu)
    ns.append(n)
    start, cpu = end, cpu_end
print(json.dumps({"times": times, "cpu": cpus, "n": ns}))
"""


def run_child(arm: str, root: Path, size: int, repo: Path = REPO, window: int = 0) -> dict:
    path = os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-c", CHILD, arm, str(root), str(size), str(BATCH), str(SEED), str(window)]
    proc = subprocess.run(  # cwd: not the repo, whose package would come first on the path
        argv, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=900, cwd=root
    )
    if proc.returncode != 0:
        raise SystemExit(f"{arm} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def opt_ml(base: Path, name: str) -> Path:
    root = base / name
    (root / "input" / "data").mkdir(parents=True)
    (root / "input" / "config").mkdir(parents=True)
    (root / "input" / "config" / "inputdataconfig.json").write_text(
        json.dumps({"bench": {"TrainingInputMode": "Pipe", "RecordWrapperType": "None"}})
    )
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=512, help="stream size per epoch (MiB)")
    parser.add_argument("--repeats", type=int, default=5, help="runs per arm; medians are reported")
    parser.add_argument("--sizes", default="1000,150000", help="record sizes in bytes")
    parser.add_argument("--readers", default="fixed,ragged,pmd", help="fixed, ragged, pmd")
    parser.add_argument("--baseline", type=Path, help="a checkout of another build: its shuffled arms too")
    parser.add_argument("--window-records", type=int, default=0, help="records a window (0: the default)")
    args = parser.parse_args()
    kinds = args.readers.split(",")
    arms = [f"{k}{s}" for k in kinds for s in ("", "-shuf", *(("-shuf-base",) if args.baseline else ()))]
    for repo in (REPO, *([args.baseline.resolve()] if args.baseline else [])):
        if not (repo / "sagemaker_dist" / "runtime").is_dir():
            raise SystemExit(f"{repo}: not a checkout of sagemaker-dist")
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(repo / "sagemaker_dist")], check=True)
    print(
        f"fresh processes, {os.cpu_count()} CPU(s), {args.mb} MiB epochs of TFRecords through FIFOs, batches "
        f"of {BATCH}, shuffle=ShuffleWindow({SEED}) ({args.window_records or 4096} records, 64 MiB), "
        f"median of {args.repeats} "
        "interleaved rounds"
    )
    with tempfile.TemporaryDirectory(prefix="bench-shuffle-") as tmp:
        base = Path(tmp)
        for size in [int(s) for s in args.sizes.split(",")]:
            src = base / f"records-{size}.tfrecord"
            records = make_file(src, size, args.mb << 20)
            nbytes = src.stat().st_size
            runs: dict[str, list[dict]] = {arm: [] for arm in arms}
            for round_ in range(args.repeats):
                for arm in rotated(arms, round_):
                    root = opt_ml(base, f"{size}-{arm}-{round_}")
                    data = root / "input" / "data"
                    writers = [start_writer(src, data / f"bench_{e}") for e in range(2)]
                    repo = args.baseline.resolve() if arm.endswith("-base") else REPO
                    result = run_child(arm, root, size, repo, args.window_records)
                    for writer in writers:
                        writer.wait()
                    assert result["n"] == [records, records], f"{arm} read {result['n']}, expected {records}"
                    runs[arm].append(result)
            report(size, nbytes, runs, kinds, bool(args.baseline))
            src.unlink()
    return 0


def report(size: int, nbytes: int, runs: dict, kinds: list[str], baseline: bool = False) -> None:
    print(f"-- {size} B records, {nbytes / 1e6:.0f} MB an epoch, load average {os.getloadavg()[0]:.1f} after")
    print(
        f"{'reader':>14} {'epoch':>5} {'unshuffled MB/s':>16} {'shuffled MB/s':>14} {'wall ratio':>11} "
        f"{'CPU s/GB':>15} {'CPU ratio':>10}"
    )
    rows = [(kind, f"{kind}-shuf", kind) for kind in kinds]
    rows += [(kind, f"{kind}-shuf-base", f"{kind}@baseline") for kind in kinds if baseline]
    for kind, shuffled_arm, name in rows:
        plain, shuffled = runs[kind], runs[shuffled_arm]
        for e, label in enumerate(("1st", "2nd")):
            mbs = [statistics.median(nbytes / r["times"][e] / 1e6 for r in arm) for arm in (plain, shuffled)]
            cpu = [statistics.median(r["cpu"][e] / nbytes * 1e9 for r in arm) for arm in (plain, shuffled)]
            ratios = [p["times"][e] / s["times"][e] for p, s in zip(plain, shuffled)]
            cpu_ratios = [p["cpu"][e] / s["cpu"][e] for p, s in zip(plain, shuffled)]
            wall_low, wall_high = median_interval(ratios)
            cpu_low, cpu_high = median_interval(cpu_ratios)
            print(
                f"{name:>14} {label:>5} {mbs[0]:>16.0f} {mbs[1]:>14.0f} {statistics.median(ratios):>11.3f} "
                f"{cpu[0]:>7.3f} {cpu[1]:>7.3f} {statistics.median(cpu_ratios):>10.3f}  90%: wall "
                f"{wall_low:.2f}-{wall_high:.2f}, CPU {cpu_low:.2f}-{cpu_high:.2f}"
            )


def median_interval(values: list[float], level: float = 0.9, resamples: int = 4000) -> tuple[float, float]:
    """A bootstrap interval (percentile, seeded) of the median of ``values``: how far the medians above
    can be trusted when single rounds on a shared VM spread by half either way."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    cut = round(resamples * (1 - level) / 2)
    return medians[cut], medians[-cut - 1]


if __name__ == "__main__":
    raise SystemExit(main())
