"""Hyperparameter tuning over the same distributed job: the search described once (``TuningSpec``), the
CreateHyperParameterTuningJob request rendered from the CreateTrainingJob request ``launch`` renders
(one place renders the training job), and each trial's training request expanded back from it.

Pure: no AWS call, no clock. SageMaker (``launch/tuning_job.py``), this machine (``local/tuning.py``,
Optuna) and Katib (``platforms/katib.py``) all start from a ``TuningSpec`` and the same request.

The training definition keeps the request's static hyperparameters (the MPI settings and the layout
included) minus the tuned ones, its channels and manifests (sharded once, shared by every trial), and
gets MetricDefinitions whose regexes read the runtime's metric line behind mpirun's tag
(``contract/metric_line.py``). The ranges are ``tuning_ranges``'s; the whole request is checked
against SageMaker's limits by ``tuning_validation``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import product

from sagemaker_dist.aws.tuning_ranges import (
    CATEGORICAL,
    CONTINUOUS,
    INTEGER,
    ParamRange,
    TuningError,
    format_number,
    to_range,
)
from sagemaker_dist.contract import hyperparameters as hp
from sagemaker_dist.contract.distributions import Distribution, distribution
from sagemaker_dist.contract.layout import layout_of
from sagemaker_dist.contract.metric_line import (
    DEFAULT_METRICS,
    MAX_METRIC_DEFINITIONS,
    check_metric_name,
    metric_definitions,
)
from sagemaker_dist.contract.request_rules import MAX_HYPERPARAMETERS
from sagemaker_dist.contract.training_request import TrainingRequest, training_definition, trial_request

OPERATION = "CreateHyperParameterTuningJob"
STRATEGIES = ("Bayesian", "Random", "Hyperband", "Grid")
OBJECTIVE_TYPES = ("Maximize", "Minimize")
EARLY_STOPPING = ("Off", "Auto")
WARM_START_TYPES = ("IdenticalDataAndAlgorithm", "TransferLearning")
TUNING_OBJECTIVE_HYPERPARAMETER = "_tuning_objective_metric"  # SageMaker adds it to every trial
MAX_TUNING_JOB_NAME = 32
TUNING_JOB_NAME_RE = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,31}$")
MAX_SEARCHED = 30  # hyperparameters that can be searched
MAX_TRAINING_JOBS = 750  # Bayesian, Hyperband and Grid (Random's default quota too; it can be raised)
MAX_PARALLEL_JOBS = 100
MAX_WARM_START_PARENTS = 5
EPOCHS_HYPERPARAMETERS = ("epochs", "num_epochs", "n_epochs", "n-epochs", "numepochs")


def default_tuning_job_name(base: str, now: datetime | None = None) -> str:
    """``base-YYmmdd-HHMMSS`` within SageMaker's 32 characters for tuning job names."""
    now = now or datetime.now(timezone.utc)
    stamp = now.strftime("%y%m%d-%H%M%S")
    base = re.sub(r"[^A-Za-z0-9-]", "-", base)[: MAX_TUNING_JOB_NAME - len(stamp) - 1].strip("-") or "tune"
    return f"{base}-{stamp}"


def check_tuning_job_name(name: str) -> str:
    if not isinstance(name, str) or len(name) > MAX_TUNING_JOB_NAME or not TUNING_JOB_NAME_RE.match(name):
        raise TuningError(
            f"tuning job name {name!r} is not valid: SageMaker allows 1-{MAX_TUNING_JOB_NAME} letters, "
            "digits and hyphens, starting and ending with a letter or digit; choose a shorter name (or "
            "leave it out for a time-stamped one)"
        )
    return name


