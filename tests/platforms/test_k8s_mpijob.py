"""``sagemaker-dist k8s``: the MPIJob checked against mpi-operator's v2beta1 API (the CRD's schema in
``fixtures/``, the enums of ``types.go`` and the controller's validation rules, written here), bad
input refused before anything is written, and the manifest's own commands run on this machine.

Sources (kubeflow/mpi-operator v0.8.0, commit 101db144e019e1de65aaded07745e9d805c2852a):
``manifests/base/kubeflow.org_mpijobs.yaml`` (the schema, descriptions removed),
``pkg/apis/kubeflow/v2beta1/types.go`` (enums) and ``pkg/apis/kubeflow/validation/validation.go``.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from helpers.k8s_schemas import strict_schema
from helpers.small_request import small_request, small_request_file

from sagemaker_dist.contract.distributions import MPIJOB, TRAINJOB
from sagemaker_dist.contract.layout import plan_layout
from sagemaker_dist.host.job_spec import JobSpec
from sagemaker_dist.platforms.k8s_mpijob import MPIJobError, check_name, mpirun_options
from sagemaker_dist.platforms.node_plan import NodePlanError, check_kubernetes_job, ranks_per_node

CLI = [sys.executable, "-m", "sagemaker_dist.cli", "k8s"]
FIXTURE = Path(__file__).parent / "fixtures" / "mpijob_v2beta1_openapi.json"
# types.go: the enums the CRD leaves as plain strings
CLEAN_POD_POLICIES = {"None", "Running", "All"}
LAUNCHER_CREATION_POLICIES = {"AtStartup", "WaitForWorkersReady"}
MPI_IMPLEMENTATIONS = {"OpenMPI", "Intel", "MPICH"}
RESTART_POLICIES = {"Never", "OnFailure"}  # validation.go: validRestartPolicies
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


SCHEMA = strict_schema(json.loads(FIXTURE.read_text())["openAPIV3Schema"])


def schema_problems(job: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMA)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(job)]


def controller_problems(job: dict) -> list[str]:
    """validation.go's ValidateMPIJob (after defaulting), and types.go's enums."""
    spec, problems = job["spec"], []
    replicas = spec.get("mpiReplicaSpecs") or {}
    workers = (replicas.get("Worker") or {}).get("replicas") or 1
    last = f"{job['metadata']['name']}-worker-{workers - 1}"
    if len(last) > 63 or not DNS_1035.match(last):
        problems.append(f"metadata.name: {last!r} is not a DNS-1035 label")
    if spec.get("slotsPerWorker", 1) < 0:
        problems.append("slotsPerWorker < 0")
    policy = spec.get("runPolicy", {})
    if policy.get("cleanPodPolicy", "None") not in CLEAN_POD_POLICIES:
        problems.append("runPolicy.cleanPodPolicy")
    for key in ("ttlSecondsAfterFinished", "activeDeadlineSeconds", "backoffLimit"):
        if policy.get(key, 0) < 0:
            problems.append(f"runPolicy.{key} < 0")
    if spec.get("launcherCreationPolicy", "AtStartup") not in LAUNCHER_CREATION_POLICIES:
        problems.append("launcherCreationPolicy")
    if spec.get("mpiImplementation", "OpenMPI") not in MPI_IMPLEMENTATIONS:
        problems.append("mpiImplementation")
    if not spec.get("sshAuthMountPath", "/root/.ssh"):
        problems.append("sshAuthMountPath is empty")
    if "Launcher" not in replicas:
        problems.append("no Launcher")
    for kind, replica in replicas.items():
        if kind not in ("Launcher", "Worker"):
            problems.append(f"replica type {kind!r}")
            continue
        count = replica.get("replicas", 1 if kind == "Launcher" else 0)
        if kind == "Launcher" and count != 1:
            problems.append(f"Launcher replicas {count} (must be 1)")
        if kind == "Worker" and count < 1:
            problems.append(f"Worker replicas {count} (must be >= 1)")
        default = "OnFailure" if kind == "Launcher" else "Never"
        if replica.get("restartPolicy", default) not in RESTART_POLICIES:
            problems.append(f"{kind} restartPolicy {replica.get('restartPolicy')!r}")
        if not replica.get("template", {}).get("spec", {}).get("containers"):
            problems.append(f"{kind} has no container")
    return problems


def _k8s(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=120, **kw)


@pytest.fixture
def demo_mpijob(aws_env, bucket, tmp_path):
    """The acceptance command's MPIJob (2 x ml.p4d.24xlarge), printed to stdout."""
    proc = _k8s(
        "--demo", "--instance-type", "ml.p4d.24xlarge", "--instance-count", 2,
        "--bucket", bucket, "--endpoint-url", aws_env["AWS_ENDPOINT_URL"],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "&id" not in proc.stdout  # no YAML anchors: the manifest reads as written
    return yaml.safe_load(proc.stdout)


def test_demo_mpijob_is_valid_v2beta1_with_8_slots_on_2_workers(demo_mpijob, s3, bucket):
    job = demo_mpijob
    assert schema_problems(job) == [] and controller_problems(job) == []
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    spec = job["spec"]
    assert spec["slotsPerWorker"] == 8 and spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert spec["runPolicy"] == {
        "cleanPodPolicy": "Running", "backoffLimit": 0, "ttlSecondsAfterFinished": 3600,
        "activeDeadlineSeconds": 86400,
    }  # fmt: skip
    launcher, workers = spec["mpiReplicaSpecs"]["Launcher"], spec["mpiReplicaSpecs"]["Worker"]
    assert launcher["replicas"] == 1 and workers["replicas"] == 2
    (command,) = [c["command"] for c in launcher["template"]["spec"]["containers"]]
    # a stop (the MPIJob or a pod deleted): SIGTERM reaches the ranks, not mpirun or sshd, which would
    # end them at once; every pod gets SageMaker's 120 s to stop
    forward = ["python", "-m", "sagemaker_dist.host.stop_forwarding"]
    assert command[:7] == [*forward, "mpirun", "--allow-run-as-root", "-np", "16"]
    assert launcher["template"]["spec"]["terminationGracePeriodSeconds"] == 120
    i = command.index("mpi4py") - 2  # the ranks: python -m mpi4py SCRIPT
    assert command[i : i + 4] == ["python", "-m", "mpi4py", "train_cifar10.py"]
    assert command[i + 4 : i + 8] == ["--batch_size", "32", "--epochs", "2"]  # as the toolkit passes them
    assert ["-x", "NCCL_DEBUG=WARN"] == command[
        command.index("NCCL_DEBUG=WARN") - 1 : command.index("NCCL_DEBUG=WARN") + 1
    ]
    pod = workers["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    assert containers["worker"]["resources"]["limits"] == {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 4}
    agent = containers["pipe-agent"]
    assert agent["command"][:4] == ["python", "-m", "sagemaker_dist.cli", "pipe-agent"]
    assert agent["command"][-2:] == ["--drain", "110"]  # feeds and syncs until the ranks have stopped
    assert containers["worker"]["command"] == [*forward, "--term-after-ranks", "/usr/sbin/sshd", "-De"]
    assert pod["terminationGracePeriodSeconds"] == 120 and pod["shareProcessNamespace"] is True
    assert {"name": "opt-ml", "emptyDir": {}} in pod["volumes"]
    assert all({"name": "opt-ml", "mountPath": "/opt/ml"} in c["volumeMounts"] for c in containers.values())
    assert pod["serviceAccountName"] == "sagemaker-dist"
    # the agents' job spec is in S3: the request the estimator rendered, for the p4d workers
    spec_uri = agent["command"][agent["command"].index("--spec") + 1]
    key = spec_uri.removeprefix(f"s3://{bucket}/")
    request = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    assert request["ResourceConfig"] == {
        "InstanceType": "ml.p4d.24xlarge",
        "InstanceCount": 2,
        "VolumeSizeInGB": 30,
    }
    assert request["HyperParameters"]["sagemaker_mpi_num_of_processes_per_host"] == "8"


def test_the_checks_catch_what_the_api_server_and_controller_refuse(demo_mpijob):
    def broken(change) -> dict:
        job = copy.deepcopy(demo_mpijob)
        change(job)
        return job

    replicas = lambda j: j["spec"]["mpiReplicaSpecs"]  # noqa: E731
    cases = {
        "two launchers": lambda j: replicas(j)["Launcher"].update(replicas=2),
        "no worker": lambda j: replicas(j)["Worker"].update(replicas=0),
        "Always": lambda j: replicas(j)["Worker"].update(restartPolicy="Always"),
        "long name": lambda j: j["metadata"].update(name="a" * 60),
        "upper case": lambda j: j["metadata"].update(name="Demo"),
        "bad policy": lambda j: j["spec"].update(launcherCreationPolicy="WhenReady"),
        "no launcher": lambda j: replicas(j).pop("Launcher"),
    }
    for what, change in cases.items():
        assert controller_problems(broken(change)), what
    typo = broken(lambda j: j["spec"].update(slotPerWorker=8))
    assert any("slotPerWorker" in p for p in schema_problems(typo))
    wrong_type = broken(lambda j: j["spec"].update(slotsPerWorker="8"))
    assert any("slotsPerWorker" in p for p in schema_problems(wrong_type))
    enum = broken(lambda j: j["spec"].update(mpiImplementation="MVAPICH"))
    assert any("mpiImplementation" in p for p in schema_problems(enum))


def test_bad_input_is_refused_before_anything_is_written(tmp_path):
    nowhere = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "PATH": "/usr/bin:/bin"}  # S3 would fail
    nowhere["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # the embedded endpoint's state: this test's own
    cpu = _k8s(
        "--demo", "--instance-type", "ml.c5.18xlarge", "--endpoint-url", "http://127.0.0.1:9", env=nowhere
    )
    assert cpu.returncode == 2 and "'ml.c5.18xlarge' has no GPUs" in cpu.stderr, cpu.stderr
    assert "--processes-per-host" in cpu.stderr
    many = _k8s("--demo", "--processes-per-host", 9, "--endpoint-url", "http://127.0.0.1:9", env=nowhere)
    assert many.returncode == 2 and "9 ranks per node but ml.p4d.24xlarge has 8 GPU(s)" in many.stderr
    broken = small_request_file(tmp_path, {"note": "it's"})  # the toolkit's /bin/sh breaks on the quote
    quote = _k8s("--request", broken, "--processes-per-host", 1, env=nowhere)
    assert quote.returncode == 2 and quote.stderr.startswith("error: hyperparameter 'note' = "), quote.stderr
    cut = _k8s(
        "--request",
        small_request_file(tmp_path, {"note": "a #b", "zeta": 1}),
        "--processes-per-host",
        1,
        env=nowhere,
    )
    assert cut.stderr.startswith(
        "warning: hyperparameter 'note' = '\"a #b\"' reaches the script as '--note' 'a'"
    )
    assert "warning: the script receives no --zeta: the sagemaker-training toolkit 4.8.3 joins" in cut.stderr
    offline = _k8s("--request", small_request_file(tmp_path, {}), "--processes-per-host", 1, env=nowhere)
    assert (
        offline.returncode == 2 and "upload the job spec to s3://b/out/small/" in offline.stderr
    )  # no bucket
    with pytest.raises(MPIJobError, match="DNS-1035"):
        check_name("x" * 60, 2)
    assert ranks_per_node("ml.g5.12xlarge", None) == (4, 4)
    torch_job = JobSpec.from_request(small_request({"sagemaker_dist_layout": _torchrun_layout()}))
    for kind, does in ((MPIJOB, "starts Horovod ranks with mpirun"), (TRAINJOB, None)):
        if does is None:
            check_kubernetes_job(torch_job, kind)  # a TrainJob runs torchrun's jobs
            continue
        with pytest.raises(NodePlanError, match=f"'torchrun' job .* a {kind} {does}: plan the job with"):
            check_kubernetes_job(torch_job, kind)
    assert ranks_per_node("ml.c5.xlarge", 2) == (2, 0)  # a CPU job says so
    assert mpirun_options("-x A=1 --NCCL_DEBUG INFO -mca btl ^openib") == [
        "-x", "A=1", "-x", "NCCL_DEBUG=INFO", "-mca", "btl", "^openib"
    ]  # fmt: skip


def _torchrun_layout() -> dict:
    """The layout of small_request's job (2 hosts x 1 process) under torchrun."""
    return json.loads(plan_layout(2, 1, distribution="torchrun").to_json())
