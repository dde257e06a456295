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

from sagemaker_dist.contract.environment import inherited, set_variables, variable
from sagemaker_dist.contract.rank_slots import (
    TORCHRUN_VARIABLES,
    mpi_local_environment,
    rank_from_environment,
    slot_environment,
)
from sagemaker_dist.local.exit_files import TERMINATED, hold_alive_lock, write_whole

JOB_ENV = "SAGEMAKER_DIST_LOCAL_JOB"  # local mode's job description file, for each rank's entry


def write_job_file(path: Path, trees, **script) -> None:
    """Local mode's job description (``$SAGEMAKER_DIST_LOCAL_JOB``), one schema for every launcher that
    reads it (the rank entry, the torchrun and toolkit host launchers), each value worked out here once:
    ``hosts`` (name, tree, environment, first rank and ranks of each host of ``trees``, a ``JobHosts``)
    and ``ranks`` (each rank's host index and its slot's variables; ``mpi_env``: Open MPI's local ones,
    for a rank mpirun started), then ``script``: the entry script's ``source_dir``, ``entry_point``,
    ``args`` and the ranks' ``pid_dir``, where the rank entry runs it. Written whole, then renamed."""
    hosts = []
    for tree, mine in zip(trees, trees.host_slots, strict=True):
        hosts.append({"name": tree.name, "tree": str(tree.root), "env": tree.env, "first_rank": mine[0].rank,
                      "ranks": len(mine)})  # fmt: skip
    ranks = []
    for slot in trees.slots:
        ranks.append(
            {"host": slot.cross_rank, "env": slot_environment(slot), "mpi_env": mpi_local_environment(slot)}
        )
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps({"hosts": hosts, "ranks": ranks, **script}))
    os.replace(part, path)


def world_rank() -> tuple[int, int]:
    """(rank, size) from the launcher's variables, with the contract's one precedence."""
    found = rank_from_environment(inherited())
    if found is None and variable(TORCHRUN_VARIABLES[0]) is not None:  # torchrun's (launchers/torchrun.py)
        found = tuple(int(variable(name)) for name in TORCHRUN_VARIABLES), "torchrun"
    if found is None:
        raise SystemExit(
            f"{__name__}: no HOROVOD_RANK, OMPI_COMM_WORLD_RANK or RANK; start it with horovodrun, mpirun "
            "or torchrun"
        )
    (rank, _, size, _), _ = found
    return rank, size


def main() -> None:
    if variable(JOB_ENV) is None:
        raise SystemExit(
            f"{__name__}: ${JOB_ENV} is not set; local mode starts this module (sagemaker-dist local)"
        )
    job = json.loads(Path(variable(JOB_ENV)).read_text())
    rank, size = world_rank()
    slot = job["ranks"][rank]
    host = job["hosts"][slot["host"]]
    set_variables(host["env"])
    set_variables(slot["env"])
    if variable("OMPI_COMM_WORLD_RANK") is not None:  # mpirun started it: Open MPI's local variables too
        set_variables(slot["mpi_env"])
    pid_dir = Path(job["pid_dir"])
    exit_file = pid_dir / f"{rank}.exit"
    terminated = []

    def on_sigterm(signum, frame):
        # horovodrun stops the other ranks with SIGTERM when one fails; record that, so the
        # supervisor can tell these ranks from the one that failed first
        if not terminated:
            terminated.append(True)
            write_whole(exit_file, TERMINATED)
            os.write(1, f"rank {rank} terminated by SIGTERM (stopped by the launcher)\n".encode())
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
    hold_alive_lock(pid_dir / f"{rank}.alive")  # its descriptor stays open until this process ends
    write_whole(pid_dir / f"{rank}.pid", str(os.getpid()))
    local = variable("HOROVOD_LOCAL_RANK")
    print(
        f"rank {rank}/{size} on {host['name']} (local rank {local} of {host['ranks']}): "
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
            # the script has ended: a SIGTERM from now on (a stop or spot interruption that came late)
            # has nothing left to stop, and finalisation gives SIGTERM back to its default, which would
            # end this rank by the signal instead of with the script's code
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            write_whole(exit_file, str(code))
            print(f"rank {rank} exits with code {code}", flush=True)


if __name__ == "__main__":
    main()
