"""Several hosts in the training image, as SageMaker runs a multi-instance job: one container per host on
a private --internal podman network, the image's own toolkit starting sshd and mpirun across hosts (or
TF_CONFIG for tf-mwms, or torchrun on each host in the PyTorch image), Pipe FIFOs of every host fed from
this machine, the moto S3 server on this machine's loopback relayed into each host.

Marked ``image``: scripts/container-test.sh builds the images and runs these. A job that succeeds pays
the toolkit's own 30 s sleeps after mpirun (the master's and the workers'); the faults do not.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers.runtime_helpers import terminal_sigint

from sagemaker_dist import LocalBackend, LocalJobFailed, run_local
from sagemaker_dist.local.demo import DEMO_JOB_DIR, demo_estimator
from sagemaker_dist.local.demo_data import write_demo_data
from sagemaker_dist.local.launchers import cluster
from sagemaker_dist.local.launchers.cluster_plan import LABEL

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
BIN = Path(sys.executable).parent
IMAGE = os.environ.get("SAGEMAKER_DIST_TEST_IMAGE")
MWMS_IMAGE = os.environ.get("SAGEMAKER_DIST_TEST_MWMS_IMAGE")
TORCH_IMAGE = os.environ.get("SAGEMAKER_DIST_TEST_TORCH_IMAGE")
NO_KEYS_IMAGE = "localhost/sagemaker-dist:test-no-ssh-keys"

pytestmark = pytest.mark.image


def _podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


def _left_behind() -> tuple[list[str], list[str]]:
    """The job containers and networks still in podman's storage (every job labels its own)."""
    containers = _podman("ps", "--all", "--filter", f"label={LABEL}", "--format", "{{.Names}}").stdout.split()
    networks = _podman("network", "ls", "--filter", f"label={LABEL}", "--format", "{{.Name}}").stdout.split()
    return containers, networks


@pytest.fixture(autouse=True)
def _nothing_left_behind():
    assert _left_behind() == ([], []), "a job container or network was there before the test"
    yield
    assert _left_behind() == ([], [])


def _request(s3, bucket, source_dir: Path, entry_point: str, hosts: int, per_host: int, hps: dict, **kw):
    """Pipe mode; the source package goes to S3 (every host's toolkit downloads it, through the relay)."""
    write_demo_data(f"s3://{bucket}/data/", files=8, records_per_file=16, validation_files=4, client=s3)
    estimator = demo_estimator(
        bucket, hosts, per_host, "Pipe", hps, source_dir=source_dir, entry_point=entry_point, **kw
    )
    inputs = {"train": f"s3://{bucket}/data/train/", "validation": f"s3://{bucket}/data/validation/"}
    return estimator.prepare(inputs, printer=None, backend=LocalBackend()).request  # CPU types: here


def _apart(lines: list[str]) -> list[str]:
    """Job lines that are neither a rank's, a toolkit's nor a command: there must be none."""
    keep = ("[rank ", "[toolkit algo-", "$ ", "local job ")
    started = next(i for i, line in enumerate(lines) if line.startswith("local job "))
    ended = next((i for i, line in enumerate(lines) if " finished in " in line), len(lines))
    return [line for line in lines[started:ended] if not line.startswith(keep)]


def _each_of_four_ranks_read_its_own_fifo(result, epochs: int) -> None:
    """2 hosts x 2 ranks: each rank read its own FIFO on its own host, every FIFO to its end (the demo
    data of ``_request``: 8 files of 16 records)."""
    fed = {(s.host, s.channel): s.bytes for s in result.feed_stats}
    for rank in range(4):
        assert fed[f"algo-{rank // 2 + 1}", f"train_{rank}"] > 0, fed
    assert [(r.rank, r.host) for r in result.ranks] == [
        (0, "algo-1"),
        (1, "algo-1"),
        (2, "algo-2"),
        (3, "algo-2"),
    ]
    assert sum(r.records for r in result.ranks) == epochs * 8 * 16, result.ranks


