"""Local mode's pure parts: /opt/ml trees, simulated rank variables, demo records, request checks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sagemaker_dist import JobSpecError, LocalJobError, run_local
from sagemaker_dist.aws.request_validation import RequestValidationError
from sagemaker_dist.contract.hyperparameters import encode_all
from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.contract.rank_slots import mpi_local_environment, rank_slots, slot_environment
from sagemaker_dist.contract.toolkit import script_argv
from sagemaker_dist.contract.training_request import ChannelSpec
from sagemaker_dist.host.lifecycle import SourceDirError, build_host_trees, fetch_source_dir
from sagemaker_dist.local import exit_files
from sagemaker_dist.local.demo_data import encode_example, generate_examples, tfrecord_file
from sagemaker_dist.local.exit_files import alive_lock_held, hold_alive_lock, write_whole
from sagemaker_dist.local.launchers import base as launchers_base
from sagemaker_dist.local.launchers.base import RankGroup, describe_exit
from sagemaker_dist.local.launchers.mpi import LaunchError
from sagemaker_dist.local.launchers.table import IMPLEMENTATIONS, launcher_class
from sagemaker_dist.local.result import final_metrics
from sagemaker_dist.local.supervision import SHOWN_LINES, TRACEBACK, last_output

SCRIPTS = Path(__file__).resolve().parents[1] / "helpers" / "local_scripts"


def _channel(name, mode="Pipe", distribution="FullyReplicated"):
    return {
        "ChannelName": name,
        "InputMode": mode,
        "DataSource": {
            "S3DataSource": {
                "S3DataType": "S3Prefix",
                "S3Uri": "s3://b/p/",
                "S3DataDistributionType": distribution,
            }
        },
    }


def test_host_trees_follow_the_container_contract(tmp_path):
    layout = plan_layout(2, 2)
    hps = {"epochs": 3, "lr": 0.1, "name": "x", "sagemaker_dist_layout": layout.to_json()}
    channels = [ChannelSpec.from_request(c) for c in (_channel("train_0"), _channel("eval", "FastFile"))]
    trees = build_host_trees(tmp_path, ["algo-1", "algo-2"], channels, hps)
    assert [t.name for t in trees] == ["algo-1", "algo-2"]
    config = trees[1].root / "input" / "config"
    resource = json.loads((config / "resourceconfig.json").read_text())
    assert resource["current_host"] == "algo-2" and resource["hosts"] == ["algo-1", "algo-2"]
    stored = json.loads((config / "hyperparameters.json").read_text())
    assert (
        stored["epochs"] == "3" and stored["name"] == "x" and all(isinstance(v, str) for v in stored.values())
    )
    data = json.loads((config / "inputdataconfig.json").read_text())
    assert data["train_0"]["TrainingInputMode"] == "Pipe" and data["eval"]["TrainingInputMode"] == "File"
    env = trees[1].env
    assert env["SAGEMAKER_DIST_OPT_ML"] == str(trees[1].root)
    assert env["SM_CURRENT_HOST"] == "algo-2" and json.loads(env["SM_HOSTS"]) == ["algo-1", "algo-2"]
    assert env["SM_CHANNEL_TRAIN_0"] == str(trees[1].root / "input" / "data" / "train_0")
    assert env["SM_HP_EPOCHS"] == "3" and "SM_HP_SAGEMAKER_DIST_LAYOUT" not in env
    assert json.loads(env["SM_HPS"]) == {"epochs": 3, "lr": 0.1, "name": "x"}
    assert script_argv(encode_all(hps)) == ["--epochs", "3", "--lr", "0.1", "--name", "x"]


@pytest.mark.parametrize(("rank", "local", "cross"), [(0, 0, 0), (1, 1, 0), (2, 0, 1), (5, 1, 2)])
def test_simulated_rank_env_fills_hosts_in_order(rank, local, cross):
    slot = rank_slots(["algo-1", "algo-2", "algo-3"], 2)[rank]
    assert (slot.rank, slot.size, slot.host) == (rank, 6, f"algo-{cross + 1}")
    env = slot_environment(slot)
    assert "OMPI_COMM_WORLD_LOCAL_RANK" not in env
    assert mpi_local_environment(slot)["OMPI_COMM_WORLD_LOCAL_RANK"] == str(local)
    assert env["HOROVOD_LOCAL_RANK"] == str(local) and env["HOROVOD_LOCAL_SIZE"] == "2"
    assert env["HOROVOD_CROSS_RANK"] == str(cross) and env["HOROVOD_CROSS_SIZE"] == "3"
    assert env["HOROVOD_HOSTNAME"] == f"algo-{cross + 1}"


def test_demo_records_are_tf_examples_in_valid_tfrecord_framing(tmp_path):
    tf = pytest.importorskip("tensorflow")
    path = tmp_path / "demo.tfrecord"
    path.write_bytes(tfrecord_file(5, seed=3))
    expected = list(generate_examples(5, seed=3))
    records = list(tf.data.TFRecordDataset(str(path)))  # checks both CRCs of every record
    assert len(records) == 5
    for raw, (image, label) in zip(records, expected):
        example = tf.train.Example.FromString(raw.numpy())
        assert example.features.feature["image"].bytes_list.value == [image]
        assert example.features.feature["label"].int64_list.value == [label]
        assert len(image) == 32 * 32 * 3
    negative = tf.train.Example.FromString(encode_example({"v": [-1, 2**40]}))
    assert list(negative.features.feature["v"].int64_list.value) == [-1, 2**40]


def test_final_metrics_from_keras_lines_or_metric_definitions():
    lines = [
        "Epoch 1/2",
        "8/8 - 3s - loss: 2.29 - accuracy: 0.10 - val_loss: 2.28",
        "Epoch 2/2",
        "8/8 - 0s - loss: 2.24 - accuracy: 0.12 - val_loss: 2.30 - 445ms/epoch",
    ]
    assert final_metrics(lines, []) == {"loss": 2.24, "accuracy": 0.12, "val_loss": 2.30}
    definitions = [{"Name": "train:loss", "Regex": r"loss: ([0-9.]+) -"}]
    assert final_metrics(lines, definitions) == {"train:loss": 2.24}
    # the helpers' metric line (the PyTorch helpers print no Keras progress)
    torch_lines = [
        "sagemaker-dist-metrics: epoch=1 accuracy=0.078125 loss=2.3081006 val_loss=2.29",
        "sagemaker-dist-metrics: epoch=2 accuracy=0.5 loss=1.5e-01 val_loss=2.1",
        "rank 0: trained 32 record(s)",
    ]
    assert final_metrics(torch_lines, []) == {"accuracy": 0.5, "loss": 0.15, "val_loss": 2.1}


def test_launcher_commands_and_exit_descriptions():
    cmd = launcher_class("horovodrun").rank_command(4, sys.executable)
    assert cmd[1:6] == ["--gloo", "-np", "4", "-H", "localhost:4"]
    assert cmd[-2:] == ["-m", "sagemaker_dist.local.rank_entry"]
    with pytest.raises(LaunchError, match="one of"):
        launcher_class("srun")
    assert describe_exit(137) == "code 137 (killed by SIGKILL)"
    assert describe_exit(-15) == "code -15 (killed by SIGTERM)"


def test_every_registered_launcher_has_one_implementation_of_the_protocol():
    """The table holds each launcher the registry names (and no other), each under its own name."""
    from sagemaker_dist.contract.distributions import REGISTRY, USER_LAUNCHERS
    from sagemaker_dist.local.launchers.base import Launcher

    registered = set(USER_LAUNCHERS) | {name for d in REGISTRY.values() for name in d.local_launchers}
    assert set(IMPLEMENTATIONS) == registered
    for name, implementation in IMPLEMENTATIONS.items():
        assert issubclass(implementation, Launcher) and implementation.name == name
        assert not getattr(implementation, "__abstractmethods__", None), name
    # the toolkit's and the image's hosts start the ranks: the CLI simulates one host by default
    assert {n for n, cls in IMPLEMENTATIONS.items() if cls.defaults_to_one_host} == {"toolkit", "container"}


def _request(**hps):
    return {
        "TrainingJobName": "j",
        "RoleArn": "arn:aws:iam::000000000000:role/r",
        "AlgorithmSpecification": {"TrainingInputMode": "Pipe"},
        "ResourceConfig": {"InstanceCount": 2, "InstanceType": "ml.c5.xlarge"},
        "HyperParameters": hps,
        "InputDataConfig": [_channel("train_0")],
        "OutputDataConfig": {"S3OutputPath": "s3://b/out"},
    }


def test_bad_requests_fail_before_anything_starts(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    layout = plan_layout(1, 2).to_json()
    with pytest.raises(JobSpecError, match="layout hyperparameter is for 1 host"):
        run_local(_request(sagemaker_program="train.py", sagemaker_dist_layout=layout), tmp_path)
    with pytest.raises(JobSpecError, match="sagemaker_program"):
        run_local(_request(), tmp_path)
    with pytest.raises(SourceDirError, match="'missing.py' is not in the source dir"):
        run_local(_request(sagemaker_program="missing.py"), tmp_path, work_dir=tmp_path / "w")
    assert not os.listdir(tmp_path / "w")  # nothing left behind
    bad = {**_request(sagemaker_program="train.py"), "InputDataConfig": [], "TrainingJobName": "a_b"}
    with pytest.raises(RequestValidationError, match=r"(?s)job name .a_b. is not valid.*has no channels"):
        run_local(bad, tmp_path, work_dir=tmp_path / "w")  # validated first, as CreateTrainingJob would
    assert not os.listdir(tmp_path / "w")
    with pytest.raises(JobSpecError, match="whole number"):
        run_local(
            _request(sagemaker_program="train.py", sagemaker_mpi_num_of_processes_per_host="two"), tmp_path
        )


def test_source_comes_from_the_submit_directory_tarball_without_a_source_dir(s3, bucket, tmp_path):
    import io
    import tarfile

    from sagemaker_dist.aws.s3_objects import s3_client

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = 12
        tar.addfile(info, io.BytesIO(b"print('hi')\n"))
    s3.put_object(Bucket=bucket, Key="src/sourcedir.tar.gz", Body=buf.getvalue())
    code = fetch_source_dir(None, f"s3://{bucket}/src/sourcedir.tar.gz", tmp_path, s3_client())
    assert (code / "train.py").read_text() == "print('hi')\n"
    (tmp_path / "x").mkdir()
    with pytest.raises(SourceDirError, match="cannot download the source package"):
        fetch_source_dir(None, f"s3://{bucket}/nope.tar.gz", tmp_path / "x", s3_client())


def test_cli_request_file_errors_name_the_file_and_job_options_are_refused(tmp_path, capsys):
    from sagemaker_dist.cli import main

    def error(*argv):
        assert main(["local", *argv]) == 2
        return capsys.readouterr().err

    missing = tmp_path / "nope.json"
    assert f"error: request file {missing} does not exist" in error("--request", str(missing))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert f"request file {broken} is not valid JSON" in error("--request", str(broken))
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    assert "holds a JSON list" in error("--request", str(listed))
    good = tmp_path / "request.json"
    good.write_text(json.dumps(_request(sagemaker_program="train.py")))
    err = error("--request", str(good), "--hosts", "3", "--epochs", "2", "--checkpoint-s3-uri", "s3://b/c")
    assert "--hosts, --epochs, --checkpoint-s3-uri cannot be combined with --request" in err
    err = error("--request", str(good), "--shuffle-seed", "3")
    assert "--shuffle-seed cannot be combined with --request" in err


def test_demo_data_creates_buckets_only_on_a_local_endpoint(s3, aws_env, capsys):
    from sagemaker_dist.cli import main
    from sagemaker_dist.local.demo_data import DemoDataError, write_demo_data

    missing = "sagemaker-dist-no-such-bucket"
    with pytest.raises(DemoDataError, match=f"bucket {missing} not found or not accessible"):
        write_demo_data(f"s3://{missing}/d/", files=1, records_per_file=1, client=s3)
    assert missing not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    # an explicit endpoint (like the embedded one) starts empty: there the command creates it
    url = aws_env["AWS_ENDPOINT_URL"]
    argv = ["demo-data", "--endpoint-url", url, "--prefix", f"s3://{missing}/d/", "--files", "1"]
    assert main([*argv, "--records-per-file", "1", "--validation-files", "0"]) == 0, capsys.readouterr()
    assert s3.list_objects_v2(Bucket=missing, Prefix="d/train/")["KeyCount"] == 1


def test_a_rank_entry_starts_without_a_module_warning(tmp_path):
    """`python -m sagemaker_dist.local.rank_entry` must not find itself already imported by its package."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_"))}
    proc = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-m", "sagemaker_dist.local.rank_entry"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert "RuntimeWarning" not in proc.stderr, proc.stderr
    assert proc.returncode != 0 and "SAGEMAKER_DIST_LOCAL_JOB is not set" in proc.stderr, proc.stderr


