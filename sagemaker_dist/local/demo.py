"""The README's demo job: CIFAR-10-shaped TFRecords on the S3 endpoint, sharded per rank into
manifests, trained by ``examples/train_cifar10.py`` with Horovod through Pipe-mode FIFOs.

The request is built by the same estimator a SageMaker launch uses; only the last step differs
(``run_local`` instead of CreateTrainingJob).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sagemaker_dist.local.demo_data import DemoDataset, write_demo_data
from sagemaker_dist.local.endpoint import s3_client
from sagemaker_dist.s3_objects import parse_s3_uri

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"
DEMO_ENTRY_POINT = "train_cifar10.py"
DEMO_BUCKET = "sagemaker-dist-demo"
LOCAL_ROLE = "arn:aws:iam::000000000000:role/sagemaker-dist-local"
LOCAL_INSTANCE_TYPE = "ml.c5.xlarge"  # CPU type: processes per host must be given
DEMO_FILES, DEMO_RECORDS_PER_FILE, DEMO_VALIDATION_FILES = 8, 64, 2


@dataclass
class DemoJob:
    """A prepared demo job: the CreateTrainingJob request and where its pieces are."""

    request: dict
    source_dir: Path
    dataset: DemoDataset | None
    layout_lines: list[str] = field(default_factory=list)


def ensure_demo_data(bucket: str = DEMO_BUCKET, client=None, **kwargs) -> DemoDataset | None:
    """Write the demo dataset unless ``s3://bucket/cifar10-demo/train/`` already has objects."""
    client = client or s3_client()
    prefix = f"s3://{bucket}/cifar10-demo/"
    _, key = parse_s3_uri(prefix)
    try:
        found = client.list_objects_v2(Bucket=bucket, Prefix=key + "train/", MaxKeys=1).get("KeyCount", 0)
    except client.exceptions.NoSuchBucket:
        found = 0
    if found:
        return None
    return write_demo_data(prefix, client=client, **kwargs)


def demo_estimator(
    bucket: str = DEMO_BUCKET,
    hosts: int = 2,
    processes_per_host: int = 1,
    input_mode: str = "Pipe",
    hyperparameters: dict | None = None,
    source_dir: str | Path = EXAMPLES_DIR,
    entry_point: str = DEMO_ENTRY_POINT,
    output_path: str | None = None,
    **kwargs,
):
    """The estimator of the demo job (the same object that would launch it on SageMaker)."""
    from sagemaker_dist.estimator import HorovodPipeEstimator

    hps = dict(hyperparameters or {})
    return HorovodPipeEstimator(
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
) -> DemoJob:
    """Write the data if missing, shard it into per-rank manifests and build the request."""
    dataset = ensure_demo_data(
        bucket,
        files=DEMO_FILES,
        records_per_file=DEMO_RECORDS_PER_FILE,
        validation_files=DEMO_VALIDATION_FILES,
    )
    if dataset and printer:
        printer(
            f"wrote demo data: {dataset.files} TFRecord files, {dataset.records} records, "
            f"{dataset.bytes / 1e6:.1f} MB under s3://{bucket}/cifar10-demo/"
        )
    hps = {
        "epochs": 2,
        "batch_size": 32,
        "total_train_records": DEMO_FILES * DEMO_RECORDS_PER_FILE,
        "total_validation_records": DEMO_VALIDATION_FILES * DEMO_RECORDS_PER_FILE,
        "tensorboard_interval": 5,
    }
    hps.update(hyperparameters or {})
    estimator = demo_estimator(bucket, hosts, processes_per_host, input_mode, hps)
    inputs = {
        "train": f"s3://{bucket}/cifar10-demo/train/",
        "validation": f"s3://{bucket}/cifar10-demo/validation/",
    }
    prepared = estimator.prepare(inputs, job_name, printer=printer)
    tensorboard = prepared.request.get("TensorBoardOutputConfig", {}).get("S3OutputPath")
    if tensorboard:  # the example script's rank 0 syncs its logs there with the runtime's syncer
        prepared.request["HyperParameters"].setdefault("tensorboard_s3_uri", tensorboard)
    return DemoJob(prepared.request, Path(estimator.source_dir), dataset, prepared.layout.explain())
