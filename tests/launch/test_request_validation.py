"""validate_request: botocore's SageMaker model plus our limits, all problems reported at once."""

from __future__ import annotations

import copy

import pytest

from sagemaker_dist.aws.request_validation import (
    RequestValidationError,
    limit_problems,
    service_model_problems,
    validate_request,
)
from sagemaker_dist.contract.layout import plan_layout

BASE = {
    "TrainingJobName": "horovod-pipe-1",
    "RoleArn": "arn:aws:iam::123456789012:role/SageMakerRole",
    "AlgorithmSpecification": {
        "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/sagemaker-dist:0.1.0",
        "TrainingInputMode": "Pipe",
    },
    "HyperParameters": {"epochs": "3", "sagemaker_mpi_enabled": "true"},
    "InputDataConfig": [
        {
            "ChannelName": f"train_{i}",
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "ManifestFile",
                    "S3Uri": f"s3://bucket/shards/train/{i}.manifest",
                    "S3DataDistributionType": "FullyReplicated",
                }
            },
            "InputMode": "Pipe",
            "RecordWrapperType": "None",
            "ShuffleConfig": {"Seed": 7},
        }
        for i in range(2)
    ],
    "OutputDataConfig": {"S3OutputPath": "s3://bucket/out"},
    "ResourceConfig": {"InstanceType": "ml.p3.16xlarge", "InstanceCount": 2, "VolumeSizeInGB": 30},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    "EnableManagedSpotTraining": False,
}


def changed(**edits):
    request = copy.deepcopy(BASE)
    for path, value in edits.items():
        *parents, leaf = path.split("__")
        node = request
        for p in parents:
            node = node[p]
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return request


def problems_of(request) -> list[str]:
    with pytest.raises(RequestValidationError) as err:
        validate_request(request)
    return err.value.problems


def test_a_good_request_passes_unchanged():
    assert validate_request(BASE) is BASE
    assert service_model_problems(BASE) == [] and limit_problems(BASE) == []


def test_21_channels_are_refused_with_a_way_out():
    channel = BASE["InputDataConfig"][0]
    channels = [dict(channel, ChannelName=f"train_{i}") for i in range(21)]
    problems = problems_of(changed(InputDataConfig=channels))
    assert any("21 channels; SageMaker allows at most 20" in p and "per-local-rank" in p for p in problems)
    # botocore's model says the same through its max of 20, which botocore itself never checks.
    assert any(
        "InputDataConfig has 21 entries; at most 20" in p
        for p in service_model_problems(changed(InputDataConfig=channels))
    )


@pytest.mark.parametrize("name", ["train 0", "train/0", "x" * 65, ""])
def test_bad_channel_names(name):
    channels = copy.deepcopy(BASE["InputDataConfig"])
    channels[0]["ChannelName"] = name
    assert any(
        "channel name" in p and "not valid" in p for p in problems_of(changed(InputDataConfig=channels))
    )


def test_repeated_channel_names():
    channels = copy.deepcopy(BASE["InputDataConfig"])
    channels[1]["ChannelName"] = "train_0"
    assert any("channel names repeat: train_0" in p for p in problems_of(changed(InputDataConfig=channels)))


@pytest.mark.parametrize("name", ["job_1", "job.1", "-job", "job-", "j" * 64, ""])
def test_bad_job_names(name):
    problems = problems_of(changed(TrainingJobName=name))
    assert len([p for p in problems if "TrainingJobName" in p or "job name" in p]) == 1, problems


def test_job_name_of_63_characters_passes():
    validate_request(changed(TrainingJobName="a" * 30 + "-" * 3 + "b" * 30))


def test_hyperparameter_limits():
    many = {f"k{i}": "v" for i in range(101)}
    assert any(
        "101 hyperparameters; SageMaker allows at most 100" in p
        for p in problems_of(changed(HyperParameters=many))
    )
    long_value = problems_of(changed(HyperParameters__layout="x" * 2501))
    assert any("'layout' is 2501 characters; at most 2500" in p for p in long_value)
    long_key = problems_of(changed(HyperParameters={"k" * 257: "v"}))
    assert any("257 characters; at most 256" in p for p in long_key)
    not_str = problems_of(changed(HyperParameters={"epochs": 3}))
    assert any("'epochs' is a int; values must be strings" in p for p in not_str)
    validate_request(changed(HyperParameters__layout="x" * 2500))


