"""Step-time cost of the TensorBoard-to-S3 syncer (target: <= 1 % of the step time).

Trains the demo job's CNN (sagemaker_dist/local/demo_job/train_cifar10.py) on in-memory CIFAR-10-shaped
batches with a
Keras TensorBoard callback (scalars every 10 steps, weight histograms every epoch) in every arm:

- ``off``: no syncer (the reference, measured in the same run);
- ``on``: TensorBoardSyncer uploading to S3 every ``--interval`` seconds and at each epoch end;
- ``s3-down``: the syncer pointed at a port nobody listens on (every upload fails and is retried).

S3 is a moto server in its own process at the lowest CPU priority (on SageMaker S3 is remote and does
not compete with the trainer for cores; here it shares the same machine).
Arms alternate round by round to cancel drift; the first epoch of each run (tracing) is not counted.
Usage: .venv/bin/python bench/bench_tensorboard_sync.py [--rounds 3] [--epochs 4] [--steps 40]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sagemaker_dist.local.demo import DEMO_JOB_DIR

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_s3() -> tuple[subprocess.Popen, str]:
    port = free_port()
    server = Path(sys.executable).with_name("moto_server")
    proc = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("moto_server did not start")


def load_example():
    spec = importlib.util.spec_from_file_location("train_cifar10", DEMO_JOB_DIR / "train_cifar10.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_arm(example, tf, arm: str, args, endpoints: dict, workdir: Path) -> dict:
    """Per-step seconds (epochs after the first), fit wall time, and the syncer's uploads, failed
    rounds and CPU seconds for one training run."""
    from sagemaker_dist.runtime.tensorboard_sync import TensorBoardSyncer

    log_dir = Path(tempfile.mkdtemp(prefix=f"{arm}-", dir=workdir))
    tf.keras.utils.set_random_seed(0)
    rng = tf.random.Generator.from_seed(1)
    images = rng.uniform((args.batch * 8, 32, 32, 3))
    labels = tf.cast(rng.uniform((args.batch * 8,), maxval=10, dtype=tf.int32), tf.int64)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(args.batch).repeat()
    model = example.build_model()
    model.compile(
        tf.keras.optimizers.legacy.Adam(1e-3),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    tensorboard = tf.keras.callbacks.TensorBoard(
        log_dir=str(log_dir), update_freq=10, histogram_freq=1, profile_batch=0
    )
    callbacks = [tensorboard]
    syncer = None
    if arm != "off":
        os.environ["AWS_ENDPOINT_URL"] = endpoints[arm]
        syncer = TensorBoardSyncer(
            log_dir, f"s3://bench-tensorboard/{log_dir.name}", interval=args.interval, flush_timeout=30
        ).start()
        callbacks.append(syncer.keras_callback(tensorboard))
    steps: list[float] = []

    class StepTimer(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch > 0:
                steps.append(time.perf_counter() - self.start)

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

    started = time.perf_counter()
    model.fit(
        data, epochs=args.epochs, steps_per_epoch=args.steps, verbose=0, callbacks=[*callbacks, StepTimer()]
    )
    return {
        "steps": steps,
        "wall": time.perf_counter() - started,
        "uploads": syncer.uploads if syncer else 0,
        "failures": syncer.failures if syncer else 0,
        "cpu": syncer.cpu_seconds if syncer else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--interval", type=float, default=1.0, help="syncer interval, s (default 30 in jobs)")
    args = parser.parse_args()

    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    server, endpoint = start_s3()
    try:
        import boto3
        import tensorflow as tf

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench-tensorboard")
        endpoints = {"on": endpoint, "s3-down": f"http://127.0.0.1:{free_port()}"}
        example = load_example()
        arms = ("off", "on", "s3-down")
        totals = {arm: {"steps": [], "wall": 0.0, "uploads": 0, "failures": 0, "cpu": 0.0} for arm in arms}
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(args.rounds):
                for arm in arms:
                    for key, value in run_arm(example, tf, arm, args, endpoints, Path(tmp)).items():
                        totals[arm][key] += value
    finally:
        server.terminate()
        server.wait()

    ref = statistics.median(totals["off"]["steps"])
    ref_mean = statistics.fmean(totals["off"]["steps"])
    print(
        f"{args.rounds} round(s) x {args.epochs - 1} timed epoch(s) x {args.steps} steps, "
        f"batch {args.batch}, syncer interval {args.interval:g} s"
    )
    print(
        f"{'arm':<8} {'median step':>12} {'mean step':>10} {'median/off':>11} {'mean/off':>9} {'uploads':>8} "
        f"{'failed rounds':>13} {'syncer CPU / fit wall':>22}"
    )
    for arm in arms:
        t = totals[arm]
        med, mean = statistics.median(t["steps"]), statistics.fmean(t["steps"])
        print(
            f"{arm:<8} {med * 1e3:>9.2f} ms {mean * 1e3:>7.2f} ms {med / ref:>11.3f} {mean / ref_mean:>9.3f} "
            f"{t['uploads']:>8} {t['failures']:>13} {t['cpu'] / t['wall']:>21.2%}"
        )


if __name__ == "__main__":
    main()
