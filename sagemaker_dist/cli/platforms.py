"""``sagemaker-dist pipe-agent`` (one node's Pipe-mode feeder, any platform) and ``sagemaker-dist k8s``
(the job as a Kubeflow MPIJob)."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from sagemaker_dist.contract.paths import opt_ml_root


def register(subparsers) -> None:
    a = subparsers.add_parser(
        "pipe-agent",
        help="feed one node's Pipe-mode FIFOs from S3 (Slurm, Kubernetes, any machine)",
        description=(
            "The SageMaker platform's part on one node: write the /opt/ml config files the runtime reads, "
            "unpack the source package, then stream each of the node's channels into <channel>_<epoch> "
            "FIFOs (the next once the previous is closed) until stopped by SIGTERM/SIGINT, --until-pid "
            "exiting, or --epochs fed. S3 is boto3's usual configuration (AWS_ENDPOINT_URL honoured)."
        ),
    )
    a.add_argument("--spec", required=True, help="the CreateTrainingJob request: a JSON file or s3:// URI")
    a.add_argument("--node-index", type=int, required=True, help="this node's index, 0..InstanceCount-1")
    a.add_argument("--ranks", help="the ranks on this node, checked against the job (e.g. 0-7 or 8,9)")
    a.add_argument(
        "--root",
        type=Path,
        help="the node's /opt/ml root (default $SAGEMAKER_DIST_OPT_ML, else /opt/ml); the ranks must see the "
        "same (set SAGEMAKER_DIST_OPT_ML for them)",
    )
    a.add_argument("--epochs", type=int, help="stop after feeding this many epochs (default: until stopped)")
    a.add_argument(
        "--shuffle-seed", type=int, help="shuffle every channel's objects per epoch with this seed"
    )
    a.add_argument(
        "--until-pid", type=int, help="stop when this process exits (e.g. the node's rank launcher)"
    )
    a.set_defaults(func=pipe_agent_command)


def pipe_agent_command(args) -> int:
    from sagemaker_dist.local.endpoint import s3_client
    from sagemaker_dist.platforms.node_plan import parse_ranks, plan_node
    from sagemaker_dist.platforms.pipe_agent import load_job_spec, run_agent

    client = s3_client()
    request = load_job_spec(args.spec, client)
    ranks = parse_ranks(args.ranks) if args.ranks else None
    plan = plan_node(request, args.node_index, ranks, args.epochs, args.shuffle_seed)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    run_agent(plan, args.root or opt_ml_root(), client, stop, args.until_pid, echo=_echo)
    return 0


def _echo(line: str) -> None:
    print(line, flush=True)
