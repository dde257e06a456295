"""Test entry script without Horovod: print what this rank sees, read its channel's first FIFO."""

import os
import time

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