# Above the job's own 500 s limit, so that the job's bound is what ends a slow run, naming what it waited
# for (about 90 s alone; after another image job, its ranks once took 260 s to open their FIFOs)
@pytest.mark.timeout(560)
def test_two_hosts_of_two_ranks_train_the_demo(s3, bucket, tmp_path):
    request = _request(s3, bucket, DEMO_JOB_DIR, "train_cifar10.py", 2, 2, {"epochs": 2, "batch_size": 16})
    lines: list[str] = []
    started = time.monotonic()
    result = run_local(request, launcher="container", image=IMAGE, work_dir=tmp_path, echo=lines.append,
                       keep_work_dir=True, timeout=500)  # fmt: skip
    took = time.monotonic() - started
    out = "\n".join(lines)
    create = [line for line in lines if line.startswith("$ podman create ")]
    assert len(create) == 2 and all(f"--hostname algo-{i + 1} " in c for i, c in enumerate(create)), create
    assert any(line.startswith("$ podman network create --internal --subnet ") for line in lines)
    mpirun = [
        line for line in lines if line.startswith("[toolkit algo-1] mpirun --host algo-1:2,algo-2:2 -np 4 ")
    ]
    assert mpirun and "btl_tcp_if_include eth0" in mpirun[0] and "oob_tcp_if_include eth0" in mpirun[0], out[
        -3000:
    ]
    assert "[toolkit algo-1] " in out and "[toolkit algo-2] " in out
    assert _apart(lines) == []
    for rank in range(4):
        assert f"[rank {rank} algo-{rank // 2 + 1}] " in out, f"rank {rank}: " + out[-3000:]
    ends = [line for line in lines if "train epoch ended for every rank" in line]
    assert len(ends) == 2 and all(e.startswith("[rank 0 algo-1] ") for e in ends), out[-3000:]
    assert all("Records read per rank: [" in e for e in ends)
    _each_of_four_ranks_read_its_own_fifo(result, epochs=2)
    assert "loss" in result.metrics and result.model_uri, out[-3000:]
    assert s3.head_object(Bucket=bucket, Key=result.model_uri.split("/", 3)[3])["ContentLength"] > 0
    hosts = Path(result.work_dir) / "hosts"
    for name in ("algo-1", "algo-2"):
        resource = json.loads((hosts / name / "input" / "config" / "resourceconfig.json").read_text())
        assert resource["network_interface_name"] == "eth0" and resource["current_host"] == name
        assert (hosts / name / "code" / "train_cifar10.py").is_file()  # downloaded from S3 via the relay
        assert (hosts / name / "output" / "success").is_file()
    assert (hosts / "algo-1" / "model" / "1" / "saved_model.pb").is_file()
    print(f"2 x 2 demo in containers: {took:.0f} s")


def test_tf_mwms_on_two_hosts(s3, bucket, tmp_path):
    request = _request(
        s3, bucket, DEMO_JOB_DIR, "train_cifar10.py", 2, 1, {"epochs": 2}, distribution="tf-mwms"
    )
    lines: list[str] = []
    started = time.monotonic()
    result = run_local(request, launcher="container", image=MWMS_IMAGE, work_dir=tmp_path, echo=lines.append,
                       keep_work_dir=True, timeout=400)  # fmt: skip
    took = time.monotonic() - started
    out = "\n".join(lines)
    assert "mpirun" not in out
    for name in ("algo-1", "algo-2"):
        assert f"[toolkit {name}] " in out and "multi_worker_mirrored_strategy setup" in out, out[-3000:]
    assert "MultiWorkerMirroredStrategy: 2 worker(s)" in out, out[-3000:]
    assert "[rank 1 algo-2] " in out and _apart(lines) == []
    fed = {(s.host, s.channel): s.bytes for s in result.feed_stats}
    assert fed["algo-1", "train_0"] > 0 and fed["algo-2", "train_1"] > 0, fed
    assert "loss" in result.metrics and result.model_uri, out[-3000:]
    for name in ("algo-1", "algo-2"):
        assert (Path(result.work_dir) / "hosts" / name / "output" / "success").is_file()
    print(f"2-host tf-mwms in containers: {took:.0f} s")


