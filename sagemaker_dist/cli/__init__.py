"""The ``sagemaker-dist`` console command: each concern registers its own subcommands."""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from sagemaker_dist import errors
from sagemaker_dist.contract.environment import set_variables

# Modules that define ``register(subparsers)``; each adds its subcommands with ``set_defaults(func=...)``.
COMMAND_MODULES = (
    "sagemaker_dist.cli.sharding",
    "sagemaker_dist.cli.launch",
    "sagemaker_dist.cli.local",
    "sagemaker_dist.cli.platforms",  # the platforms: pipe-agent, k8s, slurm; runs every job command
    "sagemaker_dist.cli.tune",
    "sagemaker_dist.cli.pack",
)


def add_distribution_argument(p) -> None:
    """``--distribution`` for plan, launch and local: how the workers train together."""
    from sagemaker_dist.contract.distributions import DEFAULT, HELP, NAMES

    p.add_argument("--distribution", default=DEFAULT, choices=NAMES, help=HELP)


def add_region_argument(p) -> None:
    """``--region`` for the commands that call AWS: the AWS region, exported for every client made."""
    p.add_argument(
        "--region",
        type=_region,
        help="AWS region (default: AWS_REGION / AWS_DEFAULT_REGION, then your AWS config's)",
    )


def use_region(args) -> None:
    """``--region``, where given, for every boto3 session this command makes (the SDK's included)."""
    if getattr(args, "region", None):
        set_variables({"AWS_DEFAULT_REGION": args.region, "AWS_REGION": args.region})


def _region(value: str) -> str:
    import re

    if not re.match(r"^[a-z]{2}(-[a-z]+)+-\d$", value):
        raise argparse.ArgumentTypeError(f"{value!r} is not an AWS region name such as us-east-1")
    return value


_python_showwarning = warnings.showwarning


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Our warnings as one ``warning: ...`` line (they say what to do); others as Python shows them."""
    if category.__module__.startswith("sagemaker_dist."):
        print(f"warning: {message}", file=file or sys.stderr)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sagemaker-dist",
        description=(
            "Shard S3 data per GPU, lay out SageMaker Pipe-mode channels, and run Horovod jobs "
            "on SageMaker or locally. Start with 'sagemaker-dist local --demo'."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # A job's progress must show as it happens under a pipe too (| tee, a CI log, a test reading it):
    # Python block-buffers stdout there, and a long job would print nothing until it ended.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)
    warnings.showwarning = _show_warning
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "takes_extra", False):  # only 'tune' passes options on to another parser
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    use_region(args)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except errors.SageMakerDistError as exc:  # ours say what to do; anything else is a bug (traceback)
        print(f"error: {exc}", file=sys.stderr)
        return 2
