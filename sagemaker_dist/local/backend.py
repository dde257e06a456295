"""Local mode behind the estimator's backend surface: ``est.launch(inputs, backend=LocalBackend())``."""

from __future__ import annotations

from dataclasses import dataclass

from sagemaker_dist.contract.toolkit import DEFAULT_TOOLKIT_VERSION


@dataclass
class LocalBackend:
    """Run a prepared request on this machine with ``run_local`` (real FIFOs, real Horovod ranks).

    No SageMaker job is created, so the job name need not be free on SageMaker.
    """

    launcher: str = "horovodrun"
    work_dir: str | None = None
    keep_work_dir: bool = False
    extra_env: dict[str, str] | None = None
    toolkit_version: str = DEFAULT_TOOLKIT_VERSION  # the image's sagemaker-training (argument passing)
    container_python: str | None = None  # launcher "toolkit": the image's environment (default .venv-toolkit)
    checks_job_name = False

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
        )
