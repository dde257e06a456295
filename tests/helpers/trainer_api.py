"""Kubeflow Trainer v2.3's API, offline: the TrainJob and TrainingRuntime CRDs' schemas (``tests/platforms/
fixtures/``, descriptions removed), their CEL rules, the admission webhooks' rules and Kubernetes' pod
rules for native sidecars, written here.

Sources (kubeflow/trainer v2.3.0, commit 658725bdae5c7e3a0854d93ac6ff492e109a22ab):
``manifests/base/crds/trainer.kubeflow.org_{trainjobs,trainingruntimes}.yaml``,
``pkg/webhooks/trainingruntime_webhook.go`` (the node job: one replica, a ``node`` container),
``pkg/runtime/framework/plugins/torch/torch.go`` (the reserved ``PET_*`` variables),
``pkg/runtime/framework/plugins/jobset/jobset.go`` and ``pkg/runtime/core/trainingruntime.go``
(the runtime must exist; runtimePatches).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema

from helpers.k8s_schemas import strict_schema
from sagemaker_dist.platforms.k8s_trainjob import RESERVED_ENV

FIXTURES = Path(__file__).resolve().parents[1] / "platforms" / "fixtures"
CRDS = {
    kind: json.loads((FIXTURES / f"{stem}_v1alpha1_crd_v2.3.0.json").read_text())["openAPIV3Schema"]
    for kind, stem in (("TrainJob", "trainjob"), ("TrainingRuntime", "trainingruntime"))
}
SCHEMAS = {kind: strict_schema(schema) for kind, schema in CRDS.items()}
RFC_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
MANAGERS = ("trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue")
# every CEL rule of the two CRDs: checked below on create, or one that only compares an update with the
# object it replaces (self == oldSelf), or one of a part these manifests do not use
CEL_CHECKED = {
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
    "size(self.metadata.name) <= 63",
    "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']",
    "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost),has(self.flux)]"
    ".filter(x, x).size() <= 1",
}
CEL_UPDATES_ONLY = {"self == oldSelf"}
CEL_UNUSED = {
    "self == '' || self.matches('^[A-Za-z][A-Za-z0-9+.-]*://.+$')",  # initializers' storageUri
    "has(self.lastUpdatedTime)",  # status
    "self >= 1",  # the flux policy
    "!self.exists(c, c == 'node')",  # envInjection
    "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && "
    "self.replicatedJobs.exists(x, has(x.dependsOn)))",
    "self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)",
}


def cel_rules(schema) -> set[str]:
    if isinstance(schema, dict):
        found = {r["rule"] for r in schema.get("x-kubernetes-validations", [])}
        return found.union(*(cel_rules(v) for v in schema.values()))
    if isinstance(schema, list):
        return set().union(*(cel_rules(v) for v in schema))
    return set()


def schema_problems(document: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(SCHEMAS[document["kind"]])
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]


def _pod_problems(pod: dict) -> list[str]:
    """The API server's pod rules these manifests meet: a Job's restart policy, container names unique,
    mounts of declared volumes, a native sidecar (restartPolicy Always) only among init containers and
    the only kind of init container with a startup probe."""
    problems = []
    if pod.get("restartPolicy", "Always") not in ("Never", "OnFailure"):
        problems.append("a Job's pod restartPolicy must be Never or OnFailure")
    init, main = pod.get("initContainers", []), pod.get("containers", [])
    names = [c["name"] for c in init + main]
    if len(names) != len(set(names)):
        problems.append(f"container names repeat: {names}")
    volumes = {v["name"] for v in pod.get("volumes", [])}
    for c in init + main:
        missing = {m["name"] for m in c.get("volumeMounts", [])} - volumes
        if missing:
            problems.append(f"container {c['name']} mounts undeclared volume(s) {sorted(missing)}")
    for c in main:
        if "restartPolicy" in c:
            problems.append(f"container {c['name']}: restartPolicy is for init containers")
    for c in init:
        if c.get("restartPolicy", "Always") != "Always" or "restartPolicy" not in c:
            if "startupProbe" in c or "readinessProbe" in c:
                problems.append(f"init container {c['name']}: probes need restartPolicy Always")
    return problems


def trainer_problems(documents: list[dict]) -> list[str]:
    """The CRDs' CEL rules on create, and the Trainer's webhooks: the TrainJob's runtime exists (as a
    TrainingRuntime in its namespace), the runtime's trainer job has one replica and a ``node``
    container, one ML policy, no reserved ``PET_*`` variable in the TrainJob's env."""
    runtimes = {
        (d["metadata"].get("namespace", "default"), d["metadata"]["name"]): d
        for d in documents
        if d["kind"] == "TrainingRuntime"
    }
    problems = []
    for runtime in runtimes.values():
        policy = runtime["spec"].get("mlPolicy") or {}
        if len([k for k in ("torch", "mpi", "jax", "xgboost", "flux") if k in policy]) > 1:
            problems.append("Only one of the policy can be configured")
        for i, job in enumerate(runtime["spec"]["template"]["spec"]["replicatedJobs"]):
            labels = (job["template"].get("metadata") or {}).get("labels") or {}
            if labels.get(ANCESTOR) != "trainer":
                continue
            if job.get("replicas", 1) != 1:
                problems.append(f"replicatedJobs[{i}].replicas: always must be 1")
            pod = job["template"]["spec"]["template"]["spec"]
            if "node" not in [c["name"] for c in pod["containers"]]:
                problems.append("must contain the required container for the ancestor: trainer")
            problems += _pod_problems(pod)
    for job in (d for d in documents if d["kind"] == "TrainJob"):
        name, spec = job["metadata"]["name"], job["spec"]
        if not RFC_1035.match(name):
            problems.append("metadata.name must match RFC 1035 DNS label format")
        if len(name) > 63:
            problems.append("metadata.name must be no more than 63 characters")
        if spec.get("managedBy", MANAGERS[0]) not in MANAGERS:
            problems.append("ManagedBy must be trainer.kubeflow.org/trainjob-controller or kueue...")
        ref = spec["runtimeRef"]
        key = (job["metadata"].get("namespace", "default"), ref["name"])
        if ref.get("kind", "ClusterTrainingRuntime") != "TrainingRuntime" or key not in runtimes:
            problems.append("specified trainingRuntime must be created before the TrainJob is created")
        reserved = [e["name"] for e in spec["trainer"].get("env", []) if e["name"] in RESERVED_ENV]
        if reserved:
            problems.append(f"must not have reserved envs, invalid envs configured: {reserved}")
        if spec.get("runtimePatches"):
            problems.append("runtimePatches: not expected here")
    return problems
