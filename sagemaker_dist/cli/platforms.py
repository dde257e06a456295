"""The registry of platforms: where a job runs, one row each (SageMaker, local mode, Slurm, Kubernetes),
every row the same ``Platform`` protocol. The job commands (``launch``, ``local``, ``k8s``, ``slurm``)
and ``tune`` look their platform up here by name and call only the protocol; no other module compares
a platform's name (``tests/test_architecture.py``). A new platform is a module with its row (its command's
options, render, submit, wait, tune) and its line in ``REGISTRY``.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any, Protocol

from sagemaker_dist.cli.k8s import KUBERNETES
from sagemaker_dist.cli.launch import SAGEMAKER
from sagemaker_dist.cli.local_platform import LOCAL
from sagemaker_dist.cli.pipe_agent import register as register_pipe_agent
from sagemaker_dist.cli.slurm import SLURM
from sagemaker_dist.errors import ConfigurationError

__all__ = [
    "DEFAULT_TUNING", "NAMES", "REGISTRY", "Platform", "platform", "register", "run_job", "tuning_platforms",
]  # fmt: skip


class Platform(Protocol):
    """Where a job runs, as the CLI and ``tune`` see it."""

    name: str  # its key in the registry
    command: str  # the subcommand that runs a job there; its options describe the job (tune reads them too)
    tune_option: str | None  # the option of 'tune' that picks it (None: the default, or no tuning)
    tune_help: str | None
    tune_only: dict[str, str]  # tune's options of its own: dest -> the error where another platform tunes

    def register(self, subparsers) -> Any:
        """Add its command's parser; returns it."""

    def add_tune_options(self, parser) -> None:
        """Add the options of 'tune' that only it takes (``tune_only``)."""

    def render(self, args, stack: ExitStack) -> Any:
        """The job as the platform takes it, every check done before anything is submitted; None where
        the command ends here (a dry run printed it). What it needs (the embedded S3) lives in ``stack``."""

    def submit(self, args, job) -> Any:
        """Write, upload, create or run the job; what to wait for, or None where the command ends here."""

    def wait(self, args, handle) -> int:
        """Until the job ends: the command's exit status."""

    def tune(self, args, job_args, spec) -> int:
        """Tune the job's hyperparameters there (``args``: tune's options; ``job_args``: the command's)."""


REGISTRY: dict[str, Platform] = {row.name: row for row in (SAGEMAKER, LOCAL, KUBERNETES, SLURM)}
NAMES = tuple(REGISTRY)
DEFAULT_TUNING = SAGEMAKER.name  # where 'tune' runs unless one of the platforms' tune options is given


def platform(name: str) -> Platform:
    """The row named ``name``."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise ConfigurationError(f"no platform {name!r}: one of {', '.join(NAMES)}") from None


def tuning_platforms() -> list[Platform]:
    """The rows that 'tune' picks with an option of its own (the default needs none)."""
    return [row for row in REGISTRY.values() if row.tune_option]


def run_job(args) -> int:
    """A job command: its platform, by name, renders the job, submits it and waits for it, the S3 the
    job reads (embedded where no other is given) up all along."""
    where = platform(args.platform)
    with ExitStack() as stack:
        job = where.render(args, stack)
        handle = None if job is None else where.submit(args, job)
        return 0 if handle is None else where.wait(args, handle)


def register(subparsers) -> None:
    """The pipe agent the other platforms' nodes run, then every platform's command not registered yet
    (``launch`` and ``local`` keep their place in the help), each run by ``run_job``."""
    register_pipe_agent(subparsers)
    for row in REGISTRY.values():
        parser = subparsers.choices.get(row.command) or row.register(subparsers)
        parser.set_defaults(func=run_job, platform=row.name)
