"""sagemaker-dist: shard S3 data per GPU, lay out Pipe-mode channels, launch Horovod jobs.

The façade lists the calls users make, the types they get back and the error families they catch.
Names are imported lazily (PEP 562) so that the container runtime, which imports
``sagemaker_dist.runtime``, never pulls in the SageMaker SDK, and the SDK side never pulls in
TensorFlow. The runtime's own API (``rank_dataset``, ``PipeModeDataset``, ``horovod_keras``) is in
``sagemaker_dist.runtime``.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    # error families (catch these)
    "SageMakerDistError": "errors",
    "ConfigurationError": "errors",
    "DataError": "errors",
    "AwsError": "errors",
    "JobFailedError": "errors",
    "ToolkitArgumentWarning": "contract.toolkit",
    # channel layout (pure)
    "plan_layout": "contract.layout",
    "ChannelLayout": "contract.layout",
    "RoleLayout": "contract.layout",
    # instance catalog
    "gpus_per_instance": "aws.instances",
    "processes_per_host": "aws.instances",
    # S3 listing, sharding and shard writing
    "list_objects": "aws.s3_objects",
    "parse_s3_uri": "contract.s3_uri",
    "S3Object": "aws.s3_objects",
    "plan_shards": "launch.sharding",
    "ShardPlan": "launch.sharding",
    "write_shards": "launch.shard_writer",
    "read_shard_set": "launch.shard_writer",
    "ShardSet": "launch.shard_writer",
    # writing records: tf.train.Example, TFRecord and RecordIO files (no TensorFlow)
    "encode_example": "launch.records",
    "TFRecordWriter": "launch.records",
    "RecordIOWriter": "launch.records",
    "write_tfrecords": "launch.records",
    "write_recordio": "launch.records",
    "RecordsWritten": "launch.records",
    "WebDatasetWriter": "launch.tar_shards",
    # packing an image set into balanced WebDataset or TFRecord shards (sagemaker-dist pack)
    "pack_dataset": "launch.pack",
    "read_pack_index": "launch.pack",
    "PackResult": "launch.pack",
    # launching
    "DistributedEstimator": "launch.estimator",
    "PreparedJob": "launch.backends",
    "ChannelSource": "launch.inputs",
    "SageMakerBackend": "launch.backends",
    "TrainingJobHandle": "launch.training_job",
    "TrainingJobFailed": "launch.training_job",
    "sdk_channels": "launch.account",
    "validate_request": "aws.request_validation",
    "container_image_uri": "launch.images",
    "dlc_tensorflow_image_uri": "launch.images",
    # hyperparameter tuning (SageMaker: est.tune; this machine: sagemaker-dist tune --local)
    "TuningSpec": "aws.tuning",
    "ParamRange": "aws.tuning_ranges",
    "TuningError": "aws.tuning_ranges",
    "TuningJobHandle": "launch.tuning_handle",
    "TuningJobFailed": "launch.tuning_handle",
    "TrialSummary": "launch.tuning_handle",
    "run_local_tuning": "local.tuning",
    "LocalTuningResult": "local.tuning",
    # local mode
    "LocalBackend": "local.backend",
    "run_local": "local.job",
    "LocalJobResult": "local.result",
    "LocalJobError": "local.launchers.base",
    "LocalJobFailed": "local.job",
    "embedded_s3": "local.endpoint",
    "write_demo_data": "local.demo_data",
    "DemoDataset": "local.demo_data",
    "JobSpecError": "host.job_spec",
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
