"""``sagemaker-dist pipe-agent``: one node's Pipe-mode feeder, on any platform (the Slurm and
Kubernetes jobs run one per node)."""

from __future__ import annotations

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
    a.add_argument(
        "--private-root",
        action="store_true",
        help="make the root and its parent this user's alone (0700; refused if another user owns either), "
        "replacing a stale root of the same path (the sbatch script's node trees)",
    )
    a.add_argument("--epochs", type=int, help="stop after feeding this many epochs (default: until stopped)")
    a.add_argument(
        "--shuffle-seed", type=int, help="shuffle every channel's objects per epoch with this seed"
    )
    a.add_argument(
        "--until-pid", type=int, help="stop when this process exits (e.g. the node's rank launcher)"
    )
    a.add_argument(
        "--drain",
        type=float,
        default=0.0,
        help="on SIGTERM (scancel, preemption, a pod's deletion: the ranks get it too), keep feeding and "
        "syncing checkpoints until this node's ranks have ended (they agree on a step and checkpoint it), "
        "this many seconds at most; SIGINT, --until-pid or --epochs still end it at once (default 0: "
        "SIGTERM ends it at once)",
    )
    a.set_defaults(func=pipe_agent_command)


def pipe_agent_command(args) -> int:
    from sagemaker_dist.platforms.pipe_agent import serve_node

    serve_node(
        args.spec, args.node_index, args.root or opt_ml_root(), ranks=args.ranks, epochs=args.epochs,
        shuffle_seed=args.shuffle_seed, private_root=args.private_root, drain=args.drain,
        until_pid=args.until_pid, echo=_echo,
    )  # fmt: skip
    return 0


def _echo(line: str) -> None:
    print(line, flush=True)
