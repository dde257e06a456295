"""The CreateTrainingJob request's rules beyond its types: the limits that make SageMaker refuse a job,
or make it fail late or hang (channel cap, names, hyperparameter counts, spot timing, secrets in
hyperparameters). Each problem says what to change; ``aws.request_validation`` adds botocore's model
of the operation and reports them all at once. Stdlib only, as the rest of the contract: the rules
read the raw request because a request that breaks them must be described, not parsed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from sagemaker_dist.contract import hyperparameters
from sagemaker_dist.contract.layout import (
    CHANNEL_NAME_RE,
    DOT_CHANNEL_NAME_PROBLEM,
    DOT_CHANNEL_NAMES,
    LAYOUT_HYPERPARAMETER,
    MAX_CHANNEL_NAME,
    MAX_CHANNELS,
    ChannelLayout,
    LayoutError,
    fifo_would_be_shared,
)
from sagemaker_dist.contract.paths import local_path_problem
from sagemaker_dist.errors import ConfigurationError

OPERATION = "CreateTrainingJob"
MAX_JOB_NAME = 63
JOB_NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
MAX_HYPERPARAMETERS = 100
MAX_HYPERPARAMETER_KEY = 256
MAX_HYPERPARAMETER_VALUE = 2500
PROCESSES_PER_HOST_HYPERPARAMETER = hyperparameters.MPI_PROCESSES_PER_HOST
INPUT_MODES = ("Pipe", "File", "FastFile")

ACCESS_KEY_ID_RE = re.compile(r"(?<![A-Z0-9])(AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Z0-9])")
SECRET_KEY_NAME_RE = re.compile(
    r"(secret|password|passwd|session[_-]?token|security[_-]?token|access[_-]?key|private[_-]?key|api[_-]?key)",
    re.IGNORECASE,
)
CONTROL_CHARACTER_RE = re.compile(r"[\x00-\x1f\x7f]")  # C0 controls and DEL, tab and newline included
# 40 base64 characters standing alone: the shape of an AWS secret access key.
SECRET_VALUE_RE = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")


def looks_like_secret_key(text: str) -> bool:
    """A standalone 40-character base64 run with upper case, lower case and digits (not a hex SHA-1)."""
    return any(
        re.search("[A-Z]", m) and re.search("[a-z]", m) and re.search("[0-9]", m)
        for m in SECRET_VALUE_RE.findall(text)
    )


class RequestValidationError(ConfigurationError):
    """A CreateTrainingJob request SageMaker would reject, or one that would fail or hang later."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"the training job request has {len(self.problems)} problem(s):\n{lines}")


def _job_name_problems(request: Mapping) -> list[str]:
    name = request.get("TrainingJobName")
    if not isinstance(name, str) or not name:
        return ["TrainingJobName is missing; give job_name= or base_job_name="]
    if len(name) > MAX_JOB_NAME or not JOB_NAME_RE.fullmatch(name):
        return [
            f"job name {name!r} is not valid: SageMaker allows 1-{MAX_JOB_NAME} letters, digits and "
            "hyphens, starting and ending with a letter or digit (no '_' or '.')"
        ]
    return []


def _channel_problems(request: Mapping) -> list[str]:
    channels = request.get("InputDataConfig") or []
    problems = []
    if not channels:
        problems.append("InputDataConfig has no channels; give at least the training data")
    if len(channels) > MAX_CHANNELS:
        problems.append(
            f"the job has {len(channels)} channels; SageMaker allows at most {MAX_CHANNELS}. Use the "
            "per-local-rank layout (ShardedByS3Key across hosts), validation='single', or fewer "
            "extra channels"
        )
    names = [c.get("ChannelName") for c in channels if isinstance(c, Mapping)]
    for name in names:
        if (
            not isinstance(name, str)
            or not name
            or len(name) > MAX_CHANNEL_NAME
            or not CHANNEL_NAME_RE.fullmatch(name)
        ):
            problems.append(
                f"channel name {name!r} is not valid: 1-{MAX_CHANNEL_NAME} letters, digits, '.', '-' or '_'"
            )
        elif name in DOT_CHANNEL_NAMES:
            problems.append(f"channel name {name!r} {DOT_CHANNEL_NAME_PROBLEM}")
    dupes = sorted({n for n in names if isinstance(n, str) and names.count(n) > 1})
    if dupes:
        problems.append(f"channel names repeat: {', '.join(dupes)}")
    mode = (request.get("AlgorithmSpecification") or {}).get("TrainingInputMode")
    for c in channels:
        if not isinstance(c, Mapping):
            continue
        s3 = (c.get("DataSource") or {}).get("S3DataSource") or {}
        uri = s3.get("S3Uri", "")
        if isinstance(uri, str) and uri and not uri.startswith(("s3://", "https://")):
            problems.append(f"channel {c.get('ChannelName')!r} S3Uri {uri!r} is not an s3:// URI")
        channel_mode = c.get("InputMode", mode)
        if c.get("RecordWrapperType") == "RecordIO" and channel_mode != "Pipe":
            problems.append(
                f"channel {c.get('ChannelName')!r} uses RecordWrapperType RecordIO in {channel_mode} mode; "
                "SageMaker applies it in Pipe mode only"
            )
    if mode not in INPUT_MODES:
        problems.append(f"TrainingInputMode is {mode!r}; use one of {', '.join(INPUT_MODES)}")
    return problems


