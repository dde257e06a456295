"""Shared fixtures: a real moto server over HTTP, reached by boto3 and the SDK via AWS_ENDPOINT_URL."""

from __future__ import annotations

import os
import socket
import uuid
from collections import Counter

import pytest

# The process ends with pytest's own status once every report is written, skipping the interpreter's
# teardown, where the C++ static destructors of TensorFlow, PyTorch, Open MPI & co. run beside their
# still-running threads (a SIGSEGV after a passing run): helpers/process_exit.py says what and why.
from helpers.process_exit import pytest_sessionfinish, pytest_unconfigure  # noqa: F401

# Under CI=true a test never skips for a missing capability (Open MPI, Slurm, the toolkit's venv, ...):
# the skip is reported as a failure naming its reason, so a green run means everything ran.
CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
_CI_SKIP = "skipped under CI=true, where every capability must be there: "


def _skip_reason(longrepr) -> str:
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if CI and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = _CI_SKIP + _skip_reason(report.longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if CI and report.skipped:  # a module-level pytest.importorskip / pytest.skip
        report.outcome = "failed"
        report.longrepr = _CI_SKIP + _skip_reason(report.longrepr)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_server():
    """One ThreadedMotoServer for the session; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def aws_env(moto_server, monkeypatch, tmp_path):
    """Environment pointing boto3 and the SDK at the moto server, with fake credentials."""
    env = {
        "AWS_ENDPOINT_URL": moto_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "SAGEMAKER_VALIDATE_ROLE": "false",
        "AWS_CONFIG_FILE": str(tmp_path / "aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "aws-credentials"),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return env


@pytest.fixture
def s3(aws_env):
    """A boto3 S3 client on the moto server."""
    import boto3

    return boto3.client("s3", endpoint_url=aws_env["AWS_ENDPOINT_URL"], region_name="us-east-1")


@pytest.fixture
def bucket(s3):
    """A fresh, empty bucket name (unique per test so tests never see each other's objects)."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


# Markers by module, so a developer can run the fast subset: pytest -m "not slow" (see the README).
# slow: starts real horovodrun/mpirun ranks or whole local jobs; horovod: needs Horovod;
# tensorflow: imports TensorFlow (seconds per process).
_MODULE_MARKERS = {
    "test_horovod_training": ("slow", "horovod", "tensorflow"),
    "test_stop_resume": ("slow", "horovod", "tensorflow"),
    "test_local_spot": ("slow", "horovod", "tensorflow"),
    "test_local_job": ("slow", "horovod", "tensorflow"),
    "test_toolkit_launcher": ("slow", "horovod", "tensorflow"),
    "test_mwms_job": ("slow", "tensorflow"),
    "test_notebook": ("slow", "horovod", "tensorflow"),
    "test_local_tuning": ("slow", "horovod", "tensorflow"),
    "test_horovod_keras": ("tensorflow",),
    "test_checkpoints": ("tensorflow",),
    "test_pipe_dataset": ("tensorflow",),
    "test_large_records": ("tensorflow",),
    "test_file_channels": ("tensorflow",),
    "test_tensorboard_sync": ("tensorflow",),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in _MODULE_MARKERS.get(item.module.__name__.rsplit(".", 1)[-1], ()):
            item.add_marker(getattr(pytest.mark, name))
    # Tests of the training image (marker `image`) run under scripts/container-test.sh, which builds the
    # image and names it in SAGEMAKER_DIST_TEST_IMAGE; elsewhere they are deselected, not skipped.
    # Tests marked `gpu` need a CUDA device: they run where SAGEMAKER_DIST_TEST_GPU=1 says one is (CI has
    # none), and are deselected elsewhere, not skipped.
    for marker, variable in (("image", "SAGEMAKER_DIST_TEST_IMAGE"), ("gpu", "SAGEMAKER_DIST_TEST_GPU")):
        if not os.environ.get(variable):
            chosen = [item for item in items if item.get_closest_marker(marker)]
            if chosen:
                config.hook.pytest_deselected(items=chosen)
                items[:] = [item for item in items if not item.get_closest_marker(marker)]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _longest_modules_first(items)


def _longest_modules_first(items) -> None:
    """Modules with the most ``slow`` tests first, each module's tests in their order: pytest-xdist hands
    the suite's modules to its workers in this order (``--dist loadfile``, scripts/test.sh), so the long
    ones start at once and quick modules fill the end, where one worker would otherwise run a long module
    alone."""
    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    place = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
    items.sort(key=lambda item: (-slow[item.path], place[item.path]))


def pytest_generate_tests(metafunc):
    """tfrecord_scan runs a test through both TFRecord scans, or those its `scans` marker names."""
    if "tfrecord_scan" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("scans")
        scans = list(marker.args) if marker else ["compiled", "numpy"]
        metafunc.parametrize("tfrecord_scan", scans, indirect=True, scope="module")


@pytest.fixture(scope="module")
def tfrecord_scan(request):
    """Run a module's TFRecord tests through both scans: the compiled one setup.py builds, and numpy's."""
    from sagemaker_dist.runtime.framing import tfrecord

    compiled = tfrecord._native
    if request.param == "compiled" and compiled is None:
        pytest.fail(
            "sagemaker_dist.runtime.framing._tfrecord_scan is not built: pip install -e . needs a C compiler"
        )
    tfrecord._native = compiled if request.param == "compiled" else None
    try:
        yield request.param
    finally:
        tfrecord._native = compiled
