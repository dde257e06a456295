"""``sagemaker-dist tune --k8s``: the Katib Experiment checked offline against Katib's own API definitions
and its admission webhook's rules, its trial template against mpi-operator's MPIJob schema, and the
setup Katib needs for v2beta1 MPIJobs.

Sources (kubeflow/katib v0.19.0, commit 578e60f1ce83dbb5e7151026a3bdc4de233947fc):
``fixtures/katib_v1beta1_swagger.json`` is ``pkg/apis/v1beta1/swagger.json`` as is (the Experiment's
definitions; the Kubernetes ones it refers to are stood in for below), ``fixtures/katib_config_v0.19.0.yaml``
is ``manifests/v1beta1/installs/katib-standalone/katib-config.yaml``. The webhook's rules
(``pkg/webhook/v1beta1/experiment/validator/validator.go``) are ``platforms.katib_rules.experiment_problems``.
The CRD's own YAML preserves unknown fields and checks nothing, so it is not used.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from helpers.k8s_schemas import strict_schema

from sagemaker_dist.aws.tuning import TuningSpec
from sagemaker_dist.contract.metric_line import metric_line
from sagemaker_dist.platforms.k8s_pods import FORWARD_STOPS
from sagemaker_dist.platforms.katib import (
    DEFAULT_KATIB_CONFIG,
    MPIJOB_V2_RESOURCE,
    KatibError,
    check_experiment_spec,
    katib_config,
    katib_setup_documents,
)
from sagemaker_dist.platforms.katib_rules import experiment_problems

FIXTURES = Path(__file__).parent / "fixtures"
CLI = [sys.executable, "-m", "sagemaker_dist.cli", "tune", "--k8s"]
SWAGGER = json.loads((FIXTURES / "katib_v1beta1_swagger.json").read_text())
KATIB_CONFIG = yaml.safe_load((FIXTURES / "katib_config_v0.19.0.yaml").read_text())
# Katib's DefaultFilter for StdOut metrics (pkg/metricscollector/v1beta1/common/const.go); RE2 and
# Python read it alike
KATIB_DEFAULT_FILTER = r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)"
# The Kubernetes definitions swagger.json refers to but does not hold
K8S_STAND_INS = {
    "v1.ObjectMeta": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    },
    "v1.unstructured.Unstructured": {"type": "object"},  # the trial spec: checked against the MPIJob's schema
    "v1.Container": {"type": "object"},
    "v1.HTTPGetAction": {"type": "object"},
    "v1.Time": {"type": "string"},
    "v1.ListMeta": {"type": "object"},
}


EXPERIMENT_SCHEMA = strict_schema(
    {"$ref": "#/definitions/v1beta1.Experiment", "definitions": {**SWAGGER["definitions"], **K8S_STAND_INS}}
)
MPIJOB_SCHEMA = strict_schema(
    json.loads((FIXTURES / "mpijob_v2beta1_openapi.json").read_text())["openAPIV3Schema"]
)


def swagger_problems(document: dict) -> list[str]:
    validator = jsonschema.Draft4Validator(EXPERIMENT_SCHEMA)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def substituted(experiment: dict, values: dict[str, str]) -> dict:
    """The trial's MPIJob as Katib creates it: each ${trialParameters.NAME} replaced, then named."""
    text = json.dumps(experiment["spec"]["trialTemplate"]["trialSpec"])
    for name, value in values.items():
        text = text.replace("${trialParameters." + name + "}", value)
    job = json.loads(text)
    job["metadata"]["name"] = experiment["metadata"]["name"] + "-abcd1234"
    job["metadata"]["namespace"] = experiment["metadata"]["namespace"]
    return job


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """``tune --k8s --demo`` run once: the Experiment, the setup documents and the spec it uploaded."""
    tmp = tmp_path_factory.mktemp("katib")
    proc = subprocess.run(
        [*CLI, "--demo", "--s3-state-dir", str(tmp / "s3"), "--instance-type", "ml.p4d.24xlarge",
         "--instance-count", "2", "--image", "123456789012.dkr.ecr.us-east-1.amazonaws.com/sagemaker-dist:1",
         "--namespace", "training", "-o", str(tmp / "experiment.yaml"), "--katib-setup",
         str(tmp / "setup.yaml"), "--objective-metric", "val_accuracy", "--range",
         "learning_rate=1e-4:1e-2:log", "--range", "batch_size=16,32,64", "--range", "epochs=2:6",
         "--max-jobs", "6", "--max-parallel-jobs", "2", "--early-stopping", "Auto"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {
        "experiment": yaml.safe_load((tmp / "experiment.yaml").read_text()),
        "setup": list(yaml.safe_load_all((tmp / "setup.yaml").read_text())),
        "stderr": proc.stderr,
    }


def test_the_experiment_passes_katibs_api_definitions_and_webhook_rules(generated):
    experiment = generated["experiment"]
    assert experiment["apiVersion"] == "kubeflow.org/v1beta1" and experiment["kind"] == "Experiment"
    assert swagger_problems(experiment) == []
    setup_config = yaml.safe_load(generated["setup"][2]["data"]["katib-config.yaml"])
    assert experiment_problems(experiment, setup_config) == []
    spec = experiment["spec"]
    assert spec["algorithm"] == {"algorithmName": "tpe"}
    assert spec["earlyStopping"] == {"algorithmName": "medianstop"}
    assert spec["parallelTrialCount"] == 2 and spec["maxTrialCount"] == 6
    assert (
        spec["objective"]["type"] == "maximize" and spec["objective"]["objectiveMetricName"] == "val_accuracy"
    )
    assert {"name": "val_accuracy", "value": "latest"} in spec["objective"]["metricStrategies"]
    assert spec["parameters"] == [
        {"name": "learning_rate", "parameterType": "double",
         "feasibleSpace": {"min": "0.0001", "max": "0.01", "distribution": "logUniform"}},
        {"name": "batch_size", "parameterType": "categorical", "feasibleSpace": {"list": ["16", "32", "64"]}},
        {"name": "epochs", "parameterType": "int", "feasibleSpace": {"min": "2", "max": "6"}},
    ]  # fmt: skip
    template = spec["trialTemplate"]
    assert template["primaryPodLabels"] == {"training.kubeflow.org/job-role": "launcher"}
    assert template["primaryContainerName"] == "launcher"
    assert template["successCondition"] == 'status.conditions.#(type=="Succeeded")#|#(status=="True")#'
    assert template["failureCondition"] == 'status.conditions.#(type=="Failed")#|#(status=="True")#'
    assert spec["metricsCollectorSpec"] == {"collector": {"kind": "StdOut"}}


def test_katib_v019s_own_config_would_never_see_a_v2beta1_trial_end(generated):
    problems = experiment_problems(generated["experiment"], KATIB_CONFIG)
    assert (
        len(problems) == 1
        and "MPIJob.v2beta1.kubeflow.org is not among katib-config's trialResources" in problems[0]
    )


def test_the_trial_is_our_mpijob_with_the_tuned_values_substituted(generated):
    experiment = generated["experiment"]
    job = substituted(experiment, {"learning_rate": "0.00316", "batch_size": "32", "epochs": "4"})
    validator = jsonschema.Draft7Validator(MPIJOB_SCHEMA)
    assert [e.message for e in validator.iter_errors(job)] == []
    assert job["apiVersion"] == "kubeflow.org/v2beta1" and job["kind"] == "MPIJob"
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["name"] == "launcher" and launcher["command"][:2] == ["sh", "-c"]
    argv = shlex.split(launcher["command"][2])
    # mpirun under the stop forwarder (a pod deletion's SIGTERM reaches every rank), then the job's args
    assert argv[: len(FORWARD_STOPS) + 1] == [*FORWARD_STOPS, "mpirun"], argv
    assert argv[argv.index("-np") + 1] == "16"
    script = argv[argv.index("mpi4py") + 1 :]
    pairs = dict(zip(script[1::2], script[2::2]))
    assert (
        pairs["--learning_rate"] == "0.00316" and pairs["--batch_size"] == "32" and pairs["--epochs"] == "4"
    )
    assert pairs["--_tuning_objective_metric"] == "val_accuracy"  # as SageMaker adds it
    # the pipe agents read the job spec; the workers are the MPIJob's, unchanged
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 2 and job["spec"]["slotsPerWorker"] == 8
    # the launcher's output carries the chief's metric line, which Katib's default StdOut filter reads
    line = metric_line(3, {"loss": 1.25, "val_accuracy": 0.4375})
    found = {m.group(1): m.group(2) for m in re.finditer(KATIB_DEFAULT_FILTER, line)}
    assert found["val_accuracy"] == "0.4375" and found["loss"] == "1.25"
    # Katib joins the command with spaces and runs it under sh -c, with its redirection added
    wrapped = " ".join(launcher["command"][2:]) + " 1>/var/log/katib/metrics.log 2>&1"
    assert shlex.split(wrapped)[: len(argv)] == argv


def test_the_setup_adds_mpijob_v2beta1_to_katibs_own_config(generated):
    role, binding, config_map = generated["setup"]
    assert role["kind"] == "ClusterRole" and {"kubeflow.org"} == {
        g for r in role["rules"] for g in r["apiGroups"]
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "katib-controller", "namespace": "kubeflow"}
    ]
    assert config_map["metadata"] == {"name": "katib-config", "namespace": "kubeflow"}
    written = yaml.safe_load(config_map["data"]["katib-config.yaml"])
    expected = copy.deepcopy(KATIB_CONFIG)
    expected["init"]["controller"]["trialResources"].append(MPIJOB_V2_RESOURCE)
    assert written == expected
    assert DEFAULT_KATIB_CONFIG == KATIB_CONFIG  # the module's copy is Katib v0.19's
    assert katib_setup_documents()[2]["data"]["katib-config.yaml"] == config_map["data"]["katib-config.yaml"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda e: e["metadata"].update(name="x" * 41), "metadata.name"),
        (lambda e: e["spec"].update(parallelTrialCount=7), "parallelTrialCount should be less than or equal"),
        (lambda e: e["spec"].update(maxFailedTrialCount=-1), "should not be less than 0"),
        (
            lambda e: e["spec"]["objective"]["additionalMetricNames"].append("val_accuracy"),
            "should not contain",
        ),
        (lambda e: e["spec"]["algorithm"].update(algorithmName="anneal"), "has no suggestion"),
        (lambda e: e["spec"]["trialTemplate"]["trialParameters"].pop(), "not found in spec.trialParameters"),
        (lambda e: e["spec"]["trialTemplate"]["trialSpec"]["metadata"].update(name="x"), "must be omitted"),
        (lambda e: e["spec"]["trialTemplate"].update(primaryContainerName="trainer"), "primary container"),
        (lambda e: e["spec"]["parameters"][0]["feasibleSpace"].update(list=["1"]), "list is not supported"),
        (
            lambda e: e["spec"]["parameters"][1]["feasibleSpace"].update(min="1"),
            "not supported for categorical",
        ),
    ],
)
def test_the_webhook_rules_catch_what_katib_would_refuse(generated, change, message):
    experiment = copy.deepcopy(generated["experiment"])
    change(experiment)
    problems = experiment_problems(experiment, katib_config())
    assert any(message in p for p in problems), problems


