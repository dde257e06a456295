"""The notebook runs top to bottom in local mode (LOCAL = True), uses only the public API and draws its
pictures; any failing cell fails the test."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import sagemaker_dist

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "horovod_pipe_mode.ipynb"
EXECUTED = REPO / "docs" / "notebooks" / "horovod_pipe_mode.ipynb"  # ignored; scripts/docs.sh reuses it
EXECUTE = REPO / "scripts" / "lib" / "execute_notebook.py"
PICTURES = 4  # shard balance, input over time, training curves, trials


def _code(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def test_the_notebook_uses_only_the_public_api():
    """What a reader copies must be the supported surface: names from the façade, no request edits."""
    code = "\n".join(_code(nbformat.read(NOTEBOOK, as_version=4)))
    assert "LOCAL = True" in code
    modules = re.findall(r"^\s*(?:from|import) (sagemaker_dist[\w.]*)", code, flags=re.M)
    assert modules and set(modules) == {"sagemaker_dist"}, modules
    for names in re.findall(r"^\s*from sagemaker_dist import (.+)$", code, flags=re.M):
        for name in (n.strip() for n in names.split(",")):
            assert name in sagemaker_dist.__all__, name
    assert not re.search(r"\brequest\s*\[", code), "the notebook edits a request by hand"
    launches = re.findall(r"\.(launch|tune)\(", code)
    assert sorted(launches) == ["launch", "tune"]  # one call each, local or SageMaker by backend alone


@pytest.mark.timeout(1200)  # two local jobs and three tuning trials, each starting TensorFlow ranks
def test_notebook_runs_in_local_mode_and_draws_its_pictures():
    """Executed as scripts/docs.sh does (the same script), into the copy the docs site shows."""
    proc = subprocess.run(
        [sys.executable, str(EXECUTE), str(NOTEBOOK), str(EXECUTED), "--cell-timeout", "600"],
        capture_output=True, text=True, timeout=1150,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]  # names the cell that failed
    nb = nbformat.read(EXECUTED, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "\n".join(o.get("text", "") for o in outputs)
    assert "finished in" in text and "model: s3://" in text
    assert "event file(s) under s3://" in text
    assert re.search(r"best: \S+-\d{3}-", text), text[-3000:]  # the tuning table's best trial
    pictures = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(pictures) >= PICTURES, f"{len(pictures)} picture(s)"
    balance = re.findall(r"plan_shards: the largest shard is ([0-9.]+)x the mean", text)
    naive = re.findall(r"every world-th key: the largest shard is ([0-9.]+)x the mean", text)
    assert balance and naive and float(balance[0]) < float(naive[0])