def _local_args(*argv):
    from sagemaker_dist.cli import build_parser

    return build_parser().parse_args(["local", *argv])


def test_entry_point_jobs_are_named_after_their_script_not_the_demo():
    from sagemaker_dist.cli.local import entry_point_estimator
    from sagemaker_dist.local.defaults import LOCAL_INSTANCE_TYPE, LOCAL_ROLE

    args = _local_args(
        "--entry-point", "count_records.py", "--source-dir", str(SCRIPTS), "--train", "s3://b-x/t/"
    )
    est = entry_point_estimator(args, "b-x", 2, 1, "Pipe")
    assert est.base_job_name == "count-records" and "demo" not in est.base_job_name
    assert (est.role, est.instance_type, est.validation) == (LOCAL_ROLE, LOCAL_INSTANCE_TYPE, "per-worker")
    args = _local_args(
        "--entry-point",
        "count_records.py",
        "--source-dir",
        str(SCRIPTS),
        "--train",
        "s3://b-x/t/",
        "--role",
        "arn:aws:iam::123456789012:role/Mine",
        "--instance-type",
        "ml.m5.large",
        "--validation-spread",
        "single",
    )
    est = entry_point_estimator(args, "b-x", 2, 1, "Pipe")
    assert (est.role, est.instance_type, est.validation) == (
        "arn:aws:iam::123456789012:role/Mine",
        "ml.m5.large",
        "single",
    )


