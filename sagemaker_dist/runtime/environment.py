"""The environment variables the runtime reads (in the ranks, the training script's process), each named
once with what it means, and read or written only through this module: no other runtime module
touches ``os.environ`` (``tests/test_architecture.py`` checks it). It imports the stdlib and the
contract's rank names only, so the framework folders (``tensorflow/``, ``torch/``) and the core import
it alike. (The C framing core's own switch, ``SAGEMAKER_DIST_CRC32C``, is read in C:
``framing/native/record_core.h``.)

Code that takes an ``environ=`` mapping (tests give one; ``setup_ddp`` hands one on) asks
``environ(given)``: the mapping given, else this process's environment. A named reader reads one
variable of this process's environment, or of ``env`` where it takes one. Names another module owns
with their meaning are read through the mapping: the launchers' rank variables
(``contract.rank_slots``: ``OMPI_COMM_WORLD_*``, ``HOROVOD_*``, torchrun's, ``TF_CONFIG``) and the
/opt/ml root (``contract.paths.ROOT_ENV``, which ``ContainerConfig.load`` resolves from ``environ()``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from sagemaker_dist.contract.rank_slots import RANK_VARIABLES, TORCHRUN_VARIABLES

# SageMaker's container (the training toolkit sets them)
MODEL_DIR = "SM_MODEL_DIR"  # where the model goes (uploaded to S3 at the end)
OUTPUT_DATA_DIR = "SM_OUTPUT_DATA_DIR"  # output/data (uploaded as output.tar.gz)
NUM_GPUS = "SM_NUM_GPUS"
CURRENT_HOST = "SM_CURRENT_HOST"  # algo-<n>, this host's name in the job
HOSTS = "SM_HOSTS"  # the job's hosts, a JSON list
# the toolkit's copies of the three config files, read where a file is missing
RESOURCE_CONFIG = "SM_RESOURCE_CONFIG"
INPUT_DATA_CONFIG = "SM_INPUT_DATA_CONFIG"
HYPERPARAMETERS = "SM_HPS"

# torchrun's rendezvous and this rank (the four rank variables: contract.rank_slots.TORCHRUN_VARIABLES)
TORCH_RANK = TORCHRUN_VARIABLES[0]  # "RANK"
MASTER_ADDR = "MASTER_ADDR"  # rank 0's host (or torchrun's store)
MASTER_PORT = "MASTER_PORT"
AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"  # "True": a client of torchrun's own store
USE_LIBUV = "USE_LIBUV"  # torch's TCPStore backend ("1", the default: libuv)
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"  # the GPUs this process sees ("" : none)

# mpirun's and Horovod's
MPI_WORLD_SIZE = RANK_VARIABLES[0][2]  # "OMPI_COMM_WORLD_SIZE": the processes mpirun started
HOROVOD_GLOO_VARIABLES = ("HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS")  # Horovod told to run on Gloo

# sagemaker-dist's own settings
COLLECTIVE_TIMEOUT = "SAGEMAKER_DIST_COLLECTIVE_TIMEOUT"  # seconds a collective may wait for its peers
STOP_GRACE = "SAGEMAKER_DIST_STOP_GRACE"  # seconds from SIGTERM to the watchdog's forced exit
MALLOC_TUNING = "SAGEMAKER_DIST_MALLOC_TUNING"  # "0": leave glibc's malloc thresholds alone
READER = "SAGEMAKER_DIST_READER"  # the Pipe-mode reader of TensorFlow: auto, compiled or python
CACHE = "SAGEMAKER_DIST_CACHE"  # where the compiled reader is built (default ~/.cache/sagemaker-dist)

# glibc's malloc thresholds, read by glibc at start: set, they win over malloc_tuning's
MALLOC_MMAP_THRESHOLD = "MALLOC_MMAP_THRESHOLD_"
MALLOC_TRIM_THRESHOLD = "MALLOC_TRIM_THRESHOLD_"

# the compiled reader's build
COMPILER = "CXX"  # the C++ compiler (else g++, else c++)
CACHE_HOME = "XDG_CACHE_HOME"  # else ~/.cache

# AWS, as boto3 reads them (for the CRT client of sharded checkpoints in S3)
REGION_NAMES = ("AWS_REGION", "AWS_DEFAULT_REGION")  # the first set wins
S3_ENDPOINT_NAMES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")  # botocore's precedence for S3


def environ(given: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """``given``, else this process's environment (live: a later change shows), for the code that
    takes an ``environ=`` mapping."""
    return os.environ if given is None else given


def variable(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The variable ``name`` of ``env`` (default this process's), None where unset or empty."""
    return environ(env).get(name) or None


def set_variable(name: str, value: str) -> None:
    """Set ``name`` in this process's environment (the reader's self-check forces the compiled one)."""
    os.environ[name] = value


# This rank and its host.
def torch_rank(env: Mapping[str, str] | None = None) -> str | None:
    """torchrun's ``$RANK`` as written, or None."""
    return variable(TORCH_RANK, env)


def current_host(env: Mapping[str, str] | None = None) -> str | None:
    """``$SM_CURRENT_HOST`` (algo-1, ...), or None outside a SageMaker-style job."""
    return variable(CURRENT_HOST, env)


def master_addr(env: Mapping[str, str] | None = None) -> str | None:
    """``$MASTER_ADDR``: where the ranks meet, or None."""
    return variable(MASTER_ADDR, env)


def master_port(env: Mapping[str, str] | None = None) -> str | None:
    """``$MASTER_PORT`` as written (the caller checks it is a port), or None."""
    return variable(MASTER_PORT, env)


def cuda_visible_devices() -> str | None:
    """``$CUDA_VISIBLE_DEVICES`` of this process (the one CUDA saw), as written: "" hides every GPU,
    None (unset) shows them all."""
    return os.environ.get(CUDA_VISIBLE_DEVICES)


# sagemaker-dist's settings: the text as written, stripped ("" where unset); the caller checks it.
def collective_timeout(env: Mapping[str, str] | None = None) -> str:
    """``$SAGEMAKER_DIST_COLLECTIVE_TIMEOUT``, stripped; "" where unset."""
    return environ(env).get(COLLECTIVE_TIMEOUT, "").strip()


def stop_grace(env: Mapping[str, str] | None = None) -> str:
    """``$SAGEMAKER_DIST_STOP_GRACE``, stripped; "" where unset."""
    return environ(env).get(STOP_GRACE, "").strip()


def reader() -> str:
    """``$SAGEMAKER_DIST_READER``, stripped and lower-case; "auto" where unset or empty."""
    return os.environ.get(READER, "auto").strip().lower() or "auto"


def cache() -> str | None:
    """``$SAGEMAKER_DIST_CACHE``: the compiled reader's cache root, or None."""
    return variable(CACHE)


def cache_home() -> str | None:
    """``$XDG_CACHE_HOME``, or None (then ~/.cache)."""
    return variable(CACHE_HOME)


def compiler() -> str | None:
    """``$CXX``: the C++ compiler to build the reader with, or None."""
    return variable(COMPILER)


# AWS.
def aws_region() -> str | None:
    """``$AWS_REGION``, else ``$AWS_DEFAULT_REGION``, else None."""
    return next((os.environ[name] for name in REGION_NAMES if variable(name)), None)


def s3_endpoint_url() -> str | None:
    """The S3 endpoint boto3 would use other than AWS's (``$AWS_ENDPOINT_URL_S3``, else
    ``$AWS_ENDPOINT_URL``: local mode's embedded S3, MinIO), or None."""
    return next((os.environ[name] for name in S3_ENDPOINT_NAMES if variable(name)), None)
