"""Local mode end to end: real horovodrun ranks, real FIFOs, S3 on a moto server over HTTP.

Few and small on purpose: each job pays TensorFlow start-up per rank.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
from helpers.local_s3_proxy import cutting_proxy
from helpers.runtime_helpers import terminal_sigint

from sagemaker_dist import LocalBackend, LocalJobFailed, run_local
from sagemaker_dist.host.processes import pid_running
from sagemaker_dist.local.demo import DEMO_JOB_DIR, demo_estimator, prepare_demo_job
from sagemaker_dist.local.demo_data import write_demo_data
from sagemaker_dist.local.launchers.mpi import LaunchError, horovod_mpi_built

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "helpers" / "local_scripts"
CLI = [sys.executable, "-m", "sagemaker_dist.cli"]


def _job_processes(work: Path) -> list[int]:
    """Pids of live processes whose environment points at a local job under ``work``."""
    found = []
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            if str(work).encode() in (proc_dir / "environ").read_bytes() and pid_running(int(proc_dir.name)):
                found.append(int(proc_dir.name))
        except OSError:
            continue
    return found


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _small_data(s3, bucket, files=4, records=16):
    data = write_demo_data(
        f"s3://{bucket}/data/", files=files, records_per_file=records, validation_files=2, client=s3
    )
    return data


def test_demo_runs_end_to_end_on_the_embedded_endpoint(tmp_path):
    """`sagemaker-dist local --demo` with nothing else: embedded S3, demo data, 2 ranks, artefacts."""
    state = tmp_path / "s3"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.run(
        [*CLI, "local", "--demo", "--s3-state-dir", str(state)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "[rank 0 algo-1]" in out and "[rank 1 algo-2]" in out
    summary = out[out.index("finished in") :]
    rows = [line.split() for line in summary.splitlines() if line.strip().startswith(("0 ", "1 "))]
    assert [r[2] for r in rows] == ["train_0", "train_1"]
    # 4 files x 64 records per rank x 2 epochs: train_epoch takes exactly the shard each epoch and no
    # iterator opens a third FIFO, so the feeder streams exactly that much (its count of records written)
    assert [int(r[3]) for r in rows] == [512, 512], rows
    assert "_records" not in out.split("rank 0/2 on algo-1")[1].splitlines()[0]  # no count is passed
    assert "train epoch ended for every rank after 8 step(s)" in out  # 256 records / 32 each epoch
    assert "final metrics (rank 0): loss=" in out
    # the embedded endpoint saved its buckets on exit: model, checkpoints and TensorBoard logs are there
    jobs = state / "sagemaker-dist-demo" / "jobs"
    (job,) = [p for p in jobs.iterdir() if (p / "output").exists()]
    with tarfile.open(job / "output" / "model.tar.gz") as tar:
        assert any(name.startswith("1/saved_model.pb") for name in tar.getnames())
    assert list((job / "checkpoints").glob("epoch-00002/meta.json"))
    assert list((job / "tensorboard").rglob("events.out.tfevents.*"))


def test_demo_with_unequal_shards_on_three_ranks_of_one_host(s3, bucket, tmp_path):
    """13 equal files over 3 ranks are shards of 5, 4 and 4 files, and no rank is told a count: every
    epoch ends for all when the 4-file ranks run out, and what rank 0 had read ahead is reported."""
    write_demo_data(
        f"s3://{bucket}/cifar10-demo/", files=13, records_per_file=64, validation_files=3, client=s3
    )
    job = prepare_demo_job(bucket, 1, 3, hyperparameters={"epochs": 1}, printer=None)
    assert not [k for k in job.request["HyperParameters"] if "records" in k]
    lines = []
    result = run_local(job.request, job.source_dir, work_dir=tmp_path, echo=lines.append, timeout=150)
    out = "\n".join(lines)
    # 320, 256, 256 records, batches of 32: ranks 1 and 2 run out after 8 steps
    assert "train epoch ended for every rank after 8 step(s): rank(s) 1, 2 ran out of data" in out
    assert "Records read per rank: [256, 256, 256]" in out and "rank 0: 32" in out
    assert len(result.ranks) == 3 and "val_loss" in result.metrics


def _request(bucket, entry_point, hps, epochs=2, checkpoint=None, hosts=2, per_host=1):
    estimator = demo_estimator(
        bucket,
        hosts,
        per_host,
        "Pipe",
        {"epochs": epochs, **hps},
        source_dir=SCRIPTS if entry_point != "train_cifar10.py" else DEMO_JOB_DIR,
        entry_point=entry_point,
        **({"checkpoint_s3_uri": checkpoint} if checkpoint else {}),
    )
    return estimator.prepare({"train": f"s3://{bucket}/data/train/"}, printer=None).request


def test_rank_killed_mid_run_stops_the_job_and_a_rerun_resumes(s3, bucket, tmp_path):
    _small_data(s3, bucket, files=4, records=160)
    ckpt = f"s3://{bucket}/ckpt/job"
    hps = {"batch_size": 8, "train_records": 320}  # 4 equal files over 2 ranks: 2 files each
    request = _request(bucket, "train_cifar10.py", hps, epochs=30, checkpoint=ckpt)
    killed = {}

    def kill_rank_1_after_second_checkpoint():
        _wait_for(
            lambda: next(tmp_path.glob("*/hosts/algo-1/checkpoints/epoch-00002/meta.json"), None),
            120,
            "rank 0's epoch-2 checkpoint",
        )
        pid_file = next(tmp_path.glob("*/ranks/1.pid"))
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        killed["at"] = time.monotonic()

    killer = threading.Thread(target=kill_rank_1_after_second_checkpoint, daemon=True)
    killer.start()
    lines = []
    with pytest.raises(LocalJobFailed) as failure:
        run_local(request, DEMO_JOB_DIR, work_dir=tmp_path, echo=lines.append, timeout=200)
    stopped_after = time.monotonic() - killed["at"]
    # rank 0 is stopped (SIGTERM) or fails in a collective after rank 1 died: never blamed
    assert str(failure.value).startswith("rank 1 (host algo-2) died"), str(failure.value)
    assert stopped_after < 10, f"the job took {stopped_after:.1f} s to stop after the kill"
    assert not [p for p in tmp_path.rglob("*") if p.exists() and stat.S_ISFIFO(p.stat().st_mode)]
    assert not list(tmp_path.iterdir())  # temp trees removed

    # the newest checkpoint in S3 is complete: every file meta.json lists has its size
    keys = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="ckpt/job/")["Contents"]}
    epochs = sorted({int(k.split("/")[2].split("-")[1]) for k in keys if k.endswith("meta.json")})
    newest = epochs[-1]
    meta = json.loads(
        s3.get_object(Bucket=bucket, Key=f"ckpt/job/epoch-{newest:05d}/meta.json")["Body"].read()
    )
    for name, size in meta["files"].items():
        assert keys[f"ckpt/job/epoch-{newest:05d}/{name}"] == size

    # rerun (fewer epochs than trained + 2): resumes from the newest checkpoint and finishes
    rerun = _request(bucket, "train_cifar10.py", hps, epochs=newest + 2, checkpoint=ckpt)
    lines = []
    result = run_local(rerun, DEMO_JOB_DIR, work_dir=tmp_path, echo=lines.append, timeout=200)
    out = "\n".join(lines)
    assert "restored" in out
    assert f"Epoch {newest + 1}/{newest + 2}" in out and "Epoch 1/" not in out
    assert result.model_uri


def test_rank_raising_an_exception_is_named_with_its_traceback(s3, bucket, tmp_path):
    """Rank 1 raises while rank 0 waits in a collective: horovodrun then stops rank 0 (SIGTERM), or
    rank 0 fails in the collective; the error must still name rank 1 and show its traceback."""
    _small_data(s3, bucket, files=2, records=2)
    request = _request(bucket, "fail_rank.py", {"fail_rank": 1}, hosts=2, per_host=1)
    started = time.monotonic()
    with pytest.raises(LocalJobFailed) as failure:
        run_local(request, SCRIPTS, work_dir=tmp_path, echo=lambda line: None, timeout=120)
    message = str(failure.value)
    assert message.startswith("rank 1 (host algo-2) exited with code 1"), message
    assert "RuntimeError: rank 1 failed on purpose" in message
    assert 'raise RuntimeError(f"rank {hvd.rank()} failed on purpose")' in message
    assert time.monotonic() - started < 60
    assert not list(tmp_path.iterdir())


def test_a_rank_that_never_ends_is_named_when_the_time_limit_stops_the_job(s3, bucket, tmp_path):
    """The others ended; rank 1 hangs on its way out: the time limit's message names it, with its
    last output, so a hang at exit is told from a slow job."""
    _small_data(s3, bucket, files=2, records=2)
    request = _request(bucket, "print_rank_env.py", {"hang_rank": 1}, hosts=2, per_host=1)
    with pytest.raises(LocalJobFailed) as failure:
        run_local(request, SCRIPTS, work_dir=tmp_path, echo=lambda line: None, timeout=20)
    message = str(failure.value)
    assert message.startswith("the job ran past its 20 s limit"), message
    assert "the other ranks had ended, rank 1 (host algo-2) had not" in message, message
    assert "  rank 1 waits on its way out" in message, message
    assert not list(tmp_path.iterdir())


def test_setup_without_any_record_count_works_on_several_ranks(s3, bucket, tmp_path):
    """No train_records on 2 ranks: setup() accepts it, and the ranks agree on epoch ends instead."""
    _small_data(s3, bucket, files=2, records=2)
    request = _request(bucket, "setup_without_counts.py", {}, hosts=1, per_host=2)
    lines = []
    run_local(request, SCRIPTS, work_dir=tmp_path, echo=lines.append, timeout=120)
    assert sum("setup returned without a record count" in line for line in lines) == 2


def test_s3_failing_mid_job_stops_it_naming_the_object(s3, bucket, tmp_path, monkeypatch, aws_env):
    _small_data(s3, bucket, files=2, records=8)
    request = _request(bucket, "count_records.py", {}, hosts=1, per_host=1)
    started = time.monotonic()
    with cutting_proxy(aws_env["AWS_ENDPOINT_URL"], fail_times=1000, match="part-00001") as (_, url):
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        with pytest.raises(LocalJobFailed) as failure:
            run_local(request, SCRIPTS, work_dir=tmp_path, echo=lambda line: None, timeout=120)
    message = str(failure.value)
    assert f"s3://{bucket}/data/train/part-00001.tfrecord" in message and "attempts" in message
    assert time.monotonic() - started < 60
    assert not list(tmp_path.iterdir())


def test_ctrl_c_cleans_up_every_process_and_fifo(s3, bucket, tmp_path, aws_env):
    _small_data(s3, bucket, files=2, records=200)
    work = tmp_path / "work"
    cmd = [
        *CLI,
        "local",
        "--entry-point",
        "count_records.py",
        "--source-dir",
        str(SCRIPTS),
        "--train",
        f"s3://{bucket}/data/train/",
        "--output-path",
        f"s3://{bucket}/jobs",
        "--endpoint-url",
        aws_env["AWS_ENDPOINT_URL"],
        "-p",
        "delay=0.05",
        "--work-dir",
        str(work),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=terminal_sigint,
        # stdout is a pipe here, as under `| tee` or a CI log: the lines must come while the job runs
        env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
    )
    output = io.StringIO()
    reader = threading.Thread(target=lambda: [output.write(line) for line in proc.stdout], daemon=True)
    reader.start()
    try:
        pid_files = _wait_for(
            lambda: len(list(work.glob("*/ranks/*.pid"))) == 2 and list(work.glob("*/ranks/*.pid")),
            120,
            "both ranks to start",
        )
        pids = [int(p.read_text()) for p in pid_files]
        _wait_for(lambda: output.getvalue().count("first record") == 2, 60, "both ranks reading")
        assert [p for p in work.rglob("train_*") if stat.S_ISFIFO(p.stat().st_mode)]
        assert len(_job_processes(work)) >= 3  # horovodrun and the two ranks (plus helpers)
        os.kill(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(5)
    assert code == 130, output.getvalue()[-3000:]
    assert not [pid for pid in pids if pid_running(pid)]
    assert not _job_processes(work)
    assert not list(work.iterdir())  # FIFOs and /opt/ml trees removed


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")
def test_mpirun_launcher_gives_each_rank_its_simulated_host(s3, bucket, tmp_path):
    _small_data(s3, bucket, files=2, records=4)
    request = _request(bucket, "print_rank_env.py", {}, hosts=2, per_host=1)
    assert horovod_mpi_built(), "Horovod was built without MPI: scripts/setup.sh rebuilds it with Open MPI"
    lines = []
    result = run_local(request, SCRIPTS, launcher="mpirun", work_dir=tmp_path, echo=lines.append, timeout=60)
    seen = sorted(line.split("] ", 1)[1] for line in lines if "env rank=" in line)
    fed = {(s.host, s.channel): s.bytes for s in result.feed_stats}
    assert seen == [
        f"env rank=0 local=0 host=algo-1 bytes={fed['algo-1', 'train_0']} yield=1",
        f"env rank=1 local=0 host=algo-2 bytes={fed['algo-2', 'train_1']} yield=1",
    ]
    assert fed["algo-1", "train_0"] > 0


def test_mpirun_launcher_refuses_a_horovod_built_without_mpi(s3, bucket, tmp_path, monkeypatch):
    """Each rank would init Horovod as a job of size 1: refused up front, before anything is created."""
    _small_data(s3, bucket, files=2, records=4)
    request = _request(bucket, "print_rank_env.py", {}, hosts=2, per_host=1)
    monkeypatch.setattr(sys.modules[horovod_mpi_built.__module__], "horovod_mpi_built", lambda *a, **k: False)
    with pytest.raises(LaunchError, match="needs a Horovod built with MPI"):
        run_local(request, SCRIPTS, launcher="mpirun", work_dir=tmp_path, echo=print, timeout=60)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("input_mode", ["Pipe", "File"])
def test_estimator_fit_local_runs_the_same_request_here(s3, bucket, tmp_path, input_mode):
    """`fit(backend=LocalBackend())`: the estimator a SageMaker launch uses, run here on 1 host x 2 processes.

    The same script reads the same records per rank whether its channels are FIFOs or files.
    """
    _small_data(s3, bucket, files=4, records=8)
    estimator = demo_estimator(
        bucket, 1, 2, input_mode, {"epochs": 2}, source_dir=SCRIPTS, entry_point="count_records.py"
    )
    lines = []
    result = estimator.fit(
        {"train": f"s3://{bucket}/data/train/"}, printer=lines.append, backend=LocalBackend(work_dir=tmp_path)
    )
    out = "\n".join(lines)
    assert (result.hosts, result.processes_per_host, len(result.ranks)) == (1, 2, 2)
    # 4 files x 8 records split over 2 ranks by bytes: 16 records each, per epoch
    assert sorted(line.split("] ", 1)[1] for line in out.splitlines() if "] epoch " in line) == [
        "epoch 0 records 16",
        "epoch 0 records 16",
        "epoch 1 records 16",
        "epoch 1 records 16",
    ]
    assert "per-rank" in out  # the layout was explained before the run
    assert result.input_mode == input_mode
    if input_mode == "File":
        assert "downloaded channel train_0" in out and "downloaded channel train_1" in out


@pytest.mark.slow
def test_file_mode_on_two_hosts_downloads_each_hosts_share_only(s3, bucket, tmp_path):
    """File mode, 2 hosts x 2 ranks: with one FullyReplicated channel per rank every host downloaded the
    whole dataset; per-local-rank channels (ShardedByS3Key) bring each host its half, every record once."""
    _small_data(s3, bucket, files=8, records=8)
    total = sum(o["Size"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="data/train/")["Contents"])
    estimator = demo_estimator(
        bucket, 2, 2, "File", {"epochs": 1}, source_dir=SCRIPTS, entry_point="count_records.py"
    )
    lines = []
    backend = LocalBackend(work_dir=tmp_path, keep_work_dir=True)
    estimator.fit({"train": f"s3://{bucket}/data/train/"}, printer=lines.append, backend=backend)
    out = "\n".join(lines)
    assert "strategy per-local-rank" in out and "ShardedByS3Key" in out
    per_host = {}
    for data in tmp_path.rglob("input/data"):
        host = data.parents[1].name
        per_host[host] = sum(
            f.stat().st_size for f in data.rglob("*") if f.is_file() and "train" in f.parts[-2]
        )
    assert len(per_host) == 2 and sum(per_host.values()) == total, (per_host, total)  # each object once
    assert all(size <= total * 0.6 for size in per_host.values()), per_host  # a share, not everything
    records = [int(line.rsplit(" ", 1)[1]) for line in out.splitlines() if "] epoch 0 records" in line]
    assert len(records) == 4 and sum(records) == 64


def test_estimator_refuses_local_options_for_a_sagemaker_launch(s3, bucket):
    _small_data(s3, bucket, files=2, records=2)
    estimator = demo_estimator(bucket, 1, 2, "Pipe", {}, source_dir=SCRIPTS, entry_point="count_records.py")
    with pytest.raises(TypeError, match="work_dir"):  # local options belong to LocalBackend
        estimator.fit({"train": f"s3://{bucket}/data/train/"}, printer=None, work_dir="/tmp")
    # refused before any AWS call: nothing sharded, no source uploaded, no job created
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="jobs/")


def _uneven_request(bucket, s3, entry_point, hps, source_dir):
    """2 hosts x 1 rank; rank 0's shard is 1 file, rank 1's is 5 (no counts anywhere)."""
    for name, files in (("one", 1), ("five", 5)):
        write_demo_data(
            f"s3://{bucket}/{name}/", files=files, records_per_file=32, validation_files=files, client=s3
        )
    estimator = demo_estimator(bucket, 2, 1, "Pipe", hps, source_dir=source_dir, entry_point=entry_point)
    inputs = {
        "train": [f"s3://{bucket}/one/train/", f"s3://{bucket}/five/train/"],
        "validation": [f"s3://{bucket}/one/validation/", f"s3://{bucket}/five/validation/"],
    }
    return estimator.prepare(inputs, printer=None, backend=LocalBackend()).request


def test_the_example_script_trains_unchanged_on_uneven_shards_without_counts(s3, bucket, tmp_path):
    """1 file against 5 on 2 hosts, the demo's own script, no counts: ends 0, every epoch ends at the
    short shard's last batch on both ranks, validation (MetricAverageCallback) does not stall."""
    request = _uneven_request(bucket, s3, "train_cifar10.py", {"epochs": 2}, DEMO_JOB_DIR)
    lines = []
    result = run_local(request, DEMO_JOB_DIR, work_dir=tmp_path, echo=lines.append, timeout=200)
    out = "\n".join(lines)
    ends = [line for line in lines if "train epoch ended for every rank" in line]
    assert len(ends) == 2 and all("after 1 step(s): rank(s) 0 ran out" in e for e in ends), ends
    assert sum("validation epoch ended for every rank after 1 step(s)" in line for line in lines) == 2
    assert "val_loss" in result.metrics and result.model_uri, out[-2000:]


