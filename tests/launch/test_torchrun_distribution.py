"""``distribution='torchrun'`` on the SDK side: one process and one Pipe channel per GPU rank, the
toolkit's torch_distributed hyperparameter with its processes per host and no MPI, the PyTorch 2.8 DLC
(GPU or CPU tag by instance type), a request that validates, and a CPU instance type refused for a
SageMaker launch before any AWS call (SDK v2's rule for torch_distributed; local mode runs on the CPU)."""

from __future__ import annotations

import json

import pytest

from sagemaker_dist import DistributedEstimator, __version__, validate_request
from sagemaker_dist.aws.request_validation import service_model_problems
from sagemaker_dist.cli import main
from sagemaker_dist.contract.distributions import DistributionError
from sagemaker_dist.contract.layout import ChannelLayout, LayoutError
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.launch.backends import SageMakerBackend
from sagemaker_dist.launch.inputs import ChannelSource, EstimatorError

ROLE_ARN = "arn:aws:iam::123456789012:role/SageMakerRole"
OURS = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/sagemaker-dist-pytorch:{__version__}"
DLC = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.8-gpu-py312"


def _estimator(script, instance_type="ml.g5.12xlarge", **kwargs):
    kwargs = {
        "instance_count": 2,
        "output_path": "s3://out-bucket/jobs",
        "distribution": "torchrun",
        **kwargs,
    }
    return DistributedEstimator(script, ROLE_ARN, instance_type, **kwargs)


def _manifests(count):
    return ChannelSource(
        tuple(f"s3://data-bucket/shards/train/{i}.manifest" for i in range(count)), "ManifestFile"
    )


def test_request_has_one_channel_per_gpu_rank_the_torch_hyperparameters_and_the_pytorch_gpu_image(
    no_aws, script
):
    est = _estimator(script)
    assert (est.processes_per_host, est.world_size) == (4, 8)  # one process per GPU of a g5.12xlarge
    request = est.build_request({"train": _manifests(8)}, job_name="torchrun")
    validate_request(request)
    assert [c["ChannelName"] for c in request["InputDataConfig"]] == [f"train_{i}" for i in range(8)]
    assert {c["InputMode"] for c in request["InputDataConfig"]} == {"Pipe"}
    hps = request["HyperParameters"]
    assert hps["sagemaker_torch_distributed_enabled"] == "true"
    # sagemaker-training's TorchDistributedRunner reads --nproc_per_node from the MPI count, runs no mpirun
    assert hps["sagemaker_mpi_num_of_processes_per_host"] == "4"
    assert "sagemaker_mpi_enabled" not in hps and "sagemaker_mpi_custom_mpi_options" not in hps
    layout = ChannelLayout.from_json(hps["sagemaker_dist_layout"])
    assert (layout.distribution, layout.world_size, layout.processes_per_host) == ("torchrun", 8, 4)
    assert request["AlgorithmSpecification"]["TrainingImage"] == OURS  # in the role's account: no STS call
    assert not est.ships_package()


def test_per_rank_channels_stay_within_the_twenty_channel_cap(no_aws, script):
    small = _estimator(script, "ml.p4d.24xlarge", instance_count=2).plan({"train": "s3://data-bucket/train/"})
    assert small.world_size == 16 and len(small.channel_names) == 16
    big = _estimator(script, "ml.p4d.24xlarge", instance_count=3).plan({"train": "s3://data-bucket/train/"})
    assert big.world_size == 24 and len(big.channel_names) <= 20


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"mpi_options": "-x NCCL_DEBUG=INFO"}, "mpi_options is a Horovod (mpirun) option"),
    ({"processes_per_host": 8}, "4 GPU(s)"),
    ({"distribution": "torch"}, "distribution='torch'; use one of horovod, tf-mwms, torchrun"),
])  # fmt: skip
def test_bad_input_is_refused_before_any_aws_call(no_aws, script, kwargs, message):
    with pytest.raises((EstimatorError, LayoutError, ConfigurationError)) as error:
        _estimator(script, **kwargs)
    assert message in str(error.value)


