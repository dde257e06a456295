"""Hyperparameter tuning on Kubernetes: a Katib ``kubeflow.org/v1beta1`` Experiment (Katib v0.19)
whose trial template is the job's Kubernetes object, as plain data: the MPIJob of a Horovod job
(``kubeflow.org/v2beta1``, ``k8s_mpijob.py``), the TrainJob of a torchrun job
(``trainer.kubeflow.org/v1alpha1``, ``k8s_trainjob.py``; every trial on one TrainingRuntime, written
beside the Experiment).

The trial is the CreateTrainingJob request SageMaker would make for a trial
(``launch.tuning.trial_training_request``), planned with a stand-in for each tuned value, which then
becomes ``${trialParameters.NAME}`` (Katib substitutes it in the trial's manifest). The primary pod is
the one whose output carries the chief's metric line (``contract/metric_line.py``, ``name=value``:
Katib's StdOut format): the MPIJob's launcher, the TrainJob's first node (Katib's own default for a
TrainJob); success and failure are the object's conditions. Katib v0.19 watches only the trial kinds
its config lists: its default config lists TrainJob v1alpha1 and MPIJob v1 only, so
``katib_setup_documents`` gives the KatibConfig with ``MPIJob.v2beta1.kubeflow.org`` added and the RBAC
for it. ``katib_rules.experiment_problems`` encodes the admission webhook's rules, so the Experiment is
checked here, offline. Pure: no I/O, no Kubernetes client.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from sagemaker_dist.aws.tuning import TuningSpec, trial_training_request
from sagemaker_dist.aws.tuning_ranges import CATEGORICAL, INTEGER, format_number
from sagemaker_dist.contract.distributions import MPIJOB, TRAINJOB, distribution
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.host.job_spec import JobSpec
from sagemaker_dist.platforms.k8s_mpijob import plan_mpijob
from sagemaker_dist.platforms.k8s_pods import K8sJobOptions, to_yaml
from sagemaker_dist.platforms.k8s_trainjob import NODE, plan_training_runtime, plan_trainjob, pod_name

API_VERSION = "kubeflow.org/v1beta1"
KATIB_VERSION = "v0.19.0"
KATIB_NAMESPACE = "kubeflow"
MPIJOB_V2_RESOURCE = "MPIJob.v2beta1.kubeflow.org"  # Kind.version.group, as katib-config lists them
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"  # mpi-operator v0.8 sets it on each pod: launcher, worker
LAUNCHER_CONTAINER = "launcher"  # k8s_mpijob's launcher container
# MPIJob v2beta1's conditions (mpi-operator v0.8 types.go: JobSucceeded, JobFailed), in GJSON
SUCCESS_CONDITION = 'status.conditions.#(type=="Succeeded")#|#(status=="True")#'
FAILURE_CONDITION = 'status.conditions.#(type=="Failed")#|#(status=="True")#'
# a TrainJob's (Katib v0.19's DefaultTrainJobSuccessCondition and its failure twin) and its first node
# pod, which Katib picks by default (DefaultTrainJobPrimaryPodLabels)
TRAINJOB_SUCCESS_CONDITION = 'status.conditions.#(type=="Complete")#|#(status=="True")#'
TRAINJOB_PRIMARY_POD_LABELS = {
    "jobset.sigs.k8s.io/replicatedjob-name": NODE,
    "batch.kubernetes.io/job-completion-index": "0",
}
ALGORITHMS = {"Bayesian": "tpe", "Random": "random", "Grid": "grid"}  # Katib's hyperopt TPE, ...
EARLY_STOPPING = {"Auto": "medianstop"}
MAX_EXPERIMENT_NAME = 40
TRIAL_SUFFIX = 9  # Katib names a trial <experiment>-<8 random characters>
PLACEHOLDER = "${trialParameters.%s}"
PLACEHOLDER_RE = re.compile(
    r"\$\{trialParameters\..+?\}"
)  # Katib consts.TrialTemplateParamReplaceFormatRegex
NAME_RE = re.compile(
    r"^[a-z]([-a-z0-9]*[a-z0-9])?"
)  # the webhook's naming convention (not anchored at the end)
_IMAGE = "ghcr.io/kubeflow/katib/{}:" + KATIB_VERSION

# Katib v0.19's default KatibConfig (manifests/v1beta1/installs/katib-standalone/katib-config.yaml),
# as data: the algorithms, early stopping and collectors the webhook accepts, and the trial resources.
DEFAULT_KATIB_CONFIG = {
    "apiVersion": "config.kubeflow.org/v1beta1",
    "kind": "KatibConfig",
    "init": {
        "certGenerator": {"enable": True},
        "controller": {
            "webhookPort": 8443,
            "trialResources": [
                "TrainJob.v1alpha1.trainer.kubeflow.org",
                "Job.v1.batch",
                "TFJob.v1.kubeflow.org",
                "PyTorchJob.v1.kubeflow.org",
                "MPIJob.v1.kubeflow.org",
                "XGBoostJob.v1.kubeflow.org",
            ],
        },
    },
    "runtime": {
        "metricsCollectors": [
            {"kind": "StdOut", "image": _IMAGE.format("file-metrics-collector")},
            {"kind": "File", "image": _IMAGE.format("file-metrics-collector")},
            {
                "kind": "TensorFlowEvent",
                "image": _IMAGE.format("tfevent-metrics-collector"),
                "resources": {"limits": {"memory": "1Gi"}},
            },
        ],
        "suggestions": [
            {"algorithmName": "random", "image": _IMAGE.format("suggestion-hyperopt")},
            {"algorithmName": "tpe", "image": _IMAGE.format("suggestion-hyperopt")},
            {"algorithmName": "grid", "image": _IMAGE.format("suggestion-optuna")},
            {"algorithmName": "hyperband", "image": _IMAGE.format("suggestion-hyperband")},
            {"algorithmName": "bayesianoptimization", "image": _IMAGE.format("suggestion-skopt")},
            {"algorithmName": "cmaes", "image": _IMAGE.format("suggestion-goptuna")},
            {"algorithmName": "sobol", "image": _IMAGE.format("suggestion-goptuna")},
            {"algorithmName": "multivariate-tpe", "image": _IMAGE.format("suggestion-optuna")},
            {
                "algorithmName": "enas",
                "image": _IMAGE.format("suggestion-enas"),
                "resources": {"limits": {"memory": "400Mi"}},
            },
            {"algorithmName": "darts", "image": _IMAGE.format("suggestion-darts")},
            {
                "algorithmName": "pbt",
                "image": _IMAGE.format("suggestion-pbt"),
                "persistentVolumeClaimSpec": {
                    "accessModes": ["ReadWriteMany"],
                    "resources": {"requests": {"storage": "5Gi"}},
                },
            },
        ],
        "earlyStoppings": [
            {"algorithmName": "medianstop", "image": _IMAGE.format("earlystopping-medianstop")}
        ],
    },
}


class KatibError(ConfigurationError):
    """A tuning job that cannot run as a Katib Experiment as asked; the message says what to change."""


@dataclass(frozen=True)
class ExperimentOptions:
    """What the tuning request does not say: where the Experiment lives."""

    namespace: str = "default"
    max_failed_trials: int | None = None  # default: every trial may fail (SageMaker goes on too)


def katib_config(base: Mapping | None = None) -> dict:
    """``base`` (Katib v0.19's default) with MPIJob v2beta1 among the trial resources."""
    config = copy.deepcopy(dict(base or DEFAULT_KATIB_CONFIG))
    resources = config.setdefault("init", {}).setdefault("controller", {}).setdefault("trialResources", [])
    if MPIJOB_V2_RESOURCE not in resources:
        resources.append(MPIJOB_V2_RESOURCE)
    return config


def katib_setup_documents(namespace: str = KATIB_NAMESPACE, config_yaml: str | None = None) -> list[dict]:
    """What Katib needs once for v2beta1 MPIJob trials: RBAC for ``mpijobs`` (any version) to the
    katib-controller service account, and the ``katib-config`` ConfigMap with MPIJob v2beta1 among its
    trial resources (Katib v0.19's default config otherwise; restart katib-controller after applying)."""
    rules = [
        {
            "apiGroups": ["kubeflow.org"],
            "resources": ["mpijobs"],
            "verbs": ["get", "list", "watch", "create", "delete"],
        },
        {"apiGroups": ["kubeflow.org"], "resources": ["mpijobs/status"], "verbs": ["get"]},
    ]
    name = "katib-controller-sagemaker-dist-mpijobs"
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": "katib-controller", "namespace": namespace}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "katib-config", "namespace": namespace},
            "data": {"katib-config.yaml": config_yaml or to_yaml(katib_config())},
        },
    ]


