"""``sagemaker-dist slurm``: the sbatch script, bad input refused before anything is written or
submitted, and (slow) the demo and a failing-rank job on a private 2-node Slurm cluster
(``scripts/slurm-cluster.sh``) with S3 on a moto server over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.small_request import small_request_file

from sagemaker_dist.local.backend import LocalBackend
from sagemaker_dist.local.demo import demo_estimator, prepare_demo_job
from sagemaker_dist.local.demo_data import write_demo_data
from sagemaker_dist.platforms.node_plan import NodePlanError
from sagemaker_dist.platforms.slurm import SlurmJobError, SlurmOptions, check_tasks, sbatch_script

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "sagemaker_dist.cli", "slurm"]
DEAD_ENDPOINT = "http://127.0.0.1:9"  # any S3 call would fail: the checks come first


def _slurm(*args, env=None, cwd=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
    )


def test_the_script_runs_an_agent_per_node_then_the_ranks_with_pmix(s3, bucket, tmp_path):
    """A Horovod job (the demo's default)."""
    request = prepare_demo_job(bucket, 2, 4, printer=None).request
    options = SlurmOptions(
        spec="s3://b/spec.json", python="/opt/py/bin/python", gpus_per_node=4, partition="gpu"
    )
    script = sbatch_script(request, options)
    for directive in (
        "--nodes=2",
        "--ntasks-per-node=4",
        "--gpus-per-node=4",
        "--partition=gpu",
        "--time=1440",
        "--signal=TERM@120",  # the ranks stop and checkpoint before the time limit's SIGKILL
    ):
        assert f"#SBATCH {directive}\n" in script
    # on a stop the agents feed and sync until the ranks have ended; the script ends them with SIGINT
    assert "pipe-agent --spec s3://b/spec.json --drain 110" in script
    assert 'scancel --signal=INT "$step"' in script
    assert "pipe-agent --spec s3://b/spec.json" in script and '--node-index "$SLURM_NODEID"' in script
    assert "srun --overlap --mpi=pmix --nodes=2 --ntasks-per-node=4 --kill-on-bad-exit=1 --label" in script
    assert "/opt/py/bin/python train_cifar10.py --batch_size 32 --epochs 2" in script  # the toolkit's argv
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert "FI_PROVIDER" not in script
    assert "export FI_PROVIDER=efa" in sbatch_script(request, SlurmOptions(spec="s3://b/s.json", efa=True))
    mwms = json.loads(request["HyperParameters"]["sagemaker_dist_layout"]) | {"distribution": "tf-mwms"}
    tf_mwms = {
        **request,
        "HyperParameters": {**request["HyperParameters"], "sagemaker_dist_layout": json.dumps(mwms)},
    }
    with pytest.raises(
        NodePlanError, match="'tf-mwms' job .* the sbatch script starts one task per rank with srun"
    ):
        sbatch_script(tf_mwms, options)
    with pytest.raises(SlurmJobError, match="4 tasks per node but 2 GPU.s. per node"):
        sbatch_script(request, SlurmOptions(spec="s3://b/s.json", gpus_per_node=2))


def test_a_torchrun_jobs_ranks_get_torchruns_variables_and_meet_at_the_first_node(s3, bucket):
    """No MPI: each srun task is one rank with the variables torchrun gives it, the rendezvous at the
    allocation's first node on a port of the job's own; bash runs the rendezvous lines as written."""
    request = prepare_demo_job(bucket, 2, 4, printer=None, distribution="torchrun").request
    script = sbatch_script(request, SlurmOptions(spec="s3://b/spec.json", gpus_per_node=4))
    assert "x 4 PyTorch DDP rank(s)" in script and "--mpi=" not in script
    assert "srun --overlap --nodes=2 --ntasks-per-node=4 --kill-on-bad-exit=1 --label" in script
    for variable in (
        'RANK="$SLURM_PROCID"', 'WORLD_SIZE="$SLURM_NTASKS"', 'LOCAL_RANK="$SLURM_LOCALID"',
        'LOCAL_WORLD_SIZE="4"', 'MASTER_ADDR="$SD_MASTER_ADDR"', 'MASTER_PORT="$SD_MASTER_PORT"',
    ):  # fmt: skip
        assert variable in script
    assert "python3 train_torch.py --batch_size 32 --epochs 2" in script
    lines = [
        line for line in script.splitlines() if line.startswith(("first=", "SD_MASTER_ADDR=", "export SD_"))
    ]
    fake = "scontrol() { if [ $1 = show ] && [ $2 = hostnames ]; then printf 'n7\\nn8\\n'; "
    fake += "else echo 'NodeName=n7 Arch=x86_64 NodeAddr=10.1.2.3 NodeHostName=n7'; fi; }\n"
    shell = fake + "SLURM_JOB_ID=123456\n" + "\n".join(lines) + '\necho "$SD_MASTER_ADDR:$SD_MASTER_PORT"'
    shown = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=10)
    assert shown.stdout.strip() == "10.1.2.3:23456", shown.stderr


