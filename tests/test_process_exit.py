"""The pytest process ends with pytest's own status, its reports written (helpers/process_exit.py).

A child pytest runs a small test file with the plugin: the status it exits with is the one pytest
computed (0, 1, a pytest.exit's code, 5 for no tests), the junit-xml and the summary are out, the atexit
handlers ran and the interpreter's teardown did not. Then the suite's heaviest in-process mix
(TensorFlow, PyTorch, the compiled readers, Horovod with Open MPI) ends 0 twice in a row.
``scripts/exit-check.sh`` runs the larger mix five times.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.process_exit import NATURAL_EXIT_ENV

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

# A module-level object's __del__ runs in the interpreter's teardown (module globals cleared); atexit
# handlers run before it. Each writes a word to EXIT_MARKS, so the run shows which of them happened.
CHILD_TESTS = textwrap.dedent(
    """
    import atexit, os, pytest

    MARKS = os.environ["EXIT_MARKS"]

    def _mark(word, _open=open, _path=MARKS):
        with _open(_path, "a") as f:
            f.write(word + "\\n")

    atexit.register(_mark, "atexit")

    class _AtTeardown:
        def __del__(self, _mark=_mark):
            _mark("teardown")

    _kept = _AtTeardown()
    CASE = os.environ["EXIT_CASE"]

    def test_passes():
        pass

    @pytest.mark.skipif(CASE != "fail", reason="only where a failure is wanted")
    def test_fails():
        assert CASE != "fail"

    @pytest.mark.skipif(CASE != "exit", reason="only where pytest.exit is wanted")
    def test_exits():
        pytest.exit("stopped by the test", returncode=3)
    """
)


def _child_env(tmp_path: Path, case: str, natural: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (NATURAL_EXIT_ENV, "CI", "PYTEST_ADDOPTS")}
    env.update(EXIT_MARKS=str(tmp_path / "marks"), EXIT_CASE=case, PYTHONPATH=str(TESTS))
    if natural:
        env[NATURAL_EXIT_ENV] = "1"
    return env


def _run_child(tmp_path: Path, case: str, *args: str, natural: bool = False) -> subprocess.CompletedProcess:
    (tmp_path / "test_child.py").write_text(CHILD_TESTS)
    command = [sys.executable, "-m", "pytest", "-p", "helpers.process_exit", "-p", "no:cacheprovider"]
    command += ["-q", "--rootdir", str(tmp_path), "--junitxml", str(tmp_path / "junit.xml"), *args]
    return subprocess.run(
        command,
        cwd=tmp_path,
        env=_child_env(tmp_path, case, natural),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _marks(tmp_path: Path) -> list[str]:
    path = tmp_path / "marks"
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize(
    ("case", "args", "status", "summary"),
    [
        ("pass", ["test_child.py"], 0, "1 passed, 2 skipped"),
        ("fail", ["test_child.py"], 1, "1 failed, 1 passed, 1 skipped"),
        ("exit", ["test_child.py"], 3, "stopped by the test"),
        ("pass", ["test_child.py", "-k", "no_such_test"], 5, "3 deselected"),
    ],
)
def test_the_process_exits_with_pytests_status_after_its_reports(tmp_path, case, args, status, summary):
    done = _run_child(tmp_path, case, *args)
    assert done.returncode == status, done.stdout + done.stderr
    assert summary in done.stdout + done.stderr
    junit = (tmp_path / "junit.xml").read_text()
    assert ('failures="1"' in junit) == (case == "fail"), junit
    # atexit handlers ran; the teardown, where the static destructors crash, did not
    assert _marks(tmp_path) == ["atexit"], done.stdout + done.stderr


def test_natural_exit_keeps_the_interpreters_teardown(tmp_path):
    done = _run_child(tmp_path, "fail", "test_child.py", natural=True)
    assert done.returncode == 1, done.stdout + done.stderr
    assert _marks(tmp_path) == ["atexit", "teardown"], done.stdout + done.stderr


def test_pytest_main_called_by_another_program_returns_to_it(tmp_path):
    (tmp_path / "test_child.py").write_text(CHILD_TESTS)
    program = (
        "import pytest, sys\n"
        "args = ['-q', '-p', 'helpers.process_exit', '-p', 'no:cacheprovider', 'test_child.py']\n"
        "code = pytest.main(args)\n"
        "print('returned', int(code))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=tmp_path,
        env=_child_env(tmp_path, "fail"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "returned 1" in done.stdout, done.stdout + done.stderr
    assert _marks(tmp_path) == ["atexit", "teardown"]


# The suite's heaviest in-process mix, small: TensorFlow (TensorBoard's writer) and PyTorch with the
# compiled readers (test_torch_runtime_parts), Horovod with Open MPI left up to the end.
HEAVY = [
    "tests/runtime/torch/test_torch_runtime_parts.py",
    "tests/runtime/test_horovod_keras.py",
    "-k",
    "not test_horovod_keras or shard_smaller_than_a_batch",
]


@pytest.mark.tensorflow
@pytest.mark.horovod
def test_the_heaviest_in_process_mix_exits_0_twice(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != NATURAL_EXIT_ENV}
    for run in range(2):
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "not slow"]
        command += ["--basetemp", str(tmp_path / f"run{run}"), *HEAVY]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, (
            f"run {run + 1}: exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
        assert " passed" in done.stdout and "failed" not in done.stdout.splitlines()[-1]
