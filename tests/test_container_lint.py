"""container/: hadolint and shellcheck clean, and build_and_push.sh run end to end against stand-in
``aws`` and ``docker`` commands that record what they were asked to do (no Docker or AWS here)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sagemaker_dist import __version__

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "container" / "Dockerfile"
SCRIPT = REPO / "container" / "build_and_push.sh"
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is missing from {BIN}; install the dev extra: pip install -e '.[dev]'"
    return str(path)


def test_dockerfile_is_hadolint_clean():
    done = subprocess.run([_tool("hadolint"), str(DOCKERFILE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_build_script_is_shellcheck_clean():
    done = subprocess.run([_tool("shellcheck"), str(SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dockerfile_builds_horovod_with_nccl_and_mpi_and_keeps_the_toolkit_entrypoint():
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG TF_VERSION=2\.14\.\d+$", text, re.M)
    assert (
        re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.M) and "tensorflow-training:${TF_VERSION}-gpu" in text
    )
    assert "ARG HOROVOD_VERSION=0.28.1" in text
    for setting in ("HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_WITH_MPI=1", "HOROVOD_WITH_TENSORFLOW=1"):
        assert setting in text
    assert r"\[X\] NCCL" in text and r"\[X\] MPI" in text  # the build greps what Horovod reports
    assert not re.search(r"^(ENTRYPOINT|CMD)\b", text, re.M)  # the DLC's toolkit entrypoint stays


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
