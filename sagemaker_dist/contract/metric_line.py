"""The one machine-readable metric line a job prints per epoch, and the regexes that read it back.

The runtime's Keras helpers print, from the chief only, one line per epoch with every metric:

    sagemaker-dist-metrics: epoch=3 loss=1.8211 accuracy=0.3125 val_loss=1.9032 val_accuracy=0.28125

``name=value`` pairs are also Katib's StdOut collector format (its default filter), and SageMaker's
MetricDefinitions read the same line with ``metric_regex``. On SageMaker the toolkit runs the script
under ``mpirun --tag-output``, so CloudWatch holds ``[1,mpirank:0,algo-1]<stdout>:sagemaker-dist-...``
(horovod#2527): the regexes are not anchored and match behind any tag. ``epoch`` counts finished
epochs from 1. Only finite values are printed (a diverged metric is left out, not printed as nan).
Stdlib only: the runtime prints the line, the SDK side writes the regexes, local mode reads both.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

PREFIX = "sagemaker-dist-metrics:"
EPOCH = "epoch"
# Names the line can carry: Keras metric names, and the characters Katib's filter takes ([\w|-]+).
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,127}$")
# One capture group first (SageMaker takes group 1), plain syntax only (no look-arounds, no (?:...)).
NUMBER = r"([-+]?[0-9]*[.]?[0-9]+([eE][-+]?[0-9]+)?)"
MAX_METRIC_DEFINITIONS = 40  # CreateTrainingJob / CreateHyperParameterTuningJob MetricDefinitions
DEFAULT_METRICS = ("loss", "accuracy", "val_loss", "val_accuracy")  # what Keras prints for the demo


def format_value(value: float) -> str:
    return format(float(value), ".8g")


def metric_line(epoch: int, logs: Mapping) -> str | None:
    """The line for ``epoch`` (finished epochs, from 1) and Keras ``logs``; None when nothing is finite.

    Values that are not numbers (or not finite) and names the regexes cannot carry are left out.
    """
    pairs = [f"{EPOCH}={int(epoch)}"]
    for name, value in logs.items():
        if name == EPOCH or not isinstance(name, str) or not NAME_RE.match(name):
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            pairs.append(f"{name}={format_value(number)}")
    return f"{PREFIX} {' '.join(pairs)}" if len(pairs) > 1 else None


def check_metric_name(name: str) -> str:
    """``name`` if the line can carry it; ValueError naming the rule otherwise."""
    if not isinstance(name, str) or not NAME_RE.match(name) or name == EPOCH:
        raise ValueError(
            f"metric name {name!r} cannot be reported on the metric line: use letters, digits, '_' and "
            f"'-', starting with a letter or '_', at most 128 characters (and not {EPOCH!r})"
        )
    return name


def metric_regex(name: str) -> str:
    """The regex (group 1: the value) that finds ``name`` on the metric line, behind any prefix."""
    return f"{re.escape(PREFIX)}.* {re.escape(check_metric_name(name))}={NUMBER}"


EPOCH_REGEX = f"{re.escape(PREFIX)} {EPOCH}=([0-9]+)"


def metric_definitions(names: Iterable[str]) -> list[dict[str, str]]:
    """SageMaker MetricDefinitions for ``names`` (order kept, repeats dropped)."""
    seen: list[str] = []
    for name in names:
        if name not in seen:
            seen.append(check_metric_name(name))
    return [{"Name": name, "Regex": metric_regex(name)} for name in seen]


def read_metrics(line: str, definitions: Iterable[Mapping[str, str]]) -> tuple[int | None, dict[str, float]]:
    """The epoch and the metrics that ``definitions`` find in one output ``line`` (as SageMaker does); a
    definition whose regex has no group, or whose group is not a number there, finds nothing."""
    values = {}
    for d in definitions:
        match = re.search(d["Regex"], line)
        if match:
            try:
                values[d["Name"]] = float(match.group(1))
            except (ValueError, IndexError):
                continue
    epoch = re.search(EPOCH_REGEX, line)
    return (int(epoch.group(1)) if epoch else None), values


def defined_names(definitions: Iterable[Mapping[str, str]]) -> list[str]:
    """The metric names that MetricDefinitions define."""
    return [d.get("Name") for d in definitions]