def test_a_sagemaker_launch_on_a_cpu_type_is_refused_before_any_aws_call(no_aws, script):
    est = _estimator(script, "ml.c5.xlarge", processes_per_host=2)
    with pytest.raises(
        DistributionError, match=r"GPU or Trainium instance types \(ml\.p\*, ml\.g\*, ml\.trn\*\)"
    ):
        est.launch({"train": "s3://data-bucket/train/"}, wait=False)
    request = est.build_request({"train": _manifests(4)}, job_name="torchrun-cpu")
    with pytest.raises(DistributionError, match="not 'ml.c5.xlarge'"):
        SageMakerBackend().complete_request(request, printer=None)
    gpu = _estimator(script).build_request({"train": _manifests(8)}, job_name="torchrun-gpu")
    assert (
        SageMakerBackend().complete_request(gpu, printer=None)["ResourceConfig"]["InstanceType"]
        == "ml.g5.12xlarge"
    )


def _launch_argv(script, bucket, instance_type):
    argv = ["launch", script, "--role", ROLE_ARN, "--instance-type", instance_type, "--instance-count", "2"]
    argv += ["--train", f"s3://{bucket}/train/", "--distribution", "torchrun", "--dry-run"]
    return argv + ["--output-path", f"s3://{bucket}/jobs"]


def test_cli_dry_run_prints_the_request_a_launch_would_send(aws_env, s3, bucket, script, capsys):
    """With S3 reachable, the same listing, balance and checks as a launch, and the manifest URIs it
    would write (shown, not written)."""
    for i in range(4):
        s3.put_object(Bucket=bucket, Key=f"train/part-{i}.tfrecord", Body=b"x" * 100)
    assert main(_launch_argv(script, bucket, "ml.g5.12xlarge")) == 2  # 4 objects for 8 ranks: as launch
    assert "every worker needs at least one object" in capsys.readouterr().err
    for i in range(4, 8):
        s3.put_object(Bucket=bucket, Key=f"train/part-{i}.tfrecord", Body=b"x" * (100 + i))
    assert main(_launch_argv(script, bucket, "ml.g5.12xlarge")) == 0
    out = capsys.readouterr().out
    request = json.loads(out[out.index("{") :])
    validate_request(request)
    assert "2 host(s) x 4 process(es) = 8 torchrun rank(s)" in out
    uris = [c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["InputDataConfig"]]
    assert len(set(uris)) == 8 and all(u.startswith(f"s3://{bucket}/jobs/") for u in uris)
    assert {c["DataSource"]["S3DataSource"]["S3DataType"] for c in request["InputDataConfig"]} == {
        "ManifestFile"
    }
    assert f"train: {uris[0]}: 1 object(s)" in out and "(planned, not written)" in out
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="jobs/").get("KeyCount", 0)
    assert listed == 0  # nothing written
    assert request["HyperParameters"]["sagemaker_torch_distributed_enabled"] == "true"
    assert request["AlgorithmSpecification"]["TrainingImage"] == OURS
    with pytest.raises(SystemExit):
        main(["launch", "--help"])
    assert "torchrun: PyTorch DDP under torchrun" in " ".join(capsys.readouterr().out.split())


