"""``sagemaker_dist.host`` serves local mode and the platforms' pipe agent alike: it reads a request
into host trees one way for both, and keeps none of local mode's own vocabulary."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from helpers.small_request import small_request

import sagemaker_dist
from sagemaker_dist.aws.s3_objects import s3_client
from sagemaker_dist.host.job_spec import JobSpec
from sagemaker_dist.host.lifecycle import (
    DEFAULT_INSTANCE_TYPE,
    HostLifecycle,
    OutputUploadError,
    host_trees_for,
)
from sagemaker_dist.local.demo import prepare_demo_job
from sagemaker_dist.local.rank_entry import write_job_file

PACKAGE = Path(sagemaker_dist.__file__).parent


def test_one_reading_of_a_request_into_host_trees(s3, bucket, tmp_path):
    request = prepare_demo_job(bucket, 2, 1, printer=None).request
    request["ResourceConfig"]["InstanceType"] = "ml.p4d.24xlarge"
    request["Environment"] = {"FROM_THE_REQUEST": "1"}
    trees = host_trees_for(JobSpec.from_request(request), tmp_path)
    assert [t.name for t in trees] == ["algo-1", "algo-2"]
    resource = json.loads((trees[1].config_dir / "resourceconfig.json").read_text())
    assert (resource["current_host"], resource["current_instance_type"]) == ("algo-2", "ml.p4d.24xlarge")
    assert (
        trees[1].env["FROM_THE_REQUEST"] == "1"
        and trees[1].env["TRAINING_JOB_NAME"] == request["TrainingJobName"]
    )
    assert DEFAULT_INSTANCE_TYPE == "local"


def test_the_job_spec_works_out_what_its_hosts_derive_when_it_is_made():
    """Host names, rank slots (all, and host by host) and the script's arguments are fields of the job
    spec, worked out with it: every launcher, the rank entry and a node's plan read the same values,
    and a job spec replaced with other hosts has its own."""
    request = small_request({"epochs": 3, "sagemaker_mpi_num_of_processes_per_host": 2})
    request["ResourceConfig"]["InstanceCount"] = 2
    job = JobSpec.from_request(request)
    assert job.host_names == ("algo-1", "algo-2") and [s.rank for s in job.slots] == [0, 1, 2, 3]
    assert [[s.rank for s in host] for host in job.slots_by_host] == [[0, 1], [2, 3]]
    assert job.toolkit_args == ("--epochs", "3") and job.script_hyperparameters.user == {"epochs": 3}
    assert {"host_names", "slots", "slots_by_host", "script_hyperparameters"} <= set(vars(job))
    bigger = dataclasses.replace(job, hosts=3)
    assert bigger.host_names[-1] == "algo-3" and [s.host for s in bigger.slots_by_host[2]] == ["algo-3"] * 2


def test_the_trees_say_which_host_each_rank_runs_on(s3, bucket, tmp_path):
    """Hosts are filled in order, as SageMaker does: with 2 ranks per host, ranks 2 and 3 are algo-2's.
    The launchers' rank prefixes, the failure messages and the summary all ask the trees."""
    request = prepare_demo_job(bucket, 2, 2, printer=None).request
    trees = host_trees_for(JobSpec.from_request(request), tmp_path)
    assert trees.world == 4 and len(trees) == 2 and trees[:1] == (trees[0],)
    assert [trees.host_of(r) for r in range(4)] == ["algo-1", "algo-1", "algo-2", "algo-2"]
    assert [trees.local_rank(r) for r in range(4)] == [0, 1, 0, 1]
    assert trees.host_of(4) == "?" and trees.host_of(-1) == "?"
    # a platform's node: its own tree alone, at the node's root, with the same answers
    alone = host_trees_for(JobSpec.from_request(request), tmp_path / "node", node=1)
    assert (alone.first_index, len(alone), alone[0].name) == (1, 1, "algo-2")
    assert alone[0].root == tmp_path / "node" and alone[0].config_dir == tmp_path / "node/input/config"
    assert [alone.host_of(r) for r in range(4)] == ["?", "?", "algo-2", "algo-2"]
    assert [(s.rank, s.local_rank, s.cross_rank) for s in alone.slots] == [(2, 0, 1), (3, 1, 1)]
    assert alone.slots == trees.slots[2:] and not (tmp_path / "node" / "algo-1").exists()
    resource = json.loads((alone[0].config_dir / "resourceconfig.json").read_text())
    assert resource["hosts"] == ["algo-1", "algo-2"]  # every host of the job, named
    assert not list((tmp_path / "node").rglob(".*partial"))  # each file written whole, then renamed


