"""A launched SageMaker training job: status, CloudWatch log streams, ``wait()`` and ``stop()``."""

from __future__ import annotations

import time
from collections.abc import Callable

import boto3
from botocore.exceptions import ClientError

from sagemaker_dist.aws.progress import progress_bar
from sagemaker_dist.errors import JobFailedError

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
TERMINAL_STATUSES = ("Completed", "Failed", "Stopped")


class TrainingJobFailed(JobFailedError):
    """The training job ended Failed or Stopped."""


class TrainingJobHandle:
    """A launched job: status, CloudWatch log streams, ``wait()`` and ``stop()``."""

    def __init__(self, training_job, boto_session=None):
        self.training_job = training_job  # sagemaker.core.resources.TrainingJob
        self._boto_session = boto_session

    @property
    def name(self) -> str:
        return self.training_job.training_job_name

    @property
    def arn(self) -> str:
        return self.training_job.training_job_arn

    @property
    def model_uri(self) -> str | None:
        """The model artefact's S3 URI once the job completed (as ``LocalJobResult.model_uri``)."""
        return (self.describe().get("ModelArtifacts") or {}).get("S3ModelArtifacts")

    def _client(self, service: str):
        return (self._boto_session or boto3.Session()).client(service)

    def describe(self) -> dict:
        """DescribeTrainingJob, as boto3 returns it."""
        response = self._client("sagemaker").describe_training_job(TrainingJobName=self.name)
        response.pop("ResponseMetadata", None)
        return response

    def log_stream_names(self) -> list[str]:
        """The job's CloudWatch log streams (``<job>/algo-N-<epoch>``); empty until instances start."""
        logs = self._client("logs")
        try:
            pages = logs.get_paginator("describe_log_streams").paginate(
                logGroupName=LOG_GROUP, logStreamNamePrefix=f"{self.name}/"
            )
            return [s["logStreamName"] for page in pages for s in page.get("logStreams", [])]
        except ClientError:  # no log group yet, or no logs:DescribeLogStreams permission
            return []

    def wait(
        self, poll: float = 30.0, timeout: float | None = None, printer: Callable[[str], None] | None = print
    ) -> str:
        """Poll until the job ends, printing each status transition and new log stream; return the status.

        Raises TrainingJobFailed with the failure reason if the job fails or is stopped.
        """
        say = printer or (lambda _line: None)
        say(f"CloudWatch logs: group {LOG_GROUP}, streams {self.name}/algo-<n>-<time>")
        with progress_bar(desc=self.name, bar_format="{desc} [{elapsed}]") as bar:
            return self._watch(poll, timeout, say, bar)

    def _watch(self, poll, timeout, say, bar) -> str:
        start = time.monotonic()
        seen_transitions, seen_streams, last = 0, set(), None
        while True:
            info = self.describe()
            transitions = info.get("SecondaryStatusTransitions", [])
            for t in transitions[seen_transitions:]:
                say(f"{self.name}: {t['Status']} - {t.get('StatusMessage', '')}".rstrip(" -"))
            seen_transitions = len(transitions)
            status = (info["TrainingJobStatus"], info.get("SecondaryStatus"))
            bar.set_description_str(f"{self.name}: {status[0]} ({status[1]})")
            if status != last:
                say(f"{self.name}: status {status[0]} ({status[1]})")
                last = status
            for stream in self.log_stream_names():
                if stream not in seen_streams:
                    seen_streams.add(stream)
                    say(f"{self.name}: log stream {LOG_GROUP}/{stream}")
            if status[0] in TERMINAL_STATUSES:
                if status[0] != "Completed":
                    raise TrainingJobFailed(
                        f"training job {self.name} ended {status[0]}: "
                        f"{info.get('FailureReason', 'no reason given')}"
                    )
                return status[0]
            if timeout is not None and time.monotonic() - start > timeout:
                say(f"{self.name}: still {status[0]} after {timeout:.0f} s; call wait() again to watch on")
                return status[0]
            time.sleep(poll)

    def stop(self) -> None:
        self.training_job.stop()
