"""Hyperparameter tuning on SageMaker: the spec's checks, the request rendered from the training request
(checked with botocore's model), created on the moto server and described back, and the CLI's
``tune --dry-run``."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import boto3
import pytest

from sagemaker_dist.aws.request_validation import service_model_problems, validate_request
from sagemaker_dist.aws.tuning import (
    TUNING_OBJECTIVE_HYPERPARAMETER,
    TuningSpec,
    default_tuning_job_name,
    render_tuning_request,
    trial_training_request,
)
from sagemaker_dist.aws.tuning_ranges import TuningError, parse_range_option, to_range
from sagemaker_dist.aws.tuning_validation import TuningRequestError, validate_tuning_request
from sagemaker_dist.contract.metric_line import (
    PREFIX,
    metric_definitions,
    metric_line,
    read_metrics,
)
from sagemaker_dist.launch.estimator import DistributedEstimator
from sagemaker_dist.launch.tuning_handle import TrialSummary, TuningJobHandle, trial_table
from sagemaker_dist.launch.tuning_job import draft_tuning_request

IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/sagemaker-dist:0.1.0"
ROLE_ARN = "arn:aws:iam::123456789012:role/SageMakerRole"
CLI = [sys.executable, "-m", "sagemaker_dist.cli"]
RANGES = {"learning_rate": "1e-4:1e-2:log", "batch_size": "16,32,64"}


def spec(**kw) -> TuningSpec:
    args = {"objective_metric": "val_accuracy", "ranges": RANGES, "max_jobs": 4, "max_parallel_jobs": 2}
    args.update(kw)
    return TuningSpec.build(**args)


def estimator(tmp_path, **kw) -> DistributedEstimator:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "train.py").write_text("print('training')\n")
    args = dict(
        source_dir=str(src),
        image_uri=IMAGE,
        processes_per_host=2,
        hyperparameters={"epochs": 3},
        output_path="s3://out-bucket/jobs",
    )
    args.update(kw)
    return DistributedEstimator("train.py", ROLE_ARN, "ml.c5.xlarge", 2, **args)


# ----- the metric line and its regexes -----


def test_metric_line_carries_every_finite_metric_and_the_regexes_read_it_behind_mpiruns_tag():
    line = metric_line(3, {"loss": 1.5, "accuracy": 0.25, "val_loss": float("nan"), "val_accuracy": 1e-5})
    assert line == f"{PREFIX} epoch=3 loss=1.5 accuracy=0.25 val_accuracy=1e-05"
    definitions = metric_definitions(["loss", "accuracy", "val_loss", "val_accuracy"])
    for tagged in (
        line,
        f"[1,mpirank:0,algo-1]<stdout>:{line}",
        f"[1,0]<stdout>:{line}",
        f"[0]<stdout>:{line}",
    ):
        epoch, values = read_metrics(tagged, definitions)
        assert epoch == 3
        assert values == {"loss": 1.5, "accuracy": 0.25, "val_accuracy": 1e-5}  # val_loss was nan: left out
    # 'loss' is not read out of 'val_loss', and no regex matches a Keras progress line
    epoch, values = read_metrics(f"{PREFIX} epoch=1 val_loss=0.5", definitions)
    assert values == {"val_loss": 0.5}
    assert read_metrics("8/8 - 1s - loss: 2.3 - accuracy: 0.1", definitions) == (None, {})
    assert metric_line(1, {"loss": float("inf")}) is None


# ----- the spec: bad input refused before anything is created -----


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"objective_metric": "val_acc"}, "not one the job reports"),
        ({"ranges": {"learning_rate": ""}}, "is empty"),
        ({"ranges": {"learning_rate": "0.1:0.01"}}, "must be less than maximum"),
        ({"ranges": {"learning_rate": "0.1:0.1"}}, "must be less than maximum"),
        ({"ranges": {"learning_rate": "0:0.1:log"}}, "above 0"),
        ({"ranges": {"optimizer": "adam"}}, "has one value"),
        ({"ranges": {}}, "no ranges"),
        ({"max_parallel_jobs": 5}, "more than the 4 trial(s)"),
        ({"max_jobs": 0}, "max_jobs=0"),
        ({"strategy": "Hyperband", "early_stopping": "Auto"}, "Hyperband"),
        ({"strategy": "Grid", "max_jobs": None, "max_parallel_jobs": 1}, "categorical ranges only"),
        ({"strategy": "Grid", "ranges": {"batch_size": "16,32"}, "max_jobs": 3}, "only 2 combination"),
        ({"strategy": "Simulated"}, "use one of Bayesian"),
        ({"ranges": {"sagemaker_program": "a.py,b.py"}}, None),
        ({"warm_start": ["x" * 33]}, "tuning job name"),
    ],
)
def test_bad_searches_are_refused_naming_what_to_change(kw, message):
    if message is None:  # a framework name: refused where the static hyperparameters are known
        built = spec(**kw)
        with pytest.raises(TuningError, match="cannot be tuned"):
            built.check_static({})
        return
    with pytest.raises(TuningError, match=re.escape(message)):
        spec(**kw)


def test_ranges_parse_as_sagemaker_takes_them():
    assert parse_range_option("epochs=2:10").as_request() == {
        "Name": "epochs", "MinValue": "2", "MaxValue": "10", "ScalingType": "Auto",
    }  # fmt: skip
    assert parse_range_option("lr=1e-4:0.1:log").as_request() == {
        "Name": "lr", "MinValue": "0.0001", "MaxValue": "0.1", "ScalingType": "Logarithmic",
    }  # fmt: skip
    assert parse_range_option("opt=adam, sgd").as_request() == {"Name": "opt", "Values": ["adam", "sgd"]}
    assert to_range("momentum", "0.5:0.99:reverse-log").scaling == "ReverseLogarithmic"
    assert to_range("size", [16, 32]).values == ("16", "32")
    with pytest.raises(TuningError, match="NAME=MIN:MAX"):
        parse_range_option("no-equals")
    with pytest.raises(TuningError, match="not a number"):
        parse_range_option("lr=a:b")


def test_sdk_parameter_classes_are_accepted_as_ranges():
    from sagemaker.core.parameter import CategoricalParameter, ContinuousParameter, IntegerParameter

    built = spec(
        ranges={
            "learning_rate": ContinuousParameter(1e-4, 1e-2, scaling_type="Logarithmic"),
            "epochs": IntegerParameter(2, 8),
            "optimizer": CategoricalParameter(["adam", "sgd"]),
        }
    )
    assert [r.describe() for r in built.ranges] == [
        "learning_rate continuous [0.0001, 0.01, logarithmic]",
        "epochs integer [2, 8]",
        "optimizer in {adam, sgd}",
    ]


def test_tuning_job_names_fit_sagemakers_32_characters():
    name = default_tuning_job_name("a-very-long-base-job-name-for-tuning")
    assert len(name) <= 32 and re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,31}", name)


# ----- the request, from the training request -----


def test_tuning_request_is_built_from_the_training_request(tmp_path):
    est = estimator(tmp_path, checkpoint_s3_uri="s3://out-bucket/ckpt", tags={"team": "ml"})
    inputs = {"train": "s3://data/train/", "validation": "s3://data/val/"}
    training = est.draft_request(inputs, job_name="tune-1")
    request, notes = render_tuning_request(training, spec(), "tune-1")
    validate_tuning_request(request, spec())
    assert service_model_problems(request, "CreateHyperParameterTuningJob") == []
    definition = request["TrainingJobDefinition"]
    # the same channels and manifests, the same static hyperparameters (MPI settings and layout included)
    assert definition["InputDataConfig"] == training["InputDataConfig"]
    # plus the TF toolkit's model_dir: a trial's becomes <output path>/<trial>/model (see below)
    assert definition["StaticHyperParameters"] == {
        **training["HyperParameters"],
        "model_dir": "s3://out-bucket/jobs",
    }
    for key in ("RoleArn", "OutputDataConfig", "ResourceConfig", "StoppingCondition"):
        assert definition[key] == training[key]
    assert definition["AlgorithmSpecification"]["TrainingImage"] == IMAGE
    assert definition["AlgorithmSpecification"]["TrainingInputMode"] == "Pipe"
    assert [d["Name"] for d in definition["AlgorithmSpecification"]["MetricDefinitions"]] == [
        "loss", "accuracy", "val_loss", "val_accuracy",
    ]  # fmt: skip
    assert "CheckpointConfig" not in definition and any("CheckpointConfig" in n for n in notes)
    assert request["Tags"] == [{"Key": "team", "Value": "ml"}]
    config = request["HyperParameterTuningJobConfig"]
    assert config["HyperParameterTuningJobObjective"] == {"Type": "Maximize", "MetricName": "val_accuracy"}
    assert config["ResourceLimits"] == {"MaxParallelTrainingJobs": 2, "MaxNumberOfTrainingJobs": 4}
    assert config["ParameterRanges"]["ContinuousParameterRanges"] == [
        {"Name": "learning_rate", "MinValue": "0.0001", "MaxValue": "0.01", "ScalingType": "Logarithmic"}
    ]
    # each trial is a valid CreateTrainingJob request: static + tuned + the objective SageMaker adds
    trial = trial_training_request(
        request, "tune-1-001-abcdef12", {"learning_rate": "0.001", "batch_size": "32"}
    )
    validate_request(trial)
    assert trial["HyperParameters"]["learning_rate"] == "0.001"
    assert trial["HyperParameters"][TUNING_OBJECTIVE_HYPERPARAMETER] == "val_accuracy"
    assert trial["InputDataConfig"] == training["InputDataConfig"]


@pytest.mark.parametrize("distribution", ["horovod", "tf-mwms", "torchrun"])
def test_a_tensorflow_trial_gets_a_model_dir_the_toolkit_can_extend(tmp_path, distribution):
    """AWS's TF toolkit sets a tuning trial's model_dir to "<model_dir>/<job>/model"; with none it is
    "None/<job>/model", a relative directory the model is saved into and never leaves. A TF job's tuning
    definition carries the output path as model_dir (one the user sets is kept); PyTorch's reads none."""
    est = estimator(
        tmp_path, distribution=distribution, processes_per_host=1 if distribution == "tf-mwms" else 2
    )
    inputs = {"train": "s3://data/train/", "validation": "s3://data/val/"}
    training = est.draft_request(inputs, job_name="tune-1")
    static = render_tuning_request(training, spec(), "tune-1")[0]["TrainingJobDefinition"][
        "StaticHyperParameters"
    ]
    if distribution == "torchrun":
        assert "model_dir" not in static
    else:
        assert static["model_dir"] == "s3://out-bucket/jobs"
        own = estimator(tmp_path, distribution=distribution, hyperparameters={"model_dir": "s3://mine/m"},
                        processes_per_host=1 if distribution == "tf-mwms" else 2)  # fmt: skip
        mine = render_tuning_request(own.draft_request(inputs, job_name="tune-1"), spec(), "tune-1")[0]
        assert mine["TrainingJobDefinition"]["StaticHyperParameters"]["model_dir"] == "s3://mine/m"


