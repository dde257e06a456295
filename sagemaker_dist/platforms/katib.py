"""Hyperparameter tuning on Kubernetes: a Katib ``kubeflow.org/v1beta1`` Experiment (Katib v0.19)
whose trial template is the job's MPIJob (``kubeflow.org/v2beta1``, ``k8s_mpijob.py``), as plain data.

The trial is the CreateTrainingJob request SageMaker would make for a trial
(``launch.tuning.trial_training_request``), planned as an MPIJob with a stand-in for each tuned value,
which then becomes ``${trialParameters.NAME}`` (Katib substitutes it in the trial's manifest). The
launcher, whose output carries the chief's metric line (``contract/metric_line.py``, ``name=value``:
Katib's StdOut format), is the primary pod; success and failure are MPIJob v2beta1's conditions.
Katib v0.19 watches only the trial kinds its config lists, and lists MPIJob v1 only:
``katib_setup_documents`` gives the KatibConfig with ``MPIJob.v2beta1.kubeflow.org`` added and the RBAC
for it. ``experiment_problems`` encodes the admission webhook's rules, so the Experiment is checked
here, offline. Pure: no I/O, no Kubernetes client.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.launch.tuning import (
    CATEGORICAL,
    INTEGER,
    TuningSpec,
    format_number,
    trial_training_request,
)
from sagemaker_dist.platforms.k8s_mpijob import API_VERSION as MPIJOB_API_VERSION
from sagemaker_dist.platforms.k8s_mpijob import MPIJobOptions, plan_mpijob

API_VERSION = "kubeflow.org/v1beta1"
KATIB_VERSION = "v0.19.0"
KATIB_NAMESPACE = "kubeflow"
MPIJOB_V2_RESOURCE = "MPIJob.v2beta1.kubeflow.org"  # Kind.version.group, as katib-config lists them
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"  # mpi-operator v0.8 sets it on each pod: launcher, worker
LAUNCHER_CONTAINER = "launcher"  # k8s_mpijob's launcher container
# MPIJob v2beta1's conditions (mpi-operator v0.8 types.go: JobSucceeded, JobFailed), in GJSON
SUCCESS_CONDITION = 'status.conditions.#(type=="Succeeded")#|#(status=="True")#'
FAILURE_CONDITION = 'status.conditions.#(type=="Failed")#|#(status=="True")#'
ALGORITHMS = {"Bayesian": "tpe", "Random": "random", "Grid": "grid"}  # Katib's hyperopt TPE, ...
EARLY_STOPPING = {"Auto": "medianstop"}
MAX_EXPERIMENT_NAME = 40
TRIAL_SUFFIX = 9  # Katib names a trial <experiment>-<8 random characters>
_PLACEHOLDER = "${trialParameters.%s}"
_PLACEHOLDER_RE = re.compile(
    r"\$\{trialParameters\..+?\}"
)  # Katib consts.TrialTemplateParamReplaceFormatRegex
_NAME_RE = re.compile(
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
            "data": {"katib-config.yaml": config_yaml or _yaml(katib_config())},
        },
    ]


def _yaml(document: dict) -> str:
    from sagemaker_dist.platforms.k8s_mpijob import to_yaml

    return to_yaml(document)


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
    if len(name) > MAX_EXPERIMENT_NAME or not _NAME_RE.fullmatch(name):
        raise KatibError(
            f"experiment name {name!r}: Katib wants lower-case letters, digits and '-', starting with a "
            f"letter, at most {MAX_EXPERIMENT_NAME} characters; give a shorter lower-case job name"
        )


def plan_experiment(
    tuning_request: Mapping, spec: TuningSpec, mpijob: MPIJobOptions, options: ExperimentOptions | None = None
) -> dict:
    """The Katib Experiment that runs ``spec`` over the tuning request's training definition."""
    options = options or ExperimentOptions()
    name = tuning_request["HyperParameterTuningJobName"].lower()
    check_experiment_spec(spec, name)
    sentinels = {r.name: _sentinel(i) for i, r in enumerate(spec.ranges)}
    trial_request = trial_training_request(tuning_request, name, sentinels)
    job = plan_mpijob(trial_request, mpijob)  # every MPIJob check, with a trial's longest name below
    workers = job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    last_pod = f"{name}-{'x' * (TRIAL_SUFFIX - 1)}-worker-{workers - 1}"
    if len(last_pod) > 63:
        raise KatibError(
            f"experiment name {name!r} is too long for its trials' worker pods ({last_pod!r} is over 63 "
            "characters); give a shorter job name"
        )
    job.pop("metadata", None)  # Katib names the trial's MPIJob; the webhook refuses name and namespace
    labels = {"app.kubernetes.io/name": "sagemaker-dist", "sagemaker-dist/experiment": name}
    job["metadata"] = {"labels": labels}
    for replica in job["spec"]["mpiReplicaSpecs"].values():
        replica["template"]["metadata"]["labels"] = labels
    (launcher,) = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    # Katib's StdOut collector joins the command's words with spaces and runs them under sh -c: quote
    # them ourselves, as one sh -c string, each tuned value in single quotes
    command = " ".join(shlex.quote(word) for word in launcher["command"])
    for r_name, token in sentinels.items():
        command = command.replace(token, "'" + _PLACEHOLDER % r_name + "'")
    launcher["command"] = ["sh", "-c", command]
    text = json.dumps(job)
    for r_name, token in sentinels.items():
        text = text.replace(token, _PLACEHOLDER % r_name)
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
            "primaryContainerName": LAUNCHER_CONTAINER,
            "primaryPodLabels": {JOB_ROLE_LABEL: "launcher"},
            "successCondition": SUCCESS_CONDITION,
            "failureCondition": FAILURE_CONDITION,
            "trialParameters": [
                {"name": r.name, "description": r.describe(), "reference": r.name} for r in spec.ranges
            ],
            "trialSpec": trial_spec,
        },
    }
    if spec.early_stopping == "Auto":
        experiment_spec["earlyStopping"] = {"algorithmName": EARLY_STOPPING["Auto"]}
    return {
        "apiVersion": API_VERSION,
        "kind": "Experiment",
        "metadata": {
            "name": name,
            "namespace": options.namespace,
            "labels": {"app.kubernetes.io/name": "sagemaker-dist"},
        },
        "spec": experiment_spec,
    }


