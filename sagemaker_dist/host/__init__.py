"""One training host as the SageMaker platform prepares and serves it, around the ranks: the job spec
read from the request, the ``/opt/ml`` tree, Pipe-mode FIFOs and File-mode downloads fed from S3,
checkpoints synced both ways, the outputs packed, the source directory fetched.

Local mode's simulated hosts and the platforms' pipe agent (Slurm, Kubernetes, a plain machine)
both run on it; it knows nothing of how the ranks are started.
"""