def test_ranks_end_each_epoch_together_and_finish_with_equal_weights(s3, bucket, tmp_path):
    request = _uneven_request(bucket, s3, "train_without_counts.py", {"epochs": 3}, SCRIPTS)
    lines = []
    run_local(request, SCRIPTS, work_dir=tmp_path, echo=lines.append, timeout=200)
    per_rank = {}
    for line in lines:
        for key in ("train steps", "validation steps", "weights"):
            if f"] {key} " in line:
                per_rank.setdefault(key, []).append(line.split(f"] {key} ", 1)[1])
    assert per_rank["train steps"] == ["[4, 4, 4]", "[4, 4, 4]"]  # 32 records / batches of 8
    assert per_rank["validation steps"][0] == per_rank["validation steps"][1] == "[4, 4, 4]"
    assert per_rank["weights"][0] == per_rank["weights"][1]


def _one_channel_over_two_hosts(bucket, epochs, **options):
    """train_without_counts.py on 2 hosts x 1 rank reading one ShardedByS3Key channel, no validation."""
    hps = {"epochs": epochs, "validate": "no"}
    return demo_estimator(
        bucket,
        2,
        1,
        "Pipe",
        hps,
        source_dir=SCRIPTS,
        entry_point="train_without_counts.py",
        strategy="per-local-rank",
        **options,
    )


