"""Test entry script for several-host jobs: every rank says where it runs once all are connected, then
the rank --fail-rank picks raises (none by default: the ranks tick in collectives until stopped)."""

import argparse
import os
import socket
import time

import horovod.tensorflow as hvd
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--fail-rank", "--fail_rank", dest="fail_rank", type=int, default=-1)
args, _ = parser.parse_known_args()

hvd.init()
hvd.allreduce(tf.constant(1.0), name="warm_up")  # every rank is up and connected
mpi_yield = os.environ.get("OMPI_MCA_mpi_yield_when_idle")  # local mode's, passed on by mpirun over SSH
host = socket.gethostname()
print(f"rank {hvd.rank()} of {hvd.size()} up on {host} (MPI yields when idle: {mpi_yield})", flush=True)
if hvd.rank() == args.fail_rank:
    time.sleep(0.5)
    raise RuntimeError(f"rank {hvd.rank()} failed on purpose on {socket.gethostname()}")
while True:
    hvd.allreduce(tf.constant(1.0), name="tick")
    time.sleep(0.2)