def test_torchrun_on_two_hosts_of_two_ranks_trains_the_torch_demo(s3, bucket, tmp_path):
    """The PyTorch image: each host's toolkit (sagemaker-pytorch-training) runs torchrun against
    algo-1:7777, Gloo across the hosts' network, each rank on its own FIFO."""
    hps = {"epochs": 1, "batch_size": 16}
    request = _request(s3, bucket, DEMO_JOB_DIR, "train_torch.py", 2, 2, hps, distribution="torchrun")
    lines: list[str] = []
    started = time.monotonic()
    result = run_local(request, launcher="container", image=TORCH_IMAGE, work_dir=tmp_path, echo=lines.append,
                       keep_work_dir=True, timeout=400)  # fmt: skip
    took = time.monotonic() - started
    out = "\n".join(lines)
    for node in range(2):  # the toolkit's own command on each host, as in the PyTorch DLC
        shown = (
            "torchrun --nnodes 2 --nproc_per_node 2 --master_addr algo-1 --master_port 7777 "
            f"--node_rank {node} train_torch.py"
        )
        assert any(line.startswith(f"[toolkit algo-{node + 1}] ") and shown in line for line in lines), out[
            -4000:
        ]
    assert "mpirun" not in out and _apart(lines) == []
    for rank in range(4):
        assert f"[rank {rank} algo-{rank // 2 + 1}] rank {rank}: trained " in out, out[-3000:]
    _each_of_four_ranks_read_its_own_fifo(result, epochs=1)
    assert "val_accuracy" in result.metrics and result.model_uri, out[-3000:]
    for name in ("algo-1", "algo-2"):
        assert (Path(result.work_dir) / "hosts" / name / "output" / "success").is_file()
    assert (Path(result.work_dir) / "hosts" / "algo-1" / "model" / "model.pt").is_file()
    print(f"2 x 2 torchrun demo in containers: {took:.0f} s")


def test_a_torchrun_rank_raising_on_algo_2_is_named_with_its_traceback(s3, bucket, tmp_path):
    request = _request(s3, bucket, SCRIPTS, "torch_rank.py", 2, 2, {"fail_rank": 3}, distribution="torchrun")
    lines: list[str] = []
    with pytest.raises(LocalJobFailed) as failure:
        run_local(
            request,
            launcher="container",
            image=TORCH_IMAGE,
            work_dir=tmp_path,
            echo=lines.append,
            timeout=300,
        )
    message = str(failure.value)
    # torchrun on algo-2 blames rank 3 (its root cause), not rank 2, which it stopped
    assert message.startswith("rank 3 (host algo-2) "), message + "\n".join(lines[-40:])
    assert "ValueError: boom at rank 3" in message, message


def test_a_worker_host_that_dies_stops_the_job_naming_it(s3, bucket, tmp_path):
    request = _request(s3, bucket, SCRIPTS, "cluster_rank.py", 2, 1, {})
    killed: dict = {}

    def echo(line: str) -> None:
        if "up on algo-2" in line and not killed:
            killed["at"], killed["line"] = time.monotonic(), line
            name = next(n for n in _left_behind()[0] if n.endswith("-algo-2"))
            killed["done"] = _podman("kill", name)

    with pytest.raises(LocalJobFailed) as failure:
        run_local(request, launcher="container", image=IMAGE, work_dir=tmp_path, echo=echo, timeout=300)
    stopped_after = time.monotonic() - killed["at"]
    message = str(failure.value)
    assert killed["done"].returncode == 0, killed["done"].stderr
    assert message.startswith("host algo-2 (rank(s) 1) died: its container exited with code 137"), message
    # local mode's MPI ranks yield when idle (all hosts share this machine's cores), on algo-2 too
    assert killed["line"].endswith("up on algo-2 (MPI yields when idle: 1)"), killed["line"]
    assert stopped_after < 30, f"stopped {stopped_after:.1f} s after algo-2 died"
    print(f"stopped {stopped_after:.1f} s after algo-2's container was killed")


def test_a_rank_raising_on_algo_2_has_its_traceback_in_the_error(s3, bucket, tmp_path):
    request = _request(s3, bucket, SCRIPTS, "cluster_rank.py", 2, 1, {"fail_rank": 1})
    lines: list[str] = []
    with pytest.raises(LocalJobFailed) as failure:
        run_local(
            request, launcher="container", image=IMAGE, work_dir=tmp_path, echo=lines.append, timeout=300
        )
    message = str(failure.value)
    assert message.startswith("rank 1 (host algo-2) "), message + "\n".join(lines[-40:])
    # the traceback's last frames, as for one host (the rank's last 12 lines). mpirun relays a remote
    # rank's output in the pieces it was written in, each tagged as a line of its own: Python writes an
    # exception's type and its message apart, so they may come on two lines
    assert 'File "cluster_rank.py", line' in message and re.search(
        r"RuntimeError\s*: rank 1 failed on purpose on algo-2", message
    ), message + "\n-- the job's last lines --\n" + "\n".join(lines[-60:])
    assert "/opt/ml/output/failure says:" in message