@pytest.mark.parametrize(
    "hps",
    [
        {"aws_secret_access_key": "abc"},
        {"AWS_ACCESS_KEY_ID": "x"},
        {"db_password": "hunter2"},
        {"session_token": "t"},
        {"creds": "AKIAIOSFODNN7EXAMPLE"},
        {"creds": "ASIAIOSFODNN7EXAMPLE"},
        {"creds": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"},
    ],
)
def test_credential_like_hyperparameters_are_refused_and_not_echoed(hps):
    problems = problems_of(changed(HyperParameters=hps))
    text = "\n".join(problems)
    assert "looks like" in text
    for value in hps.values():
        if len(value) > 8:
            assert value not in text


def test_credentials_in_environment_are_refused_too():
    problems = problems_of(changed(Environment={"AWS_SECRET_ACCESS_KEY": "x" * 40}))
    assert any("Environment key 'AWS_SECRET_ACCESS_KEY' looks like a credential" in p for p in problems)


def test_ordinary_hyperparameters_are_not_mistaken_for_secrets():
    validate_request(
        changed(
            HyperParameters={
                "learning_rate": "0.001",
                "model_dir": "s3://bucket/models/resnet50/2024-01-01/checkpoints/latest",
                "sagemaker_dist_layout": plan_layout(2, 8).to_json(),
                "sagemaker_mpi_custom_mpi_options": "--NCCL_DEBUG WARN -x HOROVOD_CYCLE_TIME=5",
                "token_limit": "512",
                "git_commit": "3f2a9c0e5b7d41a8e6f9b2c4d1e0a7b6c5d4e3f2",  # 40 hex: not a secret key
            }
        )
    )


def test_spot_needs_max_wait_at_least_max_run():
    problems = problems_of(changed(EnableManagedSpotTraining=True))
    assert any("managed spot training needs MaxWaitTimeInSeconds" in p for p in problems)
    short = changed(
        EnableManagedSpotTraining=True,
        StoppingCondition={"MaxRuntimeInSeconds": 7200, "MaxWaitTimeInSeconds": 3600},
    )
    assert any("max_wait=3600 is less than max_run=7200" in p for p in problems_of(short))
    ok = changed(
        EnableManagedSpotTraining=True,
        StoppingCondition={"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 3600},
        CheckpointConfig={"S3Uri": "s3://bucket/ckpt/job", "LocalPath": "/opt/ml/checkpoints"},
    )
    validate_request(ok)
    no_spot = changed(StoppingCondition={"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200})
    assert any("managed spot training is off" in p for p in problems_of(no_spot))


def test_spot_needs_a_checkpoint_s3_uri_to_restart_from():
    spot = changed(
        EnableManagedSpotTraining=True,
        StoppingCondition={"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 3600},
    )
    assert any("needs a checkpoint S3 URI (CheckpointConfig.S3Uri)" in p for p in problems_of(spot))


def test_service_model_catches_types_unknown_members_enums_and_required():
    problems = problems_of(
        changed(
            RoleArn=None,
            ResourceConfig={
                "InstanceType": "ml.p3.17xlarge",
                "InstanceCount": "2",
                "VolumeSizeInGB": 30,
                "Foo": 1,
            },
        )
    )
    text = "\n".join(problems)
    assert 'Missing required parameter in input: "RoleArn"' in text
    assert 'Unknown parameter in ResourceConfig: "Foo"' in text
    assert "Invalid type for parameter ResourceConfig.InstanceCount" in text
    assert "ResourceConfig.InstanceType is 'ml.p3.17xlarge'; allowed:" in text


def test_service_model_checks_max_and_patterns_botocore_skips():
    problems = problems_of(changed(RoleArn="not-an-arn-but-long-enough"))
    assert any("RoleArn 'not-an-arn-but-long-enough' does not match the pattern" in p for p in problems)
    tags = [{"Key": f"k{i}", "Value": "v"} for i in range(51)]
    assert any("Tags has 51 entries; at most 50" in p for p in problems_of(changed(Tags=tags)))
    uri = changed(OutputDataConfig={"S3OutputPath": "ftp://bucket/out"})
    assert any("S3OutputPath 'ftp://bucket/out' does not match" in p for p in problems_of(uri))


def test_vpc_needs_subnets_and_security_groups():
    problems = problems_of(changed(VpcConfig={"Subnets": ["subnet-1"], "SecurityGroupIds": []}))
    assert any("VpcConfig needs both" in p for p in problems)


@pytest.mark.parametrize(
    ("instance_type", "local"),
    [
        ("ml.p3.16xlarge", False),
        ("ml.p3dn.24xlarge", True),
        ("ml.p4d.24xlarge", True),
        ("ml.g4dn.12xlarge", True),
        ("ml.g5.12xlarge", True),
        ("ml.p5.48xlarge", True),
        ("ml.m5.xlarge", False),
        ("ml.c5n.18xlarge", False),
        ("ml.m5d.4xlarge", True),
    ],
)
def test_volume_kms_key_is_refused_on_instances_with_local_nvme(instance_type, local):
    request = changed(
        ResourceConfig={
            "InstanceType": instance_type,
            "InstanceCount": 1,
            "VolumeSizeInGB": 30,
            "VolumeKmsKeyId": "alias/volume",
        }
    )
    problems = limit_problems(request)
    assert bool(problems) == local, problems
    if local:
        assert "local NVMe storage" in problems[0] and "drop volume_kms_key" in problems[0]


def test_recordio_wrapper_only_in_pipe_mode():
    channels = copy.deepcopy(BASE["InputDataConfig"])
    channels[0].update(InputMode="File", RecordWrapperType="RecordIO")
    assert any("RecordIO in File mode" in p for p in problems_of(changed(InputDataConfig=channels)))


def test_all_problems_are_reported_at_once():
    problems = problems_of(
        changed(TrainingJobName="bad_name", EnableManagedSpotTraining=True, HyperParameters={"secret": "x"})
    )
    assert len(problems) == 4  # the name, max_wait and the checkpoint URI of spot, the secret
    assert str(RequestValidationError(problems)).startswith("the training job request has 4 problem(s):")


def _with_layout(per_host: int, validation_mode: str, extra_mode: str = "File") -> dict:
    layout = plan_layout(2, 1, validation="single", extra_channels=("labels",))
    request = copy.deepcopy(BASE)
    request["HyperParameters"]["sagemaker_dist_layout"] = layout.to_json()
    request["HyperParameters"]["sagemaker_mpi_num_of_processes_per_host"] = str(per_host)
    shared = copy.deepcopy(request["InputDataConfig"][0])
    for name, mode in (("validation", validation_mode), ("labels", extra_mode)):
        request["InputDataConfig"].append({**copy.deepcopy(shared), "ChannelName": name, "InputMode": mode})
    return request


def test_shared_pipe_channels_need_one_process_per_host():
    problems = problems_of(_with_layout(4, "Pipe", "Pipe"))
    assert len(problems) == 2
    assert "channel 'validation' is shared by all 4 processes per host but is in Pipe mode" in problems[0]
    assert "channel 'labels'" in problems[1] and "File or FastFile" in problems[1]
    assert validate_request(_with_layout(1, "Pipe", "Pipe"))  # one reader per FIFO
    assert validate_request(_with_layout(4, "File", "FastFile"))
    no_mode = _with_layout(4, "Pipe")
    del no_mode["InputDataConfig"][-2]["InputMode"]  # inherits TrainingInputMode Pipe
    assert "channel 'validation'" in problems_of(no_mode)[0]
    broken = _with_layout(4, "File")
    broken["HyperParameters"]["sagemaker_dist_layout"] = "{not json"
    assert "is not a sagemaker-dist layout" in problems_of(broken)[0]


def test_names_with_a_trailing_newline_are_refused_by_our_checks():
    problems = limit_problems(changed(TrainingJobName="horovod-pipe-1\n"))
    assert any(p.startswith("job name 'horovod-pipe-1\\n' is not valid") for p in problems)
    request = copy.deepcopy(BASE)
    request["InputDataConfig"][0]["ChannelName"] = "train_0\n"
    assert any(p.startswith("channel name 'train_0\\n' is not valid") for p in limit_problems(request))


@pytest.mark.parametrize(
    "field, entry",
    [
        ("HyperParameters", {"lr": "0.1\ntouch /tmp/owned"}),
        ("HyperParameters", {"lr\nx": "0.1"}),
        ("HyperParameters", {"lr": "0.1\r"}),
        ("HyperParameters", {"lr": "a\tb"}),
        ("HyperParameters", {"lr": "a\x00b"}),
        ("Environment", {"MY_FLAG": "1\nreboot"}),
        ("Environment", {"MY\x1bFLAG": "1"}),
    ],
)
def test_control_characters_in_hyperparameters_and_environment_are_refused(field, entry):
    problems = problems_of(changed(**{field: entry}))
    (key,) = entry
    assert any(p.startswith(f"{field} ") and repr(key) in p and "control character" in p for p in problems)


def test_a_newline_in_a_hyperparameter_would_run_a_second_command_under_the_toolkits_shell(tmp_path):
    """The attack the check stops: AWS's toolkit runs the joined line through /bin/sh."""
    import shlex
    import subprocess

    marker = tmp_path / "owned"
    value = f"0.1\ntouch {shlex.quote(str(marker))}"
    subprocess.run(["/bin/sh", "-c", f"true --lr {value}"], check=True, timeout=10)
    assert marker.exists()  # the second line ran
    assert "control character '\\n'" in "\n".join(problems_of(changed(HyperParameters={"lr": value})))


def test_unicode_text_without_control_characters_passes():
    validate_request(changed(HyperParameters={"run_name": "résumé – ünïcode ✓", "epochs": "3"}))


@pytest.mark.parametrize("name", [".", ".."])
def test_channel_names_of_dots_alone_are_refused(name):
    """SageMaker's pattern takes them, but a File channel's folder would be the data folder or its parent."""
    request = copy.deepcopy(BASE)
    request["InputDataConfig"][0]["ChannelName"] = name
    assert any(p.startswith(f"channel name {name!r} names the data folder") for p in problems_of(request))
