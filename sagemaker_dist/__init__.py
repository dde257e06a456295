"""sagemaker-dist: shard S3 data per GPU, lay out Pipe-mode channels, launch Horovod jobs."""

__version__ = "0.1.0"