def test_cli_dry_run_without_s3_prints_stand_ins_that_no_host_runs(no_aws, script, tmp_path, capsys):
    from sagemaker_dist.contract.draft import DraftRequestError
    from sagemaker_dist.host.job_spec import JobSpec

    argv = _launch_argv(script, "data-bucket", "ml.g5.12xlarge") + ["--region", "eu-west-1"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "S3 could not be asked" in captured.err and "local --request refuses it" in captured.err
    request = json.loads(captured.out[captured.out.index("{") :])
    uris = [c["DataSource"]["S3DataSource"]["S3Uri"] for c in request["InputDataConfig"]]
    assert uris == [f"s3://sagemaker-dist-draft-not-sharded/train/{i}" for i in range(8)]
    assert (
        ".dkr.ecr.eu-west-1.amazonaws.com/sagemaker-dist-pytorch:"
        in request["AlgorithmSpecification"]["TrainingImage"]
    )
    with pytest.raises(DraftRequestError, match="is a dry run's draft: channel train_0 is the stand-in"):
        JobSpec.from_request(request)
    bare = json.loads(json.dumps(request))
    for channel in bare["InputDataConfig"]:
        channel["DataSource"]["S3DataSource"].update(S3Uri="s3://data-bucket/train/", S3DataType="S3Prefix")
    with pytest.raises(
        DraftRequestError, match="all name the whole prefix s3://data-bucket/train/: every rank"
    ):
        JobSpec.from_request(bare)
    with pytest.raises(SystemExit):
        main([*argv[:-1], "eu-west"])
    assert "'eu-west' is not an AWS region name" in capsys.readouterr().err


def test_cli_refuses_a_cpu_type_for_torchrun(aws_env, s3, bucket, script, capsys):
    argv = _launch_argv(script, bucket, "ml.c5.xlarge") + ["--processes-per-host", "2"]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert "distribution 'torchrun' runs on SageMaker on GPU or Trainium instance types" in err
    assert "sagemaker-dist local" in err


def _tune_argv(script, instance_type):
    argv = ["tune", script, "--role", ROLE_ARN, "--instance-type", instance_type, "--instance-count", "2"]
    argv += [
        "--processes-per-host",
        "2",
        "--train",
        "s3://data-bucket/train/",
        "--output-path",
        "s3://out/jobs",
    ]
    argv += ["--distribution", "torchrun", "--objective-metric", "val_accuracy"]
    return argv + ["--range", "learning_rate=1e-4:1e-2:log", "--max-jobs", "2", "--dry-run"]


def test_cli_tune_dry_run_on_gpu_validates_and_on_cpu_is_refused(no_aws, script, capsys):
    assert main(_tune_argv(script, "ml.g5.12xlarge")) == 0
    out = capsys.readouterr().out
    request = json.loads(out)  # the explanation goes to stderr
    assert service_model_problems(request, "CreateHyperParameterTuningJob") == []
    definition = request["TrainingJobDefinition"]
    assert definition["AlgorithmSpecification"]["TrainingImage"] == OURS
    assert [c["ChannelName"] for c in definition["InputDataConfig"]] == [f"train_{i}" for i in range(4)]
    assert definition["StaticHyperParameters"]["sagemaker_torch_distributed_enabled"] == "true"
    assert main(_tune_argv(script, "c5.xlarge")) == 2
    assert "not 'c5.xlarge'" in capsys.readouterr().err


def test_the_toolkit_runs_only_a_python_script_outside_a_package(no_aws, tmp_path):
    """sagemaker-training's torch_distributed refuses a .sh entry point and a source dir with setup.py."""
    (tmp_path / "train.sh").write_text("echo 1\n")
    with pytest.raises(EstimatorError, match="entry point 'train.sh' is not a .py file"):
        _estimator("train.sh", source_dir=str(tmp_path))
    (tmp_path / "train.py").write_text("print(1)\n")
    _estimator("train.py", source_dir=str(tmp_path))
    (tmp_path / "setup.py").write_text("")
    with pytest.raises(EstimatorError, match="the source dir holds a setup.py"):
        _estimator("train.py", source_dir=str(tmp_path))
    _estimator("train.py", source_dir=str(tmp_path), distribution="horovod")  # the MPI runner takes packages


def test_a_plain_dlc_gets_the_package_in_the_source_tarball_and_a_line_saying_what_that_means(
    aws_env, s3, bucket, tmp_path
):
    """AWS's PyTorch DLC lacks sagemaker_dist: the package and its runtime's requirements travel with the
    script, and AWS's toolkit installs requirements.txt before it runs the script."""
    import io
    import tarfile

    from sagemaker_dist.launch.runtime_package import runtime_requirements

    for i in range(8):
        s3.put_object(Bucket=bucket, Key=f"train/part-{i}.tfrecord", Body=b"x" * 100)
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("import sagemaker_dist.runtime\n")
    (src / "requirements.txt").write_text("einops==0.8.1\n")
    est = _estimator("train.py", source_dir=str(src), image_uri=DLC, output_path=f"s3://{bucket}/jobs")
    assert est.ships_package()
    lines = []
    prepared = est.prepare({"train": f"s3://{bucket}/train/"}, "plain-dlc", printer=lines.append)
    assert prepared.request["AlgorithmSpecification"]["TrainingImage"] == DLC
    shipped = next(line for line in lines if line.startswith("image "))
    assert "has no sagemaker_dist: the package travels in sourcedir.tar.gz" in shipped
    assert (
        "does not forward SIGTERM" in shipped and "resume from the last step or epoch checkpoint" in shipped
    )
    body = s3.get_object(Bucket=bucket, Key="jobs/plain-dlc/source/sourcedir.tar.gz")["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        names = set(tar.getnames())
        requirements = tar.extractfile("requirements.txt").read().decode().splitlines()
    assert {"train.py", "sagemaker_dist/__init__.py", "sagemaker_dist/runtime/torch/training.py"} <= names
    assert "sagemaker_dist/runtime/framing/native/record_core.h" in names
    assert not any(name.endswith((".so", ".pyc")) for name in names)
    assert requirements[0] == "einops==0.8.1" and any(r.startswith("crc32c") for r in requirements)
    assert requirements[2:] == runtime_requirements()
    ours = _estimator("train.py", source_dir=str(src), image_uri=OURS, output_path=f"s3://{bucket}/jobs")
    assert not ours.ships_package()
    (src / "sagemaker_dist").mkdir()
    (src / "sagemaker_dist" / "mine.py").write_text("")
    with pytest.raises(
        ConfigurationError, match="holds 'sagemaker_dist/mine.py': the sagemaker_dist package"
    ):
        est.prepare({"train": f"s3://{bucket}/train/"}, "plain-dlc-2", printer=None)


@pytest.mark.slow
def test_the_shipped_package_imports_and_frames_records_after_the_toolkits_pip_install(tmp_path):
    """What AWS's toolkit does in a plain DLC, in a fresh venv: ``python -m pip install -r
    requirements.txt`` in the code folder (sagemaker_training.modules.install_requirements), then the
    script from that folder: it imports the shipped package, not an installed one."""
    import subprocess
    import sys
    import tarfile

    from sagemaker_dist.launch.source_package import pack_source

    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(
        "import sagemaker_dist\n"
        "from sagemaker_dist.contract.record_formats import encode_tfrecord\n"
        "from sagemaker_dist.runtime.framing import tfrecord\n"
        "print(sagemaker_dist.__file__)\n"
        "print(tfrecord.__name__, len(encode_tfrecord(b'abc')))\n"
    )
    package = pack_source("train.py", src, dest_dir=tmp_path / "out", runtime_package=True)
    code = tmp_path / "code"
    with tarfile.open(package.path) as tar:  # Debian 12's Python 3.11.2 has no extraction filters
        tar.extractall(code, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    venv = tmp_path / "venv"
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", venv], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    pip = subprocess.run(
        [python, "-m", "pip", "install", "-q", "-r", "requirements.txt"],
        cwd=code, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stderr[-2000:]
    ran = subprocess.run([python, "train.py"], cwd=code, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.splitlines() == [
        str(code / "sagemaker_dist" / "__init__.py"),
        "sagemaker_dist.runtime.framing.tfrecord 19",
    ]
