"""The mpirun and toolkit launchers refuse, before anything starts, a Python whose Horovod was built
without MPI (each rank would train alone) or whose Horovod cannot be probed at all.

The Pythons are real: the SDK side's and the container environment's interpreters, started through a
wrapper that puts a stand-in ``horovod`` package first on their path (one built without MPI, one
that fails to import), so the probe runs as it does on a badly set-up machine.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from sagemaker_dist import LocalJobError, run_local
from sagemaker_dist.contract.layout import TF_MWMS
from sagemaker_dist.local.demo import demo_estimator
from sagemaker_dist.local.demo_data import write_demo_data
from sagemaker_dist.local.launchers.mpi import (
    HorovodProbeError,
    LaunchError,
    check_horovod_mpi,
    horovod_mpi_built,
)
from sagemaker_dist.local.launchers.toolkit import ToolkitLauncherError, check_toolkit_host

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "helpers" / "local_scripts"
CONTAINER_PYTHON = REPO / ".venv-toolkit" / "bin" / "python"

GLOO_ONLY = "def mpi_built():\n    return False\n"
BROKEN = "raise ImportError('libhorovod_tensorflow.so: undefined symbol: stand-in for a broken build')\n"


def _python_with(tmp_path: Path, horovod_tensorflow: str, base: Path = Path(sys.executable)) -> Path:
    """``base`` started with a stand-in ``horovod.tensorflow`` (its source given) ahead of the real one."""
    stub = tmp_path / "stub"
    (stub / "horovod" / "tensorflow").mkdir(parents=True)
    (stub / "horovod" / "__init__.py").write_text("")
    (stub / "horovod" / "tensorflow" / "__init__.py").write_text(horovod_tensorflow)
    wrapper = tmp_path / "bin" / "python"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{stub}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{base}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def _request(s3, bucket, hosts: int = 1, per_host: int = 1, **kwargs) -> dict:
    write_demo_data(f"s3://{bucket}/data/", files=2, records_per_file=4, validation_files=2, client=s3)
    estimator = demo_estimator(bucket, hosts, per_host, "Pipe", {}, SCRIPTS, "print_rank_env.py", **kwargs)
    return estimator.prepare({"train": f"s3://{bucket}/data/train/"}, printer=None).request


def test_the_probe_says_why_it_cannot_tell(tmp_path):
    with pytest.raises(HorovodProbeError, match="(?s)failed .*stand-in for a broken build"):
        horovod_mpi_built(_python_with(tmp_path, BROKEN))
    with pytest.raises(HorovodProbeError, match="could not run .*no-such-python"):
        horovod_mpi_built(tmp_path / "no-such-python")
    assert horovod_mpi_built(_python_with(tmp_path / "gloo", GLOO_ONLY)) is False


def test_a_probe_that_cannot_tell_is_a_refusal(tmp_path):
    """A probe that cannot tell refuses, naming why and what to run; the launcher does not go on."""
    python = _python_with(tmp_path, BROKEN)
    with pytest.raises(LaunchError) as error:
        check_horovod_mpi(python, "mpirun")
    message = str(error.value)
    assert f"whether {python}'s is could not be told" in message, message
    assert "stand-in for a broken build" in message  # the probe's stderr
    assert "./scripts/setup.sh" in message and "HOROVOD_WITH_MPI=1" in message


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")
def test_mpirun_launcher_refuses_when_the_probe_fails(s3, bucket, tmp_path):
    request = _request(s3, bucket, hosts=2)
    python = _python_with(tmp_path / "py", BROKEN)
    work = tmp_path / "work"
    with pytest.raises(LaunchError, match="(?s)could not be told.*stand-in for a broken build"):
        run_local(request, SCRIPTS, launcher="mpirun", container_python=python, work_dir=work, echo=print)
    assert not work.exists() or not list(work.iterdir())  # refused before anything was created


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")
def test_toolkit_launcher_refuses_a_container_horovod_without_mpi(s3, bucket, tmp_path):
    """The README's fresh-machine failure: .venv-toolkit kept a Gloo-only Horovod after Open MPI came."""
    python = _python_with(tmp_path / "py", GLOO_ONLY, base=CONTAINER_PYTHON)
    with pytest.raises(ToolkitLauncherError) as error:
        check_toolkit_host(python)
    message = str(error.value)
    assert f"launcher 'toolkit' needs a Horovod built with MPI, and {python}'s is not" in message, message
    assert "./scripts/setup.sh" in message and "--no-build-isolation" in message
    work = tmp_path / "work"
    with pytest.raises(ToolkitLauncherError, match="needs a Horovod built with MPI"):
        run_local(_request(s3, bucket), SCRIPTS, launcher="toolkit", container_python=python, work_dir=work)
    assert not work.exists() or not list(work.iterdir())


def test_toolkit_launcher_leaves_horovod_alone_for_a_tf_mwms_job(s3, bucket, tmp_path):
    """A tf-mwms job runs no mpirun and no Horovod: the same Python passes, and run_local goes on to
    its next check (one host only)."""
    python = _python_with(tmp_path / "py", GLOO_ONLY, base=CONTAINER_PYTHON)
    assert check_toolkit_host(python, horovod=False) == python
    request = _request(s3, bucket, hosts=2, distribution=TF_MWMS)
    with pytest.raises(LocalJobError, match="simulates one host"):
        run_local(request, SCRIPTS, launcher="toolkit", container_python=python, work_dir=tmp_path / "work")
