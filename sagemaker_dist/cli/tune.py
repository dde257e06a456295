"""``sagemaker-dist tune``: hyperparameter tuning over the same job, on SageMaker (default), this machine
(``--local``, Optuna) or Kubernetes (``--k8s``, a Katib Experiment): the registry of platforms' rows
that tune (``cli/platforms.py``), picked by name.

Its own options say what to search; every other option is the platform's job command's (``launch``
for SageMaker, ``local`` with ``--local``, ``k8s`` with ``--k8s``), parsed by that command's own
parser, so the job is described exactly as it would be launched.
"""

from __future__ import annotations

import argparse

from sagemaker_dist.cli.platforms import DEFAULT_TUNING, REGISTRY, Platform, platform, tuning_platforms
from sagemaker_dist.errors import ConfigurationError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tune",
        help="hyperparameter tuning over the job: SageMaker, this machine (--local) or Katib (--k8s)",
        description=(
            "Tune the job's hyperparameters. Besides the options below, give the options of 'launch' "
            "(SageMaker: entry point, --role, --instance-type, --train, ..., --dry-run prints the request as "
            "JSON), of 'local' with --local (--demo, --entry-point, --hosts, ...; the trials run here, one "
            "at a time by default) or of 'k8s' with --k8s (--demo or --request, --image, ...; prints a Katib "
            "Experiment). The script reports metrics through the runtime's Keras helpers (a line per epoch)."
        ),
    )
    where = p.add_mutually_exclusive_group()
    for row in tuning_platforms():
        where.add_argument(row.tune_option, dest="platform", action="store_const", const=row.name,
                           help=row.tune_help)  # fmt: skip
    p.add_argument("--objective-metric", required=True, help="e.g. val_accuracy (a Keras metric name)")
    p.add_argument("--objective-type", default="Maximize", choices=("Maximize", "Minimize"))
    p.add_argument(
        "--range",
        action="append",
        default=[],
        metavar="NAME=MIN:MAX[:log]|NAME=A,B,C",
        help="a hyperparameter to search (repeatable): integers if both bounds are, scale log, linear, "
        "reverse-log or auto; or categorical values",
    )
    p.add_argument("--max-jobs", type=int, help="trials in all (Grid: default every combination)")
    p.add_argument("--max-parallel-jobs", type=int, default=1, help="trials at a time (default 1)")
    p.add_argument("--strategy", default="Bayesian", choices=("Bayesian", "Random", "Hyperband", "Grid"))
    p.add_argument("--early-stopping", default="Off", choices=("Auto", "Off"))
    p.add_argument(
        "--metric",
        action="append",
        default=[],
        metavar="NAME",
        help="a metric the script's Keras logs report, besides loss, accuracy, val_loss, val_accuracy",
    )
    p.add_argument(
        "--warm-start", action="append", default=[], metavar="TUNING_JOB", help="parent tuning job"
    )
    p.add_argument(
        "--warm-start-type",
        default="IdenticalDataAndAlgorithm",
        choices=("IdenticalDataAndAlgorithm", "TransferLearning"),
    )
    p.add_argument("--seed", type=int, help="the search's random seed")
    for row in REGISTRY.values():
        row.add_tune_options(p)
    p.set_defaults(func=tune_command, takes_extra=True, platform=DEFAULT_TUNING)


def _job_args(where: Platform, extra: list[str]) -> argparse.Namespace:
    """``extra`` parsed by the platform's own job command's parser (launch, local or k8s)."""
    parser = argparse.ArgumentParser(prog="sagemaker-dist tune")
    job_parser = where.register(parser.add_subparsers(dest="command"))
    job_parser.prog = "sagemaker-dist tune" + (f" {where.tune_option}" if where.tune_option else "")
    return job_parser.parse_args(extra)


def _spec(args, drop_metrics: bool = False):
    from sagemaker_dist.aws.tuning import TuningSpec
    from sagemaker_dist.aws.tuning_ranges import parse_range_option
    from sagemaker_dist.contract.metric_line import DEFAULT_METRICS

    warm = {"parents": args.warm_start, "type": args.warm_start_type} if args.warm_start else None
    return TuningSpec.build(
        objective_metric=args.objective_metric,
        objective_type=args.objective_type,
        ranges=[parse_range_option(r) for r in args.range],
        max_jobs=args.max_jobs,
        max_parallel_jobs=args.max_parallel_jobs,
        strategy=args.strategy,
        early_stopping=args.early_stopping,
        metrics=[*DEFAULT_METRICS, *args.metric],
        warm_start=warm,
        seed=args.seed,
    )


def tune_command(args) -> int:
    where = platform(args.platform)
    spec = _spec(args)  # the search is checked before the job's options are even read
    for row in REGISTRY.values():  # another platform's own options of 'tune'
        if row is not where:
            for dest, refusal in row.tune_only.items():
                if getattr(args, dest):
                    raise ConfigurationError(refusal)
    return where.tune(args, _job_args(where, list(getattr(args, "extra", []))), spec)
