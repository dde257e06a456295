"""A SageMaker hyperparameter tuning job once created: CreateHyperParameterTuningJob through SDK v3's
``sagemaker.core``, and the handle that reports status, every trial and the best."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from sagemaker_dist.aws.progress import progress_bar
from sagemaker_dist.aws.tuning_ranges import TuningError
from sagemaker_dist.contract.training_request import TrainingRequest, trial_request
from sagemaker_dist.errors import JobFailedError
from sagemaker_dist.launch.account import aws_error, create_with_sdk, existing

TERMINAL_STATUSES = ("Completed", "Failed", "Stopped")
MAX_TUNING_SECONDS = 30 * 24 * 3600  # SageMaker's longest tuning job


class TuningJobFailed(JobFailedError):
    """The tuning job ended Failed or Stopped."""


@dataclass(frozen=True)
class TrialSummary:
    """One training job of a tuning job: its tuned values, status and final objective."""

    name: str
    status: str
    hyperparameters: dict[str, str]
    objective: float | None
    objective_status: str | None = None
    failure_reason: str | None = None

    @classmethod
    def from_summary(cls, summary: Mapping) -> TrialSummary:
        """From a HyperParameterTrainingJobSummary (a listed training job, or BestTrainingJob)."""
        final = summary.get("FinalHyperParameterTuningJobObjectiveMetric") or {}
        return cls(
            name=summary.get("TrainingJobName", ""),
            status=summary.get("TrainingJobStatus", ""),
            hyperparameters=dict(summary.get("TunedHyperParameters") or {}),
            objective=float(final["Value"]) if "Value" in final else None,
            objective_status=summary.get("ObjectiveStatus"),
            failure_reason=summary.get("FailureReason"),
        )


def trial_table(trials: list[TrialSummary], objective: str, best: str | None = None) -> list[str]:
    """The trials as a table: one row each, the best marked with '*'."""
    names = sorted({k for t in trials for k in t.hyperparameters})
    header = ["", "trial", "status", objective, *names]
    rows = [
        [
            "*" if t.name == best else "",
            t.name,
            t.status,
            "-" if t.objective is None else f"{t.objective:.6g}",
            *(t.hyperparameters.get(n, "-") for n in names),
        ]
        for t in trials
    ]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]


class TuningJobHandle:
    """A created tuning job: ``describe()``, ``status``, ``training_jobs()``, ``best_training_job()``,
    ``wait()`` (bounded) and ``stop()``."""

    def __init__(self, name: str, boto_session=None, request: Mapping | None = None, arn: str | None = None):
        self.name = name
        self.request = dict(request or {})
        self.arn = arn
        self._boto_session = boto_session

    def _client(self):
        return (self._boto_session or boto3.Session()).client("sagemaker")

    def describe(self) -> dict:
        """DescribeHyperParameterTuningJob, as boto3 returns it."""
        try:
            response = self._client().describe_hyper_parameter_tuning_job(
                HyperParameterTuningJobName=self.name
            )
        except (ClientError, BotoCoreError) as exc:
            raise aws_error(exc, f"describe tuning job {self.name!r}", "check the name and region") from exc
        response.pop("ResponseMetadata", None)
        self.arn = response.get("HyperParameterTuningJobArn", self.arn)
        return response

    @property
    def status(self) -> str:
        return self.describe()["HyperParameterTuningJobStatus"]

    def training_jobs(self) -> list[TrialSummary]:
        """Every training job the tuning job ran so far (ListTrainingJobsForHyperParameterTuningJob)."""
        client = self._client()
        try:
            pages = client.get_paginator("list_training_jobs_for_hyper_parameter_tuning_job").paginate(
                HyperParameterTuningJobName=self.name
            )
            summaries = [s for page in pages for s in page.get("TrainingJobSummaries", [])]
        except (ClientError, BotoCoreError) as exc:
            raise aws_error(exc, f"list the training jobs of tuning job {self.name!r}", "") from exc
        return [TrialSummary.from_summary(s) for s in summaries]

    def best_training_job(self, description: Mapping | None = None) -> TrialSummary | None:
        """The best training job so far (DescribeHyperParameterTuningJob's BestTrainingJob), if any."""
        best = (description or self.describe()).get("BestTrainingJob")
        return TrialSummary.from_summary(best) if best else None

    def report_lines(self, description: Mapping | None = None, trials: list[TrialSummary] | None = None):
        """Status, the trial counters, one row per training job and the best."""
        info = description or self.describe()
        objective = (info.get("HyperParameterTuningJobConfig") or {}).get(
            "HyperParameterTuningJobObjective", {}
        )
        counters = info.get("TrainingJobStatusCounters") or {}
        best = self.best_training_job(info)
        lines = [
            f"tuning job {self.name}: {info.get('HyperParameterTuningJobStatus')}; training jobs "
            + ", ".join(f"{k} {v}" for k, v in counters.items() if v)
        ]
        if trials:
            lines += trial_table(
                trials, objective.get("MetricName", "objective"), best.name if best else None
            )
        if best:
            shown = ", ".join(f"{k}={v}" for k, v in best.hyperparameters.items())
            lines.append(
                f"best: {best.name}, {objective.get('MetricName', 'objective')} = {best.objective} ({shown})"
            )
        return lines

    def wait(
        self, poll: float = 60.0, timeout: float | None = None, printer: Callable[[str], None] | None = print
    ) -> str:
        """Poll until the tuning job ends, printing status changes; return the status. Bounded: without
        ``timeout``, by the request's budget (rounds of parallel trials x each one's MaxRuntimeInSeconds,
        plus an hour) or SageMaker's 30 days. Raises TuningJobFailed if it ends Failed or Stopped."""
        say = printer or (lambda _line: None)
        limit = timeout if timeout is not None else self._budget_seconds()
        config = self.request.get("HyperParameterTuningJobConfig") or {}
        total = (config.get("ResourceLimits") or {}).get("MaxNumberOfTrainingJobs")
        with progress_bar(total, desc=self.name, unit="job") as bar:
            return self._watch(poll, limit, say, bar)

    def _watch(self, poll, limit, say, bar) -> str:
        start, last = time.monotonic(), None
        while True:
            info = self.describe()
            status = info["HyperParameterTuningJobStatus"]
            counters = info.get("TrainingJobStatusCounters") or {}
            bar.update(sum(counters.get(k, 0) for k in ("Completed", "Stopped", "NonRetryableError")) - bar.n)
            bar.set_postfix_str(status)
            now = (status, tuple(sorted(counters.items())))
            if now != last:
                say(self.report_lines(info)[0])
                last = now
            if status in TERMINAL_STATUSES:
                if status != "Completed":
                    reason = info.get("FailureReason") or "no reason given"
                    raise TuningJobFailed(f"tuning job {self.name} ended {status}: {reason}")
                return status
            if time.monotonic() - start > limit:
                say(f"{self.name}: still {status} after {limit:.0f} s; call wait() again to watch on")
                return status
            time.sleep(poll)

    def _budget_seconds(self) -> float:
        config = self.request.get("HyperParameterTuningJobConfig") or {}
        limits = config.get("ResourceLimits") or {}
        trial = TrainingRequest.parse(trial_request(self.request, self.name, {}))  # each trial's limits
        jobs, parallel = limits.get("MaxNumberOfTrainingJobs"), limits.get("MaxParallelTrainingJobs") or 1
        run = trial.max_wait or trial.max_runtime
        if not jobs or not run:
            return MAX_TUNING_SECONDS
        return min(MAX_TUNING_SECONDS, math.ceil(jobs / parallel) * run + 3600)

    def stop(self) -> None:
        """StopHyperParameterTuningJob: SageMaker stops every running training job of it."""
        try:
            self._client().stop_hyper_parameter_tuning_job(HyperParameterTuningJobName=self.name)
        except (ClientError, BotoCoreError) as exc:
            raise aws_error(exc, f"stop tuning job {self.name!r}", "") from exc


def check_tuning_job_name_free(name: str, boto_session=None) -> None:
    """Raise TuningError if a tuning job called ``name`` exists (DescribeHyperParameterTuningJob)."""
    client = (boto_session or boto3.Session()).client("sagemaker")
    job = existing(
        lambda: client.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=name),
        f"describe tuning job {name!r}",
        "sagemaker:DescribeHyperParameterTuningJob",
    )
    if job is None:
        return
    raise TuningError(
        f"a tuning job named {name!r} already exists (status {job.get('HyperParameterTuningJobStatus')}); "
        "pass another tuning_job_name= (CLI: --job-name), or leave it out for a time-stamped name"
    )


