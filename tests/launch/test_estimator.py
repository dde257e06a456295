"""DistributedEstimator against a moto server over HTTP: real S3 objects, real CreateTrainingJob calls."""

from __future__ import annotations

import io
import json
import os
import tarfile

import boto3
import pytest
from helpers.scripted_handle import ScriptedHandle

from sagemaker_dist.aws.instances import ProcessesPerHostError, UnknownInstanceTypeError
from sagemaker_dist.aws.request_validation import RequestValidationError
from sagemaker_dist.contract.layout import ChannelLayout, LayoutError
from sagemaker_dist.launch.account import role_arn, sdk_channels, with_sdk_config_defaults
from sagemaker_dist.launch.estimator import DistributedEstimator
from sagemaker_dist.launch.images import ImageError, container_image_uri, dlc_tensorflow_image_uri
from sagemaker_dist.launch.inputs import ChannelSource, EstimatorError
from sagemaker_dist.launch.request import DEFAULT_MPI_OPTIONS, default_job_name
from sagemaker_dist.launch.sharding import NotEnoughObjectsError
from sagemaker_dist.launch.source_package import SourcePackageError
from sagemaker_dist.launch.training_job import TrainingJobFailed

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/sagemaker-dist:0.1.0"
ROLE_ARN = "arn:aws:iam::123456789012:role/SageMakerRole"


@pytest.fixture
def session(aws_env, bucket):
    """An SDK v3 session whose default bucket exists (so the SDK makes no STS/bucket-creation calls)."""
    from sagemaker.core.helper.session_helper import Session

    return Session(boto_session=boto3.Session(region_name="us-east-1"), default_bucket=bucket)


@pytest.fixture
def sagemaker(aws_env):
    return boto3.client("sagemaker", region_name="us-east-1")


def job_names(sagemaker) -> set[str]:
    pages = sagemaker.get_paginator("list_training_jobs").paginate()
    return {j["TrainingJobName"] for page in pages for j in page["TrainingJobSummaries"]}


@pytest.fixture
def assert_no_job(sagemaker):
    """Checks that ListTrainingJobs shows no job beyond those that existed when the test began.

    The moto server lives for the whole session, so earlier tests' jobs are still listed.
    """
    before = job_names(sagemaker)

    def check():
        assert job_names(sagemaker) == before

    return check


