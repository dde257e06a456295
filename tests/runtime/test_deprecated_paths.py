"""Module paths of earlier releases keep working: each warns (DeprecationWarning) and re-exports the
names from their homes in the framework-neutral core or the TensorFlow side."""

from __future__ import annotations

import importlib
import sys

import pytest

# old path -> {name: the module that defines it}
ALIASES = {
    "sagemaker_dist.runtime.checkpoints": {
        "Checkpoint": "sagemaker_dist.runtime.checkpoint_format",
        "checkpoint_dir": "sagemaker_dist.runtime.checkpoint_format",
        "latest_checkpoint": "sagemaker_dist.runtime.checkpoint_format",
        "list_checkpoints": "sagemaker_dist.runtime.checkpoint_format",
        "remove_stale_temporaries": "sagemaker_dist.runtime.checkpoint_format",
        "CheckpointMismatchError": "sagemaker_dist.runtime.checkpoint_format",
        "save_checkpoint": "sagemaker_dist.runtime.keras.checkpoints",
        "restore_checkpoint": "sagemaker_dist.runtime.keras.checkpoints",
        "resume_point": "sagemaker_dist.runtime.keras.checkpoints",
        "resume_position": "sagemaker_dist.runtime.keras.checkpoints",
    },
    "sagemaker_dist.runtime.file_dataset": {
        "FileChannelError": "sagemaker_dist.runtime.file_channel",
        "channel_files": "sagemaker_dist.runtime.file_channel",
        "file_channel_dataset": "sagemaker_dist.runtime.keras.file_dataset",
    },
    "sagemaker_dist.runtime.keras.stop": {
        "StopRequest": "sagemaker_dist.runtime.stop",
        "TrainingStopped": "sagemaker_dist.runtime.stop",
        "ResumeSkip": "sagemaker_dist.runtime.stop",
        "StepSchedule": "sagemaker_dist.runtime.stop",
    },
}


@pytest.mark.parametrize("old", sorted(ALIASES))
def test_an_old_path_warns_and_re_exports(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(DeprecationWarning, match=rf"{old.replace('.', '[.]')} is deprecated"):
        module = importlib.import_module(old)
    for name, home in ALIASES[old].items():
        assert getattr(module, name) is getattr(importlib.import_module(home), name), f"{old}.{name}"


def test_the_old_checkpoints_module_still_has_checkpoint_callback(monkeypatch):
    """Resolved when asked for: importing the old path loads no TensorFlow by itself."""
    pytest.importorskip("tensorflow")
    monkeypatch.delitem(sys.modules, "sagemaker_dist.runtime.checkpoints", raising=False)
    with pytest.warns(DeprecationWarning):
        from sagemaker_dist.runtime.checkpoints import checkpoint_callback
    from sagemaker_dist.runtime.keras.callbacks import checkpoint_callback as home

    assert checkpoint_callback is home
