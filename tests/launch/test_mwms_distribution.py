"""``distribution='tf-mwms'`` on the SDK side: one worker and one channel per host, the toolkit's
MultiWorkerMirroredStrategy hyperparameter and no MPI, the TF 2.21 DLC, a request that validates, and
bad input refused before any AWS call (any call would fail: the endpoint points where nothing listens)."""

from __future__ import annotations

import json

import pytest

from sagemaker_dist import DistributedEstimator, validate_request
from sagemaker_dist.cli import main
from sagemaker_dist.contract.layout import ChannelLayout, LayoutError
from sagemaker_dist.contract.rank_slots import RankVariablesError, rank_from_environment
from sagemaker_dist.launch.inputs import ChannelSource, EstimatorError

ROLE_ARN = "arn:aws:iam::123456789012:role/SageMakerRole"


def _estimator(script, **kwargs):
    kwargs = {"instance_count": 3, "output_path": "s3://out-bucket/jobs", "distribution": "tf-mwms", **kwargs}
    return DistributedEstimator(script, ROLE_ARN, "ml.p4d.24xlarge", **kwargs)


def test_request_has_one_channel_per_host_no_mpi_and_the_tf_2_21_image(no_aws, script):
    est = _estimator(script)
    assert est.processes_per_host == 1  # one worker drives the host's 8 GPUs
    uris = tuple(f"s3://data-bucket/shards/train/{i}.manifest" for i in range(3))
    request = est.build_request({"train": ChannelSource(uris, "ManifestFile")}, job_name="mwms")
    validate_request(request)
    assert [c["ChannelName"] for c in request["InputDataConfig"]] == ["train_0", "train_1", "train_2"]
    hps = request["HyperParameters"]
    assert hps["sagemaker_multi_worker_mirrored_strategy_enabled"] == "true"
    assert not [k for k in hps if k.startswith("sagemaker_mpi")]
    assert ChannelLayout.from_json(hps["sagemaker_dist_layout"]).distribution == "tf-mwms"
    image = request["AlgorithmSpecification"]["TrainingImage"]
    assert image == "763104351884.dkr.ecr.us-east-1.amazonaws.com/tensorflow-training:2.21-gpu-py312"


def test_above_twenty_hosts_one_sharded_by_key_channel(no_aws, script):
    layout = _estimator(script, instance_count=25).plan({"train": "s3://data-bucket/train/"})
    assert layout.channel_names == ["train_0"] and layout.roles[0].distribution == "ShardedByS3Key"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"processes_per_host": 8}, "processes per host must be 1, not 8"),
    ({"mpi_options": "-x NCCL_DEBUG=INFO"}, "mpi_options is a Horovod (mpirun) option"),
    ({"default_mpi_options": False}, "default_mpi_options=False is a Horovod (mpirun) option"),
    ({"distribution": "mwms"}, "distribution='mwms'; use one of horovod, tf-mwms"),
])  # fmt: skip
def test_bad_input_is_refused_before_any_aws_call(no_aws, script, kwargs, message):
    with pytest.raises((EstimatorError, LayoutError)) as error:
        _estimator(script, **kwargs)
    assert message in str(error.value)


def test_cli_offers_the_distribution_and_its_dry_run_request_validates(aws_env, s3, bucket, script, capsys):
    s3.put_object(Bucket=bucket, Key="train/part-0.tfrecord", Body=b"x" * 100)
    s3.put_object(Bucket=bucket, Key="train/part-1.tfrecord", Body=b"x" * 100)
    argv = [
        "launch",
        script,
        "--role",
        ROLE_ARN,
        "--instance-type",
        "ml.g5.12xlarge",
        "--instance-count",
        "2",
    ]
    argv += ["--train", f"s3://{bucket}/train/", "--distribution", "tf-mwms", "--dry-run"]
    argv += ["--output-path", f"s3://{bucket}/jobs"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    request = json.loads(out[out.index("{") :])
    validate_request(request)
    assert "2 MultiWorkerMirroredStrategy worker(s)" in out
    assert request["AlgorithmSpecification"]["TrainingImage"].endswith("tensorflow-training:2.21-gpu-py312")
    with pytest.raises(SystemExit):
        main(["launch", "--help"])
    assert "--distribution {horovod,tf-mwms,torchrun}" in capsys.readouterr().out


def test_rank_comes_from_tf_config_after_the_mpi_variables():
    config = {"cluster": {"worker": ["algo-1:8890", "algo-2:8890"]}, "task": {"index": 1, "type": "worker"}}
    assert rank_from_environment({"TF_CONFIG": json.dumps(config)}) == ((1, 0, 2, 1), "TF_CONFIG")
    both = {"TF_CONFIG": json.dumps(config), **dict.fromkeys(["HOROVOD_RANK", "HOROVOD_SIZE"], "0")}
    both.update(HOROVOD_LOCAL_RANK="0", HOROVOD_LOCAL_SIZE="1", HOROVOD_SIZE="1")
    assert rank_from_environment(both)[1] == "HOROVOD_*"
    ps = {"cluster": {"worker": ["a:1"], "ps": ["b:1"]}, "task": {"index": 0, "type": "worker"}}
    with pytest.raises(RankVariablesError, match="workers only"):
        rank_from_environment({"TF_CONFIG": json.dumps(ps)})
    with pytest.raises(RankVariablesError, match="task index 5"):
        rank_from_environment({"TF_CONFIG": json.dumps({**config, "task": {"index": 5, "type": "worker"}})})