def test_validation_help_says_it_is_sharded_per_worker(capsys):
    from sagemaker_dist.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["local", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "one channel all ranks read)" not in help_text
    assert "sharded per rank like --train" in help_text


def test_the_demo_refuses_entry_point_options():
    from sagemaker_dist.cli import main

    assert main(["local", "--demo", "--job-name", "mine", "--endpoint-url", "http://127.0.0.1:9"]) == 2


def test_an_unresolvable_host_name_is_refused_before_gloo_crashes():
    from sagemaker_dist.local.launchers.mpi import check_hostname_resolves

    check_hostname_resolves("localhost")
    with pytest.raises(LaunchError, match=r"host name 'no-such-host\.invalid' does not resolve.*/etc/hosts"):
        check_hostname_resolves("no-such-host.invalid")


def test_the_machines_own_host_name_is_the_one_checked():
    """In a UTS namespace whose host name does not resolve (where Gloo segfaults), the check says so."""
    import shutil

    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare for a private host name")
    code = "from sagemaker_dist.local.launchers.mpi import check_hostname_resolves; check_hostname_resolves()"
    proc = subprocess.run(
        ["unshare", "-u", "sh", "-c", f'hostname gloo-cannot-resolve-me && "{sys.executable}" -c "{code}"'],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "'gloo-cannot-resolve-me' does not resolve" in proc.stderr, proc.stderr


def test_a_hyperparameter_the_toolkits_shell_cannot_parse_fails_the_local_job_as_it_would_fail_the_real_one(
    tmp_path, aws_env, s3, bucket
):
    (tmp_path / "train.py").write_text("print('hi')\n")
    request = _request(sagemaker_program="train.py", note="it's broken")
    request["ResourceConfig"]["InstanceCount"] = 1
    request["InputDataConfig"] = [
        _channel("train_0")
        | {
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": f"s3://{bucket}/none/",
                    "S3DataDistributionType": "FullyReplicated",
                }
            }
        }
    ]
    s3.put_object(Bucket=bucket, Key="none/x", Body=b"")
    with pytest.raises(LocalJobError, match=r"'note' = \"it's broken\".*broken command line.*unterminated"):
        run_local(request, tmp_path, work_dir=tmp_path / "w")
    assert not os.listdir(tmp_path / "w")  # refused before any rank started


