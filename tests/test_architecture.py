"""The two sides stay apart: the SDK side never loads TensorFlow/Horovod, the runtime never loads the SDK."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import sagemaker_dist

SDK_MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(sagemaker_dist.__path__, "sagemaker_dist.")
    if not m.name.startswith("sagemaker_dist.runtime")
)
RUNTIME_MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(sagemaker_dist.runtime.__path__, "sagemaker_dist.runtime.")
)


def _loaded_after_import(modules: list[str], watched: list[str]) -> dict[str, list[str]]:
    """Import each module in a fresh interpreter; return which watched packages each one loaded."""
    code = (
        "import importlib, json, sys\n"
        f"watched = {watched!r}\n"
        f"modules = {modules!r}\n"
        "out = {}\n"
        "for name in modules:\n"
        "    importlib.import_module(name)\n"
        "    hit = [w for w in watched if w in sys.modules]\n"
        "    if hit:\n"
        "        out[name] = hit\n"
        "        break\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    import json

    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_module_lists_are_not_empty():
    assert "sagemaker_dist.sharding" in SDK_MODULES
    assert "sagemaker_dist.estimator" in SDK_MODULES
    assert "sagemaker_dist.runtime.ranks" in RUNTIME_MODULES


def test_sdk_side_never_imports_tensorflow_or_horovod():
    assert _loaded_after_import(SDK_MODULES, ["tensorflow", "horovod", "keras"]) == {}


def test_runtime_never_imports_the_sagemaker_sdk():
    assert _loaded_after_import(RUNTIME_MODULES, ["sagemaker", "sagemaker.core"]) == {}


def test_public_api_resolves():
    for name in sagemaker_dist.__all__:
        assert getattr(sagemaker_dist, name) is not None, name
