"""Check a whole CreateTrainingJob request before any AWS call.

Two layers: botocore's own SageMaker service model (types, required members, and the min/max/pattern
constraints botocore ships but does not enforce), then the request's rules (``contract.request_rules``:
the limits that make jobs fail late or hang). All problems are reported at once, each saying what to
change. The rules' names are kept here too, where callers found them before they moved.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping

from sagemaker_dist.contract.request_rules import (  # noqa: F401 - the rules' names, kept here too
    ACCESS_KEY_ID_RE,
    CONTROL_CHARACTER_RE,
    INPUT_MODES,
    JOB_NAME_RE,
    MAX_HYPERPARAMETER_KEY,
    MAX_HYPERPARAMETER_VALUE,
    MAX_HYPERPARAMETERS,
    MAX_JOB_NAME,
    OPERATION,
    PROCESSES_PER_HOST_HYPERPARAMETER,
    SECRET_KEY_NAME_RE,
    SECRET_VALUE_RE,
    RequestValidationError,
    has_local_nvme,
    limit_problems,
    looks_like_secret_key,
    rule_report,
)


@functools.lru_cache(maxsize=4)
def _input_shape(operation: str = OPERATION):
    """An operation's input shape from botocore's bundled model (loaded from disk, no network)."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    return model.operation_model(operation).input_shape


@functools.lru_cache(maxsize=256)
def _pattern(pattern: str) -> re.Pattern | None:
    try:
        return re.compile(pattern, re.DOTALL)
    except re.error:  # Java-only syntax (e.g. \p{L}); the service checks it
        return None


def _constraint_problems(value, shape, path: str) -> Iterator[str]:
    """The max-length, max-value and pattern constraints of the model that botocore does not check."""
    meta = shape.metadata
    kind = shape.type_name
    if kind == "structure" and isinstance(value, Mapping):
        for name, member in shape.members.items():
            if name in value:
                yield from _constraint_problems(value[name], member, f"{path}.{name}")
    elif kind == "list" and isinstance(value, list):
        if "max" in meta and len(value) > meta["max"]:
            yield f"{path} has {len(value)} entries; at most {meta['max']} allowed"
        for i, item in enumerate(value):
            yield from _constraint_problems(item, shape.member, f"{path}[{i}]")
    elif kind == "map" and isinstance(value, Mapping):
        if "max" in meta and len(value) > meta["max"]:
            yield f"{path} has {len(value)} entries; at most {meta['max']} allowed"
        for k, v in value.items():
            yield from _constraint_problems(k, shape.key, f"{path} key {k!r}")
            yield from _constraint_problems(v, shape.value, f"{path}[{k!r}]")
    elif kind == "string" and isinstance(value, str):
        if "max" in meta and len(value) > meta["max"]:
            yield f"{path} is {len(value)} characters; at most {meta['max']} allowed"
        if shape.enum and value not in shape.enum:
            allowed = ", ".join(shape.enum[:12]) + (" ..." if len(shape.enum) > 12 else "")
            yield f"{path} is {value!r}; allowed: {allowed} (if it is new, upgrade botocore)"
        pattern = _pattern(meta["pattern"]) if "pattern" in meta else None
        if pattern is not None and not pattern.fullmatch(value):
            yield f"{path} {value!r} does not match the pattern {meta['pattern']!r}"
    elif kind in ("integer", "long") and isinstance(value, int):
        if "max" in meta and value > meta["max"]:
            yield f"{path} is {value}; at most {meta['max']} allowed"


def service_model_problems(request: Mapping, operation: str = OPERATION) -> list[str]:
    """Problems botocore's SageMaker model finds in ``operation``'s request (CreateTrainingJob by
    default): types and required members, then max and pattern."""
    from botocore.validate import ParamValidator

    shape = _input_shape(operation)
    report = ParamValidator().validate(dict(request), shape)
    problems = []
    if report.has_errors():
        problems += [line.strip() for line in report.generate_report().splitlines() if line.strip()]
    problems += list(_constraint_problems(request, shape, operation))
    return problems


def validate_request(request: Mapping) -> Mapping:
    """Raise RequestValidationError listing every problem in ``request``; return it unchanged if none."""
    # On names our messages say more than the model's bare length or pattern: keep one per subject.
    problems, covered = rule_report(request)
    problems += [p for p in service_model_problems(request) if not any(f in p for f in covered)]
    if problems:
        raise RequestValidationError(problems)
    return request