def test_bad_input_is_refused_before_anything_is_written(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env["AWS_ENDPOINT_URL"] = DEAD_ENDPOINT
    base = ["--demo", "--endpoint-url", DEAD_ENDPOINT]

    def refused(*args, **extra) -> str:
        proc = _slurm(*base, *args, env={**env, **extra}, cwd=tmp_path)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        return proc.stderr

    assert "SLURM_CONF is not set" in refused("--submit", "--wait")
    assert "is not a file" in refused("--submit", "--wait", SLURM_CONF=str(tmp_path / "none.conf"))
    (tmp_path / "slurm.conf").write_text("")
    no_sbatch = refused("--submit", "--wait", SLURM_CONF=str(tmp_path / "slurm.conf"), PATH=str(tmp_path))
    assert "sbatch is not on PATH" in no_sbatch
    assert "5 tasks per node but 4 GPU(s)" in refused("--gpus-per-node", 4, "--tasks-per-node", 5)
    assert "9 ranks per node but ml.p4d.24xlarge has 8" in refused(
        "--instance-type", "ml.p4d.24xlarge", "--tasks-per-node", 9
    )
    cpu = refused("--instance-type", "ml.c5.xlarge")
    assert "'ml.c5.xlarge' has no GPUs" in cpu and "give --tasks-per-node N" in cpu
    assert "--wait waits for a submitted job" in refused("--wait")
    injected = refused("--partition", "gpu\n#SBATCH --uid=0")  # a second directive, or a shell line
    assert "--partition 'gpu\\n#SBATCH --uid=0': an #SBATCH value cannot" in injected
    assert "Traceback" not in injected
    assert "--output " in refused("--out-dir", tmp_path / "runs\nrm -rf ~")
    quote = _slurm("--request", small_request_file(tmp_path, {"note": "it's"}), env=env, cwd=tmp_path).stderr
    assert (
        quote.startswith("error: hyperparameter 'note' = ") and "broken command line (unterminated" in quote
    )
    cut = _slurm(
        "--request", small_request_file(tmp_path, {"note": "a #b", "zeta": 1}), env=env, cwd=tmp_path
    )
    assert cut.stderr.startswith(
        "warning: hyperparameter 'note' = '\"a #b\"' reaches the script as '--note' 'a'"
    )
    assert "warning: the script receives no --zeta: the sagemaker-training toolkit 4.8.3 joins" in cut.stderr
    request_flags = _slurm("--request", tmp_path / "r.json", "--nodes", 3, env=env, cwd=tmp_path)
    assert (
        request_flags.returncode == 2 and "--nodes cannot be combined with --request" in request_flags.stderr
    )
    assert sorted(tmp_path.iterdir()) == [
        tmp_path / "request.json",
        tmp_path / "slurm.conf",
    ]  # no script written
    check_tasks(16, 0)  # CPU nodes: any count


def test_waiting_says_each_pending_reason_and_gives_up_only_on_one_that_never_clears(monkeypatch):
    """The reasons that clear on their own (nodes back, other jobs done, a node count within the
    partition's) are shown while the job waits; one that never clears cancels the job at once."""
    from sagemaker_dist.platforms import slurm_submit

    monkeypatch.setattr(slurm_submit, "POLL_S", 0)
    partition = {"TotalNodes": "2", "MaxNodes": "UNLIMITED", "MinNodes": "0"}
    monkeypatch.setattr(slurm_submit, "partition_fields", lambda name: partition)
    job = {"Partition": "debug", "NumNodes": "2-2", "NumTasks": "2", "NumCPUs": "2"}
    states = iter(
        [
            {**job, "JobState": "PENDING", "Reason": "None"},
            {**job, "JobState": "PENDING", "Reason": "Priority"},
            {**job, "JobState": "PENDING", "Reason": "Priority"},
            {**job, "JobState": "PENDING", "Reason": "ReqNodeNotAvail,_UnavailableNodes:n2"},
            {**job, "JobState": "PENDING", "Reason": "PartitionNodeLimit"},  # n2 drained: 2 nodes fit
            {**job, "JobState": "RUNNING", "Reason": "None", "NodeList": "n[1-2]"},
            {**job, "JobState": "COMPLETED", "Reason": "None", "NodeList": "n[1-2]", "ExitCode": "0:0"},
        ]
    )
    monkeypatch.setattr(slurm_submit, "job_fields", lambda job_id: next(states))
    lines: list[str] = []
    assert slurm_submit.wait_for_job("7", echo=lines.append)[0] == 0
    assert lines == [
        "slurm job 7: PENDING",
        "slurm job 7: PENDING (Priority: jobs of higher priority go first)",
        "slurm job 7: PENDING (ReqNodeNotAvail, UnavailableNodes:n2: a node it needs is not available now "
        "(in use, reserved, down or drained))",
        "slurm job 7: PENDING (PartitionNodeLimit: nodes it needs are down or drained)",
        "slurm job 7: RUNNING on n[1-2]",
        "slurm job 7: COMPLETED on n[1-2]",
    ]
    never = slurm_submit.never_clears
    assert never("PartitionNodeLimit", {**job, "NumNodes": "3-3"})[0] == (
        "it asks for 3 node(s), partition debug has 2"
    )
    for reason in ("PartitionConfig", "PartitionTimeLimit", "BadConstraints", "InvalidAccount", "InvalidQOS"):
        assert never(reason, job) is not None, reason
    for reason in ("QOSMaxNodePerJobLimit", "AssocMaxGRESPerNode", "QOSMinGRES", "DependencyNeverSatisfied"):
        assert never(reason, job) is not None, reason
    for reason in ("ReqNodeNotAvail", "PartitionDown", "QOSJobLimit", "QOSMaxJobsPerUserLimit", "Resources"):
        assert never(reason, job) is None, reason
    for reason in ("AssocGrpCpuLimit", "MaxCpuPerAccount", "JobHeldAdmin", "NodeDown", "Priority"):
        assert never(reason, job) is None, reason

    cancelled: list[list[str]] = []
    monkeypatch.setattr(
        slurm_submit, "job_fields", lambda job_id: {**job, "JobState": "PENDING", "Reason": "PartitionConfig"}
    )
    monkeypatch.setattr(slurm_submit.subprocess, "run", lambda argv, **kw: cancelled.append(argv))
    with pytest.raises(
        slurm_submit.SlurmJobFailed, match=r"slurm job 8 can never start: .*PartitionConfig .*cancelled"
    ):
        slurm_submit.wait_for_job("8", echo=lines.append)
    assert cancelled == [["scancel", "8"]]


def _free_ports(count: int) -> int:
    """The first of ``count`` consecutive free TCP ports on 127.0.0.1."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        try:
            with contextlib.ExitStack() as stack:
                for port in range(base, base + count):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise AssertionError("no free ports for the Slurm cluster")


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """A private 2-node cluster (n1, n2 on 127.0.0.1), up for this module; yields SLURM_CONF."""
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("slurmctld", "slurmd", "munged", "sbatch")):
        pytest.skip("needs root and slurm-wlm, munge (scripts/slurm-cluster.sh)")
    cluster = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "SLURM_CLUSTER_PORT": str(_free_ports(3))}
    up = subprocess.run(
        [REPO / "scripts" / "slurm-cluster.sh", "up", cluster], capture_output=True, text=True, env=env
    )
    assert up.returncode == 0, up.stderr
    try:
        yield up.stdout.strip().removeprefix("export SLURM_CONF=")
    finally:
        subprocess.run([REPO / "scripts" / "slurm-cluster.sh", "down", cluster], capture_output=True)


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.tensorflow
def test_the_demo_trains_on_two_slurm_nodes(slurm_cluster, aws_env, s3, bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", slurm_cluster)
    proc = _slurm(
        "--demo", "--nodes", 2, "--tasks-per-node", 1, "--submit", "--wait", "--timeout", 400,
        "--bucket", bucket, "--endpoint-url", aws_env["AWS_ENDPOINT_URL"], cwd=tmp_path, timeout=500,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, out[-6000:] + proc.stderr[-2000:]
    assert "ended COMPLETED with exit code 0" in proc.stderr
    assert "0: train epoch ended for every rank after 8 step(s)" in out
    assert "pipe agent: node 1 (algo-2) of 2" in out and "1: pipe agent: train_1: 2 epoch(s)" in out
    (script,) = tmp_path.glob("sagemaker-dist-jobs/*/*.sbatch")  # the job's folder, nothing loose here
    job = script.stem
    (output,) = script.parent.glob(f"{job}-*.out")  # Slurm's output beside it
    assert "0: train epoch ended for every rank" in output.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sagemaker-dist-jobs"]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"jobs/{job}/").get("Contents", [])]
    assert f"jobs/{job}/output/model.tar.gz" in keys
    assert f"jobs/{job}/checkpoints/epoch-00002/meta.json" in keys
    job_id = proc.stderr.split("submitted slurm job ")[1].split()[0]
    assert not Path(f"/tmp/sagemaker-dist-{job_id}").exists()  # the nodes' trees went with the job


@pytest.mark.slow
@pytest.mark.torch
def test_the_torchrun_demo_trains_on_two_slurm_nodes_with_two_ranks_each(
    slurm_cluster, aws_env, s3, bucket, tmp_path, monkeypatch
):
    """PyTorch DDP under srun: four Gloo ranks on two nodes, each reading its own FIFO from its node's
    agent, meeting at the first node; the model and rank 0's checkpoints in S3."""
    monkeypatch.setenv("SLURM_CONF", slurm_cluster)
    proc = _slurm(
        "--demo", "--distribution", "torchrun", "--nodes", 2, "--tasks-per-node", 2, "--submit", "--wait",
        "--timeout", 400, "--bucket", bucket, "--endpoint-url", aws_env["AWS_ENDPOINT_URL"], cwd=tmp_path,
        timeout=500,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, out[-6000:] + proc.stderr[-2000:]
    assert "ended COMPLETED with exit code 0" in proc.stderr
    trained = dict(re.findall(r"^(\d+): rank \1: trained (\d+) record\(s\)", out, re.MULTILINE))
    assert sorted(trained) == ["0", "1", "2", "3"], out[-4000:]  # every rank, its srun label its rank
    assert "0: sagemaker-dist: train epoch ended for every rank" in out
    assert re.search(r"^0: sagemaker-dist-metrics: epoch=2 ", out, re.MULTILINE), out[-4000:]
    (script,) = tmp_path.glob("sagemaker-dist-jobs/*/*.sbatch")
    job = script.stem
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"jobs/{job}/").get("Contents", [])]
    assert f"jobs/{job}/output/model.tar.gz" in keys
    assert f"jobs/{job}/checkpoints/epoch-00002/state.pt" in keys


