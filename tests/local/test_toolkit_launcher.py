"""``launcher="toolkit"``: AWS's real sagemaker-training 4.8.3 entry point (``train`` with the TF DLC's
``SAGEMAKER_TRAINING_MODULE``) runs the simulated host in a private mount and PID namespace, builds
mpirun itself and starts real MPI ranks; S3 on a moto server over HTTP, real FIFOs.

Each successful job pays the toolkit's own 30 s sleep after mpirun (``mpi.py``), so they are few.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import pytest

from sagemaker_dist import LocalJobError, LocalJobFailed, run_local
from sagemaker_dist.contract import toolkit
from sagemaker_dist.local.demo import DEMO_JOB_DIR, demo_estimator
from sagemaker_dist.local.demo_data import write_demo_data
from sagemaker_dist.local.launchers.toolkit import ToolkitLauncherError, check_toolkit_host

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "helpers" / "local_scripts"
CONTAINER_PYTHON = REPO / ".venv-toolkit" / "bin" / "python"


def _request(s3, bucket, entry_point: str, hps: dict, per_host: int = 2, hosts: int = 1) -> dict:
    write_demo_data(f"s3://{bucket}/data/", files=4, records_per_file=16, validation_files=2, client=s3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", toolkit.ToolkitArgumentWarning)  # some values are tricky on purpose
        estimator = demo_estimator(
            bucket,
            hosts,
            per_host,
            "Pipe",
            hps,
            source_dir=DEMO_JOB_DIR if entry_point == "train_cifar10.py" else SCRIPTS,
            entry_point=entry_point,
        )
        return estimator.prepare({"train": f"s3://{bucket}/data/train/"}, printer=None).request


def _run(request, tmp_path, lines, source_dir=None, **kwargs):
    return run_local(
        request,
        source_dir,
        launcher="toolkit",
        container_python=CONTAINER_PYTHON,
        work_dir=tmp_path,
        echo=lines.append,
        timeout=240,
        **kwargs,
    )


def test_each_rank_sees_what_the_dlc_shows_it(s3, bucket, tmp_path):
    """The toolkit downloads the source package from the S3 endpoint, runs its own mpirun line, and
    each rank gets the toolkit's arguments (our model of them, shell included), gethostname.so's
    algo-1, SM_* and its own FIFO under the hard-coded /opt/ml."""
    hps = {"epochs": 1, "flag": "true", "ratio": "1.50", "sizes": "[256,256]", "note": "a b"}
    request = _request(s3, bucket, "toolkit_view.py", hps)
    lines = []
    result = _run(request, tmp_path, lines, keep_work_dir=True)
    out = "\n".join(lines)
    mpirun = next(line for line in lines if line.startswith("[launcher] mpirun --host algo-1:2 -np 2 "))
    assert "-x LD_PRELOAD=" in mpirun and "gethostname" in mpirun, mpirun
    assert " -m mpi4py toolkit_view.py " in mpirun, mpirun
    views = {}
    for line in lines:
        if "VIEW " in line:
            prefix, payload = line.split("VIEW ", 1)
            view = json.loads(payload)
            assert prefix == f"[rank {view['rank']} algo-1] ", line  # tagged output, attributed
            views[view["rank"]] = view
    assert sorted(views) == [0, 1], out[-3000:]
    expected_argv = toolkit.script_argv(request["HyperParameters"], "4.8.3", {"HOME": "/root"})
    assert "a" in expected_argv and "b" in expected_argv and "[256," in expected_argv  # the shell split them
    fed = {(s.host, s.channel): s.bytes for s in result.feed_stats}
    for rank, view in views.items():
        assert view["argv"] == expected_argv
        assert view["local_rank"] == rank
        assert view["gethostname"] == "algo-1" and view["sm_current_host"] == "algo-1"
        assert view["ld_preload"].endswith(".so") and "gethostname" in view["ld_preload"]
        assert view["sm_hps"]["flag"] is True and view["sm_hps"]["sizes"] == [256, 256]
        assert view["cwd"] == "/opt/ml/code"
        assert view["bytes"] == fed["algo-1", f"train_{rank}"] > 0
    work = Path(result.work_dir)
    assert (work / "hosts" / "algo-1" / "output" / "success").is_file()
    assert (work / "hosts" / "algo-1" / "code" / "toolkit_view.py").is_file()  # the toolkit fetched it
    assert not Path("/opt/ml").exists() or not (Path("/opt/ml") / "code" / "toolkit_view.py").exists()


def test_a_failing_rank_is_named_with_the_toolkits_failure_file(s3, bucket, tmp_path):
    request = _request(s3, bucket, "fail_rank.py", {"fail_rank": 1})
    lines = []
    with pytest.raises(LocalJobFailed) as failure:
        _run(request, tmp_path, lines)
    message = str(failure.value)
    assert message.startswith("rank 1 (host algo-1) "), message
    # the rank's own error: under load mpirun (--tag-output) may cut "RuntimeError: ..." in two where the
    # script's writes were cut, and the toolkit's failure file prints it as "RuntimeError:: :rank 1 ..."
    assert "RuntimeError" in message and "rank 1 failed on purpose" in message, message
    assert "/opt/ml/output/failure says:" in message
    assert not list(tmp_path.iterdir())


def test_without_root_it_says_so_before_anything_starts(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ToolkitLauncherError, match="needs root"):
        check_toolkit_host(CONTAINER_PYTHON)


def test_a_container_python_without_the_toolkit_is_named(tmp_path):
    with pytest.raises(ToolkitLauncherError, match="cannot import sagemaker_training") as error:
        check_toolkit_host(Path(sys.executable))  # the SDK side's Python: no toolkit there
    assert "scripts/setup.sh" in str(error.value)


def test_several_hosts_are_refused_with_the_way_out(s3, bucket, tmp_path):
    request = _request(s3, bucket, "toolkit_view.py", {"epochs": 1}, per_host=1, hosts=2)
    with pytest.raises(LocalJobError, match="simulates one host"):
        _run(request, tmp_path, [])