@dataclass(frozen=True)
class TuningSpec:
    """What to search and how: the objective, the ranges, the budget, the strategy. ``build`` checks
    everything that needs no request; ``max_jobs`` may be None for Grid (every combination once)."""

    objective_metric: str
    objective_type: str
    ranges: tuple[ParamRange, ...]
    max_jobs: int | None
    max_parallel_jobs: int = 1
    strategy: str = "Bayesian"
    early_stopping: str = "Off"
    metrics: tuple[str, ...] = DEFAULT_METRICS
    warm_start_parents: tuple[str, ...] = ()
    warm_start_type: str = "IdenticalDataAndAlgorithm"
    seed: int | None = None

    @classmethod
    def build(
        cls,
        *,
        objective_metric: str,
        ranges,
        max_jobs: int | None = None,
        max_parallel_jobs: int = 1,
        objective_type: str = "Maximize",
        strategy: str = "Bayesian",
        early_stopping: str = "Off",
        metrics: Sequence[str] | None = None,
        warm_start=None,
        seed: int | None = None,
    ) -> TuningSpec:
        """Check the search and return it; every problem raises a TuningError naming what to change.

        ``ranges`` maps names to ranges (see ``to_range``) or is a sequence of ``ParamRange``.
        ``metrics`` are the metric names the job reports (default loss, accuracy, val_loss,
        val_accuracy) plus the objective. ``warm_start`` is a parent tuning job name, a list of them,
        or ``{"parents": [...], "type": "IdenticalDataAndAlgorithm" | "TransferLearning"}``.
        """
        parsed = _ranges(ranges)
        objective_type = _choice(objective_type, OBJECTIVE_TYPES, "objective type")
        strategy = _choice(strategy, STRATEGIES, "strategy")
        early_stopping = _choice(early_stopping, EARLY_STOPPING, "early stopping")
        names = list(DEFAULT_METRICS if metrics is None else metrics)
        try:
            for name in [*names, objective_metric]:
                check_metric_name(name)
        except ValueError as exc:
            raise TuningError(str(exc)) from None
        if objective_metric not in names:
            raise TuningError(
                f"objective metric {objective_metric!r} is not one the job reports ({', '.join(names)}); "
                "name one of them, or add it to the metrics (metrics=[...], CLI --metric NAME) if the "
                "script logs it to Keras"
            )
        if len(set(names)) > MAX_METRIC_DEFINITIONS:
            raise TuningError(f"{len(set(names))} metrics; SageMaker takes at most {MAX_METRIC_DEFINITIONS}")
        parents, start_type = _warm_start(warm_start)
        spec = cls(
            objective_metric, objective_type, parsed, max_jobs, max_parallel_jobs, strategy,
            early_stopping, tuple(dict.fromkeys(names)), parents, start_type, seed,
        )  # fmt: skip
        spec._check_budget()
        return spec

    def _check_budget(self) -> None:
        for what, value in (("max_jobs", self.max_jobs), ("max_parallel_jobs", self.max_parallel_jobs)):
            if value is None and what == "max_jobs" and self.strategy == "Grid":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TuningError(
                    f"{what}={value!r}; give a whole number >= 1 (CLI --{what.replace('_', '-')})"
                )
        if self.strategy == "Grid":
            non_categorical = [r.name for r in self.ranges if r.kind != CATEGORICAL]
            if non_categorical:
                raise TuningError(
                    f"the Grid strategy searches categorical ranges only; {', '.join(non_categorical)} "
                    "is a MIN:MAX range: list its values (NAME=A,B,C) or use Bayesian or Random"
                )
            size = self.grid_size
            if size > MAX_TRAINING_JOBS:
                raise TuningError(
                    f"the grid has {size} combinations; SageMaker runs at most {MAX_TRAINING_JOBS} training "
                    "jobs for Grid: drop values or ranges"
                )
            if self.max_jobs is not None and self.max_jobs > size:
                raise TuningError(
                    f"max_jobs={self.max_jobs} but the grid has only {size} combination(s), each run once; "
                    f"give at most {size} (or leave max_jobs out for all of them)"
                )
        elif self.max_jobs is None:
            raise TuningError(f"the {self.strategy} strategy needs max_jobs (CLI --max-jobs N)")
        elif self.strategy != "Random" and self.max_jobs > MAX_TRAINING_JOBS:
            raise TuningError(
                f"max_jobs={self.max_jobs}; SageMaker runs at most {MAX_TRAINING_JOBS} training jobs per "
                f"{self.strategy} tuning job"
            )
        if self.max_parallel_jobs > self.n_trials:
            raise TuningError(
                f"max_parallel_jobs={self.max_parallel_jobs} is more than the {self.n_trials} trial(s) to "
                f"run; give at most {self.n_trials}"
            )
        if self.max_parallel_jobs > MAX_PARALLEL_JOBS:
            raise TuningError(
                f"max_parallel_jobs={self.max_parallel_jobs}; SageMaker allows at most {MAX_PARALLEL_JOBS}"
            )
        if self.strategy == "Hyperband" and self.early_stopping != "Off":
            raise TuningError(
                "the Hyperband strategy stops poor trials itself, and SageMaker refuses it with early "
                "stopping on: use early_stopping='Off' (CLI --early-stopping Off)"
            )

    @property
    def grid_size(self) -> int:
        return math.prod(len(r.values) for r in self.ranges) if self.ranges else 0

    @property
    def n_trials(self) -> int:
        """How many trials run: ``max_jobs``, or for Grid without it every combination."""
        return self.max_jobs if self.max_jobs is not None else self.grid_size

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.ranges)

    def metric_definitions(self) -> list[dict[str, str]]:
        return metric_definitions(self.metrics)

    def grid(self) -> list[dict[str, str]]:
        """Every combination of a Grid search, in order."""
        return [dict(zip(self.names, combo)) for combo in product(*(r.values for r in self.ranges))]

    def describe(self) -> list[str]:
        budget = f"{self.n_trials} trial(s), {self.max_parallel_jobs} at a time"
        lines = [
            f"tuning: {self.objective_type.lower()} {self.objective_metric}, {self.strategy} search, "
            f"{budget}, early stopping {self.early_stopping}",
        ]
        lines += [f"  {r.describe()}" for r in self.ranges]
        return lines

    def check_static(self, static: Mapping[str, str], what: str = "static hyperparameter") -> None:
        """The tuned names are not also static, nor the framework's; the total stays within 100."""
        both = [n for n in self.names if n in static]
        if both:
            raise TuningError(
                f"{', '.join(both)} is both tuned and a {what}; drop it from the hyperparameters (--hp / -p) "
                "or from the ranges"
            )
        framework = [n for n in self.names if hp.is_framework(n) or n == TUNING_OBJECTIVE_HYPERPARAMETER]
        if framework:
            raise TuningError(
                f"{', '.join(framework)} is set by sagemaker-dist or SageMaker and cannot be tuned"
            )
        total = len(static) + len(self.ranges) + 1
        if total > MAX_HYPERPARAMETERS:
            raise TuningError(
                f"{len(static)} static + {len(self.ranges)} tuned hyperparameters + the "
                f"{TUNING_OBJECTIVE_HYPERPARAMETER} SageMaker adds = {total}; SageMaker allows "
                f"{MAX_HYPERPARAMETERS} in all. Put the rest in a config file in source_dir"
            )