def test_mpirun_tags_inside_a_line_are_split_by_rank():
    """Under load mpirun tags chunks, not lines (both captured from real runs): a rank's line written in
    parts carries its own tag inside; two ranks' lines run together carry the other rank's."""
    from sagemaker_dist.local.launchers.mpi import split_inner_tags

    parts = "RuntimeError[1,mpirank:1,algo-1]<stderr>:: [1,mpirank:1,algo-1]<stderr>:rank 1 failed on purpose"
    assert split_inner_tags(1, parts) == [(1, "RuntimeError: rank 1 failed on purpose")]
    joined = "env rank=0 host=algo-1 bytes=12504[1,1]<stdout>:env rank=1 host=algo-2 bytes=12504"
    assert split_inner_tags(0, joined) == [
        (0, "env rank=0 host=algo-1 bytes=12504"),
        (1, "env rank=1 host=algo-2 bytes=12504"),
    ]
    assert split_inner_tags(0, "abc[1,0]<stdout>:") == [(0, "abc")]
    assert split_inner_tags(0, "") == [(0, "")]
    assert split_inner_tags(0, "x[1,1]<stdout>:y[1,0]<stdout>:z") == [(0, "x"), (1, "y"), (0, "z")]


def test_demo_data_with_one_count_per_file_writes_files_of_those_sizes(s3, bucket):
    from sagemaker_dist import write_demo_data
    from sagemaker_dist.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="2 count"):
        write_demo_data(f"s3://{bucket}/d/", files=3, records_per_file=[1, 2], client=s3)
    data = write_demo_data(
        f"s3://{bucket}/d/", files=3, records_per_file=[1, 5, 9], validation_files=1, client=s3
    )
    sizes = [o["Size"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="d/train/")["Contents"]]
    assert sizes[0] < sizes[1] < sizes[2] and sizes[1] == 5 * sizes[0]  # records of one size each
    assert data.records == 1 + 5 + 9 + 5  # the validation file gets the mean count


