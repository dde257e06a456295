"""The launcher of a local ``distribution='tf-mwms'`` job: one worker process per simulated host, each
with the ``TF_CONFIG`` SageMaker's TF toolkit writes (every worker's address, its own task index),
here on free localhost ports.

It behaves like horovodrun towards local mode's supervisor: worker output relayed as
``[i]<stdout>:line``, the first worker that fails reported as ``Process name: i`` / ``Exit code: c``,
the others then stopped, and its exit code that worker's.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading

from sagemaker_dist.contract.environment import inherited
from sagemaker_dist.local.launchers.worker_group import supervise_workers

STOP_GRACE_S = 3.0


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def tf_config(addresses: list[str], index: int) -> str:
    """The TF toolkit's TF_CONFIG for worker ``index`` (``_build_tf_config_for_mwms``)."""
    return json.dumps(
        {"cluster": {"worker": addresses}, "environment": "cloud", "task": {"index": index, "type": "worker"}}
    )


def _relay(index: int, stream, lock: threading.Lock) -> None:
    for line in stream:
        with lock:
            sys.stdout.write(f"[{index}]<stdout>:{line if line.endswith(chr(10)) else line + chr(10)}")
            sys.stdout.flush()


def run_workers(count: int, command: list[str]) -> int:
    """Start ``count`` workers of ``command``; 0 when all end 0, else the first failure's code."""
    addresses = [f"localhost:{port}" for port in free_ports(count)]
    lock = threading.Lock()
    workers, relays = [], []
    for index in range(count):
        env = {**inherited(), "TF_CONFIG": tf_config(addresses, index)}
        proc = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        workers.append(proc)
        relays.append(threading.Thread(target=_relay, args=(index, proc.stdout, lock), daemon=True))
        relays[-1].start()

    return supervise_workers(workers, relays, STOP_GRACE_S, lambda index, code: (index, code))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sagemaker_dist.local.launchers.tf_config")
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    raise SystemExit(run_workers(args.workers, command))


if __name__ == "__main__":
    main()