def _choice(value, allowed: tuple[str, ...], what: str) -> str:
    for option in allowed:
        if isinstance(value, str) and value.lower() == option.lower():
            return option
    raise TuningError(f"{what} {value!r}; use one of {', '.join(allowed)}")


def _ranges(ranges) -> tuple[ParamRange, ...]:
    if isinstance(ranges, Mapping):
        parsed = [to_range(str(name), value) for name, value in ranges.items()]
    elif isinstance(ranges, (list, tuple)) and all(isinstance(r, ParamRange) for r in ranges):
        parsed = list(ranges)
    else:
        raise TuningError(
            "ranges must map hyperparameter names to ranges, e.g. {'learning_rate': '1e-4:1e-2:log'}"
        )
    if not parsed:
        raise TuningError("no ranges to search; give at least one (ranges={...}, CLI --range NAME=MIN:MAX)")
    names = [r.name for r in parsed]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise TuningError(f"ranges repeat {', '.join(dupes)}; give each hyperparameter one range")
    if len(parsed) > MAX_SEARCHED:
        raise TuningError(f"{len(parsed)} ranges; SageMaker searches at most {MAX_SEARCHED} hyperparameters")
    return tuple(parsed)


def _warm_start(warm_start) -> tuple[tuple[str, ...], str]:
    start_type = "IdenticalDataAndAlgorithm"
    if warm_start is None:
        return (), start_type
    if isinstance(warm_start, str):
        parents = [warm_start]
    elif isinstance(warm_start, Mapping):
        parents = warm_start.get("parents") or []
        parents = [parents] if isinstance(parents, str) else list(parents)
        start_type = _choice(warm_start.get("type", start_type), WARM_START_TYPES, "warm start type")
    else:
        parents = list(warm_start)
    if not parents or len(parents) > MAX_WARM_START_PARENTS:
        raise TuningError(
            f"warm start from {len(parents)} parent tuning job(s); give 1 to {MAX_WARM_START_PARENTS}"
        )
    for name in parents:
        check_tuning_job_name(name)
    return tuple(parents), start_type


# ----- the request -----


