"""Hyperparameter names the sagemaker-training toolkit and sagemaker-dist read, and their encoding.

SageMaker stores every hyperparameter value as a string. The toolkit json-decodes each value it can
and hands the user's (those not starting with ``sagemaker_``) to the script as ``--key value``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

PROGRAM = "sagemaker_program"  # the entry script, relative to the source directory
SUBMIT_DIRECTORY = "sagemaker_submit_directory"  # the source tarball (S3 URI or a path in the container)
MPI_ENABLED = "sagemaker_mpi_enabled"
MPI_PROCESSES_PER_HOST = "sagemaker_mpi_num_of_processes_per_host"
MPI_CUSTOM_OPTIONS = "sagemaker_mpi_custom_mpi_options"
# the TF toolkit writes TF_CONFIG (one worker per host, <host>:8890) and runs the script once per host
MWMS_ENABLED = "sagemaker_multi_worker_mirrored_strategy_enabled"
# sagemaker-training's TorchDistributedRunner: torchrun once per host, --nproc_per_node from
# MPI_PROCESSES_PER_HOST (default the host's GPUs), --master_addr algo-1 --master_port 7777
TORCH_DISTRIBUTED_ENABLED = "sagemaker_torch_distributed_enabled"
LAYOUT = "sagemaker_dist_layout"  # the channel layout, so the container never guesses
# a user hyperparameter: where the example scripts' rank 0 syncs its TensorBoard logs (setup()'s argument)
TENSORBOARD_S3_URI = "tensorboard_s3_uri"
FRAMEWORK_PREFIX = "sagemaker_"  # the toolkit keeps these from the script's arguments
FRAMEWORK_HYPERPARAMETERS = (
    PROGRAM,
    SUBMIT_DIRECTORY,
    MPI_ENABLED,
    MPI_PROCESSES_PER_HOST,
    MPI_CUSTOM_OPTIONS,
    MWMS_ENABLED,
    TORCH_DISTRIBUTED_ENABLED,
    LAYOUT,
)


def is_framework(key: str) -> bool:
    return key.startswith(FRAMEWORK_PREFIX)


def encode_value(value: Any) -> str:
    """Strings as they are; anything else as compact JSON (the toolkit json-decodes what it can)."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def encode_all(hyperparameters: Mapping | None) -> dict[str, str]:
    """Every value as SageMaker stores it: a string."""
    return {str(k): encode_value(v) for k, v in (hyperparameters or {}).items()}


def decode_all(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Decode each value that is JSON (as the toolkit does); others stay strings."""
    out = {}
    for key, value in raw.items():
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                pass
        out[key] = value
    return out


def decode_one(hyperparameters: Mapping[str, Any], key: str, default=None):
    """One hyperparameter, decoded, or ``default`` if absent."""
    return decode_all({key: hyperparameters[key]})[key] if key in hyperparameters else default


def user_hyperparameters(hyperparameters: Mapping[str, Any]) -> dict[str, Any]:
    """The script's own hyperparameters: every key but the framework's ``sagemaker_*``."""
    return {k: v for k, v in hyperparameters.items() if not is_framework(k)}