@pytest.mark.slow
def test_an_agent_that_cannot_read_its_data_fails_the_job_before_the_ranks(
    slurm_cluster, aws_env, s3, bucket, tmp_path, monkeypatch
):
    monkeypatch.setenv("SLURM_CONF", slurm_cluster)
    written = _slurm(
        "--demo", "--nodes", 2, "--tasks-per-node", 1, "--bucket", bucket,
        "--endpoint-url", aws_env["AWS_ENDPOINT_URL"], "-o", tmp_path / "job.sbatch", cwd=tmp_path,
    )  # fmt: skip
    assert written.returncode == 0, written.stderr
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="jobs/")["Contents"]
    (manifest,) = [o["Key"] for o in listed if o["Key"].endswith("shards/train/1.manifest")]
    entries = json.loads(s3.get_object(Bucket=bucket, Key=manifest)["Body"].read())
    gone = entries[0]["prefix"].split("/", 3)[3] + entries[1]  # the first object of node 1's shard
    s3.delete_object(Bucket=bucket, Key=gone)
    proc = subprocess.run(
        ["sbatch", "--wait", str(tmp_path / "job.sbatch")], capture_output=True, text=True, timeout=200
    )
    assert proc.returncode != 0
    (output,) = tmp_path.glob("*.out")
    log = output.read_text()
    assert f"s3://{bucket}/{gone}): 404" in log and "pipe agent cannot read channel" in log, log
    assert "a pipe agent stopped before the ranks started" in log and "train epoch" not in log
    job_id = output.stem.rsplit("-", 1)[1]
    assert not Path(f"/tmp/sagemaker-dist-{job_id}").exists()  # node 0's tree is removed too