def test_hyperband_reads_the_epochs_and_grid_needs_no_max_jobs(tmp_path):
    est = estimator(tmp_path)
    training = est.draft_request({"train": "s3://data/train/"}, job_name="tune-2")
    request, _ = render_tuning_request(training, spec(strategy="Hyperband"), "tune-2")
    assert request["HyperParameterTuningJobConfig"]["StrategyConfig"] == {
        "HyperbandStrategyConfig": {"MinResource": 1, "MaxResource": 3}
    }
    grid = spec(strategy="Grid", ranges={"batch_size": "16,32", "optimizer": "adam,sgd"}, max_jobs=None)
    assert grid.n_trials == 4 and len(grid.grid()) == 4
    request, _ = render_tuning_request(training, grid, "tune-2")
    validate_tuning_request(request, grid)
    assert "MaxNumberOfTrainingJobs" not in request["HyperParameterTuningJobConfig"]["ResourceLimits"]


def test_a_tuned_name_that_is_also_static_is_refused(tmp_path):
    est = estimator(tmp_path, hyperparameters={"epochs": 3, "learning_rate": 0.1})
    with pytest.raises(TuningError, match="learning_rate is both tuned and a static hyperparameter"):
        draft_tuning_request(est, {"train": "s3://data/train/"}, spec(), "tune-3")


