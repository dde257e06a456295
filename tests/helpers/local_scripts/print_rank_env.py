"""Test entry script without Horovod: print what this rank sees, read its channel's first FIFO
(``--hang_rank R``: rank R then never ends, as a rank that hangs on its way out; ``--busy S``: every rank
then works S seconds without a stop handler; ``--linger S``: every rank's exit then takes S seconds, as
a framework's teardown can)."""

import argparse
import atexit
import os
import time

parser = argparse.ArgumentParser()
parser.add_argument("--hang_rank", type=int, default=-1)
parser.add_argument("--busy", type=float, default=0.0)
parser.add_argument("--linger", type=float, default=0.0)
args, _ = parser.parse_known_args()

root = os.environ["SAGEMAKER_DIST_OPT_ML"]
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("HOROVOD_RANK", "-1")))
local = os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("HOROVOD_LOCAL_RANK"))
fifo = f"{root}/input/data/train_{rank}_0"
while not os.path.exists(fifo):
    time.sleep(0.01)
with open(fifo, "rb") as f:
    size = len(f.read())
mpi_yield = os.environ.get("OMPI_MCA_mpi_yield_when_idle")  # local mode's ranks share one machine's cores
host = os.environ["SM_CURRENT_HOST"]
print(f"env rank={rank} local={local} host={host} bytes={size} yield={mpi_yield}", flush=True)
if rank == args.hang_rank:
    print(f"rank {rank} waits on its way out", flush=True)
    while True:
        time.sleep(1)
if args.busy:
    print(f"rank {rank} works {args.busy} s", flush=True)
    time.sleep(args.busy)
if args.linger:
    atexit.register(time.sleep, args.linger)
