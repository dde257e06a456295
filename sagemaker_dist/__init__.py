"""sagemaker-dist: shard S3 data per GPU, lay out Pipe-mode channels, launch Horovod jobs.

Names are imported lazily (PEP 562) so that the container runtime, which imports
``sagemaker_dist.runtime``, never pulls in the SageMaker SDK, and the SDK side never pulls in TensorFlow.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    # channel layout (pure)
    "plan_layout": "layout",
    "ChannelLayout": "layout",
    "RoleLayout": "layout",
    "LayoutError": "layout",
    "LAYOUT_HYPERPARAMETER": "layout",
    "MAX_CHANNELS": "layout",
    # instance catalog
    "gpus_per_instance": "instances",
    "processes_per_host": "instances",
    "UnknownInstanceTypeError": "instances",
    "ProcessesPerHostError": "instances",
    # S3 listing, sharding and shard writing
    "list_objects": "s3_objects",
    "parse_s3_uri": "s3_objects",
    "S3Object": "s3_objects",
    "plan_shards": "sharding",
    "ShardPlan": "sharding",
    "check_host_split": "sharding",
    "NotEnoughObjectsError": "sharding",
    "write_shards": "shard_writer",
    "read_shard_set": "shard_writer",
    "plan_shard_set": "shard_writer",
    "ShardSet": "shard_writer",
    # launching
    "HorovodPipeEstimator": "estimator",
    "TrainingJobHandle": "estimator",
    "ChannelSource": "estimator",
    "EstimatorError": "estimator",
    "AwsRequestError": "estimator",
    "sdk_channels": "estimator",
    "validate_request": "request_validation",
    "RequestValidationError": "request_validation",
    "pack_source": "source_package",
    "container_image_uri": "images",
    "dlc_tensorflow_image_uri": "images",
    # local mode
    "run_local": "local",
    "LocalJobError": "local",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sagemaker_dist' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