def experiment_problems(experiment: Mapping, config: Mapping | None = None) -> list[str]:
    """What Katib v0.19 would refuse, or never run, in ``experiment``, under KatibConfig ``config``
    (default: ``katib_config()``, the one ``katib_setup_documents`` writes).

    The rules of its admission webhook, ``pkg/webhook/v1beta1/experiment/validator/validator.go``
    (``ValidateExperiment``): the name; maxFailedTrialCount >= 0, maxTrialCount > 0,
    parallelTrialCount > 0, both at most maxTrialCount; ``validateObjective`` (type minimize or
    maximize, a metric name, not also an additional metric); ``validateAlgorithm`` and
    ``validateEarlyStopping`` (a name the config's suggestions / earlyStoppings list);
    ``validateResumePolicy``; ``validateParameters`` (known types and distributions, a feasible space:
    min and max and no list for int/double, no min, max or step for categorical/discrete);
    ``validateTrialTemplate`` (primaryContainerName, success and failure conditions, trialParameters
    named and referenced once each, each reference a parameter, each placeholder in the template and
    every placeholder defined, trialSpec without metadata.name/namespace and with apiVersion and kind);
    ``validateMetricsCollector`` (a collector kind the config lists). Then two that fail later, not
    at admission: the trial's kind must be in the config's ``init.controller.trialResources``
    (``pkg/controller.v1beta1/trial``: only those are watched), and the primary pod must hold the
    primary container (``pkg/webhook/v1beta1/pod``: the collector wraps that container's command).
    """
    config = config or katib_config()
    runtime = config.get("runtime") or {}
    problems: list[str] = []
    meta = experiment.get("metadata") or {}
    spec = experiment.get("spec") or {}
    name = meta.get("name", "")
    if not _NAME_RE.match(name) or len(name) > MAX_EXPERIMENT_NAME:
        problems.append(f"metadata.name {name!r}: lower-case alphanumerics and '-', at most 40 characters")
    max_trials, parallel, failed = (
        spec.get("maxTrialCount"),
        spec.get("parallelTrialCount"),
        spec.get("maxFailedTrialCount"),
    )
    if failed is not None and failed < 0:
        problems.append("spec.maxFailedTrialCount should not be less than 0")
    if max_trials is not None and max_trials <= 0:
        problems.append("spec.maxTrialCount must be greater than 0")
    if parallel is not None and parallel <= 0:
        problems.append("spec.parallelTrialCount must be greater than 0")
    if failed is not None and max_trials is not None and failed > max_trials:
        problems.append("spec.maxFailedTrialCount should be less than or equal to spec.maxTrialCount")
    if parallel is not None and max_trials is not None and parallel > max_trials:
        problems.append("spec.parallelTrialCount should be less than or equal to spec.maxTrialCount")
    objective = spec.get("objective")
    if not objective:
        return [*problems, "spec.objective must be specified"]
    if objective.get("type") not in ("minimize", "maximize"):
        problems.append(f"spec.objective.type {objective.get('type')!r} must be minimize or maximize")
    if not objective.get("objectiveMetricName"):
        problems.append("spec.objective.objectiveMetricName must be specified")
    if objective.get("objectiveMetricName") in (objective.get("additionalMetricNames") or []):
        problems.append(
            "spec.objective.additionalMetricNames should not contain spec.objective.objectiveMetricName"
        )
    for strategy in objective.get("metricStrategies") or []:
        if strategy.get("value") not in ("min", "max", "latest"):
            problems.append(f"metric strategy {strategy!r}: value must be min, max or latest")
    algorithm = (spec.get("algorithm") or {}).get("algorithmName")
    if algorithm not in [s.get("algorithmName") for s in runtime.get("suggestions") or []]:
        problems.append(f"spec.algorithm.algorithmName {algorithm!r} has no suggestion in katib-config")
    if spec.get("earlyStopping") is not None:
        stopping = spec["earlyStopping"].get("algorithmName")
        if stopping not in [s.get("algorithmName") for s in runtime.get("earlyStoppings") or []]:
            problems.append(f"spec.earlyStopping.algorithmName {stopping!r} is not in katib-config")
    if spec.get("resumePolicy", "") not in ("", "Never", "LongRunning", "FromVolume"):
        problems.append(f"spec.resumePolicy {spec.get('resumePolicy')!r} is not a ResumePolicyType")
    parameters = spec.get("parameters") or []
    if not parameters and spec.get("nasConfig") is None:
        problems.append("spec.parameters or spec.nasConfig must be specified")
    problems += _parameter_problems(parameters)
    problems += _template_problems(spec.get("trialTemplate"), parameters, config)
    kind = ((spec.get("metricsCollectorSpec") or {}).get("collector") or {}).get("kind", "StdOut")
    collectors = [c.get("kind") for c in runtime.get("metricsCollectors") or []]
    if kind in ("StdOut", "File", "TensorFlowEvent", "PrometheusMetric") and kind not in collectors:
        problems.append(f"metrics collector {kind!r} is not in katib-config")
    return problems


