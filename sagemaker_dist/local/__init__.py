"""Local mode: a SageMaker Pipe-mode Horovod job on this machine, no Docker, no AWS account.

``run_local(request, source_dir)`` takes the CreateTrainingJob request the estimator builds and runs
it with an /opt/ml tree per simulated host, FIFOs fed from the S3 endpoint and real Horovod ranks;
``LocalBackend`` puts it behind the estimator: ``est.launch(inputs, backend=LocalBackend())``.
Names load lazily, so each rank's ``python -m sagemaker_dist.local.rank_entry`` imports only itself.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "LocalBackend": "backend",
    "embedded_s3": "endpoint",
    "FeedError": "channel_objects",
    "LocalJobError": "job",
    "LocalJobFailed": "job",
    "LocalJobResult": "result",
    "run_local": "job",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sagemaker_dist.local' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