def _hyperparameter_problems(request: Mapping) -> list[str]:
    hps = request.get("HyperParameters") or {}
    problems = []
    if len(hps) > MAX_HYPERPARAMETERS:
        problems.append(
            f"{len(hps)} hyperparameters; SageMaker allows at most {MAX_HYPERPARAMETERS} (sagemaker-dist "
            "uses 6 of them). Put the rest in a config file in source_dir"
        )
    for key, value in hps.items():
        if not isinstance(value, str):
            problems.append(f"hyperparameter {key!r} is a {type(value).__name__}; values must be strings")
            continue
        if len(key) > MAX_HYPERPARAMETER_KEY:
            problems.append(
                f"hyperparameter key {key[:40]!r}... is {len(key)} characters; at most "
                f"{MAX_HYPERPARAMETER_KEY}"
            )
        if len(value) > MAX_HYPERPARAMETER_VALUE:
            problems.append(
                f"hyperparameter {key!r} is {len(value)} characters; at most {MAX_HYPERPARAMETER_VALUE}. "
                "Pass large values as a file in source_dir or an input channel"
            )
    return problems


def _control_character_problems(request: Mapping) -> list[str]:
    """Control characters (a newline above all) in hyperparameters and environment, keys and values.

    SageMaker's own patterns allow them, but AWS's toolkit joins the script's arguments into one
    ``/bin/sh`` line, where a newline starts a second command; no training script needs one.
    """
    problems = []
    for field in ("HyperParameters", "Environment"):
        for key, value in (request.get(field) or {}).items():
            for what, text in (("key", key), ("value", value)):
                found = CONTROL_CHARACTER_RE.search(text) if isinstance(text, str) else None
                if found:
                    subject = f"{field} key {key!r}" if what == "key" else f"{field} value of {key!r}"
                    problems.append(
                        f"{subject} holds the control character {found.group()!r}; AWS's toolkit passes it "
                        "through /bin/sh, where a newline starts another command. Remove it (pass text with "
                        "line breaks as a file in source_dir)"
                    )
    return problems


def _shared_pipe_problems(request: Mapping) -> list[str]:
    """Shared channels (a single role, an extra channel) in Pipe mode with several processes per host.

    A FIFO has one reader; several ranks on a host reading it split its bytes and stall the job.
    Only requests carrying a sagemaker-dist layout are checked (other channels' readers are unknown).
    """
    hps = request.get("HyperParameters") or {}
    text = hps.get(LAYOUT_HYPERPARAMETER)
    if not isinstance(text, str):
        return []
    try:
        layout = ChannelLayout.from_json(text)
    except LayoutError as exc:
        return [str(exc)]
    per_host = hps.get(PROCESSES_PER_HOST_HYPERPARAMETER, str(layout.processes_per_host))
    try:
        per_host = int(per_host)
    except (TypeError, ValueError):
        return [f"hyperparameter {PROCESSES_PER_HOST_HYPERPARAMETER} is {per_host!r}; give a whole number"]
    shared = set(layout.shared_channels)
    mode = (request.get("AlgorithmSpecification") or {}).get("TrainingInputMode")
    return [
        f"channel {c.get('ChannelName')!r} is shared by all {per_host} processes per host but is in "
        "Pipe mode, and a FIFO has one reader (several readers split its bytes and stall the job); "
        "give it InputMode File or FastFile (shared_channel_input_mode='File'), or spread validation "
        "per worker (validation='per-worker')"
        for c in request.get("InputDataConfig") or []
        if isinstance(c, Mapping)
        and c.get("ChannelName") in shared
        and fifo_would_be_shared(c.get("InputMode", mode), per_host)
    ]