def test_hyperparameters_count_with_the_tuned_ones_and_sagemakers_own(tmp_path):
    # 6 framework + 93 user + 2 tuned + _tuning_objective_metric = 102 > 100 (a launch of 99 passes)
    est = estimator(tmp_path, hyperparameters={f"hp{i}": i for i in range(93)})
    est.draft_request({"train": "s3://data/train/"})
    with pytest.raises(TuningError, match="SageMaker allows 100 in all"):
        draft_tuning_request(est, {"train": "s3://data/train/"}, spec(), "tune-4")


def test_validation_lists_what_sagemaker_would_refuse(tmp_path):
    est = estimator(tmp_path)
    request, _ = draft_tuning_request(est, {"train": "s3://data/train/"}, spec(), "tune-5")
    request["HyperParameterTuningJobName"] = "x" * 33
    request["TrainingJobDefinition"]["AlgorithmSpecification"]["MetricDefinitions"] = [
        {"Name": f"m{i}", "Regex": "m=(.*)"} for i in range(41)
    ]
    with pytest.raises(TuningRequestError) as info:
        validate_tuning_request(request, spec())
    text = str(info.value)
    assert "HyperParameterTuningJobName" in text and "at most 32" in text
    assert "MetricDefinitions has 41 entries; at most 40" in text
    assert "objective metric 'val_accuracy' has no MetricDefinition" in text


