"""The README's demo job: CIFAR-10-shaped TFRecords on the S3 endpoint, sharded per rank into
manifests, trained through Pipe-mode FIFOs by the distribution's demo script (package data, its
registry entry's ``demo_script``): ``demo_job/train_cifar10.py`` (Horovod, MultiWorkerMirroredStrategy)
or ``demo_job/train_torch.py`` (PyTorch DDP under torchrun). ``model="gpt"`` (torchrun only) is the
sharded-model demo instead: token records trained by ``demo_job/train_gpt.py``, a small GPT under FSDP2.

The request is built by the same estimator a SageMaker launch uses; only the last step differs
(``run_local`` instead of CreateTrainingJob).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from sagemaker_dist.aws.s3_objects import s3_client
from sagemaker_dist.contract import hyperparameters as hp
from sagemaker_dist.contract.distributions import DEFAULT as DEFAULT_DISTRIBUTION
from sagemaker_dist.contract.distributions import REGISTRY
from sagemaker_dist.contract.distributions import distribution as registered
from sagemaker_dist.contract.s3_uri import parse_s3_uri
from sagemaker_dist.contract.training_request import edited_request
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.local.backend import LocalBackend
from sagemaker_dist.local.defaults import LOCAL_INSTANCE_TYPE, LOCAL_ROLE
from sagemaker_dist.local.demo_data import (
    DATASET_FILE,
    GENERATOR,
    TOKEN_GENERATOR,
    DemoDataset,
    write_demo_data,
    write_token_data,
)

DEMO_JOB_DIR = Path(__file__).resolve().parent / "demo_job"  # package data: installed with the package
DEMO_ENTRY_POINT = registered(DEFAULT_DISTRIBUTION).demo_script  # another distribution: its entry's
DEMO_BUCKET = "sagemaker-dist-demo"
DEMO_FILES, DEMO_RECORDS_PER_FILE, DEMO_VALIDATION_FILES = 8, 64, 2  # at least; more for many ranks
# --interrupt-at: epochs long enough (about 12 s each here, 2 ranks) for an interruption to land inside
# training, in a prefix of their own so the plain demo keeps its size
INTERRUPTED_DEMO_PREFIX, INTERRUPTED_DEMO_FILES_PER_RANK = "cifar10-demo-long", 32
# what the demo asks of every distribution's demo script (each accepts them all), before the user's
# own; TensorBoard's logs reach S3 every 5 s, so that a short demo shows them
DEMO_HYPERPARAMETERS = {"epochs": 2, "batch_size": 32, "tensorboard_interval": 5}
DEMO_MODELS = ("cnn", "gpt")  # cnn: the distribution's own demo script; gpt: FSDP2 on token records
GPT_SCRIPT, GPT_PREFIX, GPT_RECORDS_PER_FILE = "train_gpt.py", "tokens-demo", 64
GPT_FILES_PER_RANK = {False: 4, True: 16}  # 16 steps an epoch a rank; --interrupt-at: 64
GPT_HYPERPARAMETERS = {"epochs": 2, "batch_size": 16, "tensorboard_interval": 5}


@dataclass
class DemoJob:
    """A prepared demo job: the CreateTrainingJob request and where its pieces are."""

    request: dict
    source_dir: Path
    dataset: DemoDataset | None
    layout_lines: list[str] = field(default_factory=list)


def ensure_demo_data(
    bucket: str = DEMO_BUCKET,
    client=None,
    files: int = DEMO_FILES,
    validation_files: int = DEMO_VALIDATION_FILES,
    prefix: str = "cifar10-demo",
    tokens: bool = False,
    **kwargs,
) -> DemoDataset | None:
    """Write the demo dataset (``tokens``: the token records) unless ``s3://bucket/<prefix>/`` already
    holds one this large. Returns None when the existing data was kept; its ``dataset.json`` says how
    many records a file has."""
    client = client or s3_client()
    _, key = parse_s3_uri(f"s3://{bucket}/{prefix}/")
    existing = _dataset_info(client, bucket, key)
    current = existing and existing.get("generator") == (TOKEN_GENERATOR if tokens else GENERATOR)
    if current and existing["files"] >= files and existing["validation_files"] >= validation_files:
        return None
    where = f"s3://{bucket}/{prefix}/"
    if tokens:
        return write_token_data(where, files=files, client=client, **kwargs)
    return write_demo_data(where, files=files, validation_files=validation_files, client=client, **kwargs)


def _dataset_info(client, bucket: str, key: str) -> dict | None:
    try:
        return json.loads(client.get_object(Bucket=bucket, Key=key + DATASET_FILE)["Body"].read())
    except (client.exceptions.NoSuchKey, client.exceptions.NoSuchBucket, ValueError):
        return None


def demo_estimator(
    bucket: str = DEMO_BUCKET,
    hosts: int = 2,
    processes_per_host: int = 1,
    input_mode: str = "Pipe",
    hyperparameters: dict | None = None,
    source_dir: str | Path = DEMO_JOB_DIR,
    entry_point: str = DEMO_ENTRY_POINT,
    output_path: str | None = None,
    **kwargs,
):
    """The estimator of the demo job (the same object that would launch it on SageMaker)."""
    from sagemaker_dist.launch.estimator import DistributedEstimator

    hps = dict(hyperparameters or {})
    return DistributedEstimator(
        entry_point=entry_point,
        source_dir=str(source_dir),
        role=LOCAL_ROLE,
        instance_type=LOCAL_INSTANCE_TYPE,
        instance_count=hosts,
        processes_per_host=processes_per_host,
        hyperparameters=hps,
        input_mode=input_mode,
        validation="per-worker",
        output_path=output_path or f"s3://{bucket}/jobs",
        base_job_name="sagemaker-dist-demo",
        **kwargs,
    )


def prepare_demo_job(
    bucket: str = DEMO_BUCKET,
    hosts: int = 2,
    processes_per_host: int = 1,
    input_mode: str = "Pipe",
    hyperparameters: dict | None = None,
    job_name: str | None = None,
    printer=print,
    distribution: str = DEFAULT_DISTRIBUTION,
    long: bool = False,
    model: str | None = None,
    shuffle_seed: int | None = None,
) -> DemoJob:
    """Write the data if missing, shard it into per-rank manifests and build the request.

    The file counts grow with the world size (4 train files and 1 validation file per rank at least),
    and no rank is told any record count: every epoch ends where the first rank runs out. ``long``:
    the larger dataset ``--interrupt-at`` uses (``INTERRUPTED_DEMO_FILES_PER_RANK`` files per rank).
    ``model``: ``"gpt"`` for the sharded-model demo (torchrun), else the distribution's own.
    ``shuffle_seed``: SageMaker's ShuffleConfig on the Pipe channels, as the estimator's.
    """
    if model == "gpt":
        return _prepare_gpt_job(bucket, hosts, processes_per_host, input_mode, hyperparameters, job_name,
                                printer, distribution, long, shuffle_seed)  # fmt: skip
    if model not in (None, "cnn"):
        raise ConfigurationError(f"demo model {model!r}: choose one of {', '.join(DEMO_MODELS)}")
    world = hosts * processes_per_host
    client = s3_client()
    prefix = INTERRUPTED_DEMO_PREFIX if long else "cifar10-demo"
    dataset = ensure_demo_data(
        bucket,
        client,
        prefix=prefix,
        files=max(DEMO_FILES, (INTERRUPTED_DEMO_FILES_PER_RANK if long else 4) * world),
        validation_files=max(DEMO_VALIDATION_FILES, world),
        records_per_file=DEMO_RECORDS_PER_FILE,
    )
    hps = {**DEMO_HYPERPARAMETERS, **(hyperparameters or {})}
    entry_point = registered(distribution).demo_script
    estimator = demo_estimator(bucket, hosts, processes_per_host, input_mode, hps, entry_point=entry_point,
                               distribution=distribution, shuffle_seed=shuffle_seed)  # fmt: skip
    inputs = {
        "train": f"s3://{bucket}/{prefix}/train/",
        "validation": f"s3://{bucket}/{prefix}/validation/",
    }
    return _prepared(estimator, inputs, job_name, printer, dataset, "records")


def _prepare_gpt_job(bucket, hosts, processes_per_host, input_mode, hyperparameters, job_name, printer,
                     distribution, long, shuffle_seed) -> DemoJob:  # fmt: skip
    """The sharded-model demo: token records (no validation channel) and ``train_gpt.py``."""
    if not registered(distribution).sharded_demo:
        runs_it = " or ".join(d.name for d in REGISTRY.values() if d.sharded_demo)
        raise ConfigurationError(
            f"--model gpt is a PyTorch FSDP2 demo, and this job's distribution is {distribution!r}: "
            f"give --distribution {runs_it}"
        )
    world = hosts * processes_per_host
    prefix = GPT_PREFIX + ("-long" if long else "")
    files = max(16, GPT_FILES_PER_RANK[long] * world)
    dataset = ensure_demo_data(
        bucket, s3_client(), files, 0, prefix, tokens=True, records_per_file=GPT_RECORDS_PER_FILE
    )
    hps = {**GPT_HYPERPARAMETERS, **(hyperparameters or {})}
    estimator = demo_estimator(bucket, hosts, processes_per_host, input_mode, hps, entry_point=GPT_SCRIPT,
                               distribution=distribution, shuffle_seed=shuffle_seed)  # fmt: skip
    inputs = {"train": f"s3://{bucket}/{prefix}/train/"}
    return _prepared(estimator, inputs, job_name, printer, dataset, "token records")


def _prepared(estimator, inputs: dict, job_name, printer, dataset, what: str) -> DemoJob:
    if dataset and printer:
        printer(
            f"wrote demo data: {dataset.files} TFRecord files, {dataset.records} {what}, "
            f"{dataset.bytes / 1e6:.1f} MB under {inputs['train'].removesuffix('train/')}"
        )
    prepared = estimator.prepare(inputs, job_name, printer=printer, backend=LocalBackend())
    request = prepared.request  # no record counts: the ranks agree on epoch ends
    training = prepared.training
    tensorboard = training.tensorboard_s3_uri
    if tensorboard and hp.TENSORBOARD_S3_URI not in training.hyperparameters:
        # the example script's rank 0 syncs its logs there with the runtime's syncer
        request = edited_request(request, hyperparameters={hp.TENSORBOARD_S3_URI: tensorboard})
    return DemoJob(request, Path(estimator.source_dir), dataset, prepared.layout.explain())