def _sentinel(index: int) -> str:
    return f"SMDTRIALPARAM{index}X"  # survives the toolkit's argument model unchanged


def _parameter(r) -> dict:
    if r.kind == CATEGORICAL:
        return {"name": r.name, "parameterType": "categorical", "feasibleSpace": {"list": list(r.values)}}
    space = {"min": format_number(r.min_value), "max": format_number(r.max_value)}
    if r.scaling == "Logarithmic":
        space["distribution"] = "logUniform"  # honoured by Katib's hyperopt suggestions (random, tpe)
    return {"name": r.name, "parameterType": "int" if r.kind == INTEGER else "double", "feasibleSpace": space}


def check_experiment_spec(spec: TuningSpec, name: str) -> None:
    """What Katib cannot do of ``spec``, refused before anything is written."""
    if spec.strategy not in ALGORITHMS:
        raise KatibError(
            f"the {spec.strategy} strategy has no Katib equivalent here (Katib's hyperband needs the epochs "
            "as a searched parameter and parallelTrialCount >= eta^s_max); use Bayesian, Random or Grid, "
            "with --early-stopping Auto for Katib's median stopping"
        )
    reverse = [r.name for r in spec.ranges if r.scaling == "ReverseLogarithmic"]
    if reverse:
        raise KatibError(
            f"{', '.join(reverse)}: Katib has no reverse-logarithmic distribution; use log or linear"
        )
    quoted = [r.name for r in spec.ranges for v in r.values if "'" in v]
    if quoted:
        raise KatibError(
            f"{', '.join(quoted)}: a categorical value with a quote cannot reach the launcher's shell"
        )
    if len(name) > MAX_EXPERIMENT_NAME or not NAME_RE.fullmatch(name):
        raise KatibError(
            f"experiment name {name!r}: Katib wants lower-case letters, digits and '-', starting with a "
            f"letter, at most {MAX_EXPERIMENT_NAME} characters; give a shorter lower-case job name"
        )


