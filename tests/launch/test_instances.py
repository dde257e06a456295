"""The instance catalog: GPU counts per SageMaker training type, and the unknown-type error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sagemaker_dist.aws.instances import (
    GPU_INSTANCE_TYPES,
    ProcessesPerHostError,
    UnknownInstanceTypeError,
    close_matches,
    gpus_per_instance,
    normalize_instance_type,
    processes_per_host,
)

# Published GPU counts (AWS instance pages), one line per family the issue names.
EXPECTED = {
    "ml.p3.2xlarge": 1,
    "ml.p3.8xlarge": 4,
    "ml.p3.16xlarge": 8,
    "ml.p3dn.24xlarge": 8,
    "ml.p4d.24xlarge": 8,
    "ml.p4de.24xlarge": 8,
    "ml.p5.48xlarge": 8,
    "ml.p5e.48xlarge": 8,
    "ml.p5en.48xlarge": 8,
    "ml.g4dn.xlarge": 1,
    "ml.g4dn.12xlarge": 4,
    "ml.g4dn.16xlarge": 1,
    "ml.g5.xlarge": 1,
    "ml.g5.12xlarge": 4,
    "ml.g5.24xlarge": 4,
    "ml.g5.48xlarge": 8,
    "ml.g6.xlarge": 1,
    "ml.g6.12xlarge": 4,
    "ml.g6.48xlarge": 8,
    "ml.g6e.2xlarge": 1,
    "ml.g6e.24xlarge": 4,
    "ml.g6e.48xlarge": 8,
    "ml.trn1.2xlarge": 2,
    "ml.trn1.32xlarge": 32,
}


@pytest.mark.parametrize("instance_type, gpus", sorted(EXPECTED.items()))
def test_known_types(instance_type, gpus):
    assert gpus_per_instance(instance_type) == gpus


def test_every_family_the_issue_names_is_covered():
    families = {t.split(".")[1] for t in GPU_INSTANCE_TYPES}
    assert {"p3", "p3dn", "p4d", "p4de", "p5", "p5e", "p5en", "g4dn", "g5", "g6", "g6e"} <= families


@pytest.mark.parametrize("spelling", ["p3.16xlarge", "ML.P3.16XLARGE", "  ml.p3.16xlarge "])
def test_spellings_normalise(spelling):
    assert normalize_instance_type(spelling) == "ml.p3.16xlarge"
    assert gpus_per_instance(spelling) == 8


def _sdk_gpu_table() -> dict[str, int]:
    """sagemaker-core's instance_gpu_info.json (all regions merged), if the SDK is installed."""
    try:
        import sagemaker.core
    except ImportError:
        return {}
    path = next(Path(sagemaker.core.__file__).parent.rglob("instance_gpu_info.json"), None)
    if path is None:
        return {}
    table: dict[str, int] = {}
    for region in json.loads(path.read_text()).values():
        for name, info in region.items():
            table[name] = info["Count"]
    return table


def test_agrees_with_sagemaker_core_table():
    sdk = _sdk_gpu_table()
    if not sdk:
        pytest.skip("sagemaker-core's instance_gpu_info.json is not installed")
    shared = sorted(set(sdk) & set(GPU_INSTANCE_TYPES))
    assert len(shared) >= 20
    assert {t: sdk[t] for t in shared} == {t: GPU_INSTANCE_TYPES[t] for t in shared}
    # Every type of a family we keep that the SDK knows is in our table too (the SDK's typo
    # 'ml.g5n.xlarge' is a family of its own, so it does not count).
    ours = {t.split(".")[1] for t in GPU_INSTANCE_TYPES}
    missing = [t for t in sdk if t.split(".")[1] in ours and t not in GPU_INSTANCE_TYPES]
    assert missing == []


def test_unknown_size_lists_the_family_and_override():
    with pytest.raises(UnknownInstanceTypeError) as info:
        gpus_per_instance("ml.p4d.48xlarge")
    message = str(info.value)
    assert "ml.p4d.48xlarge" in message
    assert "ml.p4d.24xlarge" in message
    assert "processes_per_host=N" in message and "gpus_per_instance=" not in message  # no such parameter
    assert isinstance(info.value, ValueError)


def test_typo_suggests_the_closest_spelling_first():
    assert close_matches("ml.g5.12xlarg")[0] == "ml.g5.12xlarge"
    with pytest.raises(UnknownInstanceTypeError, match=r"Did you mean ml\.g5\.12xlarge"):
        gpus_per_instance("ml.g5.12xlarg")


@pytest.mark.parametrize("bad", ["", "   ", None, 8])
def test_empty_or_non_string(bad):
    with pytest.raises(UnknownInstanceTypeError, match="instance type"):
        gpus_per_instance(bad)


def test_cpu_type_needs_the_override():
    with pytest.raises(UnknownInstanceTypeError, match="CPU instance type.*processes_per_host=N") as info:
        processes_per_host("ml.c5.18xlarge")
    assert "Did you mean" not in str(info.value)  # not a misspelt ml.g5.16xlarge
    assert close_matches("ml.c5.18xlarge") == close_matches("ml.m5d.xlarge") == []
    assert close_matches("ml.trn1.xlarge")[0].startswith("ml.trn1.")  # trn1 is not a CPU family
    assert processes_per_host("ml.c5.xlarge", 2) == 2
    assert processes_per_host("ml.p3.16xlarge") == 8
    assert processes_per_host("ml.p3.16xlarge", 4) == 4  # fewer processes than GPUs is allowed


@pytest.mark.parametrize("override", [0, -1, 1.5, True, "4"])
def test_bad_override(override):
    with pytest.raises(ProcessesPerHostError, match="must be a whole number >= 1"):
        processes_per_host("ml.p3.16xlarge", override)


def test_more_processes_than_gpus_is_refused_on_a_gpu_type_only():
    with pytest.raises(ProcessesPerHostError, match="9 processes per host but ml.p3.16xlarge has 8 GPU"):
        processes_per_host("ml.p3.16xlarge", 9)
    assert processes_per_host("ml.p3.16xlarge", 8) == 8
    assert processes_per_host("ml.c5.18xlarge", 72) == 72  # CPU: the caller knows
