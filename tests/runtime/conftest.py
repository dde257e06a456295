"""``pipe_reader``: run a PipeModeDataset test through both readers, the compiled op and Python's.

The compiled one is built for real (at first use, into the build cache); where it cannot be built
the test skips naming why, and under CI=true a skip is a failure (tests/conftest.py): CI has g++.
"""

from __future__ import annotations

import pytest

from sagemaker_dist.runtime.tensorflow.data import native_build


@pytest.fixture(params=["python", "compiled"])
def pipe_reader(request, monkeypatch):
    """The reader PipeModeDataset runs in this test (SAGEMAKER_DIST_READER, also for child processes)."""
    monkeypatch.setenv(native_build.READER_ENV, request.param)
    if request.param == "compiled":
        pytest.importorskip("tensorflow")
        try:
            native_build.compiled_op()
        except native_build.NativeReaderError as exc:
            pytest.skip(str(exc))
    return request.param
