"""Local mode: a SageMaker Pipe-mode Horovod job on this machine, no Docker, no AWS account.

``run_local(request, source_dir)`` takes the CreateTrainingJob request the estimator builds and runs
it with an /opt/ml tree per simulated host, FIFOs fed from the S3 endpoint and real Horovod ranks;
``LocalBackend`` puts it behind the estimator: ``est.launch(inputs, backend=LocalBackend())``.
"""

from sagemaker_dist.local.backend import LocalBackend
from sagemaker_dist.local.endpoint import embedded_s3
from sagemaker_dist.local.feeder import FeedError
from sagemaker_dist.local.job import LocalJobError, LocalJobFailed, LocalJobResult, run_local

__all__ = [
    "FeedError",
    "LocalBackend",
    "LocalJobError",
    "LocalJobFailed",
    "LocalJobResult",
    "embedded_s3",
    "run_local",
]