@pytest.mark.slow
def test_a_job_its_partition_can_never_run_is_cancelled_in_seconds_naming_the_reason(
    slurm_cluster, aws_env, bucket, tmp_path, monkeypatch
):
    """3 nodes on the 2-node partition: Slurm keeps the job pending (PartitionConfig, later
    PartitionNodeLimit) forever. --wait says why it waits, cancels it and fails at once instead of
    waiting out its --timeout."""
    monkeypatch.setenv("SLURM_CONF", slurm_cluster)
    started = time.monotonic()
    proc = _slurm(
        "--demo", "--nodes", 3, "--tasks-per-node", 1, "--partition", "debug", "--submit", "--wait",
        "--timeout", 300, "--bucket", bucket, "--endpoint-url", aws_env["AWS_ENDPOINT_URL"],
        cwd=tmp_path, timeout=400,
    )  # fmt: skip
    took = time.monotonic() - started
    err = proc.stderr
    assert proc.returncode == 2, err[-3000:]
    job_id = err.split("submitted slurm job ")[1].split()[0]
    reason = r"(PartitionConfig|PartitionNodeLimit)"
    assert re.search(rf"slurm job {job_id}: PENDING \({reason}\b", err), err[-3000:]
    failed = re.search(
        rf"error: slurm job {job_id} can never start: it is pending with reason {reason} \(", err
    )
    assert failed, err[-3000:]
    assert "partition debug" in err and "which Slurm does not clear by itself, so it was cancelled" in err
    assert "To run it, ask for " in err and "--nodes" in err and "--partition" in err
    assert _job_state(job_id) == "CANCELLED"
    assert took < 60, f"{took:.0f} s"  # seconds after the submission, not the --timeout's 300