def test_the_container_launcher_builds_its_host_without_starting_it(tmp_path, monkeypatch):
    """One host: ``podman run IMAGE train`` in the job's private network, the one worker's lines as rank
    0's; several hosts: the cluster's interface, and an S3 endpoint its network cannot reach refused in
    ``check()``. Nothing is started (no image needed)."""
    from contextlib import ExitStack

    from sagemaker_dist.host.job_spec import JobSpec
    from sagemaker_dist.host.lifecycle import host_trees_for
    from sagemaker_dist.local.launchers import toolkit_hosts
    from sagemaker_dist.local.launchers.base import JobSetup, LaunchOptions
    from sagemaker_dist.local.launchers.cluster_plan import INTERFACE
    from sagemaker_dist.local.launchers.container import ContainerGroup, ContainerLauncherError
    from sagemaker_dist.local.launchers.private_net import PrivateNet
    from sagemaker_dist.local.launchers.table import launcher_for

    monkeypatch.setattr(toolkit_hosts, "check_container_image", lambda image: image)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    request = {**_request(sagemaker_program="train.py"), "ResourceConfig": {"InstanceCount": 1}}
    job = JobSpec.from_request(request)
    launcher = launcher_for(job.distribution, "container")(job, LaunchOptions(image="localhost/img:1"))
    launcher.check()
    assert launcher.interface == "lo" and job.world == 1
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("")
    trees = host_trees_for(job, tmp_path / "hosts", launcher.interface)
    with ExitStack() as stack:
        setup = JobSetup(job, trees, tmp_path / "code", tmp_path / "code", tmp_path, None, print, stack)
        group = launcher.group(setup)
    assert isinstance(group, ContainerGroup) and isinstance(group.network, PrivateNet)
    assert group.command[:2] == ["podman", "run"] and group.command[-2:] == ["localhost/img:1", "train"]
    assert group.untagged_rank == 0 and group.proc is None
    assert (trees[0].root / "code" / "train.py").is_file()  # the given source dir, where the toolkit looks

    two_hosts = JobSpec.from_request({**request, "ResourceConfig": {"InstanceCount": 2}})
    cluster = launcher_for(two_hosts.distribution, "container")(
        two_hosts, LaunchOptions(image="localhost/img:1")
    )
    assert cluster.interface == INTERFACE
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://10.1.2.3:9000")
    with pytest.raises(ContainerLauncherError):
        cluster.check()


