"""Hyperparameter tuning on this machine: each trial a full local job, the search Optuna's.

The trials are the CreateTrainingJob requests SageMaker would make from the tuning request
(``aws.tuning.trial_training_request``): the static hyperparameters, the trial's values and
``_tuning_objective_metric``. Each runs as ``sagemaker-dist local --request`` in a process of its own,
one at a time by default. Its job reads rank 0's metric line with the request's own MetricDefinitions,
as SageMaker reads CloudWatch, and hands each epoch's values to the tuner as data (``--metrics-file``,
``trial_metrics``); the last value of a finished trial is its objective (SageMaker's final objective
metric).

Search: Optuna's TPE sampler for Bayesian, its random and grid samplers, its Hyperband pruner for
Hyperband; early stopping Auto is Optuna's median pruner (SageMaker's rule: stop a trial whose
objective at an epoch is worse than the median of earlier trials at that epoch). A stopped trial's
whole job is stopped, every rank together (SIGTERM to its ``local`` process, which kills the rank
group), as SageMaker stops a training job: never rank 0 alone (horovod#4027).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sagemaker_dist.aws.tuning import TuningSpec, epochs_of, trial_training_request
from sagemaker_dist.aws.tuning_ranges import CATEGORICAL, INTEGER, format_number
from sagemaker_dist.contract.training_request import TrainingRequest, trial_request
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.local.trial_metrics import EpochMetricsReader

STOP_GRACE_S = 30.0  # after SIGTERM: time a stopped trial's job gets to clean up before SIGKILL
DEFAULT_TRIAL_TIMEOUT_S = 24 * 3600.0  # the request's MaxRuntimeInSeconds when it has none
OPTUNA_PIN = "optuna==5.0.0"


class LocalTuningError(ConfigurationError):
    """A local tuning run that cannot start as asked (Optuna missing, a bad search)."""


@dataclass
class LocalTrial:
    """One trial: its job, its values, how it ended and its objective."""

    number: int
    job_name: str
    hyperparameters: dict[str, str]
    status: str = "InProgress"  # Completed, Stopped (early stopping) or Failed
    objective: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    epochs: list[tuple[int, float]] = field(default_factory=list)  # (epoch, objective) as reported
    seconds: float = 0.0
    reason: str | None = None
    log: str | None = None

    def as_json(self) -> dict:
        out = asdict(self)
        out["epochs"] = [list(e) for e in self.epochs]
        return out


@dataclass
class LocalTuningResult:
    """Every trial and the best (the best objective among Completed trials)."""

    name: str
    objective_metric: str
    objective_type: str
    strategy: str
    trials: list[LocalTrial]
    seconds: float

    @property
    def best(self) -> LocalTrial | None:
        done = [t for t in self.trials if t.status == "Completed" and t.objective is not None]
        if not done:
            return None
        pick = max if self.objective_type == "Maximize" else min
        return pick(done, key=lambda t: t.objective)

    def training_jobs(self):
        """Every trial as a ``TrialSummary``, as ``TuningJobHandle.training_jobs()`` lists SageMaker's."""
        from sagemaker_dist.launch.tuning_handle import TrialSummary

        return [
            TrialSummary(t.job_name, t.status, t.hyperparameters, t.objective, None, t.reason)
            for t in self.trials
        ]

    def best_training_job(self):
        """The best trial as a ``TrialSummary`` (None before one completed), as the handle's."""
        best = self.best
        return next((t for t in self.training_jobs() if best and t.name == best.job_name), None)

    def table_lines(self) -> list[str]:
        from sagemaker_dist.launch.tuning_handle import trial_table

        best = self.best
        lines = trial_table(self.training_jobs(), self.objective_metric, best.job_name if best else None)
        lines.append(
            f"tuning {self.name}: {len(self.trials)} trial(s) in {self.seconds:.1f} s, "
            f"{self.strategy} search, {self.objective_type.lower()} {self.objective_metric}"
        )
        if best:
            shown = ", ".join(f"{k}={v}" for k, v in best.hyperparameters.items())
            lines.append(f"best: {best.job_name}, {self.objective_metric} = {best.objective:.6g} ({shown})")
        else:
            lines.append("best: none (no trial completed with an objective)")
        for t in self.trials:
            if t.status == "Failed":
                lines.append(f"{t.job_name} failed: {t.reason}" + (f" (log {t.log})" if t.log else ""))
        return lines

    def to_json(self) -> dict:
        best = self.best
        return {
            "tuning_job": self.name,
            "objective": {"metric": self.objective_metric, "type": self.objective_type},
            "strategy": self.strategy,
            "seconds": round(self.seconds, 3),
            "trials": [t.as_json() for t in self.trials],
            "best": best.as_json() if best else None,
        }