def _job_state(job_id: str) -> str:
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    return next((f.split("=", 1)[1] for f in shown.stdout.split() if f.startswith("JobState=")), "GONE")


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.tensorflow
@pytest.mark.parametrize(
    ("distribution", "how"),
    [("horovod", ["--signal=TERM"]), ("horovod", []), ("torchrun", ["--signal=TERM"])],
    ids=["signal-TERM", "plain", "torchrun-signal-TERM"],
)
def test_scancel_stops_every_rank_after_the_same_step_and_checkpoints_it(
    slurm_cluster, aws_env, s3, bucket, tmp_path, monkeypatch, distribution, how
):
    """``scancel --signal=TERM`` (what ``--signal=TERM@120`` does before the time limit) and a plain
    ``scancel`` (SIGTERM to the steps and the script, SIGKILL after the cluster's KillWait; a
    preemption's way too) in the middle of training: every rank stops after the same step and rank 0's
    checkpoint of it reaches S3 through the agents; the job ends COMPLETED, or CANCELLED."""
    monkeypatch.setenv("SLURM_CONF", slurm_cluster)
    written = _slurm(
        "--demo", "--distribution", distribution, "--nodes", 2, "--tasks-per-node", 1, "--epochs", 40,
        "--bucket", bucket,
        "--endpoint-url", aws_env["AWS_ENDPOINT_URL"], "-o", tmp_path / "job.sbatch", cwd=tmp_path,
    )  # fmt: skip
    assert written.returncode == 0, written.stderr
    submitted = subprocess.run(
        ["sbatch", "--parsable", str(tmp_path / "job.sbatch")], capture_output=True, text=True, timeout=30,
        cwd=tmp_path,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 300
    output = None
    while time.monotonic() < deadline:  # until the first epoch has ended: training is under way
        output = next(tmp_path.glob("*.out"), None)
        if output and "train epoch ended for every rank" in output.read_text():
            break
        assert _job_state(job_id) in ("PENDING", "RUNNING", "CONFIGURING"), _job_state(job_id)
        time.sleep(0.5)
    else:
        raise AssertionError(f"no epoch ended in 300 s:\n{output.read_text()[-3000:] if output else ''}")
    subprocess.run(["scancel", *how, job_id], check=True, timeout=30)
    signalled = time.monotonic()
    while _job_state(job_id) in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
        assert time.monotonic() - signalled < 120, "the job did not end within 120 s of SIGTERM"
        time.sleep(0.5)
    log = output.read_text()
    assert _job_state(job_id) in (("COMPLETED",) if how else ("CANCELLED",)) + ("GONE",), log[-4000:]
    assert "stopped in epoch" in log and "on every rank" in log, log[-4000:]
    stopped = [line for line in log.splitlines() if "sagemaker-dist: stopped in epoch" in line]
    assert len(stopped) == 1, log[-4000:]  # rank 0's line, once
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="jobs/").get("Contents", [])]
    metas = [k for k in keys if "/checkpoints/" in k and k.endswith("meta.json")]
    meta = [json.loads(s3.get_object(Bucket=bucket, Key=k)["Body"].read()) for k in metas]
    if (
        distribution == "torchrun"
    ):  # the checkpoint the stop line names (epoch-E-step-S, or epoch-E on its last step)
        (name,) = re.findall(r"stopped in epoch .*; checkpoint (\S+?);", log)
        assert any(f"/checkpoints/{name}/meta.json" in k for k in metas), (name, metas, log[-3000:])
    else:
        assert any(m.get("stopped") for m in meta), (metas, log[-3000:])
    # a cancelled job cannot start the step that removes its nodes' trees; the next job of that id
    # (this module's cluster numbers from 1 again) removes a stale one at its start: here, now
    shutil.rmtree(f"/tmp/sagemaker-dist-{job_id}", ignore_errors=True)


