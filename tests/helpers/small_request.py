"""A small CreateTrainingJob request written by hand: 2 CPU hosts x 1 Horovod rank, one File channel,
no sagemaker-dist layout; for commands that take ``--request`` and must refuse it before any S3 call."""

from __future__ import annotations

import json
from pathlib import Path


def small_request(hyperparameters: dict) -> dict:
    """The request, with these user hyperparameters stored as the SDK stores them (JSON-encoded)."""
    return {
        "TrainingJobName": "small",
        "RoleArn": "arn:aws:iam::123456789012:role/SageMakerRole",
        "AlgorithmSpecification": {"TrainingImage": "img:1", "TrainingInputMode": "File"},
        "HyperParameters": {
            "sagemaker_program": json.dumps("train.py"),
            "sagemaker_mpi_enabled": "true",
            "sagemaker_mpi_num_of_processes_per_host": "1",
            **{k: json.dumps(v) for k, v in hyperparameters.items()},
        },
        "InputDataConfig": [
            {
                "ChannelName": "train",
                "DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://b/t/"}},
            }
        ],
        "OutputDataConfig": {"S3OutputPath": "s3://b/out"},
        "ResourceConfig": {"InstanceType": "ml.c5.xlarge", "InstanceCount": 2, "VolumeSizeInGB": 30},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    }


def small_request_file(folder: Path, hyperparameters: dict) -> Path:
    """The request as ``folder/request.json``."""
    path = folder / "request.json"
    path.write_text(json.dumps(small_request(hyperparameters)))
    return path