@dataclass(frozen=True)
class TrialRunner:
    """How a trial's local job starts: ``sagemaker-dist local --request FILE`` with these options."""

    source_dir: str | None = None
    options: tuple[str, ...] = ()  # --launcher, --endpoint-url / --bucket, --container-python, ...
    python: str = sys.executable

    def command(self, request_file: Path, timeout: float, metrics_file: Path) -> list[str]:
        """The trial's job, its per-epoch metrics written to ``metrics_file`` (``local/trial_metrics``)."""
        cmd = [self.python, "-u", "-m", "sagemaker_dist.cli", "local", "--request", str(request_file)]
        if self.source_dir:
            cmd += ["--source-dir", str(self.source_dir)]
        return [*cmd, *self.options, "--timeout", f"{timeout:g}", "--metrics-file", str(metrics_file)]


def require_optuna():
    try:
        import optuna
    except ImportError:
        raise LocalTuningError(
            f"tune --local searches with Optuna, which is not installed: pip install '{OPTUNA_PIN}' "
            "(or pip install -e .[local])"
        ) from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def make_study(spec: TuningSpec, max_epochs: int | None):
    """The Optuna study of ``spec``: the strategy's sampler, early stopping's pruner."""
    optuna = require_optuna()
    seed = spec.seed
    if spec.strategy == "Grid":
        sampler = optuna.samplers.GridSampler({r.name: list(r.values) for r in spec.ranges}, seed=seed)
    elif spec.strategy == "Random":
        sampler = optuna.samplers.RandomSampler(seed=seed)
    else:  # Bayesian; and Hyperband, whose brackets Optuna's pruner keeps
        sampler = optuna.samplers.TPESampler(seed=seed)
    if spec.strategy == "Hyperband":
        pruner = optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max_epochs or "auto")
    elif spec.early_stopping == "Auto":
        pruner = optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    else:
        pruner = optuna.pruners.NopPruner()
    direction = "maximize" if spec.objective_type == "Maximize" else "minimize"
    return optuna.create_study(direction=direction, sampler=sampler, pruner=pruner)


def suggest(trial, spec: TuningSpec) -> dict[str, str]:
    """This trial's values, as strings the script gets (SageMaker's scalings on Optuna's distributions)."""
    values = {}
    for r in spec.ranges:
        if r.kind == CATEGORICAL:
            values[r.name] = str(trial.suggest_categorical(r.name, list(r.values)))
        elif r.kind == INTEGER:
            log = r.scaling == "Logarithmic"
            values[r.name] = str(trial.suggest_int(r.name, int(r.min_value), int(r.max_value), log=log))
        elif r.scaling == "ReverseLogarithmic":  # dense near 1: log-uniform on 1 - x
            y = trial.suggest_float(f"1-{r.name}", 1 - r.max_value, 1 - r.min_value, log=True)
            values[r.name] = format_number(1 - y)
        else:
            log = r.scaling == "Logarithmic"
            values[r.name] = format_number(trial.suggest_float(r.name, r.min_value, r.max_value, log=log))
    return values


def trial_job_name(tuning_name: str, number: int, values: Mapping[str, str]) -> str:
    """``<tuning job>-<NNN>-<8 hex>``, as SageMaker names a tuning job's training jobs."""
    digest = hashlib.sha1(json.dumps(dict(values), sort_keys=True).encode()).hexdigest()[:8]
    return f"{tuning_name}-{number:03d}-{digest}"


