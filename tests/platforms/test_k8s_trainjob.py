"""``sagemaker-dist k8s`` for torchrun jobs: the TrainJob and its TrainingRuntime checked against Kubeflow
Trainer v2.3's API (``helpers/trainer_api.py``), bad input refused before anything is written, and the
manifests' own commands run on this machine (``helpers/k8s_simulation.py``)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import yaml
from helpers.trainer_api import (
    CEL_CHECKED,
    CEL_UNUSED,
    CEL_UPDATES_ONLY,
    CRDS,
    cel_rules,
    schema_problems,
    trainer_problems,
)

from sagemaker_dist.platforms.k8s_trainjob import TrainJobError, check_name

CLI = [sys.executable, "-m", "sagemaker_dist.cli", "k8s"]


def _k8s(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=120, **kw)


def _demo_documents(aws_env, bucket, *args) -> list[dict]:
    proc = _k8s(
        "--demo", "--distribution", "torchrun", "--bucket", bucket,
        "--endpoint-url", aws_env["AWS_ENDPOINT_URL"], *args,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "&id" not in proc.stdout  # no YAML anchors: the manifest reads as written
    return list(yaml.safe_load_all(proc.stdout))


@pytest.fixture
def demo_trainjob(aws_env, bucket):
    """The demo as a torchrun job on 2 x ml.p4d.24xlarge."""
    return _demo_documents(aws_env, bucket, "--instance-type", "ml.p4d.24xlarge", "--instance-count", 2)


def test_every_cel_rule_of_the_crds_is_checked_here_or_applies_to_updates_or_unused_parts():
    rules = cel_rules(CRDS["TrainJob"]) | cel_rules(CRDS["TrainingRuntime"])
    assert rules == CEL_CHECKED | CEL_UPDATES_ONLY | CEL_UNUSED


def test_demo_trainjob_is_valid_v2_3_with_8_ranks_on_each_of_2_nodes(demo_trainjob, s3, bucket):
    runtime, job = demo_trainjob
    assert [d["kind"] for d in demo_trainjob] == ["TrainingRuntime", "TrainJob"]  # the runtime first
    for document in demo_trainjob:
        assert document["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
        assert schema_problems(document) == [], document["kind"]
    assert trainer_problems(demo_trainjob) == []
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 8)
    assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 4}}
    assert {"name": "FI_PROVIDER", "value": "efa"} in trainer["env"]
    # torchrun takes --nnodes, --nproc_per_node, --node_rank and the master from the Torch plugin's
    # PET_* variables; SIGTERM goes to the ranks (they agree on a step and checkpoint it), not torchrun
    forward = ["python", "-m", "sagemaker_dist.host.stop_forwarding"]
    assert trainer["command"][:5] == [*forward, "torchrun", "train_torch.py"]
    assert trainer["command"][5:9] == ["--batch_size", "32", "--epochs", "2"]  # as the toolkit passes them
    assert job["spec"]["activeDeadlineSeconds"] == 86400
    assert job["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime", "name": runtime["metadata"]["name"],
    }  # fmt: skip
    template = runtime["spec"]["template"]["spec"]
    assert template["failurePolicy"] == {"maxRestarts": 0}  # a failed node ends the job
    (node_job,) = template["replicatedJobs"]
    assert node_job["template"]["spec"]["backoffLimit"] == 0
    pod = node_job["template"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 120 and pod["shareProcessNamespace"] is True
    (agent,) = pod["initContainers"]
    (node,) = pod["containers"]
    assert agent["restartPolicy"] == "Always"  # a native sidecar: the pod completes when the ranks end
    assert agent["startupProbe"]["exec"]["command"] == ["test", "-f", "/opt/ml/pipe_agent_ready"]
    assert agent["command"][-2:] == ["--drain", "110"]  # feeds and syncs until the ranks have stopped
    index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert agent["env"][0] == {"name": "NODE_INDEX", "valueFrom": {"fieldRef": {"fieldPath": index}}}
    assert node["workingDir"] == "/opt/ml/code"
    assert {"name": "opt-ml", "mountPath": "/opt/ml"} in node["volumeMounts"]
    assert {"name": "opt-ml", "mountPath": "/opt/ml"} in agent["volumeMounts"]
    spec_uri = agent["command"][agent["command"].index("--spec") + 1]
    request = json.loads(
        s3.get_object(Bucket=bucket, Key=spec_uri.removeprefix(f"s3://{bucket}/"))["Body"].read()
    )
    assert request["HyperParameters"]["sagemaker_torch_distributed_enabled"] == "true"
    assert request["HyperParameters"]["sagemaker_mpi_num_of_processes_per_host"] == "8"


def test_the_checks_catch_what_the_api_server_and_the_trainer_refuse(demo_trainjob):
    def broken(change) -> list[dict]:
        documents = copy.deepcopy(demo_trainjob)
        change(*documents)
        return documents

    pod = lambda r: r["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]  # noqa: E731
    cases = {
        "two replicas": lambda r, j: r["spec"]["template"]["spec"]["replicatedJobs"][0].update(replicas=2),
        "no node container": lambda r, j: pod(r)["containers"][0].update(name="trainer"),
        "reserved env": lambda r, j: j["spec"]["trainer"]["env"].append({"name": "PET_NNODES", "value": "1"}),
        "no runtime": lambda r, j: j["spec"]["runtimeRef"].update(name="elsewhere"),
        "long name": lambda r, j: j["metadata"].update(name="a" * 64),
        "upper case": lambda r, j: j["metadata"].update(name="Demo"),
        "sidecar not native": lambda r, j: pod(r)["initContainers"][0].pop("restartPolicy"),
        "Always": lambda r, j: pod(r).update(restartPolicy="Always"),
        "two policies": lambda r, j: r["spec"]["mlPolicy"].update(mpi={}),
    }
    for what, change in cases.items():
        assert trainer_problems(broken(change)), what
    typo = broken(lambda r, j: j["spec"]["trainer"].update(numProcsPerNode=8))
    assert any("numProcsPerNode" in p for p in schema_problems(typo[1]))
    wrong_type = broken(lambda r, j: j["spec"]["trainer"].update(numProcPerNode="auto"))  # a v2.1 string
    assert any("numProcPerNode" in p for p in schema_problems(wrong_type[1]))
    sidecar_typo = broken(lambda r, j: pod(r)["initContainers"][0].update(startupprobe={}))
    assert any("startupprobe" in p for p in schema_problems(sidecar_typo[0]))


def test_bad_input_is_refused_before_anything_is_written(tmp_path):
    nowhere = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "PATH": "/usr/bin:/bin"}  # S3 would fail
    nowhere["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # the embedded endpoint's state: this test's own
    mwms = _k8s("--demo", "--distribution", "tf-mwms", "--endpoint-url", "http://127.0.0.1:9", env=nowhere)
    assert mwms.returncode == 2 and "invalid choice: 'tf-mwms'" in mwms.stderr, mwms.stderr
    cpu = _k8s(
        "--demo", "--distribution", "torchrun", "--instance-type", "ml.c5.18xlarge",
        "--endpoint-url", "http://127.0.0.1:9", env=nowhere,
    )  # fmt: skip
    assert cpu.returncode == 2 and "--processes-per-host" in cpu.stderr, cpu.stderr
    with pytest.raises(TrainJobError, match="DNS-1035"):
        check_name("x" * 60, 2)  # its last pod, x...x-node-0-1, is over 63
    with pytest.raises(TrainJobError, match="DNS-1035"):
        check_name("Demo", 1)


@pytest.mark.slow
@pytest.mark.torch
def test_the_trainjob_trains_the_torch_demo_on_two_simulated_nodes(aws_env, s3, bucket, tmp_path):
    from helpers.k8s_simulation import simulate_trainjob

    from sagemaker_dist.local.launchers.toolkit import ToolkitLauncherError, check_toolkit_host

    try:
        python = check_toolkit_host()
    except ToolkitLauncherError as exc:
        pytest.fail(f"no container environment to simulate the pods with (scripts/setup.sh makes it): {exc}")
    documents = _demo_documents(
        aws_env, bucket, "--instance-type", "ml.c5.xlarge", "--processes-per-host", 2,
        "--instance-count", 2, "--epochs", 1,
    )  # fmt: skip
    assert trainer_problems(documents) == []
    runtime, job = documents
    work = tmp_path / "sim"
    work.mkdir()
    result = simulate_trainjob(runtime, job, work, python, base_env=dict(os.environ), timeout=300)
    logs = "\n".join(o[-3000:] for o in result.node_outputs + result.agent_outputs)
    assert result.returncodes == [0, 0], logs
    assert result.isolated  # torchrun's store listened in the pods' network namespace only
    # 4 ranks (2 nodes x 2) met at the first node's pod, each on its own node's FIFO
    for index in (0, 1):
        ranks, out, agent = (
            (2 * index, 2 * index + 1),
            result.node_outputs[index],
            result.agent_outputs[index],
        )
        assert f"node {index} (algo-{index + 1}) of 2" in agent, agent
        assert all(f"train_{rank}: 1 epoch(s)" in agent for rank in ranks), agent
        assert all(f"rank {rank}: trained" in out for rank in ranks), out[-3000:]
    assert "model saved to /opt/ml/model/model.pt" in result.node_outputs[0]
    # the sidecar on node 0 uploaded the model as SageMaker does when the pod ended
    model = f"jobs/{job['metadata']['name']}/output/model.tar.gz"
    assert s3.head_object(Bucket=bucket, Key=model)["ContentLength"] > 0