@dataclass(frozen=True)
class Trial:
    """A trial's object as Katib's template holds it, and what Katib needs to follow it."""

    job: dict  # the MPIJob or TrainJob, unnamed
    primary: dict  # the container whose output carries the metric line (in ``job``)
    template: dict  # primaryContainerName, primaryPodLabels, successCondition, failureCondition
    documents: tuple[dict, ...] = ()  # what the trials need applied first (a TrainJob's runtime)


def _last_pod_check(name: str, last_pod: str) -> None:
    if len(last_pod) > 63:
        raise KatibError(
            f"experiment name {name!r} is too long for its trials' pods ({last_pod!r} is over 63 "
            "characters); give a shorter job name"
        )


def _mpijob_trial(trial: JobSpec, k8s: K8sJobOptions, name: str, labels: dict) -> Trial:
    job = plan_mpijob(trial, k8s)  # every MPIJob check, with a trial's longest name below
    workers = job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    _last_pod_check(name, f"{name}-{'x' * (TRIAL_SUFFIX - 1)}-worker-{workers - 1}")
    for replica in job["spec"]["mpiReplicaSpecs"].values():
        replica["template"]["metadata"]["labels"] = labels
    (launcher,) = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    template = {
        "primaryContainerName": LAUNCHER_CONTAINER,
        "primaryPodLabels": {JOB_ROLE_LABEL: "launcher"},
        "successCondition": SUCCESS_CONDITION,
        "failureCondition": FAILURE_CONDITION,
    }
    return Trial(job, launcher, template)


def _trainjob_trial(trial: JobSpec, k8s: K8sJobOptions, name: str, labels: dict) -> Trial:
    job = plan_trainjob(trial, k8s)  # every TrainJob check; every trial runs on the one runtime
    _last_pod_check(
        name, pod_name(f"{name}-{'x' * (TRIAL_SUFFIX - 1)}", job["spec"]["trainer"]["numNodes"] - 1)
    )
    template = {
        "primaryContainerName": NODE,
        "primaryPodLabels": dict(TRAINJOB_PRIMARY_POD_LABELS),
        "successCondition": TRAINJOB_SUCCESS_CONDITION,
        "failureCondition": FAILURE_CONDITION,
    }
    return Trial(job, job["spec"]["trainer"], template, (plan_training_runtime(trial, k8s),))


