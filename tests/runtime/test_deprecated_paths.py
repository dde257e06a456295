"""Module paths of earlier releases keep working: each warns (DeprecationWarning) and gives the names at
their homes in the framework-neutral core or the TensorFlow folder (``runtime/tensorflow/``), the very
objects, so scripts, pickles and patches by an old path reach the module that runs."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import sagemaker_dist.runtime
from sagemaker_dist.runtime.deprecated_paths import MOVED, home

# old path -> {name: the module that defines it}, for the modules split by what they need
SPLIT = {
    "sagemaker_dist.runtime.checkpoints": {
        "Checkpoint": "sagemaker_dist.runtime.checkpoint_format",
        "checkpoint_dir": "sagemaker_dist.runtime.checkpoint_format",
        "latest_checkpoint": "sagemaker_dist.runtime.checkpoint_format",
        "list_checkpoints": "sagemaker_dist.runtime.checkpoint_format",
        "remove_stale_temporaries": "sagemaker_dist.runtime.checkpoint_format",
        "CheckpointMismatchError": "sagemaker_dist.runtime.checkpoint_format",
        "save_checkpoint": "sagemaker_dist.runtime.tensorflow.keras.checkpoints",
        "restore_checkpoint": "sagemaker_dist.runtime.tensorflow.keras.checkpoints",
        "resume_point": "sagemaker_dist.runtime.tensorflow.keras.checkpoints",
        "resume_position": "sagemaker_dist.runtime.tensorflow.keras.checkpoints",
    },
    "sagemaker_dist.runtime.file_dataset": {
        "FileChannelError": "sagemaker_dist.runtime.file_channel",
        "channel_files": "sagemaker_dist.runtime.file_channel",
        "file_channel_dataset": "sagemaker_dist.runtime.tensorflow.data.file_dataset",
    },
    "sagemaker_dist.runtime.keras.stop": {
        "StopRequest": "sagemaker_dist.runtime.stop",
        "TrainingStopped": "sagemaker_dist.runtime.stop",
        "ResumeSkip": "sagemaker_dist.runtime.stop",
        "StepSchedule": "sagemaker_dist.runtime.stop",
    },
}
# old paths a package's entry in MOVED covers: its submodules follow it
FOLLOWING = {
    "sagemaker_dist.runtime.keras.setup": "sagemaker_dist.runtime.tensorflow.keras.setup",
    "sagemaker_dist.runtime.keras.checkpoints": "sagemaker_dist.runtime.tensorflow.keras.checkpoints",
    "sagemaker_dist.runtime.pipe.native_build": "sagemaker_dist.runtime.tensorflow.data.native_build",
    "sagemaker_dist.runtime.pipe.tf_bridge": "sagemaker_dist.runtime.tensorflow.data.tf_bridge",
}


def _warns(old: str):
    return pytest.warns(DeprecationWarning, match=rf"{old.replace('.', '[.]')} is deprecated")


@pytest.mark.parametrize("old", sorted({**MOVED, **FOLLOWING}))
def test_an_old_module_path_warns_and_is_its_home(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with _warns(old):
        module = importlib.import_module(old)
    assert module is importlib.import_module(home(old))
    assert module.__name__ == home(old)  # classes keep their home's path (what pickles write)


def test_submodules_follow_their_package():
    assert {old: home(old) for old in FOLLOWING} == FOLLOWING
    assert home("sagemaker_dist.runtime.pipe.order") == "sagemaker_dist.runtime.epoch_reader.order"
    assert home("sagemaker_dist.runtime.tensorflow.keras") is None
    assert home("sagemaker_dist.runtime.pipeline") is None


def test_an_old_path_with_no_home_is_not_found():
    with pytest.raises(ModuleNotFoundError, match="sagemaker_dist.runtime.pipe.no_such_module"):
        importlib.import_module("sagemaker_dist.runtime.pipe.no_such_module")


@pytest.mark.parametrize("old", sorted(SPLIT))
def test_an_old_path_re_exports_each_name_from_its_home(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with _warns(old):
        module = importlib.import_module(old)
    for name, defined_in in SPLIT[old].items():
        assert getattr(module, name) is getattr(importlib.import_module(defined_in), name), f"{old}.{name}"


def test_no_module_is_left_at_an_old_path():
    """The finder answers an old path before Python's path finder: a file left there would never load."""
    runtime = Path(sagemaker_dist.runtime.__file__).parent
    for old in MOVED:
        relative = old.removeprefix("sagemaker_dist.runtime.").replace(".", "/")
        assert not (runtime / f"{relative}.py").exists(), old
        assert not (runtime / relative / "__init__.py").exists(), old


def test_the_facade_gives_the_new_homes_without_a_warning():
    """What scripts write keeps working and warns nothing; TensorFlow does not load for it."""
    code = (
        "import sys\n"
        "from sagemaker_dist.runtime import horovod_keras, mwms_keras, rank_dataset, PipeModeDataset\n"
        "from sagemaker_dist.runtime import file_channel_dataset, ReaderStateError\n"
        "assert horovod_keras.__name__ == 'sagemaker_dist.runtime.tensorflow.horovod_keras'\n"
        "assert mwms_keras.__name__ == 'sagemaker_dist.runtime.tensorflow.mwms_keras'\n"
        "assert 'tensorflow' not in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", code], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_python_m_with_an_old_path_runs_its_home(tmp_path):
    """``python -m sagemaker_dist.runtime.pipe.native_build`` (images that build the compiled reader ahead)
    runs the module at its home, its ``__file__`` the home's, so it finds its sources."""
    done = subprocess.run(
        [sys.executable, "-W", "always::DeprecationWarning", "-m", "sagemaker_dist.runtime.pipe.order"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "run python -m sagemaker_dist.runtime.epoch_reader.order" in done.stderr
    old = "sagemaker_dist.runtime.pipe.native_build"
    assert importlib.util.find_spec(old).origin == importlib.util.find_spec(home(old)).origin


def test_the_old_checkpoints_module_still_has_checkpoint_callback(monkeypatch):
    """Resolved when asked for: importing the old path loads no TensorFlow by itself."""
    pytest.importorskip("tensorflow")
    monkeypatch.delitem(sys.modules, "sagemaker_dist.runtime.checkpoints", raising=False)
    with pytest.warns(DeprecationWarning):
        from sagemaker_dist.runtime.checkpoints import checkpoint_callback
    from sagemaker_dist.runtime.tensorflow.keras.callbacks import checkpoint_callback as home_callback

    assert checkpoint_callback is home_callback
