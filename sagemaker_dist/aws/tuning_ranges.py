"""The searched hyperparameters of a tuning job: ranges as SageMaker takes them (Integer and
Continuous with a scaling, Categorical), parsed from the CLI's ``--range``, plain values or
``sagemaker.core.parameter``'s classes, and checked against SageMaker's rules for each. Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sagemaker_dist.contract import hyperparameters as hp
from sagemaker_dist.errors import ConfigurationError

INTEGER, CONTINUOUS, CATEGORICAL = "Integer", "Continuous", "Categorical"
SCALING_TYPES = ("Auto", "Linear", "Logarithmic", "ReverseLogarithmic")
# what --range NAME=MIN:MAX:<scale> accepts, besides SageMaker's own names
SCALING_ALIASES = {
    "auto": "Auto",
    "linear": "Linear",
    "log": "Logarithmic",
    "reverse-log": "ReverseLogarithmic",
}
MAX_CATEGORICAL_VALUES = 30


class TuningError(ConfigurationError):
    """A tuning job that cannot work as asked; raised before anything is created."""


def _number(text: str, name: str, what: str) -> int | float:
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise TuningError(f"range {name!r}: {what} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise TuningError(f"range {name!r}: {what} {text!r} is not a finite number")
    return value


def format_number(value: int | float) -> str:
    """A range bound or a sampled value as SageMaker and the script get it (``0.001``, ``1e-05``, ``32``)."""
    return str(int(value)) if isinstance(value, int) else repr(float(value))


@dataclass(frozen=True)
class ParamRange:
    """One searched hyperparameter: an Integer or Continuous ``[min, max]`` with a scaling, or
    Categorical ``values`` (strings, as SageMaker passes them)."""

    name: str
    kind: str
    min_value: int | float | None = None
    max_value: int | float | None = None
    scaling: str = "Auto"
    values: tuple[str, ...] = ()

    def __post_init__(self):
        self._check()

    def _check(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name:
            raise TuningError(f"a range needs a hyperparameter name; got {name!r}")
        if self.kind == CATEGORICAL:
            if not self.values:
                raise TuningError(f"range {name!r} is empty; give at least two values: {name}=A,B")
            if len(self.values) < 2:
                raise TuningError(
                    f"range {name!r} has one value ({self.values[0]!r}); give at least two, or set it as a "
                    "static hyperparameter instead (--hp / hyperparameters=)"
                )
            if len(set(self.values)) != len(self.values):
                raise TuningError(f"range {name!r} repeats values: {', '.join(self.values)}")
            if len(self.values) > MAX_CATEGORICAL_VALUES:
                raise TuningError(
                    f"range {name!r} has {len(self.values)} values; SageMaker allows at most "
                    f"{MAX_CATEGORICAL_VALUES} per categorical hyperparameter"
                )
            if any(not v.strip() for v in self.values):
                raise TuningError(f"range {name!r} has an empty value: {list(self.values)!r}")
            return
        if self.kind not in (INTEGER, CONTINUOUS):
            raise TuningError(
                f"range {name!r} has kind {self.kind!r}; use Integer, Continuous or Categorical"
            )
        if self.scaling not in SCALING_TYPES:
            raise TuningError(
                f"range {name!r} has scaling {self.scaling!r}; use one of {', '.join(SCALING_ALIASES)} "
                f"(SageMaker: {', '.join(SCALING_TYPES)})"
            )
        lo, hi = self.min_value, self.max_value
        if lo is None or hi is None:
            raise TuningError(f"range {name!r} needs both a minimum and a maximum: {name}=MIN:MAX")
        if not lo < hi:
            raise TuningError(f"range {name!r}: minimum {lo} must be less than maximum {hi}")
        if self.scaling == "Logarithmic" and lo <= 0:
            raise TuningError(f"range {name!r}: a logarithmic range needs a minimum above 0 (got {lo})")
        if self.scaling == "ReverseLogarithmic":
            if self.kind == INTEGER:
                raise TuningError(
                    f"range {name!r}: reverse-logarithmic scaling is for continuous ranges only"
                )
            if not (0 <= lo and hi < 1):
                raise TuningError(
                    f"range {name!r}: reverse-logarithmic scaling needs 0 <= minimum < maximum < 1 "
                    f"(got {lo}:{hi})"
                )

    @property
    def grid_size(self) -> int | None:
        return len(self.values) if self.kind == CATEGORICAL else None

    def as_request(self) -> dict:
        """The range as CreateHyperParameterTuningJob takes it."""
        if self.kind == CATEGORICAL:
            return {"Name": self.name, "Values": list(self.values)}
        return {
            "Name": self.name,
            "MinValue": format_number(self.min_value),
            "MaxValue": format_number(self.max_value),
            "ScalingType": self.scaling,
        }

    def describe(self) -> str:
        if self.kind == CATEGORICAL:
            return f"{self.name} in {{{', '.join(self.values)}}}"
        scale = "" if self.scaling in ("Auto", "Linear") else f", {self.scaling.lower()}"
        bounds = f"{format_number(self.min_value)}, {format_number(self.max_value)}"
        return f"{self.name} {self.kind.lower()} [{bounds}{scale}]"


def parse_range(name: str, spec: str) -> ParamRange:
    """``MIN:MAX[:scale]`` (integers if both bounds are; scale log, linear, reverse-log, auto) or
    ``A,B,C`` (categorical)."""
    text = spec.strip()
    if not text:
        raise TuningError(f"range {name!r} is empty; give MIN:MAX[:log] or A,B,C")
    if ":" in text and "," not in text:
        parts = text.split(":")
        if len(parts) not in (2, 3) or not all(p.strip() for p in parts):
            raise TuningError(
                f"range {name!r}: {spec!r} is not MIN:MAX or MIN:MAX:SCALE (e.g. 1e-4:1e-2:log)"
            )
        lo, hi = _number(parts[0], name, "minimum"), _number(parts[1], name, "maximum")
        scaling = "Auto"
        if len(parts) == 3:
            key = parts[2].strip()
            scaling = SCALING_ALIASES.get(key.lower(), key)
            if scaling not in SCALING_TYPES:
                raise TuningError(f"range {name!r}: scale {key!r} is not one of {', '.join(SCALING_ALIASES)}")
        kind = INTEGER if isinstance(lo, int) and isinstance(hi, int) else CONTINUOUS
        if kind == CONTINUOUS:
            lo, hi = float(lo), float(hi)
        return ParamRange(name, kind, lo, hi, scaling)
    return ParamRange(name, CATEGORICAL, values=tuple(v.strip() for v in text.split(",")))


def parse_range_option(text: str) -> ParamRange:
    """``NAME=MIN:MAX[:log]`` or ``NAME=A,B,C`` (the CLI's --range)."""
    name, sep, spec = text.partition("=")
    if not sep or not name.strip():
        raise TuningError(f"--range {text!r} is not NAME=MIN:MAX[:log] or NAME=A,B,C")
    return parse_range(name.strip(), spec)


def to_range(name: str, value) -> ParamRange:
    """A range from what users pass: a ``ParamRange``, a spec string, a list of categorical values,
    or one of ``sagemaker.core.parameter``'s ``IntegerParameter``, ``ContinuousParameter`` and
    ``CategoricalParameter``."""
    if isinstance(value, ParamRange):
        if value.name == name:
            return value
        return ParamRange(name, value.kind, value.min_value, value.max_value, value.scaling, value.values)
    if isinstance(value, str):
        return parse_range(name, value)
    if isinstance(value, (list, tuple)):
        return ParamRange(name, CATEGORICAL, values=tuple(hp.encode_value(v) for v in value))
    sdk = _sdk_range(name, value)
    if sdk is not None:
        return sdk
    raise TuningError(
        f"range {name!r} is a {type(value).__name__}; give 'MIN:MAX[:log]', 'A,B,C', a list of values or a "
        "sagemaker.core.parameter IntegerParameter / ContinuousParameter / CategoricalParameter"
    )


def _sdk_range(name: str, value) -> ParamRange | None:
    try:
        from sagemaker.core.parameter import CategoricalParameter, ContinuousParameter, IntegerParameter
    except ImportError:  # the SDK is not installed: then nobody passed one of its classes
        return None
    if isinstance(value, CategoricalParameter):
        return ParamRange(name, CATEGORICAL, values=tuple(str(v) for v in value.values))
    scaling = str(getattr(value, "scaling_type", "Auto"))
    if isinstance(value, IntegerParameter):
        return ParamRange(name, INTEGER, int(value.min_value), int(value.max_value), scaling)
    if isinstance(value, ContinuousParameter):
        return ParamRange(name, CONTINUOUS, float(value.min_value), float(value.max_value), scaling)
    return None
