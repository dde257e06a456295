"""The CreateTrainingJob request read once into typed fields: SageMaker's defaults where a member is
absent, and a member of the wrong shape refused with its path in the request."""

from __future__ import annotations

import pytest
from helpers.small_request import small_request

from sagemaker_dist.contract.training_request import (
    MODEL_TARBALL,
    ChannelSpec,
    RequestFormatError,
    TrainingRequest,
    edited_request,
    is_training_request,
    request_from_json,
)
from sagemaker_dist.host.job_spec import JobSpec, JobSpecError


def _full_request() -> dict:
    request = small_request({"epochs": 2})
    request["AlgorithmSpecification"]["MetricDefinitions"] = [{"Name": "loss", "Regex": "loss=(.*)"}]
    request["InputDataConfig"].append(
        {
            "ChannelName": "eval",
            "InputMode": "FastFile",
            "ContentType": "application/x-tfrecord",
            "ShuffleConfig": {"Seed": 7},
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "ManifestFile",
                    "S3Uri": "s3://b/eval.json",
                    "S3DataDistributionType": "ShardedByS3Key",
                }
            },
        }
    )
    request["OutputDataConfig"]["S3OutputPath"] = "s3://b/out/"
    request["CheckpointConfig"] = {"S3Uri": "s3://b/ckpt", "LocalPath": "/opt/ml/checkpoints"}
    request["TensorBoardOutputConfig"] = {"S3OutputPath": "s3://b/tb"}
    request["StoppingCondition"]["MaxWaitTimeInSeconds"] = 7200
    request["EnableManagedSpotTraining"] = True
    request["Environment"] = {"A": "1"}
    request["Tags"] = ({"Key": "team", "Value": "ml"},)  # a request built in Python may hold tuples
    return request


def test_every_member_a_host_uses_is_a_typed_field():
    read = TrainingRequest.parse(_full_request())
    assert (read.name, read.image, read.input_mode, read.hosts, read.instance_type) == (
        "small", "img:1", "File", 2, "ml.c5.xlarge",
    )  # fmt: skip
    assert read.hyperparameters["sagemaker_program"] == '"train.py"'
    train, eval_ = read.channels
    assert train == ChannelSpec("train", "s3://b/t/", input_mode="File")
    assert eval_ == ChannelSpec(
        "eval",
        "s3://b/eval.json",
        "ManifestFile",
        "ShardedByS3Key",
        "None",
        7,
        "File",
        "application/x-tfrecord",
    )
    assert read.output_path == "s3://b/out" and read.output_uri(MODEL_TARBALL) == (
        "s3://b/out/small/output/model.tar.gz"
    )
    assert (read.checkpoint_s3_uri, read.checkpoint_local_path) == ("s3://b/ckpt", "/opt/ml/checkpoints")
    assert (read.tensorboard_s3_uri, read.max_runtime, read.max_wait, read.spot) == (
        "s3://b/tb",
        3600,
        7200,
        True,
    )
    assert read.environment == {"A": "1"} and read.tags == ({"Key": "team", "Value": "ml"},)
    assert read.metric_definitions == ({"Name": "loss", "Regex": "loss=(.*)"},)


def test_absent_members_take_sagemakers_defaults():
    read = TrainingRequest.parse({"TrainingJobName": "bare"})
    assert (read.input_mode, read.hosts, read.output_path, read.channels, read.environment) == (
        "File", 1, "", (), {},
    )  # fmt: skip
    assert read.output_uri(MODEL_TARBALL) is None and read.checkpoint_s3_uri is None


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda r: r.pop("TrainingJobName"), "TrainingJobName is missing"),
        (lambda r: r.update(ResourceConfig=[]), "ResourceConfig is list"),
        (lambda r: r["ResourceConfig"].update(InstanceCount="2"), "ResourceConfig.InstanceCount is str"),
        (lambda r: r["ResourceConfig"].update(InstanceCount=True), "InstanceCount is bool"),
        (
            lambda r: r["InputDataConfig"][0].pop("ChannelName"),
            r"InputDataConfig\[0\].ChannelName is missing",
        ),
        (
            lambda r: r["InputDataConfig"][0]["DataSource"]["S3DataSource"].update(S3Uri=3),
            r"InputDataConfig\[0\].DataSource.S3DataSource.S3Uri is int",
        ),
        (lambda r: r["InputDataConfig"].append("eval"), r"InputDataConfig\[1\] is str"),
        (lambda r: r.update(HyperParameters={1: "x"}), "HyperParameters has the key 1"),
        (lambda r: r.update(Tags=["team"]), r"Tags\[0\] is str"),
        (lambda r: r.update(StoppingCondition={"MaxRuntimeInSeconds": 1.5}), "MaxRuntimeInSeconds is float"),
    ],
)
def test_a_member_of_the_wrong_shape_is_named(change, named):
    request = small_request({})
    change(request)
    with pytest.raises(RequestFormatError, match=named):
        TrainingRequest.parse(request)


def test_the_job_spec_is_the_typed_request_and_names_its_errors_as_its_own():
    job = JobSpec.from_request(small_request({}))
    assert isinstance(job, TrainingRequest) and job.instance_type == "ml.c5.xlarge"
    with pytest.warns(DeprecationWarning, match="now JobSpec.channels"):
        assert job.specs == job.channels  # the older names
    with pytest.warns(DeprecationWarning, match="now JobSpec.input_mode"):
        assert job.default_mode == job.input_mode
    assert JobSpec.of(job) is job
    with pytest.raises(JobSpecError, match="not a CreateTrainingJob dict"):
        JobSpec.from_request([])


def test_edits_make_a_copy_and_name_the_members_once():
    request = small_request({"epochs": 2, "batch_size": 8})
    edited = edited_request(
        request,
        instance_type="ml.p4d.24xlarge",
        checkpoint_s3_uri="s3://b/c",
        without_hyperparameters=["epochs"],
    )
    read = TrainingRequest.parse(edited)
    assert (read.instance_type, read.hosts, read.checkpoint_s3_uri) == ("ml.p4d.24xlarge", 2, "s3://b/c")
    assert "epochs" not in read.hyperparameters and "batch_size" in read.hyperparameters
    assert TrainingRequest.parse(request).instance_type == "ml.c5.xlarge"  # the original is unchanged
    assert "epochs" in request["HyperParameters"] and "CheckpointConfig" not in request
    assert edited_request(request) == request
    added = TrainingRequest.parse(
        edited_request(request, hyperparameters={"tensorboard_s3_uri": "s3://b/tb"})
    )
    assert added.hyperparameters["tensorboard_s3_uri"] == "s3://b/tb" and "epochs" in added.hyperparameters


def test_a_training_request_is_told_from_other_documents():
    assert is_training_request(small_request({}))
    assert not is_training_request({"HyperParameterTuningJobName": "t", "TrainingJobDefinition": {}})
    assert not is_training_request(["AlgorithmSpecification", "InputDataConfig"])


def test_a_request_file_that_is_not_a_request_is_named():
    assert request_from_json(
        '{"TrainingJobName": "x", "AlgorithmSpecification": {}, "InputDataConfig": []}', "f"
    )
    with pytest.raises(RequestFormatError, match="request.json is not valid JSON"):
        request_from_json("{", "request.json")
    with pytest.raises(
        RequestFormatError, match="plan.json is not a CreateTrainingJob request: it holds a JSON list"
    ):
        request_from_json("[]", "plan.json")
    with pytest.raises(RequestFormatError, match="it holds a JSON object, and a request"):
        request_from_json('{"shards": []}', "plan.json")
