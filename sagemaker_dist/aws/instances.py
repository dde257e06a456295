"""GPUs per SageMaker training instance type: how many Horovod processes one host runs.

The table is ours (kept and tested here) so that the planner works without the SageMaker SDK and
covers families newer than the SDK's own ``instance_gpu_info.json``. For trn1 the count is the
number of NeuronCores, the unit one worker process drives.
"""

from __future__ import annotations

import difflib
import re

from sagemaker_dist.errors import ConfigurationError

# ml.<family>.<size> -> accelerators per instance (NVIDIA GPUs; NeuronCores for trn1/trn1n).
_FAMILIES: dict[str, dict[str, int]] = {
    "p2": {"xlarge": 1, "8xlarge": 8, "16xlarge": 16},
    "p3": {"2xlarge": 1, "8xlarge": 4, "16xlarge": 8},
    "p3dn": {"24xlarge": 8},
    "p4d": {"24xlarge": 8},
    "p4de": {"24xlarge": 8},
    "p5": {"48xlarge": 8},
    "p5e": {"48xlarge": 8},
    "p5en": {"48xlarge": 8},
    "g4dn": {"xlarge": 1, "2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "16xlarge": 1, "12xlarge": 4},
    "g5": {
        "xlarge": 1,
        "2xlarge": 1,
        "4xlarge": 1,
        "8xlarge": 1,
        "16xlarge": 1,
        "12xlarge": 4,
        "24xlarge": 4,
        "48xlarge": 8,
    },
    "g6": {
        "xlarge": 1,
        "2xlarge": 1,
        "4xlarge": 1,
        "8xlarge": 1,
        "16xlarge": 1,
        "12xlarge": 4,
        "24xlarge": 4,
        "48xlarge": 8,
    },
    "g6e": {
        "xlarge": 1,
        "2xlarge": 1,
        "4xlarge": 1,
        "8xlarge": 1,
        "16xlarge": 1,
        "12xlarge": 4,
        "24xlarge": 4,
        "48xlarge": 8,
    },
    "trn1": {"2xlarge": 2, "32xlarge": 32},
    "trn1n": {"32xlarge": 32},
}

GPU_INSTANCE_TYPES: dict[str, int] = {
    f"ml.{family}.{size}": count for family, sizes in _FAMILIES.items() for size, count in sizes.items()
}
NEURON_FAMILIES = frozenset({"trn1", "trn1n"})
# CPU families (c5, m5d, r6i, t3, ...): their names look like GPU ones (c5 ~ g5) but have no GPUs.
_CPU_FAMILY_RE = re.compile(r"[cmrt]\d+[a-z]*")


class UnknownInstanceTypeError(ConfigurationError):
    """An instance type missing from the catalog (typo, CPU type, or a family newer than the table)."""


class ProcessesPerHostError(ConfigurationError):
    """A processes-per-host override that is not a count, or more processes than a type has GPUs."""


def normalize_instance_type(instance_type: str) -> str:
    """``p3.16xlarge`` or ``ML.P3.16XLARGE`` -> ``ml.p3.16xlarge``."""
    if not isinstance(instance_type, str) or not instance_type.strip():
        raise UnknownInstanceTypeError(
            f"instance type {instance_type!r} is empty; give a SageMaker type such as 'ml.p3.16xlarge'"
        )
    name = instance_type.strip().lower()
    return name if name.startswith("ml.") else f"ml.{name}"


def _family(name: str) -> str:
    return name.split(".")[1] if name.count(".") >= 2 else ""


def is_cpu_family(instance_type: str) -> bool:
    """Whether ``instance_type`` is of a CPU family (ml.c5.18xlarge, ml.m5.xlarge, ...)."""
    return bool(_CPU_FAMILY_RE.fullmatch(_family(normalize_instance_type(instance_type))))


def close_matches(instance_type: str, limit: int = 5) -> list[str]:
    """Catalog types that look like ``instance_type``: same family first, then by spelling.

    None for CPU families: ml.c5.18xlarge is not a misspelt ml.g5.16xlarge.
    """
    name = normalize_instance_type(instance_type)
    family = _family(name)
    if is_cpu_family(name):
        return []
    same_family = [t for t in GPU_INSTANCE_TYPES if t.split(".")[1] == family]
    spelled = difflib.get_close_matches(name, list(GPU_INSTANCE_TYPES), n=limit, cutoff=0.6)
    ranked = [t for t in spelled if t in same_family] + same_family + spelled
    return list(dict.fromkeys(ranked))[:limit]


def gpus_per_instance(instance_type: str) -> int:
    """Accelerators on one instance of ``instance_type`` (``ml.`` prefix optional).

    Raises UnknownInstanceTypeError naming close matches and the ``processes_per_host=`` override.
    """
    name = normalize_instance_type(instance_type)
    try:
        return GPU_INSTANCE_TYPES[name]
    except KeyError:
        pass
    if is_cpu_family(name):
        raise UnknownInstanceTypeError(
            f"{instance_type!r} is a CPU instance type (no GPUs); give the number of worker processes "
            "per instance yourself: processes_per_host=N (CLI: --processes-per-host N)"
        )
    matches = close_matches(name)
    suggestion = f"Did you mean {', '.join(matches)}? " if matches else ""
    raise UnknownInstanceTypeError(
        f"unknown GPU instance type {instance_type!r}. {suggestion}"
        "For a type missing from sagemaker-dist's table (or a CPU type), pass the number of worker "
        "processes per instance yourself: processes_per_host=N (CLI: --processes-per-host N)."
    )


def processes_per_host(instance_type: str, override: int | None = None) -> int:
    """Worker processes per host: the type's GPUs, or ``override`` (needed for CPU and unlisted types).

    The one rule the CLI and the estimator share: an override must be a whole number >= 1 and, on a
    type whose GPU count is known, at most that count (Horovod runs one process per GPU). Fewer
    processes than GPUs is allowed.
    """
    if override is None:
        return gpus_per_instance(instance_type)
    if isinstance(override, bool) or not isinstance(override, int) or override < 1:
        raise ProcessesPerHostError(
            f"processes per host {override!r} for {instance_type!r} must be a whole number >= 1 "
            "(the number of worker processes per instance)"
        )
    try:
        gpus = gpus_per_instance(instance_type)
    except UnknownInstanceTypeError:
        return override  # CPU or unlisted type: the caller knows best
    if override > gpus:
        raise ProcessesPerHostError(
            f"{override} processes per host but {normalize_instance_type(instance_type)} has {gpus} "
            f"GPU(s); Horovod runs one process per GPU, so use at most {gpus} "
            "(processes_per_host= / --processes-per-host)"
        )
    return override
