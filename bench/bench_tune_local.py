"""What a ``tune --local`` trial costs next to a plain ``local --demo`` run.

Interleaved rounds, each: ``sagemaker-dist local --demo`` (wall time of the command), then
``sagemaker-dist tune --local --demo --max-jobs N --json`` (wall time of the command, and each trial's
own seconds from its JSON: the trial's ``local --request`` process from start to exit). Both share the
embedded endpoint's state dir, so the demo data is written once before the first round. Prints every
run and the medians; the ratio is the median trial over the median plain run.

    .venv/bin/python bench/bench_tune_local.py --rounds 3 --trials 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CLI = [sys.executable, "-m", "sagemaker_dist.cli"]


def run(cmd: list[str]) -> tuple[float, str]:
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return seconds, proc.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--trials", type=int, default=2, help="trials per tune run")
    args = p.parse_args()
    state = Path(tempfile.mkdtemp(prefix="bench-tune-s3-"))
    common = ["--demo", "--s3-state-dir", str(state)]
    run([*CLI, "demo-data", "--s3-state-dir", str(state)])  # the data once, outside the timings
    plain, tune_total, trials = [], [], []
    for i in range(args.rounds):
        seconds, _ = run([*CLI, "local", *common])
        plain.append(seconds)
        search = ["--objective-metric", "val_accuracy", "--range", "learning_rate=1e-4:1e-2:log"]
        seconds, out = run(
            [*CLI, "tune", "--local", *common, *search, "--max-jobs", str(args.trials), "--json"]
        )
        result = json.loads(out.strip().splitlines()[-1])
        tune_total.append(seconds)
        own = [t["seconds"] for t in result["trials"]]
        trials += own
        print(f"round {i + 1}: local --demo {plain[-1]:.1f} s; tune {seconds:.1f} s, trials "
              + ", ".join(f"{s:.1f} s" for s in own), flush=True)  # fmt: skip
    m_plain, m_trial = statistics.median(plain), statistics.median(trials)
    m_tune = statistics.median(tune_total)
    print(f"median local --demo: {m_plain:.1f} s ({len(plain)} runs)")
    print(f"median trial: {m_trial:.1f} s ({len(trials)} trials) = {m_trial / m_plain:.2f}x a plain run")
    print(f"median tune run of {args.trials} trials: {m_tune:.1f} s = {m_tune / args.trials:.1f} s per trial "
          f"(set-up included) = {m_tune / args.trials / m_plain:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