FAILING = """import os, sys, time
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
print(f"rank {rank} in {os.getcwd()}", flush=True)
if rank == 1:
    sys.exit(3)
time.sleep(120)
"""


@pytest.mark.slow
def test_a_failing_rank_fails_the_job_and_the_output_names_it(
    slurm_cluster, aws_env, s3, bucket, tmp_path, monkeypatch
):
    monkeypatch.setenv("SLURM_CONF", slurm_cluster)
    write_demo_data(f"s3://{bucket}/data/", files=4, records_per_file=4, validation_files=2, client=s3)
    source = tmp_path / "src"
    source.mkdir()
    (source / "fail_rank.py").write_text(FAILING)
    estimator = demo_estimator(bucket, 2, 1, source_dir=source, entry_point="fail_rank.py")
    request = estimator.prepare(
        {"train": f"s3://{bucket}/data/train/"}, backend=LocalBackend(), printer=None
    ).request
    (tmp_path / "request.json").write_text(json.dumps(request))
    proc = _slurm(
        "--request", tmp_path / "request.json", "--submit", "--wait", "--timeout", 200,
        "--endpoint-url", aws_env["AWS_ENDPOINT_URL"], cwd=tmp_path, timeout=300,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode not in (0, 2), out + proc.stderr
    assert "srun: error: n2: task 1: Exited with exit code 3" in out
    assert "the training step failed with exit code" in out and "ended FAILED" in proc.stderr