def _parameter_problems(parameters) -> list[str]:
    problems = []
    for i, p in enumerate(parameters):
        where = f"spec.parameters[{i}]"
        kind = p.get("parameterType")
        if kind not in ("int", "double", "categorical", "discrete", "unknown"):
            problems.append(f"{where}.parameterType {kind!r} is not supported")
        space = p.get("feasibleSpace") or {}
        if space.get("distribution", "") not in (
            "",
            "uniform",
            "logUniform",
            "normal",
            "logNormal",
            "unknown",
        ):
            problems.append(f"{where}.feasibleSpace.distribution {space['distribution']!r} is not supported")
        if not space:
            problems.append(f"{where}.feasibleSpace must be specified")
        elif kind in ("int", "double"):
            if space.get("list"):
                problems.append(f"{where}.feasibleSpace.list is not supported for parameterType {kind}")
            if not space.get("min") or not space.get("max"):
                problems.append(
                    f"{where}.feasibleSpace.max or min must be specified for parameterType {kind}"
                )
        elif kind in ("categorical", "discrete") and (
            space.get("min") or space.get("max") or space.get("step")
        ):
            problems.append(f"{where}.feasibleSpace .max, .min and .step are not supported for {kind}")
    return problems


def _template_problems(template, parameters, config) -> list[str]:
    if not template:
        return ["spec.trialTemplate must be specified"]
    problems = []
    if not template.get("primaryContainerName"):
        problems.append("spec.trialTemplate.primaryContainerName must be specified")
    if not template.get("successCondition") or not template.get("failureCondition"):
        problems.append("spec.trialTemplate: successCondition and failureCondition must be specified")
    if template.get("trialParameters") is None:
        return [*problems, "spec.trialTemplate.trialParameters must be specified"]
    trial_spec = template.get("trialSpec")
    if trial_spec is None and template.get("configMap") is None:
        return [*problems, "spec.trialTemplate.trialSpec or spec.trialTemplate.configMap must be specified"]
    if trial_spec is None:
        return problems  # a ConfigMap template is read by the webhook from the cluster; not checked here
    text = json.dumps(trial_spec)
    names = {p.get("name") for p in parameters}
    seen_names, seen_refs = set(), set()
    for i, p in enumerate(template["trialParameters"]):
        where = f"spec.trialTemplate.trialParameters[{i}]"
        pname, ref = p.get("name", ""), p.get("reference", "")
        if not pname or not ref or "{" in pname or "}" in pname:
            problems.append(
                f"{where}: name and reference must be specified and name must not contain '{{' or '}}'"
            )
            continue
        if pname in seen_names or ref in seen_refs:
            problems.append(f"{where}: name {pname!r} or reference {ref!r} is duplicated")
            continue
        seen_names.add(pname)
        seen_refs.add(ref)
        if names and ref not in names and not ref.startswith("${trialSpec."):
            problems.append(f"{where}.reference {ref!r} does not exist in spec.parameters")
        placeholder = _PLACEHOLDER % pname
        if placeholder not in text:
            problems.append(f"{where}.name {pname!r} not found in spec.trialTemplate")
            return problems
        text = text.replace(placeholder, "test-value")
    left = _PLACEHOLDER_RE.findall(text)
    if left:
        problems.append(f"parameters {left} in spec.trialTemplate not found in spec.trialParameters")
    job = json.loads(text)
    if (job.get("metadata") or {}).get("name") or (job.get("metadata") or {}).get("namespace"):
        problems.append("metadata.name and metadata.namespace in spec.trialTemplate must be omitted")
    if not job.get("apiVersion") or not job.get("kind"):
        problems.append("APIVersion and Kind in spec.trialTemplate must be specified")
    group, _, version = str(job.get("apiVersion", "")).rpartition("/")
    resource = f"{job.get('kind')}.{version}.{group}" if group else f"{job.get('kind')}.{version}"
    resources = ((config.get("init") or {}).get("controller") or {}).get("trialResources") or []
    if resource not in resources:
        problems.append(
            f"trial kind {resource} is not among katib-config's trialResources ({', '.join(resources)}): "
            "Katib would never see the trial end; apply katib_setup_documents() (tune --k8s --katib-setup)"
        )
    if job.get("apiVersion") == MPIJOB_API_VERSION and template.get("primaryContainerName"):
        labels = template.get("primaryPodLabels") or {}
        replicas = (job.get("spec") or {}).get("mpiReplicaSpecs") or {}
        role = labels.get(JOB_ROLE_LABEL, "")
        replica = replicas.get(role.capitalize()) if role else None
        containers = [
            c.get("name")
            for c in ((replica or {}).get("template") or {}).get("spec", {}).get("containers", [])
        ]
        if template["primaryContainerName"] not in containers:
            problems.append(
                f"primary container {template['primaryContainerName']!r} is not in the pods primaryPodLabels "
                f"{labels} select (mpi-operator labels them {JOB_ROLE_LABEL}: launcher or worker)"
            )
    return problems