def _credential_problems(request: Mapping) -> list[str]:
    """Keys or values that look like AWS credentials, in hyperparameters and environment (never echoed)."""
    problems = []
    for field in ("HyperParameters", "Environment"):
        for key, value in (request.get(field) or {}).items():
            text = value if isinstance(value, str) else ""
            if SECRET_KEY_NAME_RE.search(key) or ACCESS_KEY_ID_RE.search(key):
                problems.append(
                    f"{field} key {key!r} looks like a credential; never pass secrets this way (they are "
                    "visible in DescribeTrainingJob). The job's IAM role gives the container its AWS access"
                )
            elif ACCESS_KEY_ID_RE.search(text) or looks_like_secret_key(text):
                problems.append(
                    f"{field} value of {key!r} looks like an AWS access key or secret (value not shown); "
                    "remove it and let the job's IAM role provide access"
                )
    return problems


def _spot_problems(request: Mapping) -> list[str]:
    stop = request.get("StoppingCondition") or {}
    runtime = stop.get("MaxRuntimeInSeconds")
    wait = stop.get("MaxWaitTimeInSeconds")
    if request.get("EnableManagedSpotTraining"):
        problems = []
        if wait is None:
            problems.append(
                "managed spot training needs MaxWaitTimeInSeconds; pass max_wait= (seconds, at least "
                f"max_run={runtime})"
            )
        elif isinstance(runtime, int) and isinstance(wait, int) and wait < runtime:
            problems.append(
                f"max_wait={wait} is less than max_run={runtime}; spot jobs need max_wait >= max_run"
            )
        if not (request.get("CheckpointConfig") or {}).get("S3Uri"):
            # an interrupted job restarts from what SageMaker restores there; without it, from scratch
            problems.append(
                "managed spot training needs a checkpoint S3 URI (CheckpointConfig.S3Uri): an interrupted "
                "job is started again with /opt/ml/checkpoints restored from it, and without one it starts "
                "from scratch; keep checkpoints=True (the default) or pass checkpoint_s3_uri="
            )
        return problems
    elif wait is not None:
        return [
            "MaxWaitTimeInSeconds is set but managed spot training is off; pass use_spot=True or "
            "drop max_wait"
        ]
    return []


# Families with local NVMe instance storage, which SageMaker encrypts in hardware and for which it
# refuses VolumeKmsKeyId: the 'd' families (p4d, g4dn, m5d, ...) and these.
_LOCAL_NVME_FAMILIES = frozenset({"p5", "p5e", "p5en", "g5", "g6", "g6e", "trn1", "trn1n", "trn2"})


def has_local_nvme(instance_type: str) -> bool:
    """Whether ``instance_type`` (ml.<family>.<size>) has local instance storage."""
    parts = instance_type.split(".")
    family = parts[1] if len(parts) == 3 else ""
    return family in _LOCAL_NVME_FAMILIES or bool(re.match(r"^[a-z]+\d+[a-z]*d[a-z]*$", family))


def _volume_key_problems(request: Mapping) -> list[str]:
    resources = request.get("ResourceConfig") or {}
    instance_type = resources.get("InstanceType")
    if resources.get("VolumeKmsKeyId") and isinstance(instance_type, str) and has_local_nvme(instance_type):
        return [
            f"{instance_type} has local NVMe storage, which SageMaker encrypts in hardware and for which "
            "it refuses VolumeKmsKeyId; drop volume_kms_key"
        ]
    return []


def _vpc_problems(request: Mapping) -> list[str]:
    vpc = request.get("VpcConfig")
    if vpc is not None and not (vpc.get("Subnets") and vpc.get("SecurityGroupIds")):
        return ["VpcConfig needs both subnets and security_group_ids"]
    return []


def _local_path_problems(request: Mapping) -> list[str]:
    """CheckpointConfig and TensorBoardOutputConfig LocalPath, which local mode and the pipe agent map
    into each host's tree: SageMaker takes any string, but a ``..`` would map outside it."""
    problems = []
    for field in ("CheckpointConfig", "TensorBoardOutputConfig"):
        path = (request.get(field) or {}).get("LocalPath")
        problem = local_path_problem(path) if path is not None else None
        if problem:
            problems.append(f"{field}.LocalPath {path!r} {problem}")
    return problems


def limit_problems(request: Mapping) -> list[str]:
    """Our checks on top of the model: the limits botocore and moto do not enforce."""
    return rule_report(request)[0]


def rule_report(request: Mapping) -> tuple[list[str], list[str]]:
    """``limit_problems``, and the members (TrainingJobName, ChannelName) whose problems they name more
    clearly than a model's bare length or pattern does: a report keeps ours alone for those."""
    names, channels = _job_name_problems(request), _channel_problems(request)
    problems = (
        names
        + channels
        + _shared_pipe_problems(request)
        + _hyperparameter_problems(request)
        + _control_character_problems(request)
        + _credential_problems(request)
        + _spot_problems(request)
        + _vpc_problems(request)
        + _volume_key_problems(request)
        + _local_path_problems(request)
    )
    covered = [field for field, found in (("TrainingJobName", names), ("ChannelName", channels)) if found]
    return problems, covered
