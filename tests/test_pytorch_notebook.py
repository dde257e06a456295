"""The PyTorch notebook runs top to bottom in local mode (LOCAL = True): it packs a generated image set into
WebDataset shards, reads one back into a grid of decoded samples, plans and launches a torchrun job over
the shards, and plots its loss and throughput; it uses only the public API; any failing cell fails the
test."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import sagemaker_dist
import sagemaker_dist.runtime

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "pytorch_pipe_mode.ipynb"
EXECUTED = REPO / "docs" / "notebooks" / "pytorch_pipe_mode.ipynb"  # ignored; scripts/docs.sh reuses it
EXECUTE = REPO / "scripts" / "lib" / "execute_notebook.py"
PICTURES = 3  # the shards, the decoded samples, loss and throughput
FACADES = {"sagemaker_dist": sagemaker_dist, "sagemaker_dist.runtime": sagemaker_dist.runtime}


def _code(nb) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")


def test_the_pytorch_notebook_and_its_script_use_only_the_public_api():
    code = _code(nbformat.read(NOTEBOOK, as_version=4))
    assert "LOCAL = True" in code
    script = (NOTEBOOK.parent / "pytorch_job" / "train_images.py").read_text()
    for source in (code, script):
        tree = ast.parse("\n".join(line for line in source.splitlines() if not line.startswith("%")))
        imported = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        ours = [n for n in imported if (getattr(n, "module", None) or "").startswith("sagemaker_dist")]
        plain = [n for n in imported if isinstance(n, ast.Import) and "sagemaker_dist" in ast.dump(n)]
        assert ours and not plain  # names from the façades, not modules
        for node in ours:
            assert node.module in FACADES, node.module
            for alias in node.names:
                assert alias.name in FACADES[node.module].__all__, (node.module, alias.name)
    assert len(re.findall(r"\.launch\(", code)) == 1  # local or SageMaker by the backend alone


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_the_pytorch_notebook_runs_in_local_mode_and_draws_its_pictures():
    """Executed as scripts/docs.sh does (the same script), into the copy the docs site shows."""
    proc = subprocess.run(
        [sys.executable, str(EXECUTE), str(NOTEBOOK), str(EXECUTED), "--cell-timeout", "300"],
        capture_output=True, text=True, timeout=560,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]  # names the cell that failed
    nb = nbformat.read(EXECUTED, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "\n".join(o.get("text", "") for o in outputs)
    assert "packed 288 samples, 3 classes into 4 webdataset shard(s)" in text
    assert "model: s3://" in text and "exits with code 0" in text
    losses = [float(x) for x in re.findall(r"^epoch \d+: loss ([\d.]+)", text, flags=re.M)]
    assert len(losses) == 6 and losses[-1] < losses[0], text[-3000:]  # it learns
    pictures = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(pictures) >= PICTURES, f"{len(pictures)} picture(s)"