TRIALS = {MPIJOB: _mpijob_trial, TRAINJOB: _trainjob_trial}
# whether Katib needs its config and RBAC changed before it runs a kind of trial: v0.19's default
# katib-config lists TrainJob v1alpha1 but not MPIJob v2beta1 (``katib_setup_documents``)
KATIB_SETUP_NEEDED = {MPIJOB: True, TRAINJOB: False}


def needs_katib_setup(experiment: Mapping) -> bool:
    """Whether the Experiment's trials run only once ``katib_setup_documents`` are applied."""
    return KATIB_SETUP_NEEDED[experiment["spec"]["trialTemplate"]["trialSpec"]["kind"]]


def plan_experiment(
    tuning_request: Mapping, spec: TuningSpec, k8s: K8sJobOptions, options: ExperimentOptions | None = None
) -> list[dict]:
    """The Katib Experiment that runs ``spec`` over the tuning request's training definition, after
    what its trials need applied first (a TrainJob's runtime): the documents in the order to apply them."""
    options = options or ExperimentOptions()
    name = tuning_request["HyperParameterTuningJobName"].lower()
    check_experiment_spec(spec, name)
    sentinels = {r.name: _sentinel(i) for i, r in enumerate(spec.ranges)}
    trial_job = JobSpec.from_request(
        trial_training_request(tuning_request, name, sentinels), None, k8s.toolkit_version
    )
    kind = distribution(trial_job.distribution).kubernetes
    if kind not in TRIALS:
        raise KatibError(f"job {name}: its distribution runs on no Kubernetes object sagemaker-dist writes")
    labels = {"app.kubernetes.io/name": "sagemaker-dist", "sagemaker-dist/experiment": name}
    trial = TRIALS[kind](trial_job, k8s, name, labels)
    job = trial.job
    job.pop("metadata", None)  # Katib names the trial's object; the webhook refuses name and namespace
    job["metadata"] = {"labels": labels}
    # Katib's StdOut collector joins the command's words with spaces and runs them under sh -c: quote
    # them ourselves, as one sh -c string, each tuned value in single quotes
    command = " ".join(shlex.quote(word) for word in trial.primary["command"])
    for r_name, token in sentinels.items():
        command = command.replace(token, "'" + PLACEHOLDER % r_name + "'")
    trial.primary["command"] = ["sh", "-c", command]
    text = json.dumps(job)
    for r_name, token in sentinels.items():
        text = text.replace(token, PLACEHOLDER % r_name)
    trial_spec = json.loads(text)
    objective = {
        "type": spec.objective_type.lower(),
        "objectiveMetricName": spec.objective_metric,
        "additionalMetricNames": [m for m in spec.metrics if m != spec.objective_metric],
        # the last epoch's value, as SageMaker's final objective metric (Katib's default is the best)
        "metricStrategies": [{"name": m, "value": "latest"} for m in spec.metrics],
    }
    experiment_spec = {
        "objective": objective,
        "algorithm": {"algorithmName": ALGORITHMS[spec.strategy]},
        "parallelTrialCount": spec.max_parallel_jobs,
        "maxTrialCount": spec.n_trials,
        "maxFailedTrialCount": spec.n_trials
        if options.max_failed_trials is None
        else options.max_failed_trials,
        "parameters": [_parameter(r) for r in spec.ranges],
        "metricsCollectorSpec": {"collector": {"kind": "StdOut"}},
        "trialTemplate": {
            **trial.template,
            "trialParameters": [
                {"name": r.name, "description": r.describe(), "reference": r.name} for r in spec.ranges
            ],
            "trialSpec": trial_spec,
        },
    }
    if spec.early_stopping == "Auto":
        experiment_spec["earlyStopping"] = {"algorithmName": EARLY_STOPPING["Auto"]}
    experiment = {
        "apiVersion": API_VERSION,
        "kind": "Experiment",
        "metadata": {
            "name": name,
            "namespace": options.namespace,
            "labels": {"app.kubernetes.io/name": "sagemaker-dist"},
        },
        "spec": experiment_spec,
    }
    return [*trial.documents, experiment]
