"""Check a whole CreateHyperParameterTuningJob request before any AWS call: botocore's model of the
operation, the limits it does not encode (100 hyperparameters in all, 30 searched, 32-character
names, Hyperband without early stopping, Grid with categorical ranges only), and a trial's own
CreateTrainingJob request through the launch checks.
"""

from __future__ import annotations

from collections.abc import Mapping

from sagemaker_dist.aws.request_validation import service_model_problems
from sagemaker_dist.aws.tuning import (
    MAX_SEARCHED,
    MAX_TUNING_JOB_NAME,
    OPERATION,
    TUNING_JOB_NAME_RE,
    TUNING_OBJECTIVE_HYPERPARAMETER,
    TuningSpec,
    sample_values,
)
from sagemaker_dist.aws.tuning_ranges import TuningError
from sagemaker_dist.contract.metric_line import defined_names
from sagemaker_dist.contract.request_rules import MAX_HYPERPARAMETERS, limit_problems
from sagemaker_dist.contract.training_request import RequestFormatError, TrainingRequest, trial_request


class TuningRequestError(TuningError):
    """A CreateHyperParameterTuningJob request SageMaker would reject; every problem listed."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"the tuning job request has {len(self.problems)} problem(s):\n{lines}")


def tuning_problems(request: Mapping, spec: TuningSpec) -> list[str]:
    """Everything SageMaker would refuse in ``request``: botocore's model of the operation, then the
    limits it does not encode, then a trial's CreateTrainingJob request through the launch checks."""
    problems = service_model_problems(request, OPERATION)
    config = request.get("HyperParameterTuningJobConfig") or {}
    definition = request.get("TrainingJobDefinition") or {}
    name = request.get("HyperParameterTuningJobName")
    if not isinstance(name, str) or not TUNING_JOB_NAME_RE.match(name):
        problems.append(f"tuning job name {name!r}: 1-{MAX_TUNING_JOB_NAME} letters, digits and hyphens")
    objective = (config.get("HyperParameterTuningJobObjective") or {}).get("MetricName")
    trial, definitions = None, ()
    if definition:  # a trial's request, as SageMaker would make it (a stand-in value for each range)
        values = {**sample_values(spec), TUNING_OBJECTIVE_HYPERPARAMETER: str(objective)}
        trial = trial_request(request, f"{name or 'tune'}-001-00000000"[:63], values)
        try:
            definitions = TrainingRequest.parse(trial).metric_definitions
        except RequestFormatError as exc:
            problems.append(f"each trial's training job: {exc}")
    if objective not in defined_names(definitions):
        problems.append(f"objective metric {objective!r} has no MetricDefinition")
    ranges = config.get("ParameterRanges") or {}
    searched = sum(len(v or []) for v in ranges.values())
    if searched > MAX_SEARCHED:
        problems.append(f"{searched} searched hyperparameters; at most {MAX_SEARCHED}")
    static = definition.get("StaticHyperParameters") or {}
    total = len(static) + searched + 1
    if total > MAX_HYPERPARAMETERS:
        problems.append(
            f"{total} hyperparameters (static + searched + {TUNING_OBJECTIVE_HYPERPARAMETER}); at most "
            f"{MAX_HYPERPARAMETERS}"
        )
    limits = config.get("ResourceLimits") or {}
    jobs, parallel = limits.get("MaxNumberOfTrainingJobs"), limits.get("MaxParallelTrainingJobs")
    if isinstance(jobs, int) and isinstance(parallel, int) and parallel > jobs:
        problems.append(f"MaxParallelTrainingJobs {parallel} > MaxNumberOfTrainingJobs {jobs}")
    if config.get("Strategy") == "Hyperband" and config.get("TrainingJobEarlyStoppingType", "Off") != "Off":
        problems.append("Hyperband needs TrainingJobEarlyStoppingType Off")
    numeric = ranges.get("IntegerParameterRanges") or ranges.get("ContinuousParameterRanges")
    if config.get("Strategy") == "Grid" and numeric:
        problems.append("Grid takes categorical ranges only")
    if trial is not None:
        problems += [f"each trial's training job: {p}" for p in limit_problems(trial)]
    return problems


def validate_tuning_request(request: Mapping, spec: TuningSpec) -> Mapping:
    """Raise TuningRequestError listing every problem; return ``request`` unchanged if none."""
    problems = tuning_problems(request, spec)
    if problems:
        raise TuningRequestError(problems)
    return request