def create_tuning_job(request: Mapping, boto_session=None) -> str:
    """CreateHyperParameterTuningJob through SDK v3: ``sagemaker.core.resources.HyperParameterTuningJob``;
    returns the ARN."""
    from sagemaker.core.resources import HyperParameterTuningJob

    job = create_with_sdk(
        HyperParameterTuningJob,
        "CreateHyperParameterTuningJobRequest",
        request,
        f"create tuning job {request['HyperParameterTuningJobName']!r}",
        "no tuning job was created; fix what the message names and run again with another job name "
        "(the shards and source of this attempt are already in S3 under its name)",
        boto_session,
    )
    return job.hyper_parameter_tuning_job_arn


def run_sagemaker_tuning(request, spec, boto_session=None, *, wait=True, poll=60.0, timeout=None,
                         printer=print) -> TuningJobHandle:  # fmt: skip
    """CreateHyperParameterTuningJob for a validated request; waits (bounded) with ``wait``."""
    arn = create_tuning_job(request, boto_session)
    name = request["HyperParameterTuningJobName"]
    if printer:
        printer(
            f"created tuning job {name}: {spec.n_trials} training job(s), {spec.max_parallel_jobs} at a time"
        )
    handle = TuningJobHandle(name, boto_session, request, arn)
    if wait:
        handle.wait(poll=poll, timeout=timeout, printer=printer)
    return handle
