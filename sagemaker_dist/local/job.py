"""Run a CreateTrainingJob request on this machine: /opt/ml trees per simulated host, Pipe-mode
FIFOs fed from the S3 endpoint (or File-mode downloads), real Horovod ranks, checkpoints synced both
ways, ``model.tar.gz`` in the output path, and a summary of what each rank read.

``run_local`` is the orchestration only: it reads the request into a ``JobSpec`` (all checks,
no I/O), then acquires each resource under one ``ExitStack`` so that every rank, feed, FIFO,
checkpoint upload and temp dir is released in the right order on any exit.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import sagemaker_dist
from sagemaker_dist.aws.s3_objects import s3_client
from sagemaker_dist.contract import hyperparameters as hp
from sagemaker_dist.contract import toolkit
from sagemaker_dist.contract.distributions import DistributionError
from sagemaker_dist.contract.distributions import distribution as registered
from sagemaker_dist.contract.shell_words import ShellSyntaxError
from sagemaker_dist.errors import ConfigurationError, JobFailedError
from sagemaker_dist.host.feeds import close_feeds, open_feeds
from sagemaker_dist.host.job_spec import JobSpec
from sagemaker_dist.host.opt_ml import host_trees_for
from sagemaker_dist.host.outputs import CheckpointSync, pack_and_upload
from sagemaker_dist.host.source_dir import fetch_source_dir
from sagemaker_dist.local.launchers import (
    CONTAINER,
    HOROVODRUN,
    TOOLKIT,
    TOOLKIT_HOST_LAUNCHERS,
)
from sagemaker_dist.local.launchers.cluster import check_cluster_endpoint, cluster_group, supervise_cluster
from sagemaker_dist.local.launchers.cluster_plan import INTERFACE
from sagemaker_dist.local.launchers.container import (
    ContainerGroup,
    check_container_image,
    container_environment,
    sshd_stub,
    toolkit_host_env,
)
from sagemaker_dist.local.launchers.mpi import (
    RankGroup,
    check_hostname_resolves,
    rank_command,
)
from sagemaker_dist.local.launchers.private_net import PrivateNet, loopback_endpoint
from sagemaker_dist.local.launchers.toolkit import (
    blame_the_rank_that_raised,
    check_toolkit_host,
    toolkit_environment,
    toolkit_outcome,
)
from sagemaker_dist.local.launchers.toolkit_host import toolkit_host_command
from sagemaker_dist.local.launchers.torchrun import host_group_command
from sagemaker_dist.local.rank_entry import JOB_ENV
from sagemaker_dist.local.result import LocalJobResult, final_metrics, rank_summaries
from sagemaker_dist.local.supervision import interrupt_guard, supervise


class LocalJobError(ConfigurationError):
    """A request local mode cannot run as given; the message names what to fix."""


class LocalJobFailed(JobFailedError):
    """A local job whose rank or feeder failed; the message names the rank (and its last output)."""


def run_local(
    request: dict,
    source_dir: str | os.PathLike | None = None,
    *,
    launcher: str = HOROVODRUN,
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
    launcher = _launcher_for(job, launcher)
    cluster = launcher == CONTAINER and job.hosts > 1  # one container per host on a network of its own
    if launcher in TOOLKIT_HOST_LAUNCHERS:
        container, image = _check_host_launcher(job, launcher, container_python, image, work_dir, cluster)
    else:
        command = rank_command(launcher, job.world, python=str(container_python or sys.executable))
    if launcher == HOROVODRUN:
        check_hostname_resolves()
    client = s3_client()
    with interrupt_guard() as guard, ExitStack() as stack:
        work = _work_dir(stack, work_dir, job.name, keep_work_dir)
        code_dir = fetch_source_dir(source_dir, job.hyperparameters, work, client)
        if not (code_dir / job.entry_point).is_file():
            raise LocalJobError(f"entry script {job.entry_point!r} is not in the source dir {code_dir}")
        trees, ckpt = _host_trees(stack, job, work, client, echo, INTERFACE if cluster else "lo")
        stop, feed_errors, feeds = threading.Event(), [], []
        stack.callback(close_feeds, feeds)  # after stop is set (LIFO): the feeders see it and end
        stack.callback(stop.set)
        feeds += open_feeds(job.specs, trees, client, stop, feed_errors.append, echo)
        source = code_dir if source_dir else None  # the image's hosts get the source dir; else S3's
        if cluster:
            group = cluster_group(stack, job, trees, source, work, extra_env, echo, image)
        elif launcher in TOOLKIT_HOST_LAUNCHERS:
            group = _toolkit_group(job, trees, source, work, container, extra_env, echo, image)
            if job.world == 1 and not _toolkit_each_host(job, launcher):  # no mpirun: one worker, untagged
                group.untagged_rank = 0
        else:
            group = _rank_group(job, trees, code_dir, work, command, extra_env, echo)
        if not cluster:  # the launcher in a network namespace of the job's own (a cluster has its network)
            group.network = PrivateNet(group.env, echo)
        if on_rank_line is not None:
            group.on_line = _also_to(on_rank_line, group.on_line)
        stack.callback(group.kill)
        stack.callback(guard.hold)  # runs first on the way out: a second Ctrl-C cannot cut it short
        echo(
            f"local job {job.name}: {job.world} rank(s) = {job.hosts} host(s) x {job.processes_per_host}, "
            f"work dir {work}"
        )
        echo("$ " + " ".join(group.command))
        for feed in feeds:
            feed.start()
        launch_time = time.monotonic()
        ckpt.start()
        group.start()
        if on_started is not None:
            on_started(group)
        failure = _supervised(job, launcher, group, feed_errors, trees, started, cluster)
        if failure:
            raise LocalJobFailed(failure)
        stop.set()
        ckpt.stop()
        result = _result(
            job, trees, feeds, group, ckpt, client, started, launch_time, str(work) if keep_work_dir else None
        )
        for line in result.summary_lines():
            echo(line)
        return result


def _check_host_launcher(job: JobSpec, launcher: str, container_python, image, work_dir, cluster: bool):
    """The toolkit's or the container launcher's pre-flight, before anything starts: the container
    environment (toolkit) or the image (container), and the hosts it can run. Returns the container
    Python (toolkit) and the image (container), each None for the other launcher."""
    entry = registered(job.distribution)
    container = None
    if launcher == TOOLKIT:  # Horovod under the toolkit's mpirun needs Horovod with MPI (entry.mpi)
        module = entry.toolkit_training_module
        container = check_toolkit_host(
            container_python, horovod=entry.mpi, work_dir=work_dir, training_module=module
        )
    image = check_container_image(image) if launcher == CONTAINER else None
    if cluster:
        check_cluster_endpoint(os.environ)
    elif job.hosts != 1 and not _toolkit_each_host(job, launcher):
        raise LocalJobError(
            f"launcher {launcher!r} simulates one host (its ranks started by the toolkit's mpirun); this "
            f"job has {job.hosts}. Use --instance-count 1 with --processes-per-host for the ranks, "
            "launcher 'container' (the image, one container per host), or 'horovodrun' or 'mpirun'"
        )
    return container, image


def _supervised(job: JobSpec, launcher: str, group, feed_errors, trees, started: float, cluster: bool):
    """Wait for the started ranks (bounded by the job's timeout); the failure that names the rank, or
    None. Under the toolkit, its own verdict (the failure file it wrote) is added."""
    if cluster:
        failure = supervise_cluster(group, feed_errors, started, job.timeout)
    else:
        failure = supervise(group, feed_errors, trees, job.processes_per_host, started, job.timeout)
    group.finish_output()
    if launcher in TOOLKIT_HOST_LAUNCHERS:
        failure = blame_the_rank_that_raised(failure, group, trees, job.processes_per_host)
        failure = toolkit_outcome(failure, trees if _toolkit_each_host(job, launcher) else trees[:1])
    return failure


def _toolkit_each_host(job: JobSpec, launcher: str) -> bool:
    """The toolkit runs on every simulated host, side by side (torchrun's: no SSH from a master)."""
    return launcher == TOOLKIT and registered(job.distribution).toolkit_starts_each_host


def _launcher_for(job: JobSpec, launcher: str) -> str:
    """The launcher the job's distribution runs under for ``launcher`` (the registry's: e.g. a tf-mwms
    job runs one worker per host with TF_CONFIG where no launcher is named, or under the toolkit)."""
    try:
        return registered(job.distribution).local_launcher(launcher)
    except DistributionError as exc:
        raise LocalJobError(str(exc)) from None


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


def _host_trees(stack: ExitStack, job: JobSpec, work: Path, client, echo, interface: str):
    """The /opt/ml tree of each simulated host, with its checkpoints restored from S3 (and synced back)."""
    ckpt_cfg = job.request.get("CheckpointConfig") or {}
    trees = host_trees_for(job, work / "hosts", interface)
    local_dirs = [t.checkpoint_path(ckpt_cfg.get("LocalPath")) for t in trees]
    ckpt = stack.enter_context(CheckpointSync(ckpt_cfg.get("S3Uri"), local_dirs, client))
    restored = ckpt.restore()
    if restored:
        echo(f"restored {restored} checkpoint file(s) from {ckpt.s3_uri}")
    return trees, ckpt


def _rank_group(job: JobSpec, trees, code_dir: Path, work: Path, command, extra_env, echo) -> RankGroup:
    """The ranks, not yet started: their job description file and environment."""
    pid_dir = work / "ranks"
    pid_dir.mkdir()
    job_file = work / "job.json"
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra_env or {})
    env.update({JOB_ENV: str(job_file), "PYTHONUNBUFFERED": "1"})
    package_parent = str(Path(sagemaker_dist.__file__).resolve().parents[1])  # where this package is
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
    description = {
        "processes_per_host": job.processes_per_host,
        "hosts": [{"name": t.name, "env": t.env} for t in trees],
        "source_dir": str(code_dir),
        "entry_point": job.entry_point,
        "args": _script_argv(job, env, code_dir),
        "pid_dir": str(pid_dir),
    }
    job_file.write_text(json.dumps(description))
    return RankGroup(command, env, pid_dir, job.world, _rank_echo(trees, job.processes_per_host, echo))


def _rank_echo(trees, per_host: int, echo):
    """Print a launcher line as is and a rank's line with its rank and host in front."""

    def show(rank, text):
        if rank is None:
            if text.strip():
                echo(f"[launcher] {text}")
        else:
            echo(f"[rank {rank} {trees[rank // per_host].name}] {text}")

    return show


def _toolkit_group(
    job: JobSpec,
    trees,
    code_dir: Path | None,
    work: Path,
    python: Path | None,
    extra_env,
    echo,
    image: str | None = None,
) -> RankGroup:
    """The one simulated host, its toolkit entry point in a namespace of its own (or, given an
    ``image``, in that image's container), not yet started.

    A source dir given here is put at /opt/ml/code, where the toolkit looks first; otherwise the
    toolkit downloads ``sagemaker_submit_directory`` from S3 itself.
    """
    if code_dir is not None:
        for tree in trees:
            shutil.copytree(code_dir, tree.root / "code")
    tree = trees[0]
    if image is not None:
        pid_dir = work / "ranks"  # stays empty, as below
        pid_dir.mkdir()
        env = container_environment(
            os.environ,
            job.name,
            job.request.get("Environment"),
            toolkit_host_env(job.distribution, extra_env),
        )
        show = _rank_echo(trees, job.processes_per_host, echo)
        # S3 off this machine's loopback: the container shares this machine's network (private_net),
        # so its sshd, which would listen there as root, is a stub
        _, off_loopback = loopback_endpoint({**os.environ, **env})
        stub = sshd_stub(work) if off_loopback else None
        group = ContainerGroup(
            image, tree.root, [t.name for t in trees], job.name, env, pid_dir, job.world, show, stub
        )
        if registered(job.distribution).toolkit_starts_each_host:  # the toolkit's torchrun, --tee 3
            group.tee_first_rank = 0
        return group
    entry = registered(job.distribution)
    state = work / "namespace"
    env = toolkit_environment(
        dict(os.environ), python, job.name, job.request.get("Environment"), entry.toolkit_training_module
    )
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(toolkit_host_env(job.distribution, extra_env))
    if entry.toolkit_starts_each_host:  # a toolkit host per simulated host, under our host supervisor
        env[JOB_ENV] = str(work / "job.json")
        hosts = [{"name": t.name, "tree": str(t.root)} for t in trees]
        description = {"processes_per_host": job.processes_per_host, "hosts": hosts}
        Path(env[JOB_ENV]).write_text(json.dumps(description))
        command = host_group_command(sys.executable, python, state)
    else:
        command = toolkit_host_command(python, tree.root, state, [t.name for t in trees])
    pid_dir = work / "ranks"  # stays empty: the toolkit starts the ranks, not our entry
    pid_dir.mkdir()
    return RankGroup(command, env, pid_dir, job.world, _rank_echo(trees, job.processes_per_host, echo))


def _script_argv(job: JobSpec, env: dict, code_dir: Path) -> list[str]:
    """The entry script's arguments exactly as the image's sagemaker-training toolkit passes them."""
    try:
        return toolkit.script_argv(job.hyperparameters, job.toolkit_version, env, str(code_dir))
    except ShellSyntaxError:
        problems = toolkit.changed_hyperparameters(job.hyperparameters, job.toolkit_version, env)
        raise LocalJobError("; ".join(p for p in problems if "broken command line" in p)) from None


def _result(job: JobSpec, trees, feeds, group, ckpt, client, started, launch_time, work_dir):
    """Pack the outputs into the output path and sum up what each rank read."""
    request, hps = job.request, job.hyperparameters
    output_path = (request.get("OutputDataConfig") or {}).get("S3OutputPath", "").rstrip("/")
    model_uri = None
    if output_path:
        model_uri = pack_and_upload(
            trees[0].model_dir, f"{output_path}/{job.name}/output/model.tar.gz", client
        )
        pack_and_upload(trees[0].output_data_dir, f"{output_path}/{job.name}/output/output.tar.gz", client)
    tensorboard = (request.get("TensorBoardOutputConfig") or {}).get("S3OutputPath") or hp.decode_one(
        hps, "tensorboard_s3_uri"
    )
    definitions = (request.get("AlgorithmSpecification") or {}).get("MetricDefinitions") or []
    return LocalJobResult(
        job_name=job.name,
        hosts=job.hosts,
        processes_per_host=job.processes_per_host,
        input_mode="Pipe" if any(s.input_mode == "Pipe" for s in job.specs) else job.default_mode,
        seconds=time.monotonic() - started,
        ranks=rank_summaries(job.world, job.processes_per_host, trees, job.layout, feeds, launch_time),
        metrics=final_metrics(group.rank_lines.get(0, []), definitions),
        model_uri=model_uri,
        checkpoint_uri=ckpt.s3_uri,
        tensorboard_uri=tensorboard,
        work_dir=work_dir,
        feed_stats=[f.stats for f in feeds],
        output=list(group.output),
    )