def test_a_failed_ranks_shown_output_keeps_its_traceback():
    raised = [TRACEBACK, '  File "train.py", line 9, in <module>', "    boom()", "RuntimeError: boom"]
    shutdown = [f"shutdown line {i}" for i in range(30)]
    # the traceback, the lines skipped counted, then the last lines as usual
    assert last_output(["epoch 1"] * 30 + raised + shutdown) == (
        raised + ["... (18 lines)"] + shutdown[-SHOWN_LINES:]
    )
    plain = [f"line {i}" for i in range(30)]
    assert last_output(plain) == plain[-SHOWN_LINES:]
    assert last_output(["a", "b"] + raised) == ["a", "b"] + raised  # within the tail: the tail alone
    assert last_output(raised + shutdown[:10]) == raised + shutdown[:10]  # adjoining: nothing skipped
    assert last_output(raised + plain * 8) == (plain * 8)[-SHOWN_LINES:]  # too far back: not looked for


_HOLDS_THEN_DROPS_ITS_LOCK = """
import os, sys, threading, time
from pathlib import Path
from sagemaker_dist.local.exit_files import hold_alive_lock, write_whole
pid_dir, then, rank = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
fd = hold_alive_lock(pid_dir / f"{rank}.alive")
write_whole(pid_dir / f"{rank}.pid", str(os.getpid()))
for _ in range(4):  # a rank has threads (its framework's)
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
if then == "drop":
    os.close(fd)  # as a killed process's files close before its exit ends
if then == "exec":  # a script that becomes another program is the same rank
    os.execv(sys.executable, [sys.executable, "-c", "import pathlib, sys, time; "
             "pathlib.Path(sys.argv[1], 'ready').write_text(''); time.sleep(60)", sys.argv[1]])
(pid_dir / "ready").write_text("")
time.sleep(60)
"""