# ----- on the moto server -----


@pytest.fixture
def session(aws_env, bucket):
    from sagemaker.core.helper.session_helper import Session

    return Session(boto_session=boto3.Session(region_name="us-east-1"), default_bucket=bucket)


def test_tuning_job_is_created_on_the_moto_server_and_described_back(aws_env, s3, bucket, session, tmp_path):
    for i in range(8):
        s3.put_object(Bucket=bucket, Key=f"train/part-{i}.tfrecord", Body=b"x" * (100 + i))
    est = estimator(tmp_path, output_path=f"s3://{bucket}/jobs", sagemaker_session=session)
    lines: list[str] = []
    handle = est.tune(
        {"train": f"s3://{bucket}/train/"},
        objective_metric="val_accuracy",
        ranges=RANGES,
        max_jobs=4,
        max_parallel_jobs=2,
        tuning_job_name="tune-on-moto",
        wait=False,
        printer=lines.append,
    )
    assert isinstance(handle, TuningJobHandle) and handle.arn.endswith(
        ":hyper-parameter-tuning-job/tune-on-moto"
    )
    described = boto3.client("sagemaker", region_name="us-east-1").describe_hyper_parameter_tuning_job(
        HyperParameterTuningJobName="tune-on-moto"
    )
    assert described["HyperParameterTuningJobConfig"] == handle.request["HyperParameterTuningJobConfig"]
    definition = described["TrainingJobDefinition"]
    assert (
        definition["StaticHyperParameters"]
        == handle.request["TrainingJobDefinition"]["StaticHyperParameters"]
    )
    # sharded once, into 4 manifests under the tuning job's name, shared by every trial
    uris = [c["DataSource"]["S3DataSource"]["S3Uri"] for c in definition["InputDataConfig"]]
    assert len(uris) == 4 and all(u.startswith(f"s3://{bucket}/jobs/tune-on-moto/shards/") for u in uris)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="jobs/tune-on-moto/")["Contents"]}
    assert "jobs/tune-on-moto/source/sourcedir.tar.gz" in keys
    # the handle reports status and the best training job (moto's fixed answer)
    assert handle.status == "Completed"
    best = handle.best_training_job()
    assert best is not None and best.objective == 1.0
    assert any(line.startswith("created tuning job tune-on-moto") for line in lines)
    # the same name again is refused before anything is written
    with pytest.raises(TuningError, match="already exists"):
        est.tune(
            {"train": f"s3://{bucket}/train/"}, objective_metric="val_accuracy", ranges=RANGES, max_jobs=4,
            tuning_job_name="tune-on-moto", wait=False, printer=None,
        )  # fmt: skip