def run_local_tuning(
    tuning_request: Mapping,
    spec: TuningSpec,
    runner: TrialRunner,
    work_dir: str | os.PathLike,
    *,
    echo: Callable[[str], None] = print,
    trial_timeout: float | None = None,
    stop_grace: float = STOP_GRACE_S,
) -> LocalTuningResult:
    """Run ``spec.n_trials`` trials of ``tuning_request`` here, ``spec.max_parallel_jobs`` at a time."""
    optuna = require_optuna()
    started = time.monotonic()
    name = tuning_request["HyperParameterTuningJobName"]
    static = TrainingRequest.parse(trial_request(tuning_request, name, {}))  # what every trial shares
    timeout = trial_timeout or float(static.max_runtime or DEFAULT_TRIAL_TIMEOUT_S)
    study = make_study(spec, epochs_of(static.hyperparameters))
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    trials: list[LocalTrial] = []
    numbers = iter(range(1, spec.n_trials + 1))

    def worker():
        while True:
            with lock:
                number = next(numbers, None)
                if number is None:
                    return
                trial = study.ask()
                values = suggest(trial, spec)
                record = LocalTrial(number, trial_job_name(name, number, values), values)
                trials.append(record)
            request = trial_training_request(tuning_request, record.job_name, values)
            state = _run_trial(record, request, trial, runner, work, spec, timeout, stop_grace, lock, echo)
            with lock:
                if state == "complete":
                    _tell(study, trial, record.objective)
                elif state == "pruned":
                    _tell(study, trial, state=optuna.trial.TrialState.PRUNED)
                else:
                    _tell(study, trial, state=optuna.trial.TrialState.FAIL)

    threads = [threading.Thread(target=worker, name=f"trial-slot-{i}") for i in range(spec.max_parallel_jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    trials.sort(key=lambda t: t.number)
    return LocalTuningResult(name, spec.objective_metric, spec.objective_type, spec.strategy, trials,
                             time.monotonic() - started)  # fmt: skip


def _tell(study, trial, value=None, state=None) -> None:
    """``study.tell``; the grid sampler calls ``study.stop()`` once its grid is used up, which Optuna
    allows only inside ``optimize`` (RuntimeError here). The trial is stored before it raises."""
    try:
        study.tell(trial, value, state=state)
    except RuntimeError as exc:
        if "Study.stop" not in str(exc):
            raise


def _run_trial(record, request, trial, runner, work, spec, timeout, stop_grace, lock, echo) -> str:
    """Run one trial's job; report each epoch's objective to Optuna and stop the job when it prunes.
    Returns "complete", "pruned" or "failed"."""
    request_file = work / f"{record.job_name}.json"
    request_file.write_text(json.dumps(request, indent=1))
    log_path = work / f"{record.job_name}.log"
    record.log = str(log_path)
    metrics = EpochMetricsReader(work / f"{record.job_name}.metrics.jsonl")
    shown = ", ".join(f"{k}={v}" for k, v in record.hyperparameters.items())
    echo(f"trial {record.number}/{spec.n_trials} {record.job_name}: {shown}")
    started = time.monotonic()
    proc = subprocess.Popen(
        runner.command(request_file, timeout, metrics.path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        errors="replace",
        start_new_session=True,  # its own process group: SIGKILL reaches every rank if SIGTERM is not enough
    )
    stopped = threading.Event()
    # bounded: the child stops itself at --timeout; this is the backstop if it cannot
    backstop = threading.Timer(timeout + 2 * stop_grace, _stop, (proc, stop_grace))
    backstop.daemon = True
    backstop.start()
    last_lines: list[str] = []
    try:
        with log_path.open("w") as log:
            for raw in proc.stdout:  # the log; the metrics come as data, each record before its line
                log.write(raw)
                last_lines = (last_lines + [raw.rstrip("\n")])[-20:]
                _report_epochs(metrics.read(), record, trial, spec, lock, stopped, proc, stop_grace, echo)
            _report_epochs(metrics.read(), record, trial, spec, lock, stopped, proc, stop_grace, echo)
        try:
            code = proc.wait(timeout=stop_grace + 5)
        except subprocess.TimeoutExpired:  # output closed but the process lingers: stop it
            _stop(proc, stop_grace)
            code = proc.returncode
    finally:
        backstop.cancel()
        if proc.poll() is None:
            _stop(proc, 0)
    record.seconds = time.monotonic() - started
    return _trial_outcome(record, code, stopped.is_set(), last_lines, spec, echo)


def _report_epochs(epochs, record, trial, spec, lock, stopped, proc, stop_grace, echo) -> None:
    """Report each new epoch's objective to Optuna; stop the trial's job (every rank) when it prunes."""
    for epoch, values in epochs:
        if stopped.is_set():
            return
        record.metrics.update(values)
        value = values.get(spec.objective_metric)
        if value is None or epoch is None or not math.isfinite(value):
            continue
        record.epochs.append((epoch, value))
        with lock:
            trial.report(value, epoch)
            prune = trial.should_prune()
        echo(f"  {record.job_name} epoch {epoch}: {spec.objective_metric}={value:.6g}")
        if prune:
            stopped.set()
            echo(f"  {record.job_name}: early stopping at epoch {epoch}; stopping its job (all ranks)")
            threading.Thread(target=_stop, args=(proc, stop_grace), daemon=True).start()


def _trial_outcome(record, code: int, stopped: bool, last_lines: list[str], spec, echo) -> str:
    """The trial's status from how its job ended: "complete", "pruned" or "failed" (with the reason)."""
    if stopped:
        record.status, record.objective = "Stopped", (record.epochs[-1][1] if record.epochs else None)
        record.reason = f"stopped early at epoch {record.epochs[-1][0]}" if record.epochs else "stopped early"
        return "pruned"
    if code == 0 and record.epochs:
        record.status, record.objective = "Completed", record.epochs[-1][1]
        objective = f"{spec.objective_metric}={record.objective:.6g}"
        echo(f"  {record.job_name}: completed in {record.seconds:.1f} s, {objective}")
        return "complete"
    record.status = "Failed"
    if code == 0:
        record.reason = (
            f"the job finished but never reported {spec.objective_metric} on the metric line (is it one of "
            "the script's Keras metrics? a value that is not finite is left out)"
        )
    else:
        errors = [ln for ln in last_lines if ln.startswith("error:")]
        record.reason = (errors[-1] if errors else f"the job exited with code {code}").removeprefix("error: ")
    echo(f"  {record.job_name}: failed: {record.reason}")
    return "failed"


def _stop(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the trial's ``local`` process (it kills its rank group and cleans up), then SIGKILL its
    whole process group if it is still there after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
