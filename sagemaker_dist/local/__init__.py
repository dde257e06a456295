"""Local mode: a SageMaker Pipe-mode job on this machine, no AWS account.

``run_local(request, source_dir)`` takes the CreateTrainingJob request the estimator builds and runs
it with an /opt/ml tree per simulated host (``sagemaker_dist.host``), FIFOs fed from the S3 endpoint
and real ranks started by one of ``launchers``; ``LocalBackend`` puts it behind the estimator:
``est.launch(inputs, backend=LocalBackend())``. The public names are re-exported from
``sagemaker_dist``. Nothing is imported here, so each rank's ``python -m
sagemaker_dist.local.rank_entry`` imports only what it needs.
"""