def test_trial_summaries_make_a_table_with_the_best_marked():
    rows = [
        {"TrainingJobName": "t-001-a", "TrainingJobStatus": "Completed",
         "TunedHyperParameters": {"lr": "0.01"},
         "FinalHyperParameterTuningJobObjectiveMetric": {"MetricName": "val_accuracy", "Value": 0.5}},
        {"TrainingJobName": "t-002-b", "TrainingJobStatus": "Stopped", "TunedHyperParameters": {"lr": "0.1"}},
    ]  # fmt: skip
    trials = [TrialSummary.from_summary(r) for r in rows]
    table = trial_table(trials, "val_accuracy", best="t-001-a")
    assert table[0].split() == ["trial", "status", "val_accuracy", "lr"]
    assert table[1].split() == ["*", "t-001-a", "Completed", "0.5", "0.01"]
    assert table[2].split() == ["t-002-b", "Stopped", "-", "0.1"]


def test_cli_dry_run_prints_the_request_as_json(tmp_path):
    (tmp_path / "train.py").write_text("print('x')\n")
    proc = subprocess.run(
        [*CLI, "tune", "train.py", "--source-dir", str(tmp_path), "--role", ROLE_ARN, "--instance-type",
         "ml.g5.12xlarge", "--instance-count", "2", "--train", "s3://data/train/", "--output-path",
         "s3://out/jobs", "--image-uri", IMAGE, "--objective-metric", "val_loss", "--objective-type",
         "Minimize", "--range", "learning_rate=1e-4:1e-2:log", "--range", "batch_size=16,32",
         "--max-jobs", "6", "--max-parallel-jobs", "2", "--strategy", "Random", "--early-stopping", "Auto",
         "--dry-run"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    request = json.loads(proc.stdout)
    assert service_model_problems(request, "CreateHyperParameterTuningJob") == []
    config = request["HyperParameterTuningJobConfig"]
    assert config["Strategy"] == "Random" and config["TrainingJobEarlyStoppingType"] == "Auto"
    assert config["HyperParameterTuningJobObjective"] == {"Type": "Minimize", "MetricName": "val_loss"}
    regex = {
        d["Name"]: d["Regex"]
        for d in request["TrainingJobDefinition"]["AlgorithmSpecification"]["MetricDefinitions"]
    }
    tagged = f"[1,mpirank:0,algo-1]<stdout>:{metric_line(2, {'loss': 2.0, 'val_loss': 1.75})}"
    assert re.search(regex["val_loss"], tagged).group(1) == "1.75"


def test_cli_refuses_bad_input_before_any_aws_call(tmp_path):
    (tmp_path / "train.py").write_text("print('x')\n")
    base = [*CLI, "tune", "train.py", "--source-dir", str(tmp_path), "--role", ROLE_ARN, "--instance-type",
            "ml.g5.12xlarge", "--train", "s3://data/train/", "--output-path", "s3://out/jobs", "--image-uri",
            IMAGE, "--objective-metric", "val_accuracy", "--max-jobs", "2"]  # fmt: skip
    for extra, message in (
        (["--range", "learning_rate=0.1:0.01"], "must be less than maximum"),
        (["--range", "learning_rate=1e-4:1e-2", "--max-parallel-jobs", "3"], "more than the 2 trial(s)"),
        (["--range", "epochs=1:3", "--hp", "epochs=2"], "both tuned and a static"),
        (["--range", "lr=0.1,0.2", "--objective-metric", "f1"], "not one the job reports"),
    ):
        proc = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr and proc.stderr.startswith("error: ")