def _start_rank(tmp_path, then: str, rank: int = 1, **popen) -> subprocess.Popen:
    """A process that takes rank ``rank``'s lock as ``rank_entry`` does, then ``then`` (keep, drop, exec)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDS_THEN_DROPS_ITS_LOCK, str(tmp_path), then, str(rank)], **popen
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (tmp_path / "ready").exists(), f"the rank never took its lock (exit {proc.poll()})"
    return proc


@pytest.mark.parametrize("then", ["keep", "exec", "drop"])
def test_a_rank_that_let_its_lock_go_is_blamed_before_a_peer_that_failed_while_it_ended(tmp_path, then):
    """A killed rank closes its files, then its sockets; a peer can fail on them and exit while /proc
    still shows the killed one running. Its lock, let go with its files, says which came first."""
    rank_1 = _start_rank(tmp_path, then)
    try:
        group = RankGroup([], {}, tmp_path, 2, on_line=lambda *_: None)
        group.watch()
        write_whole(tmp_path / "0.exit", "1")  # the peer fails
        time.sleep(0.05)
        group.watch()  # rank 1 still running, after the peer's exit
        assert rank_1.poll() is None
    finally:
        rank_1.kill()
        rank_1.wait(10)
    if then == "drop":  # it had let its lock go: its end began before the peer failed
        assert group.first_failure() == (1, "died (killed or crashed without exiting)")
    else:  # it held its lock (an exec keeps it) when the peer failed
        assert group.first_failure() == (0, "exited with code 1")


def test_a_rank_that_runs_on_without_its_lock_counts_as_alive(tmp_path, monkeypatch):
    """A rank that let go of its lock and runs on (one that closed every descriptor) is alive: /proc
    alone says, so a peer that fails later is the one named."""
    monkeypatch.setattr(launchers_base, "LOCK_GONE_S", 0.2)
    rank_1 = _start_rank(tmp_path, "drop")
    try:
        group = RankGroup([], {}, tmp_path, 2, on_line=lambda *_: None)
        group.watch()
        assert 1 not in group.last_alive  # while it may be ending: no newer sign of life
        time.sleep(0.3)
        group.watch()
        assert 1 in group.lockless and 1 in group.last_alive
        time.sleep(0.05)
        write_whole(tmp_path / "0.exit", "1")
        time.sleep(0.05)
        group.watch()
    finally:
        rank_1.kill()
        rank_1.wait(10)
    assert group.first_failure() == (0, "exited with code 1")


def test_a_killed_ranks_lock_is_free_by_the_time_its_peer_reads_the_end_of_its_socket(tmp_path):
    """The order the supervisor relies on, from the kernel: SIGKILL a rank with threads and a
    socket; when the peer's read sees the socket end, the rank's lock is already free."""
    for attempt in range(5):
        (tmp_path / "ready").unlink(missing_ok=True)
        peer, ranks_end = socket.socketpair()
        rank = _start_rank(tmp_path, "keep", rank=attempt, pass_fds=[ranks_end.fileno()])
        ranks_end.close()  # the rank's end is now the rank's alone
        try:
            assert alive_lock_held(tmp_path / f"{attempt}.alive") is True
            peer.settimeout(30)
            rank.send_signal(signal.SIGKILL)
            assert peer.recv(1) == b""  # the rank's socket is gone
            assert alive_lock_held(tmp_path / f"{attempt}.alive") is False
        finally:
            peer.close()
            rank.kill()
            rank.wait(10)


def test_a_second_process_of_a_rank_cannot_take_its_lock(tmp_path, monkeypatch):
    path = tmp_path / "0.alive"
    assert alive_lock_held(path) is None
    holder = _start_rank(tmp_path, "keep", rank=0)
    try:
        assert alive_lock_held(path) is True
        monkeypatch.setattr(exit_files, "LOCK_WAIT_S", 0.3)
        with pytest.raises(SystemExit, match=r"0\.alive stayed locked for 0 s: another process of this rank"):
            hold_alive_lock(path)
    finally:
        holder.kill()
        holder.wait(10)
    assert alive_lock_held(path) is False
    os.close(hold_alive_lock(path))  # free again: taken at once


def test_a_toolkit_host_keeps_the_shells_mpi_tuning_but_always_tags_torchrun_lines():
    """The MPI ranks' yield is a default for ranks sharing one machine, which a user may turn off in the
    shell; torchrun's --tee is what local mode's line tagging reads, so the shell cannot turn it off."""
    from sagemaker_dist.local.launchers.container import toolkit_host_env

    assert toolkit_host_env("horovod", None, {}) == {"OMPI_MCA_mpi_yield_when_idle": "1"}
    assert toolkit_host_env("horovod", None, {"OMPI_MCA_mpi_yield_when_idle": "0"}) == {}
    assert toolkit_host_env("horovod", {"OMPI_MCA_mpi_yield_when_idle": "0"}, {}) == {
        "OMPI_MCA_mpi_yield_when_idle": "0"
    }
    assert toolkit_host_env("torchrun", None, {"PET_TEE": "0"}) == {"PET_TEE": "3"}
    assert toolkit_host_env("tf-mwms", {"X": "1"}, {}) == {"X": "1"}