def test_sharded_by_key_with_a_shuffle_changes_host_shards_per_epoch_and_never_stalls(s3, bucket, tmp_path):
    """2 hosts share one ShardedByS3Key channel; the shuffle deals other objects to each host every
    epoch (files of different record counts), no counts: 3 epochs end together, none stalls."""
    for i, records in enumerate([8, 16, 24, 40, 8, 32]):
        write_demo_data(
            f"s3://{bucket}/mixed/{i}/", files=1, records_per_file=records, validation_files=0, client=s3
        )
        s3.copy_object(
            Bucket=bucket,
            Key=f"pool/part-{i}.tfrecord",
            CopySource={"Bucket": bucket, "Key": f"mixed/{i}/train/part-00000.tfrecord"},
        )
    estimator = _one_channel_over_two_hosts(bucket, epochs=3, shuffle_seed=3)
    request = estimator.prepare(
        {"train": f"s3://{bucket}/pool/"}, printer=None, backend=LocalBackend()
    ).request
    assert (
        request["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3DataDistributionType"]
        == "ShardedByS3Key"
    )
    lines = []
    result = run_local(request, SCRIPTS, work_dir=tmp_path, echo=lines.append, timeout=200)
    steps = [line.split("] train steps ", 1)[1] for line in lines if "] train steps " in line]
    read = [json.loads(line.split("] train read ", 1)[1]) for line in lines if "] train read " in line]
    assert len(steps) == 2 and steps[0] == steps[1], steps
    assert len(json.loads(steps[0])) == 3
    assert read[0] == read[1]  # every rank logs the same gathered report
    per_epoch = read[0]
    assert len({tuple(r) for r in per_epoch}) > 1, per_epoch  # the hosts' shards changed between epochs
    streamed = {s.host: s.records for s in result.feed_stats}
    for rank, host in enumerate(("algo-1", "algo-2")):
        assert sum(epoch[rank] for epoch in per_epoch) <= streamed[host]  # trained on what was streamed


def test_a_rank_whose_fifo_delivers_nothing_ends_the_epoch_for_all_without_hanging(s3, bucket, tmp_path):
    """One object, ShardedByS3Key over 2 hosts: host 2's FIFO is empty every epoch. The epoch ends
    for every rank at step 0 with a line saying so; Keras then stops on an empty epoch: no hang."""
    write_demo_data(f"s3://{bucket}/lone/", files=1, records_per_file=16, validation_files=0, client=s3)
    estimator = _one_channel_over_two_hosts(bucket, epochs=2)
    request = estimator.build_request(
        {"train": [f"s3://{bucket}/lone/train/"]}, submit_directory="s3://x-y/z"
    )
    lines = []
    started = time.monotonic()
    with pytest.raises(LocalJobFailed):
        run_local(request, SCRIPTS, work_dir=tmp_path, echo=lines.append, timeout=150)
    assert time.monotonic() - started < 120
    assert any(
        "train epoch ended for every rank after 0 step(s): rank(s) 1 ran out of data" in line
        for line in lines
    )
