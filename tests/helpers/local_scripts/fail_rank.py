"""Test entry script: rank 1 raises an exception while rank 0 waits for it in a collective
(--fail-rank picks the rank). Local mode must blame the failing rank, not the one stopped after it."""

import argparse
import time

import horovod.tensorflow as hvd
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", "--fail_rank", dest="fail_rank", type=int, default=1)
args, _ = parser.parse_known_args()

hvd.init()
hvd.allreduce(tf.constant(1.0), name="warm_up")  # every rank is up and connected
if hvd.rank() == args.fail_rank:
    time.sleep(0.5)
    raise RuntimeError(f"rank {hvd.rank()} failed on purpose")
while True:  # the other ranks block in collectives waiting for the failed rank
    hvd.allreduce(tf.constant(1.0), name="tick")