def test_a_host_whose_ssh_never_lets_the_master_in_is_named_before_mpirun(s3, bucket, tmp_path, monkeypatch):
    """An image without root's authorized key: sshd runs on the master, but no host can log into
    another, so the master's toolkit would wait an hour for algo-2 (and algo-2 for ever for it)."""
    build = ["podman", "build", "--format", "docker", "-t", NO_KEYS_IMAGE, "-f", "-", str(tmp_path)]
    containerfile = f"FROM {IMAGE}\nRUN rm /root/.ssh/authorized_keys\n"
    built = subprocess.run(build, input=containerfile, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    monkeypatch.setattr(cluster, "SSH_WAIT_S", 10.0)
    request = _request(s3, bucket, SCRIPTS, "cluster_rank.py", 2, 1, {})
    lines: list[str] = []
    try:
        with pytest.raises(LocalJobFailed) as failure:
            run_local(request, launcher="container", image=NO_KEYS_IMAGE, work_dir=tmp_path / "work",
                      echo=lines.append, timeout=300)  # fmt: skip
    finally:
        _podman("rmi", "--force", NO_KEYS_IMAGE)
    message = str(failure.value)
    print(message)
    assert message.startswith("host algo-2 (rank(s) 1) was never reached by SSH"), message
    assert "Its SSH did not let algo-1 in within 1" in message and "mpirun never started" in message, message
    # what each toolkit last said: algo-1 cannot reach algo-2, which waits to log into algo-1 first
    assert "algo-1's toolkit last said: cannot connect to host algo-2: " in message, message
    assert "algo-2's toolkit is still waiting to log into algo-1 (" in message, message
    assert not any(" mpirun --host " in line for line in lines)


def test_the_time_limit_removes_every_container_and_the_network(s3, bucket, tmp_path):
    request = _request(s3, bucket, SCRIPTS, "cluster_rank.py", 2, 1, {})
    with pytest.raises(LocalJobFailed, match="ran past its 15 s limit"):
        run_local(
            request, launcher="container", image=IMAGE, work_dir=tmp_path, echo=lambda _: None, timeout=15
        )
    assert _left_behind() == ([], [])
    assert not list(tmp_path.iterdir())


def _stuck(proc: subprocess.Popen, lines: queue.Queue, seen: list[str]) -> str:
    """For the reader of a hang: the podman processes still there, what the command printed last,
    then its threads' stacks (faulthandler's, on SIGABRT)."""
    ps = subprocess.run(["ps", "-eo", "pid,ppid,stat,wchan:24,etime,args"], capture_output=True, text=True)
    podman = [line[:300] for line in ps.stdout.splitlines() if "podman" in line or "conmon" in line]
    proc.send_signal(signal.SIGABRT)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    time.sleep(1)
    while not lines.empty():
        seen.append(lines.get())
    return "podman processes:\n" + "\n".join(podman) + "\noutput, then stacks:\n" + "".join(seen[-120:])


def test_ctrl_c_removes_every_container_and_the_network(s3, bucket, aws_env, tmp_path):
    """The command line, interrupted as a user does once both hosts are up."""
    write_demo_data(f"s3://{bucket}/data/", files=4, records_per_file=16, validation_files=2, client=s3)
    command = [str(BIN / "sagemaker-dist"), "local", "--entry-point", "cluster_rank.py", "--source-dir",
               str(SCRIPTS), "--train", f"s3://{bucket}/data/train/", "--launcher", "container", "--image",
               IMAGE, "--hosts", "2", "--processes-per-host", "1", "--bucket", bucket, "--work-dir",
               str(tmp_path), "--endpoint-url", aws_env["AWS_ENDPOINT_URL"]]  # fmt: skip
    # faulthandler: on a hang, SIGABRT makes the command print every thread's stack (see _stuck)
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=terminal_sigint)  # fmt: skip
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen, deadline = [], time.monotonic() + 240
    try:
        while not any("up on algo-2" in line for line in seen):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(seen[-30:])
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                pass
        proc.send_signal(signal.SIGINT)
        # the clean-up's own bounds (ClusterGroup.kill, then cluster_network): `podman rm --time 3`
        # (60 s more for podman itself), each host's podman client 3 s, `podman rm` once more where
        # podman did not answer (60 s), then the network's forced removal (podman's 60 s plus 60 s).
        grace = 3.0
        stop = cluster._STOP_TIMEOUT_S
        bound = grace + stop + 2 * grace + 2 * cluster.PODMAN_TIMEOUT_S + stop
        try:
            code = proc.wait(timeout=bound + 15)
        except subprocess.TimeoutExpired:
            why = _stuck(proc, lines, seen)
            raise AssertionError(f"no exit {bound + 15:.0f} s after Ctrl-C:\n{why}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, "".join(seen[-30:])
    assert _left_behind() == ([], [])
    assert not list(tmp_path.iterdir())