@pytest.fixture
def source_dir(tmp_path):
    src = tmp_path / "src"
    (src / "lib").mkdir(parents=True)
    (src / "train.py").write_text("import lib.model\nprint('training')\n")
    (src / "lib" / "__init__.py").write_text("")
    (src / "lib" / "model.py").write_text("LAYERS = 3\n")
    (src / "lib" / "__pycache__").mkdir()
    (src / "lib" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0" * 10)
    return src


def put_objects(s3, bucket: str, prefix: str, sizes: list[int]) -> list[str]:
    keys = []
    for i, size in enumerate(sizes):
        key = f"{prefix}part-{i:05d}.tfrecord"
        s3.put_object(Bucket=bucket, Key=key, Body=b"x" * size)
        keys.append(key)
    return keys


def read_object(s3, uri: str) -> bytes:
    bucket, _, key = uri[len("s3://") :].partition("/")
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


def manifest_keys(s3, uri: str) -> list[str]:
    doc = json.loads(read_object(s3, uri))
    prefix = doc[0]["prefix"]
    return [prefix + rel for rel in doc[1:]]


def all_keys(s3, bucket: str) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_two_p3_16xlarge_hosts_give_16_ranks_with_one_pipe_channel_each(
    session, sagemaker, s3, bucket, source_dir
):
    train_keys = put_objects(s3, bucket, "data/train/", [1000 + 37 * i for i in range(40)])
    put_objects(s3, bucket, "data/val/", [500, 600])
    est = DistributedEstimator(
        "train.py",
        role="SageMakerRole",  # a name: the account comes from STS (moto's 123456789012)
        instance_type="ml.p3.16xlarge",
        instance_count=2,
        source_dir=str(source_dir),
        image_uri=IMAGE,
        hyperparameters={"epochs": 3, "learning_rate": 0.1, "optimizer": "adam"},
        shuffle_seed=7,
        use_spot=True,
        max_run=3600,
        max_wait=7200,
        subnets=["subnet-0abc"],
        security_group_ids=["sg-0abc"],
        volume_kms_key="alias/volume",
        output_kms_key="alias/output",
        encrypt_inter_container_traffic=True,
        tags={"team": "ml"},
        environment={"TF_CPP_MIN_LOG_LEVEL": "1"},
        mpi_options="-x HOROVOD_FUSION_THRESHOLD=33554432",
        sagemaker_session=session,
    )
    lines = []
    handle = est.launch(
        {"train": f"s3://{bucket}/data/train/", "validation": f"s3://{bucket}/data/val/"},
        job_name="resnet-2x-p3",
        wait=True,
        poll=0.1,
        printer=lines.append,
    )
    assert handle.name == "resnet-2x-p3"
    job = sagemaker.describe_training_job(TrainingJobName="resnet-2x-p3")

    assert job["AlgorithmSpecification"]["TrainingImage"] == IMAGE
    assert job["AlgorithmSpecification"]["TrainingInputMode"] == "Pipe"
    assert job["RoleArn"] == ROLE_ARN
    assert job["ResourceConfig"]["InstanceType"] == "ml.p3.16xlarge"
    assert job["ResourceConfig"]["InstanceCount"] == 2
    assert job["ResourceConfig"]["VolumeKmsKeyId"] == "alias/volume"
    assert job["OutputDataConfig"] == {
        "S3OutputPath": f"s3://{bucket}/sagemaker-dist",
        "KmsKeyId": "alias/output",
    }
    assert job["EnableManagedSpotTraining"] is True
    assert job["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200}
    assert job["EnableInterContainerTrafficEncryption"] is True
    assert job["EnableNetworkIsolation"] is False
    assert job["VpcConfig"] == {"SecurityGroupIds": ["sg-0abc"], "Subnets": ["subnet-0abc"]}
    assert job["CheckpointConfig"] == {
        "S3Uri": f"s3://{bucket}/sagemaker-dist/resnet-2x-p3/checkpoints",
        "LocalPath": "/opt/ml/checkpoints",
    }
    assert (
        job["TensorBoardOutputConfig"]["S3OutputPath"]
        == f"s3://{bucket}/sagemaker-dist/resnet-2x-p3/tensorboard"
    )

    channels = {c["ChannelName"]: c for c in job["InputDataConfig"]}
    assert list(channels) == [f"train_{i}" for i in range(16)] + ["validation"]
    for i in range(16):
        c = channels[f"train_{i}"]
        assert c["InputMode"] == "Pipe"
        assert c["RecordWrapperType"] == "None"
        assert c["ShuffleConfig"] == {"Seed": 7}
        assert c["DataSource"]["S3DataSource"]["S3DataType"] == "ManifestFile"
        assert c["DataSource"]["S3DataSource"]["S3DataDistributionType"] == "FullyReplicated"
    val = channels["validation"]
    assert val["InputMode"] == "File"  # shared by every rank: a FIFO would allow one reader only
    assert val["DataSource"]["S3DataSource"] == {
        "S3DataType": "S3Prefix",
        "S3Uri": f"s3://{bucket}/data/val/",
        "S3DataDistributionType": "FullyReplicated",
    }
    # The 16 manifests hold every training object exactly once.
    listed = [
        k
        for i in range(16)
        for k in manifest_keys(s3, channels[f"train_{i}"]["DataSource"]["S3DataSource"]["S3Uri"])
    ]
    assert sorted(listed) == sorted(f"s3://{bucket}/{k}" for k in train_keys)

    hps = job["HyperParameters"]
    assert hps["epochs"] == "3" and hps["learning_rate"] == "0.1" and hps["optimizer"] == "adam"
    assert hps["sagemaker_mpi_enabled"] == "true"
    assert hps["sagemaker_program"] == "train.py"
    per_host = int(hps["sagemaker_mpi_num_of_processes_per_host"])
    assert per_host == 8 and per_host * job["ResourceConfig"]["InstanceCount"] == 16
    for option in (*DEFAULT_MPI_OPTIONS, "-x HOROVOD_FUSION_THRESHOLD=33554432"):
        assert option in hps["sagemaker_mpi_custom_mpi_options"]
    layout = ChannelLayout.from_json(hps["sagemaker_dist_layout"])
    assert layout.world_size == 16 and layout.strategy == "per-rank"
    assert layout.channel_for("train", rank=13, local_rank=5) == "train_13"

    # The source tarball is in S3 and holds the entry script (and not the bytecode cache).
    assert (
        hps["sagemaker_submit_directory"]
        == f"s3://{bucket}/sagemaker-dist/resnet-2x-p3/source/sourcedir.tar.gz"
    )
    blob = read_object(s3, hps["sagemaker_submit_directory"])
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        assert sorted(tar.getnames()) == ["lib/__init__.py", "lib/model.py", "train.py"]
        assert tar.extractfile("train.py").read() == b"import lib.model\nprint('training')\n"

    tags = sagemaker.list_tags(ResourceArn=job["TrainingJobArn"])["Tags"]
    assert {"Key": "team", "Value": "ml"} in tags
    # wait=True printed the status transitions and where the logs go; never a credential.
    text = "\n".join(lines)
    assert "resnet-2x-p3: status Completed" in text
    assert "/aws/sagemaker/TrainingJobs" in text and "resnet-2x-p3/algo-" in text
    assert "16 Horovod rank(s)" in text
    assert "testing" not in text


def test_three_g5_12xlarge_hosts_give_12_ranks_per_local_rank_sharded_by_key(
    session, sagemaker, s3, bucket, source_dir
):
    put_objects(s3, bucket, "cifar/train/", [2000 + i for i in range(30)])
    shard_uris = [f"s3://{bucket}/cifar/train/"]  # eval shares one prefix
    est = DistributedEstimator(
        "train.py",
        role=ROLE_ARN,
        instance_type="ml.g5.12xlarge",
        instance_count=3,
        source_dir=str(source_dir),
        image_uri=IMAGE,
        strategy="per-local-rank",
        record_wrapper="RecordIO",
        shuffle_seed=11,
        checkpoint_s3_uri=f"s3://{bucket}/ckpt/",
        enable_network_isolation=True,
        sagemaker_session=session,
    )
    handle = est.launch(
        {"train": f"s3://{bucket}/cifar/train/", "eval": shard_uris[0]},
        wait=False,
        printer=None,
    )
    assert handle.name.startswith("sagemaker-dist-")
    job = handle.describe()
    assert job["TrainingJobName"] == handle.name
    assert job["ResourceConfig"]["InstanceCount"] == 3
    assert job["EnableNetworkIsolation"] is True
    assert job["CheckpointConfig"]["S3Uri"] == f"s3://{bucket}/ckpt/"
    channels = {c["ChannelName"]: c for c in job["InputDataConfig"]}
    assert list(channels) == ["train_0", "train_1", "train_2", "train_3", "eval", "code"]
    for i in range(4):
        c = channels[f"train_{i}"]
        assert c["DataSource"]["S3DataSource"]["S3DataDistributionType"] == "ShardedByS3Key"
        assert c["DataSource"]["S3DataSource"]["S3DataType"] == "ManifestFile"
        assert c["InputMode"] == "Pipe" and c["RecordWrapperType"] == "RecordIO"
        assert c["ShuffleConfig"] == {"Seed": 11}
    assert channels["eval"]["DataSource"]["S3DataSource"]["S3DataDistributionType"] == "FullyReplicated"
    assert channels["eval"]["InputMode"] == "File" and "RecordWrapperType" not in channels["eval"]
    hps = job["HyperParameters"]
    per_host = int(hps["sagemaker_mpi_num_of_processes_per_host"])
    assert per_host == 4 and per_host * job["ResourceConfig"]["InstanceCount"] == 12
    layout = ChannelLayout.from_json(hps["sagemaker_dist_layout"])
    assert (layout.world_size, layout.strategy) == (12, "per-local-rank")
    assert layout.channel_for("train", rank=9, local_rank=1) == "train_1"
    # Network isolation: the container cannot reach S3, so the source comes in as a File channel.
    assert hps["sagemaker_submit_directory"] == "/opt/ml/input/data/code/sourcedir.tar.gz"
    code = channels["code"]
    assert code["InputMode"] == "File" and "ShuffleConfig" not in code
    source_uri = code["DataSource"]["S3DataSource"]["S3Uri"]
    assert source_uri == f"s3://{bucket}/sagemaker-dist/{handle.name}/source/sourcedir.tar.gz"
    with tarfile.open(fileobj=io.BytesIO(read_object(s3, source_uri))) as tar:
        assert "train.py" in tar.getnames()
    logs = boto3.client("logs", region_name="us-east-1")
    logs.create_log_group(logGroupName="/aws/sagemaker/TrainingJobs")
    for host in (1, 2, 3):
        logs.create_log_stream(
            logGroupName="/aws/sagemaker/TrainingJobs", logStreamName=f"{handle.name}/algo-{host}-1700000000"
        )
    logs.create_log_stream(
        logGroupName="/aws/sagemaker/TrainingJobs", logStreamName="other-job/algo-1-1700000000"
    )
    lines = []
    assert handle.wait(poll=0.1, printer=lines.append) == "Completed"
    streams = [line for line in lines if "log stream" in line]
    assert streams == [
        f"{handle.name}: log stream /aws/sagemaker/TrainingJobs/{handle.name}/algo-{host}-1700000000"
        for host in (1, 2, 3)
    ]


def test_build_request_takes_presharded_inputs_and_needs_no_aws(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens: any AWS call fails
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    est = DistributedEstimator(
        str(script), ROLE_ARN, "ml.g5.2xlarge", 2, image_uri=IMAGE, output_path="s3://out-bucket/jobs"
    )
    uris = ["s3://data-bucket/shards/train/0.manifest", "s3://data-bucket/shards/train/1.manifest"]
    request = est.build_request(
        {"train": ChannelSource(tuple(uris), "ManifestFile"), "labels": "s3://data-bucket/labels/"},
        job_name="presharded",
    )
    assert [c["ChannelName"] for c in request["InputDataConfig"]] == ["train_0", "train_1", "labels"]
    assert [c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["InputDataConfig"][:2]] == uris
    assert request["HyperParameters"]["sagemaker_submit_directory"] == (
        "s3://out-bucket/jobs/presharded/source/sourcedir.tar.gz"
    )
    assert request["HyperParameters"]["sagemaker_mpi_num_of_processes_per_host"] == "1"
    # The same channels as SDK v3 shapes.
    from sagemaker.core.shapes import Channel

    sdk = sdk_channels(request)
    assert all(isinstance(c, Channel) for c in sdk)
    assert sdk[1].data_source.s3_data_source.s3_uri == uris[1]
    assert sdk[0].shuffle_config is None or not getattr(sdk[0].shuffle_config, "seed", None)
    # A bare prefix for a per-worker role must be sharded first.
    with pytest.raises(EstimatorError, match="sharded into 2 parts"):
        est.build_request({"train": "s3://data-bucket/train/"}, job_name="unsharded")
    with pytest.raises(EstimatorError, match="needs 2 channel"):
        est.build_request({"train": [uris[0]]}, job_name="short")


def test_cpu_instances_need_processes_per_host_and_fewer_than_gpus_is_allowed(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    with pytest.raises(UnknownInstanceTypeError, match="processes_per_host=N"):
        DistributedEstimator(str(script), ROLE_ARN, "ml.c5.18xlarge", 2)
    cpu = DistributedEstimator(str(script), ROLE_ARN, "ml.c5.18xlarge", 2, processes_per_host=4)
    assert (cpu.processes_per_host, cpu.world_size) == (4, 8)
    fewer = DistributedEstimator(str(script), ROLE_ARN, "ml.p3.16xlarge", 2, processes_per_host=4)
    assert fewer.world_size == 8
    with pytest.raises(ProcessesPerHostError, match="has 8 GPU"):
        DistributedEstimator(str(script), ROLE_ARN, "ml.p3.16xlarge", 1, processes_per_host=9)
    with pytest.raises(EstimatorError, match="sagemaker_program"):
        DistributedEstimator(
            str(script), ROLE_ARN, "ml.p3.2xlarge", hyperparameters={"sagemaker_program": "x"}
        )


# ----- bad inputs: a clear error and no job (and nothing uploaded) -----


def make(source_dir, session, **kw):
    args = dict(
        entry_point="train.py",
        role=ROLE_ARN,
        instance_type="ml.p3.16xlarge",
        instance_count=1,
        source_dir=str(source_dir),
        image_uri=IMAGE,
        sagemaker_session=session,
    )
    args.update(kw)
    return DistributedEstimator(**args)


def test_21_channels_are_refused(session, assert_no_job, s3, bucket, source_dir):
    est = make(source_dir, session)  # 8 train + 8 validation + eval + 4 extras = 21
    inputs = {
        "train": [f"s3://{bucket}/t/{i}" for i in range(8)],
        "validation": [f"s3://{bucket}/v/{i}" for i in range(8)],
        "eval": f"s3://{bucket}/e/",
        **{f"extra{i}": f"s3://{bucket}/x{i}/" for i in range(4)},
    }
    with pytest.raises(LayoutError, match="21 channels.*cap of 20"):
        est.launch(inputs, printer=None)
    assert_no_job()
    assert all_keys(s3, bucket) == []


def test_unknown_instance_type_is_refused(session, assert_no_job, source_dir):
    with pytest.raises(UnknownInstanceTypeError, match="ml.p3.16xlarge"):
        make(source_dir, session, instance_type="ml.p3.17xlarge")
    assert_no_job()


def test_missing_entry_script_is_refused(session, assert_no_job, s3, bucket, source_dir):
    put_objects(s3, bucket, "d/", [10] * 8)
    est = make(source_dir, session, entry_point="trian.py")
    with pytest.raises(SourcePackageError, match="'trian.py' does not exist.*train.py"):
        est.launch(f"s3://{bucket}/d/", printer=None)
    assert_no_job()
    assert all_keys(s3, bucket) == [f"d/part-{i:05d}.tfrecord" for i in range(8)]


def test_too_big_source_dir_is_refused(session, assert_no_job, s3, bucket, source_dir):
    put_objects(s3, bucket, "d/", [10] * 8)
    (source_dir / "weights.bin").write_bytes(b"\0" * 5000)
    est = make(source_dir, session, max_source_bytes=4096)
    with pytest.raises(SourcePackageError, match="holds 5.* bytes, over the 4096 bytes limit.*weights.bin"):
        est.launch(f"s3://{bucket}/d/", printer=None)
    assert_no_job()
    assert len(all_keys(s3, bucket)) == 8


def test_source_dir_over_the_real_500_mb_limit_is_refused(session, assert_no_job, source_dir):
    with open(source_dir / "data.bin", "wb") as f:  # sparse: 501 MB apparent size, no disk used
        f.truncate(501 * 1024 * 1024)
    est = make(source_dir, session)
    with pytest.raises(SourcePackageError, match="over the 500.0 MiB limit.*data.bin"):
        est.launch({"train": [f"s3://b-x/{i}" for i in range(8)]}, printer=None)
    assert_no_job()


def test_spot_without_max_wait_is_refused(session, assert_no_job, s3, bucket, source_dir):
    put_objects(s3, bucket, "d/", [10] * 8)
    est = make(source_dir, session, use_spot=True)
    with pytest.raises(RequestValidationError, match="managed spot training needs MaxWaitTimeInSeconds"):
        est.launch(f"s3://{bucket}/d/", printer=None)
    est = make(source_dir, session, use_spot=True, max_run=7200, max_wait=3600)
    with pytest.raises(RequestValidationError, match="max_wait=3600 is less than max_run=7200"):
        est.launch(f"s3://{bucket}/d/", printer=None)
    assert_no_job()
    assert len(all_keys(s3, bucket)) == 8  # no manifests, no source tarball


@pytest.mark.parametrize("name", ["bad_name", "-leading", "x" * 64, "trailing-"])
def test_bad_job_name_is_refused(session, assert_no_job, s3, bucket, source_dir, name):
    put_objects(s3, bucket, "d/", [10] * 8)
    with pytest.raises(RequestValidationError, match="job name .* is not valid"):
        make(source_dir, session).launch(f"s3://{bucket}/d/", job_name=name, printer=None)
    assert_no_job()
    assert len(all_keys(s3, bucket)) == 8


def test_credentials_in_hyperparameters_are_refused_without_echoing_them(session, assert_no_job, source_dir):
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    est = make(
        source_dir, session, hyperparameters={"aws_secret_access_key": secret, "key": "AKIAIOSFODNN7EXAMPLE"}
    )
    with pytest.raises(RequestValidationError) as err:
        est.launch({"train": [f"s3://b-x/{i}" for i in range(8)]}, printer=None)
    message = str(err.value)
    assert "'aws_secret_access_key' looks like a credential" in message
    assert "value of 'key' looks like an AWS access key" in message
    assert secret not in message and "AKIAIOSFODNN7EXAMPLE" not in message
    assert_no_job()


def test_empty_training_prefix_is_refused_before_any_job(session, assert_no_job, bucket, source_dir):
    with pytest.raises(ValueError, match="no objects to shard"):
        make(source_dir, session).launch(f"s3://{bucket}/nothing-here/", printer=None)
    assert_no_job()


# ----- helpers -----


def test_role_name_becomes_an_arn_with_the_callers_account(aws_env):
    assert (
        role_arn("service-role/MyRole", "us-east-1") == "arn:aws:iam::123456789012:role/service-role/MyRole"
    )
    assert (
        role_arn("MyRole", "cn-north-1", account="111122223333") == "arn:aws-cn:iam::111122223333:role/MyRole"
    )
    assert role_arn(ROLE_ARN) == ROLE_ARN
    with pytest.raises(EstimatorError, match="not an IAM role ARN"):
        role_arn("arn:aws:iam::123:user/me")


def test_default_job_name_fits_63_characters():
    name = default_job_name("a-very-long-base-name-" * 5)
    assert len(name) <= 63 and name[0].isalnum() and name[-1].isalnum()
    assert default_job_name("my_job.v2").startswith("my-job-v2-")


def test_image_uris(aws_env):
    assert container_image_uri("eu-west-1", "123456789012", tag="1.2") == (
        "123456789012.dkr.ecr.eu-west-1.amazonaws.com/sagemaker-dist:1.2"
    )
    assert container_image_uri("cn-north-1", "123456789012").endswith(
        ".amazonaws.com.cn/sagemaker-dist:0.1.0"
    )
    assert container_image_uri().startswith("123456789012.dkr.ecr.us-east-1.amazonaws.com/")  # STS on moto
    with pytest.raises(ImageError, match="12-digit"):
        container_image_uri("us-east-1", "12345")
    gpu = dlc_tensorflow_image_uri("us-west-2", "ml.p3.16xlarge")
    assert gpu == "763104351884.dkr.ecr.us-west-2.amazonaws.com/tensorflow-training:2.14-gpu-py310"
    assert dlc_tensorflow_image_uri("us-west-2", "ml.c5.xlarge").endswith(":2.14-cpu-py310")


def test_source_size_check_uses_apparent_size_only(source_dir):
    # Guard for the sparse-file test above: truncate really made a big file without writing it.
    path = source_dir / "sparse.bin"
    with open(path, "wb") as f:
        f.truncate(10 * 1024 * 1024)
    assert os.stat(path).st_size == 10 * 1024 * 1024


# ----- CLI -----


def test_cli_dry_run_prints_the_request_and_creates_nothing(
    aws_env, assert_no_job, s3, bucket, source_dir, capsys
):
    from sagemaker_dist.cli import main

    put_objects(s3, bucket, "train/", [100 + i for i in range(12)])
    argv = ["launch", "train.py", "--source-dir", str(source_dir), "--role", ROLE_ARN]
    argv += ["--instance-type", "ml.g5.12xlarge", "--instance-count", "3", "--image-uri", IMAGE]
    argv += ["--train", "s3://data-bucket/train/", "--hp", "epochs=2", "--dry-run"]
    assert main(argv) == 2  # S3 answers: the bucket the data names does not exist, as a launch would say
    assert "bucket 'data-bucket' does not exist" in capsys.readouterr().err
    argv[argv.index("s3://data-bucket/train/")] = f"s3://{bucket}/train/"
    assert main(argv) == 0
    out = capsys.readouterr().out
    request = json.loads(out[out.index("{") :])
    assert len(request["InputDataConfig"]) == 12
    assert request["HyperParameters"]["epochs"] == "2"
    assert "12 Horovod rank(s)" in out
    assert_no_job()


def test_cli_launch_creates_the_job_and_bad_input_exits_2(aws_env, sagemaker, s3, bucket, source_dir, capsys):
    from sagemaker_dist.cli import main

    put_objects(s3, bucket, "d/", [100] * 4)
    argv = ["launch", "train.py", "--source-dir", str(source_dir), "--role", ROLE_ARN, "--image-uri", IMAGE]
    argv += ["--instance-type", "ml.g5.12xlarge", "--train", f"s3://{bucket}/d/", "--output-path"]
    argv += [f"s3://{bucket}/out", "--job-name", "cli-job", "--no-wait"]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip().endswith("training-job/cli-job")
    job = sagemaker.describe_training_job(TrainingJobName="cli-job")
    assert job["HyperParameters"]["sagemaker_mpi_num_of_processes_per_host"] == "4"
    assert main([*argv[:-3], "--job-name", "cli-job-2", "--spot"]) == 2
    assert "managed spot training needs MaxWaitTimeInSeconds" in capsys.readouterr().err


def test_bad_input_is_caught_before_any_aws_call(tmp_path, monkeypatch):
    # Nothing listens on this endpoint: an AWS call would fail with a connection error instead.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    script = tmp_path / "train.py"
    script.write_text("")
    est = DistributedEstimator(str(script), "MyRole", "ml.p3.16xlarge", 2, use_spot=True)
    with pytest.raises(RequestValidationError, match="managed spot training needs"):
        est.launch("s3://data-bucket/train/", printer=None)
    ok = DistributedEstimator(str(script), "MyRole", "ml.p3.16xlarge", 2)
    draft = ok.draft_request("s3://data-bucket/train/", job_name="offline")
    assert draft["RoleArn"] == "arn:aws:iam::000000000000:role/MyRole"
    assert draft["AlgorithmSpecification"]["TrainingImage"] == (
        "000000000000.dkr.ecr.us-east-1.amazonaws.com/sagemaker-dist:0.1.0"
    )
    assert len(draft["InputDataConfig"]) == 16


def test_wait_prints_each_transition_once_and_raises_on_failure():
    starting = {"Status": "Starting", "StatusMessage": "Launching requested ML instances"}
    training = {"Status": "Training", "StatusMessage": "Training image download completed"}
    failed = {"Status": "Failed", "StatusMessage": "Training job failed"}
    answers = [
        {
            "TrainingJobStatus": "InProgress",
            "SecondaryStatus": "Starting",
            "SecondaryStatusTransitions": [starting],
        },
        {
            "TrainingJobStatus": "InProgress",
            "SecondaryStatus": "Starting",
            "SecondaryStatusTransitions": [starting],
        },
        {
            "TrainingJobStatus": "InProgress",
            "SecondaryStatus": "Training",
            "SecondaryStatusTransitions": [starting, training],
        },
        {
            "TrainingJobStatus": "Failed",
            "SecondaryStatus": "Failed",
            "SecondaryStatusTransitions": [starting, training, failed],
            "FailureReason": "AlgorithmError: rank 3 stalled",
        },
    ]
    lines = []
    with pytest.raises(TrainingJobFailed, match="scripted ended Failed: AlgorithmError: rank 3 stalled"):
        ScriptedHandle(answers).wait(poll=0, printer=lines.append)
    assert lines == [
        "CloudWatch logs: group /aws/sagemaker/TrainingJobs, streams scripted/algo-<n>-<time>",
        "scripted: Starting - Launching requested ML instances",
        "scripted: status InProgress (Starting)",
        "scripted: Training - Training image download completed",
        "scripted: status InProgress (Training)",
        "scripted: log stream /aws/sagemaker/TrainingJobs/scripted/algo-1-1",
        "scripted: Failed - Training job failed",
        "scripted: status Failed (Failed)",
    ]


def test_wait_returns_the_status_on_timeout():
    running = {
        "TrainingJobStatus": "InProgress",
        "SecondaryStatus": "Training",
        "SecondaryStatusTransitions": [],
    }
    lines = []
    assert ScriptedHandle([running]).wait(poll=0.01, timeout=0.05, printer=lines.append) == "InProgress"
    assert "call wait() again" in lines[-1]


def test_a_shard_set_written_earlier_is_reused_as_is(session, sagemaker, s3, bucket, source_dir):
    from sagemaker_dist.aws.s3_objects import list_objects
    from sagemaker_dist.launch.shard_writer import read_shard_set, write_shards
    from sagemaker_dist.launch.sharding import plan_shards

    put_objects(s3, bucket, "raw/", [300 + 10 * i for i in range(12)])
    objects = [(o.key, o.size) for o in list_objects(f"s3://{bucket}/raw/", client=s3)]
    write_shards(
        plan_shards(objects, 4), f"s3://{bucket}/raw/", f"s3://{bucket}/sharded/", mode="copy", client=s3
    )
    shard_set = read_shard_set(f"s3://{bucket}/sharded/", client=s3)  # e.g. in a later session
    est = make(source_dir, session, instance_type="ml.g5.12xlarge", instance_count=1)
    handle = est.launch({"train": shard_set}, job_name="reuse-shards", wait=False, printer=None)
    channels = handle.describe()["InputDataConfig"]
    assert [c["DataSource"]["S3DataSource"]["S3Uri"] for c in channels] == list(shard_set.uris)
    assert {c["DataSource"]["S3DataSource"]["S3DataType"] for c in channels} == {"S3Prefix"}
    assert not [k for k in all_keys(s3, bucket) if "/shards/" in k]  # nothing sharded again
    with pytest.raises(EstimatorError, match="has 4 shard.*needs 8 channel.*num_shards=8"):
        make(source_dir, session, instance_count=1).build_request({"train": shard_set})


def test_per_local_rank_shard_with_fewer_objects_than_hosts_is_refused(
    session, assert_no_job, s3, bucket, source_dir
):
    put_objects(s3, bucket, "few/", [100] * 10)  # 4 shards of 2-3 objects, each split across 3 hosts
    est = make(
        source_dir, session, instance_type="ml.g5.12xlarge", instance_count=3, strategy="per-local-rank"
    )
    with pytest.raises(NotEnoughObjectsError, match="10 object.*4 shard.*3 hosts.*strategy='per-rank'"):
        est.launch(f"s3://{bucket}/few/", printer=None)
    assert_no_job()
    assert all_keys(s3, bucket) == [f"few/part-{i:05d}.tfrecord" for i in range(10)]  # nothing written


@pytest.mark.parametrize("shared_mode", ["Pipe", None])  # None: the shared channels follow input_mode
def test_shared_pipe_channel_with_several_processes_per_host_is_refused(
    session, assert_no_job, s3, bucket, source_dir, shared_mode
):
    put_objects(s3, bucket, "d/", [10] * 8)
    before = all_keys(s3, bucket)
    est = make(source_dir, session, shared_channel_input_mode=shared_mode)  # 8 processes per host
    for inputs in (
        {"train": f"s3://{bucket}/d/", "validation": f"s3://{bucket}/v/"},
        {"train": f"s3://{bucket}/d/", "labels": f"s3://{bucket}/labels/"},
    ):
        with pytest.raises(EstimatorError, match="shared by all 8 processes.*one reader.*'File'"):
            est.launch(inputs, printer=None)
        with pytest.raises(EstimatorError, match="one reader"):
            est.draft_request(inputs)
    assert_no_job()
    assert all_keys(s3, bucket) == before
    # One process per host reads each FIFO alone; with per-worker validation nothing is shared.
    one = make(source_dir, session, shared_channel_input_mode=shared_mode, processes_per_host=1)
    assert one.draft_request({"train": f"s3://{bucket}/d/", "eval": f"s3://{bucket}/v/"})
    split = make(source_dir, session, shared_channel_input_mode=shared_mode, validation="per-worker")
    assert split.draft_request({"train": f"s3://{bucket}/d/", "validation": f"s3://{bucket}/v/"})


def test_a_role_that_cannot_be_sharded_leaves_nothing_under_the_output_path(
    session, assert_no_job, s3, bucket, source_dir
):
    put_objects(s3, bucket, "train/", [100 + i for i in range(16)])
    put_objects(s3, bucket, "val/", [100, 200, 300])  # 3 objects for 8 per-worker validation channels
    est = make(source_dir, session, validation="per-worker", output_path=f"s3://{bucket}/jobs")
    inputs = {"train": f"s3://{bucket}/train/", "validation": f"s3://{bucket}/val/"}
    with pytest.raises(NotEnoughObjectsError, match="3 object.*8 shard"):
        est.launch(inputs, job_name="half-sharded", printer=None)
    assert_no_job()
    assert [k for k in all_keys(s3, bucket) if k.startswith("jobs/")] == []  # no train manifests either


def test_a_job_name_in_use_is_refused_before_anything_is_written(session, sagemaker, s3, bucket, source_dir):
    put_objects(s3, bucket, "d/", [100 + i for i in range(8)])
    est = make(source_dir, session)
    est.launch(f"s3://{bucket}/d/", job_name="taken-name", wait=False, printer=None)
    tarball_key = "sagemaker-dist/taken-name/source/sourcedir.tar.gz"
    first = s3.get_object(Bucket=bucket, Key=tarball_key)
    before = all_keys(s3, bucket)

    (source_dir / "train.py").write_text("print('a different script')\n")
    with pytest.raises(EstimatorError, match="'taken-name' already exists.*pass another job_name="):
        make(source_dir, session).launch(f"s3://{bucket}/d/", job_name="taken-name", printer=None)
    again = s3.get_object(Bucket=bucket, Key=tarball_key)
    assert again["ETag"] == first["ETag"] and again["Body"].read() == first["Body"].read()
    assert all_keys(s3, bucket) == before
    assert sagemaker.describe_training_job(TrainingJobName="taken-name")["TrainingJobArn"]


def toolkit_mpi_options(options: str):
    """How the sagemaker-training toolkit reads sagemaker_mpi_custom_mpi_options: split on whitespace,
    --NCCL_DEBUG parsed out (default INFO, always passed on as -x NCCL_DEBUG=<v>), the rest appended."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--NCCL_DEBUG", default="INFO", type=str)
    return parser.parse_known_args(options.split())


def test_mpi_defaults_set_nccl_debug_the_way_the_toolkit_reads_it(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    est = DistributedEstimator(str(script), ROLE_ARN, "ml.p3.16xlarge", 2, mpi_options=["-x A=1"])
    parsed, rest = toolkit_mpi_options(est.mpi_options)
    assert parsed.NCCL_DEBUG == "WARN"
    assert not any("NCCL_DEBUG" in token for token in rest)  # no second, conflicting -x NCCL_DEBUG
    assert rest[-2:] == ["-x", "A=1"]
    louder = DistributedEstimator(str(script), ROLE_ARN, "ml.p3.16xlarge", mpi_options="--NCCL_DEBUG INFO")
    assert toolkit_mpi_options(louder.mpi_options)[0].NCCL_DEBUG == "INFO"  # the user's comes last
    for bad, message in (
        ("-x TAG='a b'", "has quotes.*splits the options on whitespace"),
        ('-x TAG="ab"', "has quotes"),
        ("-x NCCL_DEBUG=INFO", "write --NCCL_DEBUG <level> instead"),
    ):
        with pytest.raises(EstimatorError, match=message):
            DistributedEstimator(str(script), ROLE_ARN, "ml.p3.16xlarge", mpi_options=[bad])


def test_create_training_job_refused_by_aws_is_an_error_naming_the_code(
    aws_env, monkeypatch, assert_no_job, s3, bucket, source_dir, capsys
):
    from helpers.fault_proxy import fault_proxy

    from sagemaker_dist.cli import main

    limit = b'{"__type": "ResourceLimitExceeded", "Message": "account-level limit for ml.g5.12xlarge"}'

    def refuse_create(method, path, headers, body):
        if headers.get("X-Amz-Target") == "SageMaker.CreateTrainingJob":
            return 400, "application/x-amz-json-1.1", limit
        return None

    put_objects(s3, bucket, "d/", [100] * 4)
    argv = ["launch", "train.py", "--source-dir", str(source_dir), "--role", ROLE_ARN, "--image-uri", IMAGE]
    argv += ["--instance-type", "ml.g5.12xlarge", "--train", f"s3://{bucket}/d/", "--output-path"]
    argv += [f"s3://{bucket}/out", "--job-name", "over-quota", "--no-wait"]
    with fault_proxy(aws_env["AWS_ENDPOINT_URL"], refuse_create) as (proxy, url):
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        assert main(argv) == 2
    assert proxy.answered == 1
    err = capsys.readouterr().err
    assert err.startswith("error: AWS refused to create training job 'over-quota': ResourceLimitExceeded")
    assert "launch again with another job_name" in err
    assert_no_job()


def test_the_request_validated_is_the_request_sagemaker_core_sends(
    session, bucket, s3, sagemaker, source_dir, tmp_path, monkeypatch
):
    """TrainingJob.create merges SageMaker config-file defaults into unset fields; prepare() merges the
    same before validating, so what we checked is what CreateTrainingJob gets."""
    config = tmp_path / "config.yaml"
    config.write_text(
        "SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Resources:\n      TrainingJob:\n"
        "        vpc_config:\n          subnets: [subnet-0cfg]\n          security_group_ids: [sg-0cfg]\n"
    )
    monkeypatch.setenv("SAGEMAKER_USER_CONFIG_OVERRIDE", str(config))
    put_objects(s3, bucket, "cfg/train/", [1000] * 8)
    est = DistributedEstimator(
        "train.py",
        role=ROLE_ARN,
        instance_type="ml.p3.2xlarge",
        instance_count=2,
        source_dir=str(source_dir),
        image_uri=IMAGE,
        sagemaker_session=session,
    )
    handle = est.launch(f"s3://{bucket}/cfg/train/", job_name="cfg-defaults", wait=False, printer=None)
    job = sagemaker.describe_training_job(TrainingJobName=handle.name)
    prepared, added = with_sdk_config_defaults(
        {k: v for k, v in job.items() if k in ("TrainingJobName", "RoleArn", "OutputDataConfig")}
        | {
            "AlgorithmSpecification": job["AlgorithmSpecification"],
            "ResourceConfig": job["ResourceConfig"],
            "StoppingCondition": job["StoppingCondition"],
        }
    )
    # whatever this sagemaker-core version does with the file, our merge and its merge agree
    assert ("VpcConfig" in added) == ("VpcConfig" in job)
    if "VpcConfig" in job:
        assert job["VpcConfig"] == prepared["VpcConfig"]


def test_a_role_name_whose_account_sts_cannot_tell_is_our_aws_error(aws_env, monkeypatch):
    from sagemaker_dist.errors import AwsError

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(
        AwsError,
        match=r"could not look up the AWS account for role name 'SageMakerRole' \(sts:GetCallerIdentity\)",
    ):
        role_arn("SageMakerRole", "us-east-1", boto_session=boto3.Session(region_name="us-east-1"))
    assert role_arn(ROLE_ARN) == ROLE_ARN  # an ARN needs no STS call


def test_hyperparameters_the_toolkit_would_change_are_warned_about_before_any_aws_call(aws_env):
    from sagemaker_dist.contract.toolkit import ToolkitArgumentWarning

    with pytest.warns(ToolkitArgumentWarning) as caught:
        DistributedEstimator(
            "train.py",
            role=ROLE_ARN,
            instance_type="ml.p3.2xlarge",
            hyperparameters={"train_records_per_rank": [256, 256], "epochs": 3, "tag": "a b"},
        )
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2, messages
    assert any("'train_records_per_rank'" in m and "'[256,' '256]'" in m for m in messages)
    assert any("'tag'" in m and "'a' 'b'" in m for m in messages)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", ToolkitArgumentWarning)
        DistributedEstimator(  # what the demo passes survives unchanged: no warning
            "train.py",
            role=ROLE_ARN,
            instance_type="ml.p3.2xlarge",
            hyperparameters={"epochs": 2, "batch_size": 32, "train_records_per_rank": "256,256"},
        )
        DistributedEstimator(  # 5.x runs no shell: a space survives
            "train.py",
            role=ROLE_ARN,
            instance_type="ml.p3.2xlarge",
            hyperparameters={"tag": "a b"},
            toolkit_version="5.1.4",
        )


def test_the_request_settings_are_declared_once_and_frozen():
    """The settings the request says are ``JobSettings``'s: the estimator takes them with those defaults,
    and ``request_settings`` freezes them, normalised, for rendering."""
    from dataclasses import FrozenInstanceError, fields

    from sagemaker_dist.launch.request import JobSettings, RequestSettings

    est = DistributedEstimator(
        "train.py", ROLE_ARN, "ml.c5.xlarge", 2, processes_per_host=1, tags={"team": "ml"}, max_run=600
    )
    declared = {f.name for f in fields(JobSettings)}
    assert declared <= {f.name for f in fields(DistributedEstimator)}
    assert {f.name for f in fields(RequestSettings)} == declared | {"instance_type", "instance_count"}
    frozen = est.request_settings
    assert (frozen.max_run, frozen.instance_count, frozen.tags) == (600, 2, ({"Key": "team", "Value": "ml"},))
    assert frozen.volume_size == JobSettings().volume_size == 30  # the one default
    with pytest.raises(FrozenInstanceError):
        frozen.max_run = 1


def test_object_order_seed_writes_each_manifest_in_its_seeded_order(session, s3, bucket, source_dir):
    """Objects named class by class: name order keeps each worker's stream one class after another; the
    seed spreads them, the same objects per worker, in the order plan_shards draws for the seed."""
    from sagemaker_dist.launch.sharding import plan_shards

    sizes = [1000] * 24
    keys = put_objects(s3, bucket, "sorted/train/", sizes)

    def manifests(seed):
        est = DistributedEstimator(
            "train.py",
            role=ROLE_ARN,
            instance_type="ml.c5.xlarge",
            instance_count=2,
            processes_per_host=1,
            source_dir=str(source_dir),
            image_uri=IMAGE,
            object_order_seed=seed,
            sagemaker_session=session,
        )
        request = est.prepare({"train": f"s3://{bucket}/sorted/train/"}, printer=None).request
        channels = {c["ChannelName"]: c for c in request["InputDataConfig"]}
        uris = [channels[f"train_{i}"]["DataSource"]["S3DataSource"]["S3Uri"] for i in range(2)]
        return [manifest_keys(s3, uri) for uri in uris]

    by_name, seeded = manifests(None), manifests(5)
    assert all(keys == sorted(keys) for keys in by_name)
    assert [sorted(k) for k in seeded] == by_name  # the same objects for each worker
    assert seeded != by_name
    expected = plan_shards(list(zip(keys, sizes)), 2, order_seed=5).shards
    assert [[k.rsplit("/", 1)[1] for k in shard] for shard in seeded] == [
        [k.rsplit("/", 1)[1] for k in shard] for shard in expected
    ]
    with pytest.raises(EstimatorError, match="object_order_seed=-1"):
        DistributedEstimator("train.py", role=ROLE_ARN, instance_type="ml.c5.xlarge", object_order_seed=-1)
