"""Entry of one local-mode rank: become rank r on simulated host ``algo-(r // P + 1)``, then run
the user's entry script the way the sagemaker-training toolkit would (cwd = source dir, user
hyperparameters as ``--key value`` arguments).

``horovodrun --gloo -np H*P -H localhost:H*P`` starts every rank on this machine as if it were one
host; here each rank switches to its own host's /opt/ml tree and SM_* variables, and sets Horovod's
local/cross rank and size (and host name, which names the local Gloo group) so that
``hvd.local_rank()`` and ``hvd.cross_rank()`` are what they would be on H hosts of P processes.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import traceback
from pathlib import Path

from sagemaker_dist.local.opt_ml import JOB_ENV

TERMINATED = "terminated"  # exit-file content of a rank stopped by SIGTERM (the launcher or local mode)


def world_rank() -> tuple[int, int]:
    for rank_key, size_key in (
        ("HOROVOD_RANK", "HOROVOD_SIZE"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ):
        if rank_key in os.environ:
            return int(os.environ[rank_key]), int(os.environ[size_key])
    raise SystemExit(
        f"{__name__}: no HOROVOD_RANK or OMPI_COMM_WORLD_RANK; start it with horovodrun or mpirun"
    )


def simulated_rank_env(rank: int, size: int, processes_per_host: int, host_name: str) -> dict[str, str]:
    """Horovod and Open MPI variables of ``rank`` when ranks fill hosts of ``processes_per_host`` in order."""
    local_rank, cross_rank = rank % processes_per_host, rank // processes_per_host
    hosts = size // processes_per_host
    env = {
        "HOROVOD_HOSTNAME": host_name,
        "HOROVOD_LOCAL_RANK": str(local_rank),
        "HOROVOD_LOCAL_SIZE": str(processes_per_host),
        "HOROVOD_CROSS_RANK": str(cross_rank),
        "HOROVOD_CROSS_SIZE": str(hosts),
    }
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        env["OMPI_COMM_WORLD_LOCAL_RANK"] = str(local_rank)
        env["OMPI_COMM_WORLD_LOCAL_SIZE"] = str(processes_per_host)
    return env


def write_exit(path: Path, text: str) -> None:
    """Write a rank's exit file in one step (the supervisor never reads half of it)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main() -> None:
    job = json.loads(Path(os.environ[JOB_ENV]).read_text())
    rank, size = world_rank()
    per_host = int(job["processes_per_host"])
    host = job["hosts"][rank // per_host]
    os.environ.update(host["env"])
    os.environ.update(simulated_rank_env(rank, size, per_host, host["name"]))
    pid_dir = Path(job["pid_dir"])
    exit_file = pid_dir / f"{rank}.exit"
    terminated = []

    def on_sigterm(signum, frame):
        # horovodrun stops the other ranks with SIGTERM when one fails; record that, so the
        # supervisor can tell these ranks from the one that failed first
        if not terminated:
            terminated.append(True)
            write_exit(exit_file, TERMINATED)
            os.write(1, f"rank {rank} terminated by SIGTERM (stopped by the launcher)\n".encode())
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    (pid_dir / f"{rank}.pid").write_text(str(os.getpid()))
    local = os.environ["HOROVOD_LOCAL_RANK"]
    print(
        f"rank {rank}/{size} on {host['name']} (local rank {local} of {per_host}): "
        f"{job['entry_point']} {' '.join(job['args'])}",
        flush=True,
    )
    code = 1
    try:
        os.chdir(job["source_dir"])
        sys.path.insert(0, job["source_dir"])
        sys.argv = [job["entry_point"], *job["args"]]
        runpy.run_path(job["entry_point"], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        raise
    except BaseException:
        # the traceback goes out before the exit file, so the supervisor has it when it reports
        traceback.print_exc()
        sys.stderr.flush()
        code = 1
        raise SystemExit(1) from None
    finally:
        if not terminated:
            write_exit(exit_file, str(code))
            print(f"rank {rank} exits with code {code}", flush=True)


if __name__ == "__main__":
    main()
