"""The steps of a SageMaker hyperparameter tuning job over the estimator's request: every local check
first, the name checked free, then shards and source once, then the tuning request on the backend
(``tuning_handle`` creates it on SageMaker and follows it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from sagemaker_dist.aws.tuning import (
    TuningSpec,
    check_tuning_job_name,
    default_tuning_job_name,
    render_tuning_request,
)
from sagemaker_dist.aws.tuning_validation import validate_tuning_request
from sagemaker_dist.launch.backends import SageMakerBackend
from sagemaker_dist.launch.source_package import resolve_entry_point
from sagemaker_dist.launch.tuning_handle import check_tuning_job_name_free


class TunedJob(Protocol):
    """What the steps need of the job they tune (``DistributedEstimator``)."""

    base_job_name: str
    hyperparameters: Mapping[str, str]
    entry_point: str
    source_dir: str | None

    def draft_request(self, inputs, job_name: str | None = None) -> dict: ...

    def prepare(self, inputs, job_name=None, *, printer=print, check_job_name=None, backend=None): ...

    def _boto_session(self): ...


def draft_tuning_request(
    est: TunedJob, inputs, spec: TuningSpec, tuning_job_name: str | None = None
) -> tuple[dict, list[str]]:
    """The tuning request with the draft request's stand-ins (no AWS call), validated; and its notes."""
    name = check_tuning_job_name(tuning_job_name or default_tuning_job_name(est.base_job_name))
    spec.check_static(est.hyperparameters)
    training = est.draft_request(inputs, job_name=name)
    request, notes = render_tuning_request(training, spec, name)
    return dict(validate_tuning_request(request, spec)), notes


def launch_tuning(
    est: TunedJob,
    inputs,
    spec: TuningSpec,
    tuning_job_name: str | None = None,
    *,
    backend=None,
    wait: bool = True,
    poll: float = 60.0,
    timeout: float | None = None,
    printer: Callable[[str], None] | None = print,
):
    """Check everything locally, check the name is free, shard and upload once, then run the tuning
    request on ``backend``: a SageMaker tuning job (the default; a ``TuningJobHandle``) or, with
    ``LocalBackend()``, every trial on this machine (a ``LocalTuningResult``)."""
    say = printer or (lambda _line: None)
    name = check_tuning_job_name(tuning_job_name or default_tuning_job_name(est.base_job_name))
    _, notes = draft_tuning_request(est, inputs, spec, name)  # every local check, no AWS call
    session = est._boto_session()
    backend = backend or SageMakerBackend(session)
    if backend.checks_job_name:
        check_tuning_job_name_free(name, session)
    for line in spec.describe() + notes:
        say(line)
    prepared = est.prepare(inputs, name, printer=printer, check_job_name=False, backend=backend)
    request, _ = render_tuning_request(prepared.request, spec, name)
    validate_tuning_request(request, spec)
    source_dir = resolve_entry_point(est.entry_point, est.source_dir)[0]
    return backend.run_tuning(
        request, spec, source_dir=source_dir, wait=wait, poll=poll, timeout=timeout, printer=printer
    )
