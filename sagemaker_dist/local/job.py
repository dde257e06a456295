"""Run a CreateTrainingJob request on this machine: /opt/ml trees per simulated host, Pipe-mode
FIFOs fed from the S3 endpoint (or File-mode downloads), real Horovod ranks, checkpoints synced both
ways, ``model.tar.gz`` in the output path, and a summary of what each rank read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sagemaker_dist.contract import hyperparameters as hp
from sagemaker_dist.contract.layout import LAYOUT_HYPERPARAMETER, ChannelLayout
from sagemaker_dist.contract.s3_uri import parse_s3_uri
from sagemaker_dist.errors import ConfigurationError, JobFailedError
from sagemaker_dist.launch.request_validation import validate_request
from sagemaker_dist.local.endpoint import s3_client
from sagemaker_dist.local.feeder import (
    ChannelFeeder,
    ChannelSpec,
    FeedStats,
    download_channel,
    resolve_objects,
)
from sagemaker_dist.local.launcher import RankGroup, check_hostname_resolves, describe_exit, rank_command
from sagemaker_dist.local.opt_ml import JOB_ENV, build_host_trees

CHECKPOINT_SYNC_S = 2.0
LAUNCHER_GRACE_S = 3.0  # after a rank fails: time the launcher gets to stop the others and relay output
# Keras progress lines: "loss: 2.1 - accuracy: 0.3"; SageMaker applies MetricDefinitions the same way.
DEFAULT_METRIC = re.compile(r"\b([A-Za-z_][\w]*): (-?[0-9.]+(?:e[-+]?\d+)?|nan|inf)\b")


class LocalJobError(ConfigurationError):
    """The local job failed; the message names the rank or the S3 object and what to do."""


class LocalJobFailed(JobFailedError):
    """A local job whose rank or feeder failed; the message names the rank (and its last output)."""


@dataclass
class RankSummary:
    rank: int
    host: str
    channel: str | None
    records: int | None
    bytes: int
    first_record_s: float | None
    records_per_s: float | None


@dataclass
class LocalJobResult:
    """What a local job did, for the summary and for tests."""

    job_name: str
    hosts: int
    processes_per_host: int
    input_mode: str
    seconds: float
    ranks: list[RankSummary]
    metrics: dict[str, float]
    model_uri: str | None
    checkpoint_uri: str | None
    tensorboard_uri: str | None
    work_dir: str | None
    feed_stats: list[FeedStats] = field(default_factory=list)
    output: list[str] = field(default_factory=list)

    def summary_lines(self) -> list[str]:
        lines = [
            f"local job {self.job_name} finished in {self.seconds:.1f} s: {len(self.ranks)} rank(s) = "
            f"{self.hosts} simulated host(s) x {self.processes_per_host} process(es), {self.input_mode} mode",
            f"  {'rank':>4}  {'host':<7} {'channel':<12} {'records':>9} {'MB':>8} {'1st record':>10} "
            f"{'records/s':>10}",
        ]
        for r in self.ranks:
            rec = "?" if r.records is None else str(r.records)
            first = "-" if r.first_record_s is None else f"{r.first_record_s:.2f} s"
            rate = "-" if r.records_per_s is None else f"{r.records_per_s:,.0f}"
            lines.append(
                f"  {r.rank:>4}  {r.host:<7} {r.channel or '-':<12} {rec:>9} {r.bytes / 1e6:>8.2f} "
                f"{first:>10} {rate:>10}"
            )
        lines.append(
            "  (records: streamed into the rank's train FIFOs, tf.data read-ahead included; 1st record: "
            "seconds from starting the ranks to the first bytes the rank read; records/s: over its stream)"
        )
        if self.metrics:
            shown = ", ".join(f"{k}={v:.4g}" for k, v in self.metrics.items())
            lines.append(f"final metrics (rank 0): {shown}")
        for label, uri in (
            ("model", self.model_uri),
            ("checkpoints", self.checkpoint_uri),
            ("tensorboard", self.tensorboard_uri),
            ("work dir", self.work_dir),
        ):
            if uri:
                lines.append(f"{label}: {uri}")
        return lines


def _processes_per_host(hps: dict, layout: ChannelLayout | None) -> int:
    value = hp.decode_one(hps, hp.MPI_PROCESSES_PER_HOST)
    if value is None and layout is not None:
        value = layout.processes_per_host
    try:
        value = int(value if value is not None else 1)
    except (TypeError, ValueError) as exc:
        raise LocalJobError(
            f"sagemaker_mpi_num_of_processes_per_host is {value!r}; give a whole number"
        ) from exc
    if value < 1:
        raise LocalJobError(f"sagemaker_mpi_num_of_processes_per_host is {value}; it must be >= 1")
    return value


def _source_dir(source_dir, hps: dict, work: Path, client) -> Path:
    if source_dir is not None:
        path = Path(source_dir).resolve()
        if not path.is_dir():
            raise LocalJobError(f"source dir {source_dir} does not exist or is not a directory")
        return path
    uri = hp.decode_one(hps, hp.SUBMIT_DIRECTORY)
    if not uri:
        raise LocalJobError(
            "no source dir: pass source_dir= or set hyperparameter sagemaker_submit_directory"
        )
    if not str(uri).startswith("s3://"):
        return _source_dir(uri, hps, work, client)
    bucket, key = parse_s3_uri(uri)
    target = work / "code"
    target.mkdir()
    tarball = work / "sourcedir.tar.gz"
    try:
        client.download_file(bucket, key, str(tarball))
    except Exception as exc:  # noqa: BLE001 - botocore retried already; name the object
        raise LocalJobError(f"cannot download the source package {uri}: {exc}") from exc
    with tarfile.open(tarball) as tar:
        tar.extractall(target, filter="data")
    return target


def _layout(hps: dict) -> ChannelLayout | None:
    if LAYOUT_HYPERPARAMETER not in hps:
        return None
    return ChannelLayout.from_json(hp.decode_one(hps, LAYOUT_HYPERPARAMETER))


class CheckpointSync:
    """CheckpointConfig emulation: download at start, upload new/changed files every 2 s and at the end."""

    def __init__(self, s3_uri: str | None, local_dirs: list[Path], client):
        self.s3_uri, self.dirs, self.client = s3_uri, local_dirs, client
        self.bucket, self.prefix = parse_s3_uri(s3_uri) if s3_uri else (None, "")
        self.prefix = self.prefix.rstrip("/")
        self._seen: dict[Path, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.uploaded = 0
        self.errors: list[str] = []

    def restore(self) -> int:
        if not self.s3_uri:
            return 0
        count = 0
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + "/" if self.prefix else ""):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(self.prefix) :].lstrip("/")
                if not rel or rel.endswith("/"):
                    continue
                for d in self.dirs:
                    target = d / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    self.client.download_file(self.bucket, obj["Key"], str(target))
                    stat = target.stat()
                    self._seen[target] = (stat.st_size, stat.st_mtime_ns)
                count += 1
        return count

    def start(self) -> None:
        if self.s3_uri:
            self._thread = threading.Thread(target=self._run, name="checkpoint-sync", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(CHECKPOINT_SYNC_S):
            self.sync_once()

    def sync_once(self) -> None:
        for d in self.dirs:
            for path in sorted(p for p in d.rglob("*") if p.is_file()):
                rel = path.relative_to(d).as_posix()
                if any(part.startswith(".") for part in rel.split("/")) or rel.endswith((".tmp", ".partial")):
                    continue  # files being written; the runtime renames them into place when complete
                try:
                    stat = path.stat()
                    state = (stat.st_size, stat.st_mtime_ns)
                    if self._seen.get(path) == state:
                        continue
                    key = f"{self.prefix}/{rel}" if self.prefix else rel
                    self.client.upload_file(str(path), self.bucket, key)
                    self._seen[path] = state
                    self.uploaded += 1
                except FileNotFoundError:
                    continue  # replaced while we looked; the next round uploads the new one
                except Exception as exc:  # noqa: BLE001 - retried next round, reported in the summary
                    self.errors.append(f"{rel}: {exc}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(10)
        if self.s3_uri:
            self.sync_once()


def _pack_and_upload(directory: Path, s3_uri: str, client) -> str | None:
    """Tar ``directory`` (contents at the top, like SageMaker) to ``s3_uri``; None when it is empty."""
    if not directory.is_dir() or not any(directory.iterdir()):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        tarball = Path(tmp) / "archive.tar.gz"
        with tarfile.open(tarball, "w:gz") as tar:
            for path in sorted(directory.iterdir()):
                tar.add(path, arcname=path.name)
        bucket, key = parse_s3_uri(s3_uri)
        client.upload_file(str(tarball), bucket, key)
    return s3_uri


def _final_metrics(lines: list[str], definitions: list[dict]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    if definitions:
        for d in definitions:
            for line in lines:
                m = re.search(d["Regex"], line)
                if m:
                    try:
                        metrics[d["Name"]] = float(m.group(1))
                    except (ValueError, IndexError):
                        pass
        return metrics
    for line in lines:  # the last Keras progress line wins, key by key
        if " - " in line and "loss" in line:
            for name, value in DEFAULT_METRIC.findall(line):
                metrics[name] = float(value)
    return metrics


def _sigterm_as_interrupt():
    """Inside the main thread, SIGTERM cleans up like Ctrl-C does; returns the handler to restore."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    return signal.signal(signal.SIGTERM, handler)


