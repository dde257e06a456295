"""The training image built from container/Dockerfile runs jobs the way SageMaker runs them:
``podman run <image> train`` with the host's /opt/ml tree bind-mounted, the image's own toolkit
starting 2 MPI ranks, Pipe FIFOs fed from a moto S3 server on this machine.

The image tests run under scripts/container-test.sh, which builds the image on a stand-in for the TF
DLC, sets SAGEMAKER_DIST_TEST_IMAGE and podman's storage and selects them (marker ``image``); elsewhere
they are deselected. Each successful job pays the toolkit's own 30 s sleep after mpirun.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.stop_jobs import check_resumed_inside_the_epoch, shard_bytes, trained_segments

from sagemaker_dist import LocalJobFailed, run_local
from sagemaker_dist.local import spot
from sagemaker_dist.local.demo import DEMO_JOB_DIR, demo_estimator
from sagemaker_dist.local.demo_data import write_demo_data
from sagemaker_dist.local.launchers.container import ContainerLauncherError

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "helpers" / "local_scripts"
BIN = Path(sys.executable).parent
IMAGE = os.environ.get("SAGEMAKER_DIST_TEST_IMAGE")
MWMS_IMAGE = os.environ.get("SAGEMAKER_DIST_TEST_MWMS_IMAGE")  # built with WITH_HOROVOD=0
ROOTFS_IMAGE = "localhost/sagemaker-dist-bookworm-minbase:latest"  # what container-test.sh imports

# scripts/container-test.sh builds the image and selects these (-m image); elsewhere, with no
# SAGEMAKER_DIST_TEST_IMAGE, tests/conftest.py deselects them.
needs_image = pytest.mark.image


@pytest.fixture(autouse=True)
def _podman_for_the_image(request):
    if request.node.get_closest_marker("image"):
        assert shutil.which("podman"), "podman is not installed (scripts/container-test.sh installs it)"


def _podman(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120)


def _request(s3, bucket, source_dir: Path, entry_point: str, hps: dict, **kwargs) -> dict:
    """One host of 2 ranks, Pipe mode; the source package goes to S3 (the toolkit in the container
    downloads it, as on SageMaker)."""
    write_demo_data(f"s3://{bucket}/data/", files=4, records_per_file=16, validation_files=2, client=s3)
    per_host = 1 if kwargs.get("distribution") == "tf-mwms" else 2
    estimator = demo_estimator(
        bucket, 1, per_host, "Pipe", hps, source_dir=source_dir, entry_point=entry_point, **kwargs
    )
    inputs = {"train": f"s3://{bucket}/data/train/", "validation": f"s3://{bucket}/data/validation/"}
    return estimator.prepare(inputs, printer=None).request


def _run(request, tmp_path, lines, containers: list[str] | None = None, on_started=None, **kwargs):
    """``run_local`` in the image; ``containers`` gets the job's container name once it is started."""

    def started(group):
        if containers is not None:
            containers.append(group.name)
        if on_started is not None:
            on_started(group)

    return run_local(
        request, launcher="container", image=IMAGE, work_dir=tmp_path, echo=lines.append, on_started=started,
        **kwargs,
    )  # fmt: skip


def _gone(containers: list[str]) -> bool:
    """Each of the job's containers is gone from podman's storage (the jobs of the cluster tests may be
    running beside this one: only the job's own are looked for)."""
    assert containers, "the job never started its container"
    return all(_podman("container", "exists", name).returncode == 1 for name in containers)


