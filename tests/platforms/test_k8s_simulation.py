"""The MPIJob's own commands train the demo on this machine: two worker "pods" (mount namespaces whose
/opt/ml is the pod's directory), their pipe-agent sidecars fed from a moto server over HTTP, and the
launcher's mpirun reaching them through mpi-operator's hostfile (real ranks, the image's Python)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from helpers.k8s_simulation import hostfile_text, simulate

from sagemaker_dist.local.launchers.toolkit import ToolkitLauncherError, check_toolkit_host

pytestmark = [pytest.mark.slow, pytest.mark.horovod, pytest.mark.tensorflow]


@pytest.fixture(scope="module")
def container_python():
    try:
        return check_toolkit_host()
    except ToolkitLauncherError as exc:
        pytest.fail(f"no container environment to simulate the pods with (scripts/setup.sh makes it): {exc}")


def test_the_mpijob_trains_the_demo_on_two_simulated_workers(container_python, aws_env, s3, bucket, tmp_path):
    manifest_file = tmp_path / "mpijob.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "sagemaker_dist.cli", "k8s", "--demo", "--instance-type", "ml.g5.xlarge",
         "--instance-count", "2", "--epochs", "2", "-o", str(manifest_file), "--bucket", bucket,
         "--endpoint-url", aws_env["AWS_ENDPOINT_URL"]],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    manifest = yaml.safe_load(manifest_file.read_text())
    name = manifest["metadata"]["name"]
    assert hostfile_text(manifest) == (
        f"{name}-worker-0.{name}.default.svc slots=1\n{name}-worker-1.{name}.default.svc slots=1\n"
    )
    work = tmp_path / "sim"
    work.mkdir()
    result = simulate(manifest, work, container_python, base_env=dict(os.environ), timeout=400, echo=print)
    out = result.launcher_output
    assert result.returncode == 0, out[-6000:] + "\n".join(o[-2000:] for o in result.agent_outputs)
    # both ranks trained in step, each on its own worker's FIFOs, and rank 0 saved the model in its pod
    assert out.count("train epoch ended for every rank after 8 step(s)") == 2, out[-4000:]
    assert (result.worker_roots[0] / "model" / "1" / "saved_model.pb").is_file()
    assert not (result.worker_roots[1] / "model" / "1").exists()
    for index, agent in enumerate(result.agent_outputs):
        assert f"node {index} (algo-{index + 1}) of 2" in agent
        assert f"train_{index}: 2 epoch(s)" in agent, agent
    # the sidecar on worker 0 synced rank 0's checkpoints to CheckpointConfig.S3Uri
    spec_uri = next(
        w
        for w in manifest["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][1]["command"]
        if w.startswith("s3://")
    )
    request = json.loads(s3.get_object(Bucket=bucket, Key=spec_uri.split("/", 3)[3])["Body"].read())
    checkpoints = request["CheckpointConfig"]["S3Uri"].split("/", 3)[3]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=checkpoints).get("Contents", [])]
    assert any(k.endswith("epoch-00002/meta.json") for k in keys), keys
    # and, when its pod was deleted, uploaded the model as SageMaker does
    model = f"jobs/{name}/output/model.tar.gz"
    assert s3.head_object(Bucket=bucket, Key=model)["ContentLength"] > 0
    assert f"uploaded s3://{bucket}/{model}" in result.agent_outputs[0]
