"""The pipe agent as a real process (``sagemaker-dist pipe-agent``) against a moto server over HTTP:
the node's tree, its FIFOs epoch by epoch, how it stops, and bad input before anything starts."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.fault_proxy import fault_proxy
from helpers.local_s3_proxy import cutting_proxy

from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.host.job_spec import NodePlanError, plan_node
from sagemaker_dist.local.demo import prepare_demo_job
from sagemaker_dist.platforms.node_plan import parse_ranks
from sagemaker_dist.platforms.pipe_agent import READY_FILE, fresh_private_root, stop_on_signals, wait_ready

CLI = [sys.executable, "-m", "sagemaker_dist.cli", "pipe-agent"]


@pytest.fixture
def demo_request(s3, bucket, tmp_path):
    """The demo job's request (2 nodes x 1 rank, per-rank train and validation manifests) in a file."""
    request = prepare_demo_job(bucket, 2, 1, printer=None).request
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request))
    return request, path


def _shard_bytes(s3, request, channel: str) -> bytes:
    """What one epoch of ``channel`` holds: its manifest's objects, in order."""
    (entry,) = [c for c in request["InputDataConfig"] if c["ChannelName"] == channel]
    bucket, key = entry["DataSource"]["S3DataSource"]["S3Uri"][5:].split("/", 1)
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    pbucket, pkey = manifest[0]["prefix"][5:].split("/", 1)
    return b"".join(s3.get_object(Bucket=pbucket, Key=pkey + rel)["Body"].read() for rel in manifest[1:])


def _agent(args, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [*CLI, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw
    )


def _wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def _read_fifo(path: Path, timeout: float = 20) -> bytes:
    _wait_for(path, timeout)
    with open(path, "rb") as f:
        return f.read()


def test_node_writes_its_tree_and_feeds_its_ranks_channels_epoch_by_epoch(s3, demo_request, tmp_path):
    request, spec = demo_request
    root = tmp_path / "node1"
    (root / "input" / "data").mkdir(parents=True)
    os.mkfifo(root / "input" / "data" / "train_1_0")  # left by an agent that was killed
    agent = _agent(["--spec", spec, "--node-index", 1, "--ranks", "1", "--root", root, "--epochs", 2])
    try:
        wait_ready(root, 60, agent)
        config = root / "input" / "config"
        resource = json.loads((config / "resourceconfig.json").read_text())
        assert (resource["current_host"], resource["hosts"]) == ("algo-2", ["algo-1", "algo-2"])
        assert set(json.loads((config / "inputdataconfig.json").read_text())) == {
            "train_0", "train_1", "validation_0", "validation_1"
        }  # fmt: skip
        hps = json.loads((config / "hyperparameters.json").read_text())
        assert hps == request["HyperParameters"]
        assert (root / "code" / "train_cifar10.py").is_file()  # the source package, unpacked
        data = root / "input" / "data"
        for channel in ("train_1", "validation_1"):
            expected = _shard_bytes(s3, request, channel)
            _wait_for(data / f"{channel}_0")
            assert stat.S_IMODE((data / f"{channel}_0").stat().st_mode) == 0o600  # no other user's reader
            assert _read_fifo(data / f"{channel}_0") == expected
            # the next epoch's FIFO appears only once the first is closed
            assert _read_fifo(data / f"{channel}_1") == expected
        assert not list(data.glob("train_0*")), "node 1 fed rank 0's channel"
        out, _ = agent.communicate(timeout=30)
    finally:
        agent.kill()
    assert agent.returncode == 0, out
    assert "fed 2 epoch(s) of every channel" in out
    assert not (root / READY_FILE).exists() and not list(data.iterdir())  # FIFOs removed


def test_spec_from_s3_shuffle_per_epoch_and_stop_on_sigterm(s3, bucket, demo_request, tmp_path):
    request, spec = demo_request
    s3.put_object(Bucket=bucket, Key="specs/request.json", Body=spec.read_bytes())
    root = tmp_path / "node0"
    agent = _agent(["--spec", f"s3://{bucket}/specs/request.json", "--node-index", 0, "--root", root,
                    "--shuffle-seed", 7])  # fmt: skip
    try:
        wait_ready(root, 60, agent)
        data = root / "input" / "data"
        epochs = [_read_fifo(data / f"train_0_{n}") for n in range(3)]
        expected = _shard_bytes(s3, request, "train_0")
        assert all(sorted(e) == sorted(expected) and len(e) == len(expected) for e in epochs)
        assert len({*epochs}) > 1, "the object order did not change between epochs"
        time.sleep(0.3)
        assert (data / "train_0_3").exists()  # no epoch limit: it keeps feeding
        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=20)
    finally:
        agent.kill()
    assert agent.returncode == 0, out
    assert "pipe agent: stopped" in out and not list(data.iterdir())


