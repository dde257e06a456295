"""Per-step cost of agreeing on each epoch's end (no record counts) against fixed steps per epoch.

Run: .venv/bin/python bench/bench_epoch_agreement.py [--steps 40 --epochs 3 --repeats 5]
It starts itself under ``horovodrun --gloo -np 2`` (CPU). Each rank trains the demo job's small CNN on
in-memory CIFAR-10-shaped batches of 32, through ``hv.train_epoch`` in two arms, interleaved: "fixed"
(``train_records`` known: exactly ``steps`` batches, no per-step collective) and "agreed" (no counts:
a min-allreduce of "I have a batch" every step). Step time is an epoch's wall time over its steps,
epochs after the first of each fit; rank 0 prints the medians, the difference in microseconds and
that difference as a share of the fixed arm's step time (target: at most 2 %). Training steps on a
shared 2-core machine vary by several percent, so the agreement is also timed alone: iterating the
same epochs without a model (``--iterate-steps`` batches each), which isolates its per-step cost.
A third arm, "fixed+stop", is the fixed one with what a job with ``train_records`` runs to stop:
the ranks' allreduce of their stop flags after each step (``StopAtCountedStep``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from demo_scripts import demo_module


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="batches per epoch")
    p.add_argument("--epochs", type=int, default=3, help="epochs per fit (the first is not timed)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved fits per arm")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--iterate-steps", type=int, default=400, help="batches per epoch when iterating alone")
    return p.parse_args()


def launch(args) -> int:
    horovodrun = str(Path(sys.executable).parent / "horovodrun")
    env = {**os.environ, "SAGEMAKER_DIST_BENCH_RANK": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [horovodrun, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable, __file__, *sys.argv[1:]]
    return subprocess.call(command, env=env)


def run_rank(args) -> None:
    import tensorflow as tf

    from sagemaker_dist.runtime import horovod_keras

    hv = horovod_keras.setup(
        tf.keras.optimizers.legacy.SGD,
        learning_rate=0.01,
        batch_size=args.batch,
        checkpoints=False,
        check_channels=False,
    )
    rng = tf.random.Generator.from_seed(hv.rank)
    images = rng.uniform((args.batch * args.steps, 32, 32, 3))
    labels = tf.cast(rng.uniform((args.batch * args.steps,), maxval=10, dtype=tf.int32), tf.int64)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(args.batch).cache()
    model = demo_module("train_cifar10.py").build_model()
    model.compile(hv.optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    times = {"fixed": [], "agreed": [], "fixed+stop": []}
    counted_stop = counted_stop_callback(hv, args.steps)

    class EpochTimer(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            if epoch > 0:
                self.arm_times.append((time.perf_counter() - self.start) / args.steps)

    arms = ["fixed", "agreed", "fixed+stop"]
    for repeat in range(args.repeats):
        for arm in arms[repeat % 3 :] + arms[: repeat % 3]:
            counted = arm != "agreed"
            hv.steps_per_epoch = args.steps if counted else None
            hv.train_counts = [args.batch * args.steps] * hv.size if counted else None
            timer = EpochTimer()
            timer.arm_times = times[arm]
            callbacks = [*hv.callbacks, *([counted_stop] if arm == "fixed+stop" else []), timer]
            model.fit(hv.train_epoch(data), epochs=args.epochs, verbose=0, callbacks=callbacks)
    alone = iterate_alone(tf, hv, args)
    if hv.rank == 0:
        fixed, agreed = statistics.median(times["fixed"]), statistics.median(times["agreed"])
        cost = statistics.median(alone["agreed"]) - statistics.median(alone["fixed"])
        print(
            f"iterating alone, median of {len(alone['fixed'])} epochs per arm "
            f"({args.iterate_steps} batches): "
            f"fixed {statistics.median(alone['fixed']) * 1e6:.0f} us, agreed "
            f"{statistics.median(alone['agreed']) * 1e6:.0f} us per batch; the agreement costs "
            f"{cost * 1e6:.0f} us per step = {cost / fixed:.2%} of the fixed training step",
            flush=True,
        )
        print(
            f"step time, median of {len(times['fixed'])} epochs per arm ({args.repeats} interleaved fits, "
            f"{args.steps} steps of {args.batch}, 2 ranks, Gloo, CPU): fixed {fixed * 1e3:.2f} ms, agreed "
            f"{agreed * 1e3:.2f} ms; agreement {(agreed - fixed) * 1e6:+.0f} us per step = "
            f"{(agreed - fixed) / fixed:+.2%} of the step (ratio agreed/fixed {agreed / fixed:.3f})",
            flush=True,
        )
        stopping = statistics.median(times["fixed+stop"])
        print(
            f"fixed+stop {stopping * 1e3:.2f} ms: the stop's allreduce after each step "
            f"{(stopping - fixed) * 1e6:+.0f} us = {(stopping - fixed) / fixed:+.2%} of the fixed step",
            flush=True,
        )


def counted_stop_callback(hv, steps: int):
    """What ``setup(train_records=...)`` adds to stop: the ranks' allreduce of their flags after each step
    (never asked to stop here)."""
    from sagemaker_dist.runtime.stop import StopRequest
    from sagemaker_dist.runtime.tensorflow.keras.setup import _any_rank
    from sagemaker_dist.runtime.tensorflow.keras.stop_callback import StopAtCountedStep

    return StopAtCountedStep(StopRequest(hv.rank), agree=_any_rank, steps=steps, rank=hv.rank)


def iterate_alone(tf, hv, args) -> dict[str, list[float]]:
    """Seconds per batch of iterating each arm's epoch with no model, interleaved, first epoch dropped."""
    data = tf.data.Dataset.from_tensor_slices(tf.zeros((args.batch * args.iterate_steps, 8))).batch(
        args.batch
    )
    data = data.cache()
    times = {"fixed": [], "agreed": []}
    for repeat in range(2 * args.repeats + 1):
        for arm in ("fixed", "agreed") if repeat % 2 == 0 else ("agreed", "fixed"):
            counted = arm == "fixed"
            hv.steps_per_epoch = args.iterate_steps if counted else None
            hv.train_counts = [args.batch * args.iterate_steps] * hv.size if counted else None
            start = time.perf_counter()
            for _ in hv.train_epoch(data):
                pass
            if repeat:
                times[arm].append((time.perf_counter() - start) / args.iterate_steps)
    return times


if __name__ == "__main__":
    arguments = parse_args()
    if os.environ.get("SAGEMAKER_DIST_BENCH_RANK"):
        run_rank(arguments)
    else:
        sys.exit(launch(arguments))
