"""Fixtures the launch tests share: no reachable AWS, and a one-line entry script."""

from __future__ import annotations

import pytest


@pytest.fixture
def no_aws(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: any AWS call fails


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print(1)\n")
    return str(path)