def test_what_katib_cannot_do_is_refused_before_anything_is_written():
    def spec(**kw):
        args = {"objective_metric": "val_accuracy", "ranges": {"lr": "1e-4:1e-2:log"}, "max_jobs": 3}
        return TuningSpec.build(**{**args, **kw})

    with pytest.raises(KatibError, match="Hyperband strategy has no Katib equivalent"):
        check_experiment_spec(spec(strategy="Hyperband"), "exp")
    with pytest.raises(KatibError, match="reverse-logarithmic"):
        check_experiment_spec(spec(ranges={"m": "0.5:0.99:reverse-log"}), "exp")
    with pytest.raises(KatibError, match="at most 40 characters"):
        check_experiment_spec(spec(), "e" * 41)
    check_experiment_spec(spec(strategy="Grid", ranges={"b": "16,32"}, max_jobs=None), "exp")


def test_a_torchrun_jobs_trials_are_trainjobs_that_katibs_own_config_runs(tmp_path):
    """``tune --k8s --distribution torchrun``: the trials are TrainJobs (Katib v0.19 lists
    TrainJob.v1alpha1 as installed), each on the one TrainingRuntime written before the Experiment;
    the substituted trial passes the Trainer's API and webhooks, and its first node's container is
    the primary one (Katib's defaults for a TrainJob)."""
    from helpers.trainer_api import schema_problems, trainer_problems

    out = tmp_path / "experiment.yaml"
    proc = subprocess.run(
        [*CLI, "--demo", "--distribution", "torchrun", "--s3-state-dir", str(tmp_path / "s3"),
         "--instance-type", "ml.g5.12xlarge", "--instance-count", "2", "--namespace", "training",
         "-o", str(out), "--objective-metric", "val_accuracy", "--range", "learning_rate=1e-4:1e-2:log",
         "--max-jobs", "4", "--max-parallel-jobs", "2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TrainJob.v1alpha1.trainer.kubeflow.org" in proc.stderr
    runtime, experiment = yaml.safe_load_all(out.read_text())
    assert runtime["kind"] == "TrainingRuntime" and experiment["kind"] == "Experiment"
    assert swagger_problems(experiment) == []
    assert experiment_problems(experiment, KATIB_CONFIG) == []  # Katib's own config, unchanged
    template = experiment["spec"]["trialTemplate"]
    assert template["primaryContainerName"] == "node"
    assert template["primaryPodLabels"] == {
        "jobset.sigs.k8s.io/replicatedjob-name": "node", "batch.kubernetes.io/job-completion-index": "0",
    }  # fmt: skip
    assert template["successCondition"] == 'status.conditions.#(type=="Complete")#|#(status=="True")#'
    job = substituted(experiment, {"learning_rate": "0.00316"})
    assert schema_problems(job) == [] and schema_problems(runtime) == []
    assert trainer_problems([runtime, job]) == []
    assert job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 4)
    argv = shlex.split(trainer["command"][2])
    assert argv[: len(FORWARD_STOPS) + 2] == [*FORWARD_STOPS, "torchrun", "train_torch.py"], argv
    pairs = dict(zip(argv[len(FORWARD_STOPS) + 2 :: 2], argv[len(FORWARD_STOPS) + 3 :: 2]))
    assert pairs["--learning_rate"] == "0.00316" and pairs["--_tuning_objective_metric"] == "val_accuracy"
    broken = copy.deepcopy(experiment)
    broken["spec"]["trialTemplate"]["primaryPodLabels"] = {"training.kubeflow.org/job-role": "launcher"}
    assert any("TrainJob trial's primary container" in p for p in experiment_problems(broken, KATIB_CONFIG))
