"""Test/benchmark entry script: each rank reads its own train channel through the runtime's
rank_dataset for --epochs epochs and prints how many records it got per epoch.

--delay makes each record slow (so a test can interrupt the job while ranks read).
"""

import argparse
import time

import horovod.tensorflow as hvd

from sagemaker_dist.runtime import rank_dataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--delay", type=float, default=0.0)
args, _ = parser.parse_known_args()

hvd.init()
dataset = rank_dataset("train", "TFRecord")
start = time.monotonic()
total = 0
for epoch in range(args.epochs):
    count = 0
    for _ in dataset:
        count += 1
        if count == 1 and epoch == 0:
            print(f"first record after {time.monotonic() - start:.3f} s", flush=True)
        if args.delay:
            time.sleep(args.delay)
    total += count
    print(f"epoch {epoch} records {count}", flush=True)
elapsed = time.monotonic() - start
print(
    f"rank {hvd.rank()} records {total} seconds {elapsed:.3f} records_per_s {total / elapsed:.1f}", flush=True
)