def _listener_checks():
    """tests/local/test_listeners.py (ListenerWatch, check_nothing_exposed), loaded by its path."""
    path = REPO / "tests" / "local" / "test_listeners.py"
    spec = importlib.util.spec_from_file_location("listener_checks", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def _container_processes(group):
    """The roots of a container job's processes: the podman client and the container's PID 1 (a child
    of conmon, not of the client), once podman has it."""
    found: list[int] = []

    def roots() -> list[int]:
        if not found:
            done = _podman("inspect", "--format", "{{.State.Pid}}", group.name)
            if done.returncode == 0 and done.stdout.strip() not in ("", "0"):
                found.append(int(done.stdout.strip()))
        return [group.proc.pid, *found]

    return roots


def test_the_container_files_are_lint_clean():
    for tool, path in (
        ("hadolint", REPO / "container" / "standin-base" / "Dockerfile"),
        ("shellcheck", REPO / "scripts" / "container-test.sh"),
    ):
        assert (BIN / tool).exists(), f"{tool} is missing from {BIN}; install the dev extra"
        done = subprocess.run([str(BIN / tool), str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


@needs_image
def test_the_demo_trains_in_the_image(s3, bucket, tmp_path):
    request = _request(s3, bucket, DEMO_JOB_DIR, "train_cifar10.py", {"epochs": 2, "batch_size": 16})
    lines, containers = [], []
    listeners = _listener_checks()
    watch = listeners.ListenerWatch(lambda: [])

    def started(group):
        watch.roots = _container_processes(group)
        watch.start()

    try:
        result = _run(
            request, tmp_path, lines, containers, on_started=started, keep_work_dir=True, timeout=400
        )
    finally:
        watch.stop()
    out = "\n".join(lines)
    # the image's sshd (root, the baked key pair), mpirun's and the ranks' listeners: in the job's own
    # network namespace (only lo), reachable from nowhere else
    print(watch.report())
    listeners.check_nothing_exposed(watch, lines, "sshd")
    command = next(line for line in lines if line.startswith("$ "))
    assert command.startswith("$ podman run --rm ") and command.endswith(f" {IMAGE} train"), command
    assert "/opt/ml " in command and "--network host" in command, command
    assert any(line.startswith("[launcher] mpirun --host algo-1:2 -np 2 ") for line in lines), out[-3000:]
    ends = [line for line in lines if "train epoch ended for every rank" in line]
    assert len(ends) == 2 and all(e.startswith("[rank 0 algo-1] ") for e in ends), out[-3000:]
    readers = [line for line in lines if "PipeModeDataset: the compiled reader runs" in line]
    assert len(readers) == 2, out[-3000:]  # both ranks, on the op the image build made (none built now)
    assert all("/opt/sagemaker-dist/cache/ops/" in r and "built in" not in r for r in readers), readers
    fed = {(s.host, s.channel): s.bytes for s in result.feed_stats}
    assert fed["algo-1", "train_0"] > 0 and fed["algo-1", "train_1"] > 0, fed  # each rank read its FIFO
    assert "loss" in result.metrics and result.model_uri, out[-3000:]
    assert s3.head_object(Bucket=bucket, Key=result.model_uri.split("/", 3)[3])["ContentLength"] > 0
    ckpt_bucket, ckpt_prefix = result.checkpoint_uri[len("s3://") :].split("/", 1)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=ckpt_bucket, Prefix=ckpt_prefix)["Contents"]]
    assert any("/epoch-00002/" in key for key in keys), keys
    tree = Path(result.work_dir) / "hosts" / "algo-1"
    assert (tree / "output" / "success").is_file()
    assert not (tree / "output" / "failure").exists()
    assert (tree / "model" / "1" / "saved_model.pb").is_file()
    assert (tree / "checkpoints" / "epoch-00002").is_dir()
    assert (tree / "code" / "train_cifar10.py").is_file()  # the toolkit fetched the package from S3
    assert _gone(containers)  # --rm: the container is gone


@needs_image
def test_a_failing_rank_ends_with_the_failure_file_naming_it(s3, bucket, tmp_path):
    request = _request(s3, bucket, SCRIPTS, "fail_rank.py", {"fail_rank": 1})
    lines, containers = [], []
    with pytest.raises(LocalJobFailed) as failure:
        _run(request, tmp_path, lines, containers, keep_work_dir=True, timeout=300)
    message = str(failure.value)
    launcher_lines = "\n".join(line for line in lines if not line.startswith("[rank "))
    assert message.startswith("rank 1 (host algo-1) "), message + "\n" + launcher_lines[-4000:]
    # as in the toolkit launcher's test: mpirun may cut "RuntimeError: ..." in two under load
    assert "RuntimeError" in message and "rank 1 failed on purpose" in message, message
    assert "/opt/ml/output/failure says:" in message
    (work,) = tmp_path.iterdir()
    output = work / "hosts" / "algo-1" / "output"
    written = (output / "failure").read_text()
    assert "rank 1 failed on purpose" in written and "Process name: [[" in written, written[-2000:]
    assert not (output / "success").exists()
    assert _gone(containers)


@needs_image
def test_a_job_past_its_time_limit_is_stopped_with_its_container(s3, bucket, tmp_path):
    """No rank fails (rank 5 of 2 never comes): the job runs until the limit, then stopping it must
    remove the container, whose processes are no children of the podman client."""
    request = _request(s3, bucket, SCRIPTS, "fail_rank.py", {"fail_rank": 5})
    lines, containers = [], []
    with pytest.raises(LocalJobFailed, match="ran past its 20 s limit"):
        _run(request, tmp_path, lines, containers, timeout=20)
    assert _gone(containers)
    assert not list(tmp_path.iterdir())


@needs_image
def test_an_image_podman_does_not_have_is_named(s3, bucket, tmp_path):
    request = _request(s3, bucket, SCRIPTS, "fail_rank.py", {})
    with pytest.raises(ContainerLauncherError, match="scripts/container-test.sh") as error:
        run_local(
            request, launcher="container", image="localhost/sagemaker-dist-missing:0", work_dir=tmp_path
        )
    assert "localhost/sagemaker-dist-missing:0" in str(error.value)


@needs_image
def test_a_build_from_a_base_without_the_toolkit_says_so():
    assert not _podman("image", "exists", ROOTFS_IMAGE).returncode, f"no {ROOTFS_IMAGE} (container-test.sh)"
    done = subprocess.run(
        ["podman", "build", "--format", "docker", "--ignorefile", "container/Dockerfile.dockerignore",
         "--build-arg", f"BASE_IMAGE={ROOTFS_IMAGE}", "-f", "container/Dockerfile", "."],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode != 0
    assert f"BASE_IMAGE={ROOTFS_IMAGE} has no sagemaker-training toolkit (train)" in done.stderr, done.stderr


@needs_image
def test_a_missing_base_is_named_before_any_build(tmp_path):
    """container-test.sh --base with an image its storage lacks (a storage of its own here)."""
    env = {**os.environ, "SAGEMAKER_DIST_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        ["bash", "scripts/container-test.sh", "--base", "localhost/no-such-dlc:1", "--build-only"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "base image localhost/no-such-dlc:1 is not in podman's storage" in done.stderr
    assert "Run without --base to build the stand-in" in done.stderr


@needs_image
def test_a_tf_mwms_job_trains_in_the_image_without_horovod(s3, bucket, tmp_path):
    """WITH_HOROVOD=0: no Horovod in the image; the toolkit's MultiWorkerMirroredStrategy path (TF_CONFIG,
    no MPI) runs the demo on one host."""
    assert _podman("run", "--rm", MWMS_IMAGE, "python", "-c", "import horovod").returncode != 0
    request = _request(s3, bucket, DEMO_JOB_DIR, "train_cifar10.py", {"epochs": 2}, distribution="tf-mwms")
    lines = []
    result = run_local(
        request, launcher="container", image=MWMS_IMAGE, work_dir=tmp_path, echo=lines.append,
        keep_work_dir=True, timeout=400,
    )  # fmt: skip
    out = "\n".join(lines)
    assert "Running distributed training job with multi_worker_mirrored_strategy setup" in out, out[-3000:]
    assert "MultiWorkerMirroredStrategy: 1 worker(s)" in out and "mpirun" not in out, out[-3000:]
    assert "loss" in result.metrics and result.model_uri, out[-3000:]
    assert (Path(result.work_dir) / "hosts" / "algo-1" / "output" / "success").is_file()


@needs_image
@pytest.mark.timeout(420)  # 2 attempts, each with the toolkit's 30 s sleep; about 2 min on a quiet machine
def test_a_job_stopped_with_podman_stop_resumes_inside_the_epoch(s3, bucket, tmp_path):
    """SageMaker's stop, as a spot interruption brings it: ``podman stop --time 120`` of the running
    2-rank job mid-epoch (SIGTERM to PID 1 only, SIGKILL 120 s later). The image's entry point forwards it
    to both ranks, which agree on a step, checkpoint it and end; then the job again, its checkpoints
    restored (managed spot): it resumes inside the stopped epoch and trains each remaining batch once."""
    files, per_file, batch, epochs = 4, 80, 4, 3  # 2 files a rank: 160 records, 40 steps (6 s) an epoch
    for i in range(files):
        body = shard_bytes(i * per_file, per_file, seed=i)
        s3.put_object(Bucket=bucket, Key=f"ids/train/part-{i:05d}.tfrecord", Body=body)
    hps = {"epochs": epochs, "batch_size": batch, "pause": 0.15, "out": "/opt/ml/output/data"}
    estimator = demo_estimator(
        bucket, 1, 2, "Pipe", hps,
        source_dir=SCRIPTS, entry_point="train_ids.py", checkpoint_s3_uri=f"s3://{bucket}/ckpt/spot",
    )  # fmt: skip
    request = estimator.prepare({"train": f"s3://{bucket}/ids/train/"}, printer=None).request
    lines: list[str] = []

    def echo(line: str) -> None:  # kept, and shown with a failure (pytest's captured output)
        lines.append(line)
        print(line, flush=True)

    def in_epoch_2(attempt: int) -> bool:
        """Rank 0 has trained 44 batches (epoch 2, step 4): a point of the training, not fixed seconds (the
        start-up of the toolkit and TensorFlow takes 15 s on a quiet machine, minutes on a loaded one)."""
        logs = list(tmp_path.glob("*/hosts/algo-1/output/data/trained-rank0.jsonl"))  # attempt 1's
        return bool(logs) and logs[0].read_text().count("\n") > 44  # the start line, 44 batches

    attempts, _ = spot.run_interrupted(
        request, None, [300.0], run=run_local, echo=echo, when=in_epoch_2, launcher="container", image=IMAGE,
        work_dir=tmp_path, keep_work_dir=True, timeout=360,
    )  # fmt: skip
    log = "\n".join(lines)
    (tmp_path / "job.log").write_text(log)
    assert [a.status for a in attempts] == ["Stopped", "Completed"], log[-4000:]
    first, second = attempts
    assert "podman stop --time 120" in log
    assert "[stop-forwarding] SIGTERM: forwarded to rank process(es) [" in log, log[-4000:]
    # before SIGKILL; the toolkit sleeps its 30 s after mpirun, as after any run
    assert first.stopped_at is not None and first.ended_after_signal < 110, log[-4000:]
    epoch, step = first.stopped_at  # nothing lost; a stop on an epoch's last step checkpoints it whole
    assert second.resumed_from == ((epoch + 1, 0) if step == 2 * per_file // batch else (epoch, step))
    trees = [Path(a.result.work_dir) / "hosts" / "algo-1" for a in attempts]
    assert (trees[0] / "output" / "success").is_file()  # a stop ends as a run does: exit 0
    for rank in range(2):
        (one,), (two,) = (
            trained_segments(t / "output" / "data" / f"trained-rank{rank}.jsonl") for t in trees
        )
        check_resumed_inside_the_epoch(one, two, first.stopped_at, 2 * per_file // batch, epochs)
    print(f"SIGTERM to the job's end: {first.ended_after_signal:.1f} s; stopped at {first.stopped_at}")
