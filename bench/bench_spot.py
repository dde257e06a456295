"""What a spot interruption costs: the time from SIGTERM to the job's end, and the steps lost.

Runs ``sagemaker-dist local --demo -p epochs=E --interrupt-at T`` ROUNDS times (each a fresh embedded
S3 state, so every round writes its data and starts from scratch) and reads the command's own report:
per round, SIGTERM -> the ranks' agreed stop and checkpoint (rank 0's line), SIGTERM -> the launcher's
exit (the job's end), where the ranks stopped and where the second attempt resumed. Steps lost = the
steps trained before the stop that the resumed attempt trains again; "epoch checkpoints only" is what
the same interruption costs a job that checkpoints at epoch ends only (the steps of the stopped epoch).

    .venv/bin/python bench/bench_spot.py --rounds 3 --interrupt-at 30 --epochs 4 [--distribution tf-mwms]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

STOP = re.compile(r"stopped in epoch (\d+) after step (\d+) .*?; ([\d.]+) s after the stop request")
ATTEMPT1 = re.compile(r"attempt 1: Stopped .*?the job ended ([\d.]+) s after SIGTERM")
RESUMED = re.compile(r"attempt 2: Completed .*?resumed after epoch (\d+) step (\d+)")
ROUND_TIMEOUT_S = 900


def one_round(epochs: int, at: float, distribution: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-spot-") as state:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        command = [sys.executable, "-m", "sagemaker_dist.cli", "local", "--demo", "-p", f"epochs={epochs}",
                   "--interrupt-at", str(at), "--s3-state-dir", state,
                   *(["--distribution", distribution] if distribution else [])]  # fmt: skip
        started = time.monotonic()
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=ROUND_TIMEOUT_S)
        output = proc.stdout + proc.stderr
    stop, ended, resumed = STOP.search(output), ATTEMPT1.search(output), RESUMED.search(output)
    if proc.returncode != 0 or not (stop and ended and resumed):
        raise SystemExit(f"round failed (exit {proc.returncode}):\n{output[-4000:]}")
    epoch, step = int(stop.group(1)), int(stop.group(2))
    done_epochs, done_steps = int(resumed.group(1)), int(resumed.group(2))
    if done_epochs == epoch - 1:  # resumed inside the stopped epoch
        lost = step - done_steps
    else:  # the stop was the epoch's last step: resumed at the next epoch's start
        lost = 0 if (done_epochs, done_steps) == (epoch, 0) else None
    return {
        "stop_s": float(stop.group(3)),
        "end_s": float(ended.group(1)),
        "stopped_at": (epoch, step),
        "steps_lost": lost,
        "lost_with_epoch_checkpoints": step,
        "total_s": time.monotonic() - started,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--interrupt-at", type=float, default=30.0)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--distribution", help="the demo's distribution (default Horovod), e.g. tf-mwms")
    args = p.parse_args()
    rounds = []
    for i in range(args.rounds):
        r = one_round(args.epochs, args.interrupt_at, args.distribution)
        rounds.append(r)
        epoch, step = r["stopped_at"]
        print(
            f"round {i + 1}: stopped in epoch {epoch} after step {step}; SIGTERM -> checkpointed stop "
            f"{r['stop_s']:.1f} s, -> job's end {r['end_s']:.1f} s; steps lost {r['steps_lost']} (epoch "
            f"checkpoints only: {r['lost_with_epoch_checkpoints']}); both attempts {r['total_s']:.0f} s",
            flush=True,
        )
    med = statistics.median
    stops, ends = [r["stop_s"] for r in rounds], [r["end_s"] for r in rounds]
    print(
        f"median of {len(rounds)}: SIGTERM -> stop and checkpoint {med(stops):.1f} s, SIGTERM -> job's end "
        f"{med(ends):.1f} s (max {max(ends):.1f}); steps lost {[r['steps_lost'] for r in rounds]}, with "
        f"epoch checkpoints only {[r['lost_with_epoch_checkpoints'] for r in rounds]}"
    )


if __name__ == "__main__":
    main()