def _distribution(hyperparameters: Mapping) -> Distribution:
    """The distribution a training request's layout names (none: the registry's default, as the
    toolkit runs a request without ours)."""
    layout = layout_of(hyperparameters)
    return distribution(None if layout is None else layout.distribution)


def render_tuning_request(
    training_request: Mapping, spec: TuningSpec, tuning_job_name: str
) -> tuple[dict, list[str]]:
    """The CreateHyperParameterTuningJob request built from a CreateTrainingJob request, and notes on
    what changed on the way (fields a tuning definition cannot carry).

    CheckpointConfig is left out: SageMaker gives every trial the same checkpoint URI, so a trial
    would resume another's checkpoint. TensorBoardOutputConfig has no place in a tuning definition.
    """
    check_tuning_job_name(tuning_job_name)
    read = TrainingRequest.parse(training_request)
    static = dict(read.hyperparameters)
    spec.check_static(static)
    if _distribution(static).tuning_sets_model_dir and read.output_path and "model_dir" not in spec.names:
        static.setdefault("model_dir", read.output_path)  # each trial's: <path>/<trial>/model
    definition = training_definition(training_request, static, spec.metric_definitions())
    notes = []
    if read.checkpoint_s3_uri or read.checkpoint_local_path:
        notes.append(
            "CheckpointConfig left out: every trial of a tuning job would get the same checkpoint URI and "
            "resume another trial's checkpoint; each trial starts fresh"
        )
    if read.tensorboard_s3_uri or read.tensorboard_local_path:
        notes.append("TensorBoardOutputConfig left out: a tuning job's training definition has no such field")
    config = {
        "Strategy": spec.strategy,
        "HyperParameterTuningJobObjective": {
            "Type": spec.objective_type,
            "MetricName": spec.objective_metric,
        },
        "ResourceLimits": {"MaxParallelTrainingJobs": spec.max_parallel_jobs},
        "ParameterRanges": {
            f"{kind}ParameterRanges": [r.as_request() for r in spec.ranges if r.kind == kind]
            for kind in (INTEGER, CONTINUOUS, CATEGORICAL)
            if any(r.kind == kind for r in spec.ranges)
        },
        "TrainingJobEarlyStoppingType": spec.early_stopping,
    }
    if spec.max_jobs is not None:
        config["ResourceLimits"]["MaxNumberOfTrainingJobs"] = spec.max_jobs
    if spec.strategy == "Hyperband":
        epochs = epochs_of(static)
        if epochs:
            config["StrategyConfig"] = {"HyperbandStrategyConfig": {"MinResource": 1, "MaxResource": epochs}}
    if spec.seed is not None:
        config["RandomSeed"] = spec.seed
    request = {
        "HyperParameterTuningJobName": tuning_job_name,
        "HyperParameterTuningJobConfig": config,
        "TrainingJobDefinition": definition,
    }
    if spec.warm_start_parents:
        request["WarmStartConfig"] = {
            "ParentHyperParameterTuningJobs": [
                {"HyperParameterTuningJobName": name} for name in spec.warm_start_parents
            ],
            "WarmStartType": spec.warm_start_type,
        }
    if read.tags:
        request["Tags"] = list(read.tags)
    return request, notes


def epochs_of(hyperparameters: Mapping[str, str]) -> int | None:
    """The job's epoch count from a static hyperparameter Hyperband reads as its resource, if any."""
    for name in EPOCHS_HYPERPARAMETERS:
        try:
            value = int(str(hyperparameters[name]))
        except (KeyError, ValueError):
            continue
        if value >= 1:
            return value
    return None


def trial_training_request(tuning_request: Mapping, job_name: str, values: Mapping[str, str]) -> dict:
    """The CreateTrainingJob request SageMaker makes for one trial: the definition, the static
    hyperparameters plus this trial's ``values`` and ``_tuning_objective_metric``."""
    config = tuning_request["HyperParameterTuningJobConfig"]
    objective = config["HyperParameterTuningJobObjective"]["MetricName"]
    values = {**{str(k): str(v) for k, v in values.items()}, TUNING_OBJECTIVE_HYPERPARAMETER: objective}
    return trial_request(tuning_request, job_name, values)


def sample_values(spec: TuningSpec) -> dict[str, str]:
    """One value per range (the lower bound, the first category): a stand-in trial for checks."""
    return {r.name: r.values[0] if r.kind == CATEGORICAL else format_number(r.min_value) for r in spec.ranges}
