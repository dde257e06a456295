"""The notebook runs top to bottom in local mode (LOCAL = True); any failing cell fails the test."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "horovod_pipe_mode.ipynb"


def test_notebook_runs_in_local_mode(tmp_path, monkeypatch):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert any("LOCAL = True" in c.source for c in nb.cells if c.cell_type == "code")
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)  # the notebook brings its own endpoint and credentials
    client = NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    )
    client.execute()  # raises CellExecutionError naming the cell that failed
    outputs = "\n".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
    )
    assert "finished in" in outputs and "model: s3://" in outputs
    assert "epoch_loss" in outputs