def test_stops_when_the_watched_process_exits(demo_request, tmp_path):
    _, spec = demo_request
    sleeper = subprocess.Popen(["sleep", "60"])
    agent = _agent(["--spec", spec, "--node-index", 0, "--root", tmp_path / "n", "--until-pid", sleeper.pid])
    try:
        wait_ready(tmp_path / "n", 60, agent)
        sleeper.kill()
        sleeper.wait()
        out, _ = agent.communicate(timeout=20)
    finally:
        agent.kill()
        sleeper.kill()
    assert agent.returncode == 0 and f"process {sleeper.pid} has exited" in out


def test_a_stream_cut_mid_object_resumes_with_a_range_request(aws_env, s3, demo_request, tmp_path):
    request, spec = demo_request
    root = tmp_path / "n"
    with cutting_proxy(aws_env["AWS_ENDPOINT_URL"], fail_times=2, match="cifar10-demo/train/") as (
        proxy,
        url,
    ):
        agent = _agent(
            ["--spec", spec, "--node-index", 0, "--root", root, "--epochs", 1],
            env={**os.environ, "AWS_ENDPOINT_URL": url},
        )
        try:
            wait_ready(root, 60, agent)
            assert _read_fifo(root / "input" / "data" / "train_0_0") == _shard_bytes(s3, request, "train_0")
            _read_fifo(root / "input" / "data" / "validation_0_0")
            out, _ = agent.communicate(timeout=30)
        finally:
            agent.kill()
    assert proxy.cut == 2 and agent.returncode == 0, out


def test_a_missing_object_fails_the_agent_naming_it(s3, bucket, demo_request, tmp_path):
    request, spec = demo_request
    (entry,) = [c for c in request["InputDataConfig"] if c["ChannelName"] == "train_0"]
    mbucket, mkey = entry["DataSource"]["S3DataSource"]["S3Uri"][5:].split("/", 1)
    manifest = json.loads(s3.get_object(Bucket=mbucket, Key=mkey)["Body"].read())
    gone = manifest[0]["prefix"] + manifest[2]  # the second object: the start-up check heads the first
    s3.delete_object(Bucket=bucket, Key=gone[5:].split("/", 1)[1])
    root = tmp_path / "n"
    agent = _agent(["--spec", spec, "--node-index", 0, "--root", root, "--epochs", 1])
    try:
        wait_ready(root, 60, agent)
        with pytest.raises(AssertionError):
            _read_fifo(root / "input" / "data" / "train_0_1", timeout=1)
        _read_fifo(root / "input" / "data" / "train_0_0")  # the first object, then the writer closes
        out, _ = agent.communicate(timeout=20)
    finally:
        agent.kill()
    assert agent.returncode == 2, out
    assert f"error: host algo-1 channel 'train_0': cannot read {gone}: NoSuchKey" in out