def run_local(
    request: dict,
    source_dir: str | os.PathLike | None = None,
    *,
    launcher: str = "horovodrun",
    work_dir: str | os.PathLike | None = None,
    keep_work_dir: bool = False,
    echo=print,
    timeout: float | None = None,
    extra_env: dict[str, str] | None = None,
) -> LocalJobResult:
    """Run the CreateTrainingJob ``request`` (as the estimator builds it) here, with real Horovod ranks.

    ``source_dir`` holds the entry script (``sagemaker_program``); without it the
    ``sagemaker_submit_directory`` tarball is downloaded. S3 is whatever boto3 is configured for
    (``AWS_ENDPOINT_URL``; the CLI starts an embedded moto server by default). Raises LocalJobError
    naming the failed rank or S3 object; on any exit every rank, FIFO and temp dir is removed.
    """
    started = time.monotonic()
    if not isinstance(request, dict):
        raise LocalJobError(f"the request is a {type(request).__name__}, not a CreateTrainingJob dict")
    validate_request(request)  # what CreateTrainingJob would refuse, local mode refuses too
    hps = {k: str(v) for k, v in (request.get("HyperParameters") or {}).items()}
    algo = request.get("AlgorithmSpecification") or {}
    default_mode = algo.get("TrainingInputMode", "File")
    resources = request.get("ResourceConfig") or {}
    hosts = int(resources.get("InstanceCount", 1))
    layout = _layout(hps)
    per_host = _processes_per_host(hps, layout)
    world = hosts * per_host
    if layout is not None and (layout.hosts, layout.processes_per_host) != (hosts, per_host):
        raise LocalJobError(
            f"the layout hyperparameter is for {layout.hosts} host(s) x {layout.processes_per_host} "
            f"process(es) but the request asks for {hosts} x {per_host}; plan the layout for the job you run"
        )
    entry_point = hp.decode_one(hps, hp.PROGRAM)
    if not entry_point:
        raise LocalJobError("hyperparameter sagemaker_program (the entry script) is missing")
    job_name = request.get("TrainingJobName", "local-job")
    if timeout is None:  # SageMaker stops a job at MaxRuntimeInSeconds; so does local mode
        timeout = (request.get("StoppingCondition") or {}).get("MaxRuntimeInSeconds")
    command = rank_command(launcher, world)
    if launcher == "horovodrun":
        check_hostname_resolves()
    channels = list(request.get("InputDataConfig") or [])
    specs = [ChannelSpec.from_request(ch, default_mode) for ch in channels]
    client = s3_client()

    base = Path(work_dir) if work_dir else None
    if base:
        base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"sagemaker-dist-{job_name[:40]}-", dir=base))
    stop = threading.Event()
    feeders: list[ChannelFeeder] = []
    feed_errors: list[str] = []
    group: RankGroup | None = None
    ckpt: CheckpointSync | None = None
    previous_handler = _sigterm_as_interrupt()
    try:
        code_dir = _source_dir(source_dir, hps, work, client)
        if not (code_dir / entry_point).is_file():
            raise LocalJobError(f"entry script {entry_point!r} is not in the source dir {code_dir}")
        ckpt_cfg = request.get("CheckpointConfig") or {}
        trees = build_host_trees(
            work / "hosts",
            hosts,
            channels,
            hps,
            default_mode=default_mode,
            instance_type=resources.get("InstanceType", "local"),
            job_name=job_name,
            environment=request.get("Environment"),
            checkpoint_local_path=ckpt_cfg.get("LocalPath"),
        )
        ckpt = CheckpointSync(
            ckpt_cfg.get("S3Uri"), [t.checkpoint_dir(ckpt_cfg.get("LocalPath")) for t in trees], client
        )
        restored = ckpt.restore()
        if restored:
            echo(f"restored {restored} checkpoint file(s) from {ckpt.s3_uri}")
        for spec in specs:
            items = resolve_objects(spec, client)
            for index, tree in enumerate(trees):
                if spec.input_mode == "File":
                    t0 = time.monotonic()
                    size = download_channel(spec, items, tree.data_dir / spec.name, client, index, hosts)
                    stats = FeedStats(
                        tree.name,
                        spec.name,
                        epochs=1,
                        bytes=size,
                        records=None,
                        first_byte=None,  # downloaded before the ranks start: no streaming figures
                        last_byte=None,
                    )
                    echo(
                        f"{tree.name}: downloaded channel {spec.name} ({size / 1e6:.1f} MB) in "
                        f"{time.monotonic() - t0:.1f} s (File mode)"
                    )
                    feeders.append(_DoneFeed(stats))
                    continue
                feeder = ChannelFeeder(
                    spec,
                    items,
                    tree.data_dir,
                    index,
                    hosts,
                    client,
                    stop,
                    feed_errors.append,
                    host_name=tree.name,
                )
                feeders.append(feeder)
        pid_dir = work / "ranks"
        pid_dir.mkdir()
        job_file = work / "job.json"
        job_file.write_text(
            json.dumps(
                {
                    "processes_per_host": per_host,
                    "hosts": [{"name": t.name, "env": t.env} for t in trees],
                    "source_dir": str(code_dir),
                    "entry_point": entry_point,
                    "args": hp.script_args(hps),
                    "pid_dir": str(pid_dir),
                }
            )
        )
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env.update(extra_env or {})
        env.update({JOB_ENV: str(job_file), "PYTHONUNBUFFERED": "1"})
        repo_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH")) if p)

        def show(rank, text):
            if rank is None:
                if text.strip():
                    echo(f"[launcher] {text}")
            else:
                echo(f"[rank {rank} {trees[rank // per_host].name}] {text}")

        echo(f"local job {job_name}: {world} rank(s) = {hosts} host(s) x {per_host}, work dir {work}")
        echo("$ " + " ".join(command))
        for f in feeders:
            if isinstance(f, ChannelFeeder):
                f.start()
        launch_time = time.monotonic()
        ckpt.start()
        group = RankGroup(command, env, pid_dir, world, show)
        group.start()
        failure = _supervise(group, feed_errors, trees, per_host, started, timeout)
        group.finish_output()
        if failure:
            raise LocalJobFailed(failure)
        stop.set()
        ckpt.stop()
        output_path = (request.get("OutputDataConfig") or {}).get("S3OutputPath", "").rstrip("/")
        model_uri = None
        if output_path:
            model_uri = _pack_and_upload(
                trees[0].model_dir, f"{output_path}/{job_name}/output/model.tar.gz", client
            )
            _pack_and_upload(
                trees[0].output_data_dir, f"{output_path}/{job_name}/output/output.tar.gz", client
            )
        tb = (request.get("TensorBoardOutputConfig") or {}).get("S3OutputPath") or hp.decode_one(
            hps, "tensorboard_s3_uri"
        )
        result = LocalJobResult(
            job_name=job_name,
            hosts=hosts,
            processes_per_host=per_host,
            input_mode="Pipe" if any(s.input_mode == "Pipe" for s in specs) else default_mode,
            seconds=time.monotonic() - started,
            ranks=_rank_summaries(world, per_host, trees, layout, feeders, launch_time),
            metrics=_final_metrics(group.rank_lines.get(0, []), algo.get("MetricDefinitions") or []),
            model_uri=model_uri,
            checkpoint_uri=ckpt.s3_uri,
            tensorboard_uri=tb,
            work_dir=str(work) if keep_work_dir else None,
            feed_stats=[f.stats for f in feeders],
            output=list(group.output),
        )
        for line in result.summary_lines():
            echo(line)
        return result
    finally:
        stop.set()
        held = _hold_signals()  # a second Ctrl-C or SIGTERM must not cut the clean-up short
        if group is not None:
            group.kill()
        for f in feeders:
            if isinstance(f, ChannelFeeder):
                f.join(2)
                f.remove_fifos()
        if ckpt is not None:
            ckpt.stop()  # also after a failure: the last complete checkpoint reaches S3 for a rerun
        if not keep_work_dir:
            shutil.rmtree(work, ignore_errors=True)
        if held:  # main thread: put back SIGINT, and SIGTERM as it was before run_local
            signal.signal(signal.SIGINT, held[signal.SIGINT])
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous_handler is None else previous_handler)


