"""The demo jobs' training scripts (``sagemaker_dist/local/demo_job``, a source dir, not a package) as
modules, so that a benchmark trains the demo's own model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DEMO_JOB = Path(__file__).resolve().parents[1] / "sagemaker_dist" / "local" / "demo_job"


def demo_module(script: str):
    """``demo_job/<script>`` loaded as a module (its ``main`` not run)."""
    spec = importlib.util.spec_from_file_location(Path(script).stem, DEMO_JOB / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
