"""Test entry script for the toolkit launcher: print what this rank sees as JSON (its arguments, host
name, the toolkit's variables) after reading its channel's first FIFO at the hard-coded /opt/ml."""

import json
import os
import socket
import sys

rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
with open(f"/opt/ml/input/data/train_{rank}_0", "rb") as f:
    size = len(f.read())
view = {
    "rank": rank,
    "local_rank": int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]),
    "argv": sys.argv[1:],
    "gethostname": socket.gethostname(),
    "ld_preload": os.environ.get("LD_PRELOAD", ""),
    "sm_current_host": os.environ.get("SM_CURRENT_HOST"),
    "sm_hps": json.loads(os.environ.get("SM_HPS", "null")),
    "cwd": os.getcwd(),
    "bytes": size,
}
print("VIEW " + json.dumps(view, sort_keys=True), flush=True)