def test_no_s3_access_is_refused_before_anything_starts(aws_env, demo_request, tmp_path):
    _, spec = demo_request
    denied = b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
    root = tmp_path / "n"
    with fault_proxy(aws_env["AWS_ENDPOINT_URL"], lambda *a: (403, "application/xml", denied)) as (_, url):
        proc = subprocess.run(
            [*CLI, "--spec", str(spec), "--node-index", "0", "--root", str(root)],
            env={**os.environ, "AWS_ENDPOINT_URL": url},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2
    err = proc.stderr
    assert "pipe agent cannot read channel 'train_0'" in err and "AccessDenied" in err
    assert "s3:GetObject on arn:aws:s3:::" in err and "service account" in err
    assert not root.exists()


def test_bad_specs_and_nodes_are_refused_with_what_to_do(aws_env, demo_request, tmp_path):
    request, spec = demo_request
    not_request = tmp_path / "plan.json"
    not_request.write_text(json.dumps({"shards": []}))

    def refused(*args) -> str:
        proc = subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        return proc.stderr

    assert "is not a CreateTrainingJob request" in refused("--spec", not_request, "--node-index", 0)
    assert "cannot read the job spec file" in refused("--spec", tmp_path / "nope.json", "--node-index", 0)
    assert "cannot read the job spec s3://" in refused(
        "--spec", "s3://no-such-bucket-x/r.json", "--node-index", 0
    )
    with pytest.raises(NodePlanError, match="node index 2 is not a node of job .* 0..1"):
        plan_node(request, 2)
    with pytest.raises(NodePlanError, match="node 1 runs rank.s. 1 of job .* not 0"):
        plan_node(request, 1, [0])
    with pytest.raises(NodePlanError, match="'x' is not a rank"):
        parse_ranks("0,x")
    assert parse_ranks("0-2,5") == [0, 1, 2, 5]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_node_root_another_user_prepared_is_refused_before_anything_starts(aws_env, demo_request, tmp_path):
    """Slurm's node trees sit at a predictable path: one another user made first is never used."""
    _, spec = demo_request
    planted = tmp_path / "sagemaker-dist-7"
    planted.mkdir(mode=0o777)
    os.chown(planted, 65534, 65534)
    (planted / "node-0").mkdir()
    proc = subprocess.run(
        [*CLI, "--spec", str(spec), "--node-index", "0", "--root", str(planted / "node-0"), "--private-root"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "belongs to uid 65534" in proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and list(planted.iterdir()) == [planted / "node-0"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "linked").symlink_to(elsewhere)
    with pytest.raises(ConfigurationError, match="is not a directory"):
        fresh_private_root(tmp_path / "linked" / "node-0")
    assert list(elsewhere.iterdir()) == []


def test_a_private_root_is_fresh_and_only_its_user_can_enter(tmp_path):
    parent = tmp_path / "sagemaker-dist-8"
    (parent / "node-1" / "input").mkdir(parents=True)  # a cancelled job's stale tree
    parent.chmod(0o755)
    root = fresh_private_root(parent / "node-1")
    assert list(root.iterdir()) == []
    assert stat.S_IMODE(parent.stat().st_mode) == stat.S_IMODE(root.stat().st_mode) == 0o700
    assert fresh_private_root(tmp_path / "new" / "node-0").parent.stat().st_mode & 0o777 == 0o700


def test_per_local_rank_nodes_feed_their_local_channels(demo_request):
    """Without a layout every channel is fed; with one, only the node's ranks' channels."""
    request, _ = demo_request
    assert [c.name for c in plan_node(request, 0).channels] == ["train_0", "validation_0"]
    bare = {
        **request,
        "HyperParameters": {k: v for k, v in request["HyperParameters"].items() if "layout" not in k},
    }
    assert len(plan_node(bare, 0).channels) == 4


def test_on_sigterm_the_agent_outlives_its_nodes_ranks_then_stops(tmp_path):
    """A platform's stop sends SIGTERM to the agent and the ranks alike: with --drain the agent goes on
    (feeding, syncing checkpoints) until the ranks of its tree have ended; SIGINT stops it at once."""
    root, other = tmp_path / "node-0", tmp_path / "node-1"
    (root / "code").mkdir(parents=True)
    rank_env = {k: v for k, v in os.environ.items() if k != "SAGEMAKER_DIST_OPT_ML"}
    rank_env["OMPI_COMM_WORLD_RANK"] = "0"
    sleep = [sys.executable, "-c", "import time, sys; time.sleep(float(sys.argv[1]))"]
    mine = [  # a rank of this tree: started in its code/ (Kubernetes), or told the tree (Slurm)
        subprocess.Popen([*sleep, "2"], env=rank_env, cwd=root / "code"),
        subprocess.Popen([*sleep, "2.5"], env={**rank_env, "SAGEMAKER_DIST_OPT_ML": str(root)}),
    ]
    theirs = [  # another job's ranks on the node: not waited for
        subprocess.Popen([*sleep, "60"], env=rank_env, cwd=tmp_path),
        subprocess.Popen([*sleep, "60"], env={**rank_env, "SAGEMAKER_DIST_OPT_ML": str(other)}),
    ]
    previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        stop, lines = threading.Event(), []
        stop_on_signals(stop, root, drain=30, echo=lines.append)
        signalled = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        assert not stop.wait(1.0) and mine[0].poll() is None  # the ranks still stopping: it goes on
        # then it stops as they end: well inside the 30 s drain (the ranks' own exits may still be
        # under way when it stops, so they are waited for here, briefly)
        assert stop.wait(20) and [p.wait(timeout=5) for p in mine] == [0, 0]
        assert time.monotonic() - signalled < 20 and "until this node's ranks end" in lines[0]
        stop = threading.Event()
        stop_on_signals(stop, root, drain=30)
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.wait(1.0)  # SIGINT (the sbatch script, once its ranks ended): at once
        stop = threading.Event()
        stop_on_signals(stop, other, drain=0)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(1.0)  # no --drain: SIGTERM stops it at once
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
        for proc in theirs:
            proc.kill()
        for proc in (*mine, *theirs):
            proc.wait()
