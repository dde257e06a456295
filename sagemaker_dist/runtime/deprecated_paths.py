"""Module paths of earlier releases, kept as aliases of the modules' homes (the TensorFlow side in
``runtime/tensorflow/``, the epoch reader in ``runtime/epoch_reader/``). Importing an old path warns
(DeprecationWarning) and gives the module at its home, the same object: classes, ``isinstance``, pickles
and a ``monkeypatch`` by the old path all reach the one module.

``runtime/__init__.py`` puts the finder first on ``sys.meta_path``: a submodule of an old package must be
answered here, before Python's path finder loads its file a second time under the old name.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
import warnings

# old path -> its home; a package's submodules follow it (``runtime.keras.setup`` is
# ``runtime.tensorflow.keras.setup``) unless listed themselves
MOVED = {
    "sagemaker_dist.runtime.horovod_keras": "sagemaker_dist.runtime.tensorflow.horovod_keras",
    "sagemaker_dist.runtime.mwms_keras": "sagemaker_dist.runtime.tensorflow.mwms_keras",
    "sagemaker_dist.runtime.file_dataset": "sagemaker_dist.runtime.tensorflow.data.file_dataset",
    "sagemaker_dist.runtime.keras": "sagemaker_dist.runtime.tensorflow.keras",
    "sagemaker_dist.runtime.keras.file_dataset": "sagemaker_dist.runtime.tensorflow.data.file_dataset",
    "sagemaker_dist.runtime.keras.stop": "sagemaker_dist.runtime.stop",
    "sagemaker_dist.runtime.pipe": "sagemaker_dist.runtime.tensorflow.data",
    "sagemaker_dist.runtime.pipe.dataset": "sagemaker_dist.runtime.tensorflow.data.pipe_dataset",
    "sagemaker_dist.runtime.pipe.compiled": "sagemaker_dist.runtime.tensorflow.data.compiled_dataset",
    "sagemaker_dist.runtime.pipe.reader": "sagemaker_dist.runtime.epoch_reader.reader",
    "sagemaker_dist.runtime.pipe.epochs": "sagemaker_dist.runtime.epoch_reader.epochs",
    "sagemaker_dist.runtime.pipe.order": "sagemaker_dist.runtime.epoch_reader.order",
}


def home(name: str) -> str | None:
    """Where the module once imported as ``name`` lives now, or None when ``name`` is no old path."""
    if name in MOVED:
        return MOVED[name]
    package = name.rpartition(".")[0]
    while package:
        if package in MOVED:
            return MOVED[package] + name[len(package) :]
        package = package.rpartition(".")[0]
    return None


class _Alias:
    """Loads an old path as its home: a placeholder module that its home replaces in ``sys.modules``
    (the import system then hands the home to the importer and binds it on the old parent)."""

    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        warnings.warn(
            f"{module.__name__} is deprecated; import {self.target}", DeprecationWarning, stacklevel=2
        )
        sys.modules[module.__name__] = importlib.import_module(self.target)

    def get_code(self, name: str):
        """``python -m <old path>`` runs its home's code: images and scripts that build the compiled
        reader with ``python -m sagemaker_dist.runtime.pipe.native_build`` keep working."""
        warnings.warn(f"{name} is deprecated; run python -m {self.target}", DeprecationWarning, stacklevel=2)
        return importlib.util.find_spec(self.target).loader.get_code(self.target)


class MovedModules:
    """The meta path finder that answers the old paths in ``MOVED`` (and only those whose home exists)."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        new = home(name)
        found = None if new is None else importlib.util.find_spec(new)
        if found is None:
            return None
        return importlib.machinery.ModuleSpec(name, _Alias(new), origin=found.origin)


def install() -> None:
    """Put the finder first on ``sys.meta_path``, once per process."""
    if not any(finder is MovedModules for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModules)
