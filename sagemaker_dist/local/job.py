"""Run a CreateTrainingJob request on this machine: /opt/ml trees per simulated host, Pipe-mode
FIFOs fed from the S3 endpoint (or File-mode downloads), real Horovod ranks, checkpoints synced both
ways, ``model.tar.gz`` in the output path, and a summary of what each rank read.

``run_local`` is the orchestration only: it reads the request into a ``JobSpec`` (all checks,
no I/O), then acquires each resource under one ``ExitStack`` so that every rank, feed, FIFO,
checkpoint upload and temp dir is released in the right order on any exit.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from sagemaker_dist.aws.s3_objects import s3_client
from sagemaker_dist.contract import toolkit
from sagemaker_dist.contract.distributions import UNNAMED_LAUNCHER
from sagemaker_dist.errors import JobFailedError
from sagemaker_dist.host.job_spec import JobSpec
from sagemaker_dist.host.lifecycle import HostLifecycle
from sagemaker_dist.local.launchers.base import JobSetup, LaunchOptions
from sagemaker_dist.local.launchers.table import launcher_for
from sagemaker_dist.local.result import LocalJobResult, final_metrics, rank_summaries
from sagemaker_dist.local.supervision import interrupt_guard


class LocalJobFailed(JobFailedError):
    """A local job whose rank or feeder failed; the message names the rank (and its last output)."""


def run_local(
    request: dict,
    source_dir: str | os.PathLike | None = None,
    *,
    launcher: str = UNNAMED_LAUNCHER,
    work_dir: str | os.PathLike | None = None,
    keep_work_dir: bool = False,
    echo=print,
    timeout: float | None = None,
    extra_env: dict[str, str] | None = None,
    toolkit_version: str = toolkit.DEFAULT_TOOLKIT_VERSION,
    container_python: str | os.PathLike | None = None,
    image: str | None = None,
    on_started=None,
    on_rank_line=None,
) -> LocalJobResult:
    """Run the CreateTrainingJob ``request`` (as the estimator builds it) here, with real Horovod ranks.

    ``source_dir`` holds the entry script (``sagemaker_program``); without it the
    ``sagemaker_submit_directory`` tarball is downloaded. S3 is whatever boto3 is configured for
    (``AWS_ENDPOINT_URL``; the CLI starts an embedded moto server by default). Raises LocalJobError
    for a request it cannot run and LocalJobFailed naming the failed rank or S3 object; on any exit
    every rank, FIFO and temp dir is removed. The entry script gets its arguments as the image's
    sagemaker-training toolkit (``toolkit_version``, default the TF DLCs' 4.8.3) would pass them.
    With ``launcher="toolkit"`` the toolkit itself (in ``container_python``'s environment) starts the
    ranks, as in the DLC; with ``launcher="container"`` the training ``image`` itself runs the host
    (``podman run <image> train``), as on SageMaker. ``on_started(group)`` is called once the ranks'
    launcher has started (``local/spot.py`` interrupts the job from there). ``on_rank_line(rank, text)``
    gets each line a rank printed, before it is shown (``trial_metrics`` records rank 0's metrics).
    """
    started = time.monotonic()
    job = JobSpec.from_request(request, timeout, toolkit_version)
    # the launcher the job's registry entry names for the one asked for, checked before anything starts
    runner = launcher_for(job.distribution, launcher)(job, LaunchOptions(container_python, image, work_dir))
    runner.check()
    client = s3_client()
    with interrupt_guard() as guard, ExitStack() as stack:
        work = _work_dir(stack, work_dir, job.name, keep_work_dir)
        # the code fetched, the trees laid out, checkpoints restored, File channels downloaded; on the
        # way out (after the ranks are killed, LIFO) the feeders stopped and closed, the checkpoints synced
        host = stack.enter_context(
            HostLifecycle(job, work, client, echo, interface=runner.interface, source_dir=source_dir)
        )
        trees, code_dir = host.trees, host.code_dir
        given = code_dir if source_dir else None  # the image's hosts get the source dir; else S3's
        group = runner.group(JobSetup(job, trees, code_dir, given, work, extra_env, echo, stack))
        if on_rank_line is not None:
            group.on_line = _also_to(on_rank_line, group.on_line)
        stack.callback(group.kill)
        stack.callback(guard.hold)  # runs first on the way out: a second Ctrl-C cannot cut it short
        echo(
            f"local job {job.name}: {job.world} rank(s) = {job.hosts} host(s) x {job.processes_per_host}, "
            f"work dir {work}"
        )
        echo("$ " + " ".join(group.command))
        host.start()
        launch_time = time.monotonic()
        group.start()
        if on_started is not None:
            on_started(group)
        failure = runner.supervise(group, host.errors, trees, started)
        if failure:
            raise LocalJobFailed(failure)
        host.finish()
        result = _result(job, host, group, started, launch_time, str(work) if keep_work_dir else None)
        for line in result.summary_lines():
            echo(line)
        return result


def _also_to(on_rank_line, show):
    """A group's line handler that hands each rank's line to ``on_rank_line`` first, then shows it."""

    def on_line(rank, text):
        if rank is not None:
            on_rank_line(rank, text)
        show(rank, text)

    return on_line


def _work_dir(stack: ExitStack, work_dir, job_name: str, keep: bool) -> Path:
    base = Path(work_dir) if work_dir else None
    if base:
        base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"sagemaker-dist-{job_name[:40]}-", dir=base))
    if not keep:
        stack.callback(shutil.rmtree, work, ignore_errors=True)
    return work


def _result(job: JobSpec, host: HostLifecycle, group, started, launch_time, work_dir):
    """Pack the outputs into the output path and sum up what each rank read."""
    model_uri = host.upload_outputs()
    return LocalJobResult(
        job_name=job.name,
        hosts=job.hosts,
        processes_per_host=job.processes_per_host,
        input_mode="Pipe" if any(s.input_mode == "Pipe" for s in job.channels) else job.input_mode,
        seconds=time.monotonic() - started,
        ranks=rank_summaries(host.trees, job.layout, host.feeds, launch_time),
        metrics=final_metrics(group.rank_lines.get(0, []), job.metric_definitions),
        model_uri=model_uri,
        checkpoint_uri=host.checkpoints.s3_uri,
        tensorboard_uri=job.tensorboard_location,
        work_dir=work_dir,
        feed_stats=[f.stats for f in host.feeds],
        output=list(group.output),
    )