def _hold_signals() -> dict:
    """Ignore SIGINT and SIGTERM (main thread only); returns the handlers to put back ({} elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}


class _DoneFeed:
    """A File-mode channel: downloaded before launch, nothing to run."""

    def __init__(self, stats: FeedStats):
        self.stats = stats


def _supervise(
    group: RankGroup, feed_errors: list[str], trees, per_host: int, started: float, timeout: float | None
) -> str | None:
    """Wait for the ranks; return an error message (rank or S3 object named) or None when all succeeded."""
    while True:
        code = group.poll()
        if code is not None:
            if code == 0:
                return None
            group.finish_output()
            failed = group.first_failure()
            if failed:
                return _rank_failure(group, *failed, trees, per_host)
            reported = group.failed_rank()
            if reported:
                rank, rank_code = reported
                return _rank_failure(group, rank, f"exited with {describe_exit(rank_code)}", trees, per_host)
            return f"the launcher exited with {describe_exit(code)}; last output:\n" + "\n".join(
                group.output[-15:]
            )
        if feed_errors:
            group.kill()
            return f"input failed, the job was stopped: {feed_errors[0]}"
        failed = group.first_failure()
        if failed is not None:
            # let the launcher stop the other ranks and relay the last output (the traceback) itself
            deadline = time.monotonic() + LAUNCHER_GRACE_S
            while group.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            failed = group.first_failure() or failed  # an earlier event may have shown up meanwhile
            group.kill()
            group.finish_output()
            return _rank_failure(group, *failed, trees, per_host)
        if timeout is not None and time.monotonic() - started > timeout:
            group.kill()
            return (
                f"the job ran past its {timeout:.0f} s limit (StoppingCondition.MaxRuntimeInSeconds or "
                "timeout=) and was stopped"
            )
        time.sleep(0.05)


def _rank_failure(group: RankGroup, rank: int, what: str, trees, per_host: int) -> str:
    host = trees[rank // per_host].name if rank // per_host < len(trees) else "?"
    tail = group.rank_lines.get(rank, [])[-12:]
    shown = "\n".join(f"  {line}" for line in tail) or "  (no output)"
    stopped = [r for r in group.terminated_ranks() if r != rank]
    others = (
        f"rank(s) {', '.join(map(str, stopped))} were then stopped by the launcher"
        if stopped
        else "the other ranks were stopped"
    )
    return (
        f"rank {rank} (host {host}) {what}; {others}. Last output of rank {rank}:\n"
        f"{shown}\nCheckpoints synced so far stay in S3; rerun to resume from the newest."
    )


def _rank_summaries(world, per_host, trees, layout, feeders, launch_time) -> list[RankSummary]:
    stats = {(f.stats.host, f.stats.channel): f.stats for f in feeders}
    out = []
    for rank in range(world):
        host = trees[rank // per_host].name
        channel = None
        if layout is not None and layout.has_role("train"):
            channel = layout.channel_for("train", rank, rank % per_host)
        elif len({c for h, c in stats if h == host}) == 1:
            channel = next(c for h, c in stats if h == host)
        s = stats.get((host, channel))
        if s is None:
            out.append(RankSummary(rank, host, channel, None, 0, None, None))
            continue
        first = None if s.first_byte is None else s.first_byte - launch_time
        rate = None
        if s.records and s.first_byte and s.last_byte and s.last_byte > s.first_byte:
            rate = s.records / (s.last_byte - s.first_byte)
        out.append(RankSummary(rank, host, channel, s.records, s.bytes, first, rate))
    return out
