"""Local mode behind the estimator's backend surface: ``est.launch(inputs, backend=LocalBackend())``
and ``est.tune(inputs, ..., backend=LocalBackend())``."""

from __future__ import annotations

import tempfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from sagemaker_dist.contract.distributions import UNNAMED_LAUNCHER
from sagemaker_dist.contract.environment import endpoint_url
from sagemaker_dist.contract.s3_uri import parse_s3_uri
from sagemaker_dist.contract.toolkit import DEFAULT_TOOLKIT_VERSION
from sagemaker_dist.contract.training_request import TrainingRequest, trial_request


@dataclass
class LocalBackend:
    """Run a prepared request on this machine with ``run_local`` (real FIFOs, real Horovod ranks).

    No SageMaker job is created, so the job name need not be free on SageMaker.
    """

    launcher: str = UNNAMED_LAUNCHER  # the distribution's own launcher unless another is named
    work_dir: str | None = None
    keep_work_dir: bool = False
    extra_env: dict[str, str] | None = None
    toolkit_version: str = DEFAULT_TOOLKIT_VERSION  # the image's sagemaker-training (argument passing)
    container_python: str | None = None  # launcher "toolkit": the image's environment (default .venv-toolkit)
    image: str | None = None  # launcher "container": the training image each host runs
    checks_job_name = False
    runs_request_image = False  # the ranks run in .venv, the toolkit's venv or our stand-in images

    def complete_request(self, request: dict, printer=print) -> dict:
        """Local mode runs the request as rendered (no SageMaker config files apply here)."""
        return request

    def run(self, prepared, *, source_dir=None, wait=True, poll=30.0, timeout=None, printer=print):
        from sagemaker_dist.local.job import run_local

        return run_local(
            prepared.request,
            source_dir,
            launcher=self.launcher,
            work_dir=self.work_dir,
            keep_work_dir=self.keep_work_dir,
            echo=printer or (lambda _line: None),
            timeout=timeout,
            extra_env=self.extra_env,
            toolkit_version=self.toolkit_version,
            container_python=self.container_python,
            image=self.image,
        )

    def run_tuning(
        self, request, spec, *, source_dir=None, wait=True, poll=60.0, timeout=None, printer=print
    ):
        """Every trial here, a full local job each (Optuna picks the values); returns a
        ``LocalTuningResult`` after printing its table. ``timeout`` bounds each trial (default: the
        request's MaxRuntimeInSeconds). Trials reach S3 as this process does: ``$AWS_ENDPOINT_URL`` if
        set."""
        result = self.run_trials(request, spec, source_dir=source_dir, timeout=timeout, printer=printer)
        for line in result.table_lines():
            (printer or (lambda _line: None))(line)
        return result

    def run_trials(self, request, spec, *, source_dir=None, timeout=None, printer=print):
        """``run_tuning`` without the table (the CLI prints it to stdout, its progress to stderr)."""
        from sagemaker_dist.local.tuning import TrialRunner, run_local_tuning

        say = printer or (lambda _line: None)
        options = ["--launcher", self.launcher, "--toolkit-version", self.toolkit_version]
        endpoint = endpoint_url()
        if endpoint:
            options += ["--endpoint-url", endpoint]
        else:
            trial = TrainingRequest.parse(trial_request(request, request["HyperParameterTuningJobName"], {}))
            options += ["--bucket", parse_s3_uri(trial.output_path)[0]]
        for flag, value in (("--container-python", self.container_python), ("--image", self.image),
                            ("--work-dir", self.work_dir)):  # fmt: skip
            if value:
                options += [flag, str(value)]
        if self.keep_work_dir:
            options.append("--keep")
        runner = TrialRunner(str(source_dir) if source_dir else None, tuple(options))
        with ExitStack() as stack:
            work = self.work_dir or stack.enter_context(
                tempfile.TemporaryDirectory(prefix="sagemaker-dist-tune-")
            )
            name = request["HyperParameterTuningJobName"]
            return run_local_tuning(request, spec, runner, Path(work) / name, echo=say, trial_timeout=timeout)