def test_local_modes_job_description_holds_each_ranks_host_and_variables(s3, bucket, tmp_path):
    """Written once for every launcher: the rank entry and the torchrun host launcher look values up."""
    request = prepare_demo_job(bucket, 2, 2, printer=None).request
    trees = host_trees_for(JobSpec.from_request(request), tmp_path)
    write_job_file(tmp_path / "job.json", trees, entry_point="train.py")
    job = json.loads((tmp_path / "job.json").read_text())
    assert [(h["name"], h["first_rank"], h["ranks"]) for h in job["hosts"]] == [
        ("algo-1", 0, 2),
        ("algo-2", 2, 2),
    ]
    assert job["hosts"][1]["env"]["SM_CURRENT_HOST"] == "algo-2" and job["entry_point"] == "train.py"
    assert [r["host"] for r in job["ranks"]] == [0, 0, 1, 1]
    assert (
        job["ranks"][3]["env"]["HOROVOD_LOCAL_RANK"] == "1"
        and job["ranks"][3]["env"]["HOROVOD_CROSS_RANK"] == "1"
    )
    assert job["ranks"][3]["mpi_env"] == {
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    assert not (tmp_path / "job.json.part").exists()


def test_local_modes_own_names_stay_in_local():
    """The rank entry's job-file variable is local mode's: defined once, in local/, not in host/."""
    defined = [
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if '"SAGEMAKER_DIST_LOCAL_JOB"' in p.read_text()
    ]
    assert defined == ["local/rank_entry.py"]


def test_host_speaks_of_hosts_not_of_an_emulator():
    """Its feeding runs for real on Slurm and Kubernetes nodes: 'simulated' only where local mode is named."""
    for path in sorted((PACKAGE / "host").glob("*.py")):
        text = re.sub(r"\s+", " ", path.read_text())
        assert "emulat" not in text.lower(), path.name
        for match in re.finditer(r"simulated", text, re.IGNORECASE):
            assert text[max(0, match.start() - 13) : match.start()].lower() == "local mode's ", path.name


def test_both_users_run_one_host_lifecycle():
    """The code, the trees, checkpoints, feeds and the model's upload are ``host.lifecycle``'s, for
    local mode and the pipe agent alike: neither lays out or builds them itself."""
    own = ("CheckpointSync(", "ChannelFeeder(", "FileFeed(", "pack_and_upload(", "open_feeds(")
    lays_out = ("host_trees_for(", "build_host_trees(", "fetch_source_dir(")
    for user in ("local/job.py", "platforms/pipe_agent.py"):
        source = (PACKAGE / user).read_text()
        assert "HostLifecycle(" in source, user
        for name in own + lays_out:
            assert name not in source, (user, name)
    assert all(name in (PACKAGE / "host/lifecycle.py").read_text() for name in lays_out[::2])


def _code_dir(tmp_path: Path) -> Path:
    code = tmp_path / "src"
    code.mkdir()
    (code / "train.py").write_text("")  # small_request's entry script
    return code


def _lifecycle_job(bucket: str, hosts: int) -> JobSpec:
    request = small_request({})
    request["ResourceConfig"]["InstanceCount"] = hosts
    request["InputDataConfig"][0]["DataSource"]["S3DataSource"]["S3Uri"] = f"s3://{bucket}/train/"
    request["OutputDataConfig"]["S3OutputPath"] = f"s3://{bucket}/out/"
    request["CheckpointConfig"] = {"S3Uri": f"s3://{bucket}/ckpt"}
    return JobSpec.from_request(request)


def test_the_lifecycle_restores_feeds_syncs_and_uploads_from_the_first_host(s3, bucket, tmp_path):
    for key in ("train/a", "train/b", "ckpt/step-1/meta.json"):
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    client = s3_client()
    job = _lifecycle_job(bucket, 2)
    code = _code_dir(tmp_path)
    lines = []
    with HostLifecycle(job, tmp_path, client, lines.append, source_dir=code) as host:  # every host
        trees = host.trees
        assert host.code_dir == code
        assert [t.root for t in trees] == [tmp_path / "hosts" / name for name in ("algo-1", "algo-2")]
        assert all((t.checkpoint_path(None) / "step-1" / "meta.json").read_bytes() == b"ckpt/step-1/meta.json"
                   for t in trees)  # fmt: skip
        assert sorted(p.name for p in (trees[0].data_dir / "train").iterdir()) == ["a", "b"]  # File mode
        host.start()
        (trees[0].checkpoint_path(None) / "step-2").mkdir()
        (trees[0].checkpoint_path(None) / "step-2" / "meta.json").write_text("2")
        (trees[0].model_dir / "weights").write_text("w")
        host.finish()
        model = host.upload_outputs()
    assert model == f"s3://{bucket}/out/{job.name}/output/model.tar.gz"
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert "ckpt/step-2/meta.json" in keys and f"out/{job.name}/output/model.tar.gz" in keys
    assert lines[0] == f"restored 1 checkpoint file(s) from s3://{bucket}/ckpt"

    node = tmp_path / "node"  # the pipe agent of the second node, its ranks bringing their code
    with HostLifecycle(job, node, client, lines.append, node=1, label="pipe agent: ") as host:
        assert host.code_dir is None and host.trees[0].root == node and host.trees.first_index == 1
        (host.trees[0].model_dir / "weights").write_text("w")
        assert host.upload_outputs() is None  # only the job's first host uploads
    assert f"pipe agent: restored 2 checkpoint file(s) from s3://{bucket}/ckpt" in lines
    assert lines[-1].startswith("algo-2: downloaded channel train")  # its own host's share of the channel


def test_an_upload_that_fails_names_the_host_and_the_target(s3, bucket, tmp_path):
    job = _lifecycle_job(bucket, 1)
    s3.put_object(Bucket=bucket, Key="train/a", Body=b"a")
    with HostLifecycle(job, tmp_path, s3_client(), lambda line: None, source_dir=_code_dir(tmp_path)) as host:
        (host.trees[0].model_dir / "weights").write_text("w")
        host.client = _FailingUploads()
        with pytest.raises(OutputUploadError, match=f"algo-1: cannot upload .*model to s3://{bucket}/out/"):
            host.upload_outputs()


class _FailingUploads:
    def upload_file(self, *args, **kwargs):
        raise OSError("connection reset")


def test_the_tensorboard_location_is_read_once_from_the_request():
    """TensorBoardOutputConfig's S3 path, else the scripts' ``tensorboard_s3_uri`` hyperparameter: the
    local job's summary names it from the spec."""
    request = small_request({"tensorboard_s3_uri": "s3://b/tb/hp"})
    assert JobSpec.from_request(request).tensorboard_location == "s3://b/tb/hp"
    request["TensorBoardOutputConfig"] = {"S3OutputPath": "s3://b/tb/config"}
    assert JobSpec.from_request(request).tensorboard_location == "s3://b/tb/config"
    assert JobSpec.from_request(small_request({})).tensorboard_location is None
