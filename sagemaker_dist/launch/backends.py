"""Where a prepared job runs. A backend takes the validated request and runs it, as boto3's
CreateTrainingJob does; the SageMaker SDK's local mode mirrors that surface the same way.

``SageMakerBackend`` (the default) creates the job on SageMaker; ``sagemaker_dist.LocalBackend``
runs it on this machine. The estimator only knows the protocol, so it never imports local mode.
These are the Python API's; the command line's platforms (``cli/platforms.py``: SageMaker and local mode
over these backends, Slurm and Kubernetes beside them) are rows of one registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

from sagemaker_dist.contract import hyperparameters as hp
from sagemaker_dist.contract.distributions import distribution as registered
from sagemaker_dist.contract.layout import ChannelLayout
from sagemaker_dist.contract.training_request import TrainingRequest
from sagemaker_dist.launch.account import create_training_job, with_sdk_config_defaults
from sagemaker_dist.launch.source_package import SourcePackage
from sagemaker_dist.launch.training_job import TrainingJobHandle


@dataclass(frozen=True)
class PreparedJob:
    """What ``prepare`` produced: the validated request, the layout and the uploaded source package.

    ``source.path`` was a temporary file and is gone; the tarball lives at the request's
    ``sagemaker_submit_directory``.
    """

    request: dict
    layout: ChannelLayout
    source: SourcePackage

    @cached_property
    def training(self) -> TrainingRequest:
        """The request's members, typed (read once)."""
        return TrainingRequest.parse(self.request)

    @property
    def job_name(self) -> str:
        return self.training.name


class TrainingBackend(Protocol):
    """Runs a prepared job; ``checks_job_name`` says whether the name must be free on SageMaker,
    ``runs_request_image`` whether the request's image runs the script (else this backend's own
    environment, which has the package)."""

    checks_job_name: bool
    runs_request_image: bool

    def complete_request(self, request: dict, printer: Callable[[str], None]) -> dict:
        """The request as this backend will run it (validated after this, before any write)."""

    def run(
        self,
        prepared: PreparedJob,
        *,
        source_dir: str | None,
        wait: bool,
        poll: float,
        timeout: float | None,
        printer: Callable[[str], None] | None,
    ) -> Any: ...

    def run_tuning(
        self,
        request: dict,
        spec: Any,
        *,
        source_dir: str | None,
        wait: bool,
        poll: float,
        timeout: float | None,
        printer: Callable[[str], None] | None,
    ) -> Any:
        """Run a validated CreateHyperParameterTuningJob request (its trials share the shards)."""


def check_sagemaker_instance_type(request: dict) -> None:
    """Refuse a request whose distribution SageMaker cannot run on its instance type (the registry's
    ``sagemaker_instance_prefixes``); raises DistributionError (a ConfigurationError)."""
    read = TrainingRequest.parse(request)
    layout = read.hyperparameters.get(hp.LAYOUT)
    name = ChannelLayout.from_json(layout).distribution if layout else None
    registered(name).check_sagemaker_instance_type(read.instance_type or "")


class SageMakerBackend:
    """CreateTrainingJob through SDK v3's ``sagemaker.core``; returns a ``TrainingJobHandle``."""

    checks_job_name = True
    runs_request_image = True

    def __init__(self, boto_session=None):
        self.boto_session = boto_session

    def complete_request(self, request: dict, printer=print) -> dict:
        """SDK v3 merges SageMaker config-file defaults into the request; merge them before validation.
        A distribution SageMaker runs only on some instance types (torchrun: GPU, Trainium) is checked."""
        check_sagemaker_instance_type(request)
        merged, added = with_sdk_config_defaults(request)
        if added and printer:
            printer(f"SageMaker config file defaults added: {', '.join(added)}")
        return merged

    def run(self, prepared, *, source_dir=None, wait=True, poll=30.0, timeout=None, printer=print):
        say = printer or (lambda _line: None)
        job = prepared.training
        handle = TrainingJobHandle(
            create_training_job(prepared.request, self.boto_session), self.boto_session
        )
        say(
            f"created training job {handle.name} ({job.hosts} x {job.instance_type}, "
            f"{prepared.layout.world_size} "
            f"{registered(prepared.layout.distribution).workers})"
        )
        if wait:
            handle.wait(poll=poll, timeout=timeout, printer=printer)
        return handle

    def run_tuning(
        self, request, spec, *, source_dir=None, wait=True, poll=60.0, timeout=None, printer=print
    ):
        """Creates the tuning job on SageMaker; returns a ``TuningJobHandle``."""
        from sagemaker_dist.launch.tuning_handle import run_sagemaker_tuning

        return run_sagemaker_tuning(
            request, spec, self.boto_session, wait=wait, poll=poll, timeout=timeout, printer=printer
        )
