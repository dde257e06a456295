"""The rules Katib v0.19's admission webhook applies to an Experiment
(``pkg/webhook/v1beta1/experiment/validator/validator.go``), encoded so that ``tune --k8s``'s
Experiment is checked here, offline, before a cluster sees it: its CRD YAML preserves unknown fields and
checks nothing. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from sagemaker_dist.platforms.k8s_mpijob import API_VERSION as MPIJOB_API_VERSION
from sagemaker_dist.platforms.k8s_trainjob import API_VERSION as TRAINJOB_API_VERSION
from sagemaker_dist.platforms.k8s_trainjob import NODE
from sagemaker_dist.platforms.katib import (
    JOB_ROLE_LABEL,
    MAX_EXPERIMENT_NAME,
    NAME_RE,
    PLACEHOLDER,
    PLACEHOLDER_RE,
    TRAINJOB_PRIMARY_POD_LABELS,
    katib_config,
)


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
    if not NAME_RE.match(name) or len(name) > MAX_EXPERIMENT_NAME:
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
        placeholder = PLACEHOLDER % pname
        if placeholder not in text:
            problems.append(f"{where}.name {pname!r} not found in spec.trialTemplate")
            return problems
        text = text.replace(placeholder, "test-value")
    left = PLACEHOLDER_RE.findall(text)
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
    if job.get("apiVersion") == TRAINJOB_API_VERSION and template.get("primaryContainerName"):
        # the Trainer's node pods hold the container "node" (its runtime webhook insists), the first
        # one the metric line: Katib must pick that pod and that container
        labels = template.get("primaryPodLabels") or {}
        if template["primaryContainerName"] != NODE or labels != TRAINJOB_PRIMARY_POD_LABELS:
            problems.append(
                f"a TrainJob trial's primary container is {NODE!r} in its first node pod "
                f"(primaryPodLabels {TRAINJOB_PRIMARY_POD_LABELS}), not {template['primaryContainerName']!r} "
                f"in the pods {labels} select"
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
