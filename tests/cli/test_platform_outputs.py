"""``sagemaker-dist slurm`` and ``sagemaker-dist k8s`` write only where they say: the job's own folder
(``--out-dir``, default ``./sagemaker-dist-jobs/<job name>/``) or the file named, never loose files in
the current directory; each file is written whole (temporary file, then rename)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sagemaker_dist.cli.platform_jobs import write_atomically as _write_atomically
from sagemaker_dist.cli.slurm import JOBS_DIR

CLI = [sys.executable, "-m", "sagemaker_dist.cli"]


def _run(command: str, *args, cwd: Path, aws_env, bucket) -> subprocess.CompletedProcess:
    endpoint = ["--bucket", bucket, "--endpoint-url", aws_env["AWS_ENDPOINT_URL"]]
    cwd.mkdir(exist_ok=True)
    command_line = [*CLI, command, "--demo", *endpoint, *map(str, args)]
    return subprocess.run(command_line, cwd=cwd, capture_output=True, text=True, timeout=120)


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_slurm_writes_into_the_jobs_own_folder_by_default(aws_env, bucket, tmp_path):
    cwd = tmp_path / "cwd"
    proc = _run("slurm", "--nodes", 2, cwd=cwd, aws_env=aws_env, bucket=bucket)
    assert proc.returncode == 0, proc.stderr
    (script,) = _files(cwd)
    job = Path(script).stem
    assert script == f"{JOBS_DIR}/{job}/{job}.sbatch"  # nothing else, no leftover temporary file
    folder = (cwd / JOBS_DIR / job).resolve()
    assert f"wrote {folder / (job + '.sbatch')};" in proc.stderr
    assert f"#SBATCH --output={folder}/%x-%j.out\n" in (cwd / script).read_text()  # the job's output too
    assert os.access(cwd / script, os.X_OK)


def test_slurm_out_dir_takes_everything_elsewhere(aws_env, bucket, tmp_path):
    cwd, out = tmp_path / "cwd", tmp_path / "runs" / "here"
    proc = _run("slurm", "--nodes", 2, "--out-dir", out, cwd=cwd, aws_env=aws_env, bucket=bucket)
    assert proc.returncode == 0, proc.stderr
    assert _files(cwd) == []
    (script,) = _files(out)
    assert script.endswith(".sbatch") and f"#SBATCH --output={out}/%x-%j.out\n" in (out / script).read_text()


def test_slurm_output_beside_the_script_given_with_o(aws_env, bucket, tmp_path):
    cwd, script = tmp_path / "cwd", tmp_path / "jobs" / "j.sbatch"
    proc = _run("slurm", "--nodes", 2, "-o", script, cwd=cwd, aws_env=aws_env, bucket=bucket)
    assert proc.returncode == 0, proc.stderr
    assert _files(cwd) == [] and _files(tmp_path / "jobs") == ["j.sbatch"]
    assert f"#SBATCH --output={tmp_path / 'jobs'}/%x-%j.out\n" in (tmp_path / "jobs" / "j.sbatch").read_text()


def test_k8s_prints_by_default_and_writes_only_where_asked(aws_env, bucket, tmp_path):
    cwd = tmp_path / "cwd"
    printed = _run("k8s", cwd=cwd, aws_env=aws_env, bucket=bucket)
    assert printed.returncode == 0, printed.stderr
    assert "kind: MPIJob" in printed.stdout and _files(cwd) == []
    out = tmp_path / "manifests"
    written = _run("k8s", "--out-dir", out, cwd=cwd, aws_env=aws_env, bucket=bucket)
    assert written.returncode == 0, written.stderr
    assert _files(cwd) == [] and written.stdout == ""
    (manifest,) = _files(out)
    assert manifest.endswith(".yaml") and "kind: MPIJob" in (out / manifest).read_text()
    assert f"wrote {out / manifest};" in written.stderr
    both = _run("k8s", "--out-dir", out, "-o", out / "x.yaml", cwd=cwd, aws_env=aws_env, bucket=bucket)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_files_are_replaced_whole(tmp_path):
    target = tmp_path / "job.sbatch"
    _write_atomically(target, "old\n")
    with open(target) as reader:  # a reader of the old file keeps it whole
        _write_atomically(target, "new\n", 0o755)
        assert reader.read() == "old\n"
    assert target.read_text() == "new\n" and os.access(target, os.X_OK)
    with pytest.raises(TypeError):
        _write_atomically(target, None)  # a failed write leaves the file as it was, and no part
    assert target.read_text() == "new\n" and _files(tmp_path) == ["job.sbatch"]
