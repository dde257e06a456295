"""Tuning on this machine: the metric regexes applied to the real tagged output of local jobs (mpirun's
tag under AWS's toolkit as on SageMaker, horovodrun's), ``tune --local --demo`` with 3 trials picking
the best, and early stopping that stops a trial's whole job (a real process group, Optuna's pruner)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sagemaker_dist import LocalBackend, run_local
from sagemaker_dist.aws.tuning import TuningSpec, render_tuning_request, trial_training_request
from sagemaker_dist.contract.metric_line import PREFIX, metric_definitions, read_metrics
from sagemaker_dist.local.demo import demo_estimator
from sagemaker_dist.local.demo_data import write_demo_data
from sagemaker_dist.local.tuning import TrialRunner, run_local_tuning

REPO = Path(__file__).resolve().parents[2]
CONTAINER_PYTHON = REPO / ".venv-toolkit" / "bin" / "python"
CLI = [sys.executable, "-m", "sagemaker_dist.cli"]
METRICS = ["loss", "accuracy", "val_loss", "val_accuracy"]
TAGS = {
    "toolkit": re.compile(r"^\[1,mpirank:0,algo-1\]<stdout>:"),  # what CloudWatch holds on SageMaker
    "horovodrun": re.compile(r"^\[0\]<stdout>:"),
    "torchrun": re.compile(r"^\[0\]<stdout>:"),  # torchrun --tee 3's local rank, as the job's rank
}


def _tuning_request(s3, bucket, per_host: int, hosts: int, spec: TuningSpec, **kw) -> dict:
    write_demo_data(f"s3://{bucket}/data/", files=4, records_per_file=16, validation_files=2, client=s3)
    est = demo_estimator(bucket, hosts, per_host, "Pipe", {"epochs": 2, "batch_size": 8}, **kw)
    inputs = {"train": f"s3://{bucket}/data/train/", "validation": f"s3://{bucket}/data/validation/"}
    training = est.prepare(inputs, printer=None, backend=LocalBackend()).request
    return render_tuning_request(training, spec, "regex-check")[0]


@pytest.mark.parametrize("launcher", ["toolkit", "horovodrun", "torchrun"])
def test_metric_definitions_match_the_real_tagged_output_of_a_trial(s3, bucket, tmp_path, launcher):
    """A trial's request (as SageMaker would create it) run here; every regex of its MetricDefinitions
    finds its metric in the raw launcher output, behind the launcher's tag, once per epoch (torchrun:
    the PyTorch helpers' metric line). The toolkit's trial is also the check that the demo's script
    trains unchanged under AWS's toolkit (one job: each pays the toolkit's 30 s sleep after mpirun)."""
    spec = TuningSpec.build(
        objective_metric="val_accuracy", ranges={"learning_rate": "1e-4:1e-2:log"}, max_jobs=2
    )
    hosts, per_host = (1, 2) if launcher == "toolkit" else (2, 1)
    torch = {"distribution": "torchrun", "entry_point": "train_torch.py"} if launcher == "torchrun" else {}
    tuning = _tuning_request(s3, bucket, per_host, hosts, spec, **torch)
    request = trial_training_request(tuning, "regex-check-001-00000000", {"learning_rate": "0.003"})
    extra = {"container_python": CONTAINER_PYTHON} if launcher == "toolkit" else {}
    result = run_local(request, None, launcher=launcher, work_dir=tmp_path, echo=lambda _l: None,
                       timeout=240, **extra)  # fmt: skip
    raw = [line for line in result.output if PREFIX in line]
    assert len(raw) == 2, result.output[-40:]  # one line per epoch, from the chief only
    assert all(TAGS[launcher].match(line) for line in raw), raw
    definitions = request["AlgorithmSpecification"]["MetricDefinitions"]
    assert definitions == metric_definitions(METRICS)
    for epoch, line in enumerate(raw, start=1):
        for d in definitions:  # SageMaker applies each regex to the log line and takes group 1
            match = re.search(d["Regex"], line)
            assert match, (d, line)
            assert float(match.group(1)) >= 0
        assert read_metrics(line, definitions)[0] == epoch
    # the same values local mode reports as the final metrics (the last line)
    assert read_metrics(raw[-1], definitions)[1] == pytest.approx(
        {k: v for k, v in result.metrics.items() if k in METRICS}, rel=1e-6
    )
    if launcher == "toolkit":
        _check_the_demo_trained_unchanged_under_the_toolkit(s3, bucket, result, tmp_path)


def _check_the_demo_trained_unchanged_under_the_toolkit(s3, bucket, result, work_dir) -> None:
    """The trial is the demo's own script on AWS's toolkit (its mpirun, 2 ranks): it trains unchanged,
    its epochs end together, rank 0 checkpoints under the toolkit's /opt/ml, the model reaches S3, and
    the host's trees and the namespace's overlays are gone afterwards."""
    out = "\n".join(result.output)
    ends = [line for line in result.output if "train epoch ended for every rank" in line]
    # (the raw output, behind the tags of the toolkit's mpirun --tag-output)
    assert len(ends) == 2 and all(e.startswith("[1,mpirank:0,algo-1]<stdout>:") for e in ends), out[-3000:]
    assert "checkpoint for epoch 2 written to /opt/ml/checkpoints/epoch-00002" in out, out[-3000:]
    assert result.model_uri, out[-3000:]
    key = result.model_uri.split("/", 3)[3]
    assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] > 0
    assert not list(work_dir.iterdir())


def test_tune_local_demo_runs_three_trials_and_picks_the_best(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.run(
        [*CLI, "tune", "--local", "--demo", "--s3-state-dir", str(tmp_path / "s3"), "--objective-metric",
         "val_accuracy", "--range", "learning_rate=1e-4:1e-2:log", "--range", "batch_size=16,32",
         "--max-jobs", "3", "--seed", "7", "--json"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1])  # --json: one JSON object last
    trials = result["trials"]
    assert len(trials) == 3 and all(t["status"] == "Completed" for t in trials), trials
    for t in trials:
        assert 1e-4 <= float(t["hyperparameters"]["learning_rate"]) <= 1e-2
        assert t["hyperparameters"]["batch_size"] in ("16", "32")
        assert [e for e, _ in t["epochs"]] == [1, 2]  # the demo's 2 epochs, each reported
        assert t["objective"] == t["epochs"][-1][1]  # the final value is the objective
    best = max(trials, key=lambda t: t["objective"])
    assert result["best"]["job_name"] == best["job_name"]
    # the table names every trial and marks the best
    table = "\n".join(lines[:-1])
    assert f"* {best['job_name']}" in " ".join(table.split()) or f"*  {best['job_name']}" in table
    assert f"best: {best['job_name']}" in table
    # each trial ran its own job with its own values (its own run: no trial resumed another's checkpoint)
    assert proc.stderr.count("completed in") == 3


FAKE_JOB = textwrap.dedent(
    """
    import json, signal, sys, time
    request = json.load(open(sys.argv[sys.argv.index("--request") + 1]))
    metrics_file = sys.argv[sys.argv.index("--metrics-file") + 1]
    hps = request["HyperParameters"]
    score = float(hps["score"])
    if hps.get("stubborn") == "yes":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a job that will not stop: SIGKILL ends it
    for epoch in (1, 2, 3):
        with open(metrics_file, "a") as out:  # what local mode records of rank 0's metric line
            out.write(json.dumps({"epoch": epoch, "metrics": {"val_accuracy": score}}) + "\\n")
        print(f"[rank 0 algo-1] {PREFIX} epoch={epoch} val_accuracy={score}", flush=True)
        print(f"[rank 1 algo-2] {PREFIX} epoch={epoch} val_accuracy=0.0", flush=True)  # not read
        time.sleep(0.2 if score > 0.5 else 30)
    """
).replace("{PREFIX}", PREFIX)


class FakeJobRunner(TrialRunner):
    """Each trial runs a small script in place of ``sagemaker-dist local``: it records rank 0's metrics
    as local mode does (``--metrics-file``), and sleeps long after a bad first epoch (a job worth
    stopping)."""

    def command(self, request_file, timeout, metrics_file):
        return [
            sys.executable,
            "-c",
            FAKE_JOB,
            "--request",
            str(request_file),
            "--metrics-file",
            str(metrics_file),
        ]


def test_early_stopping_stops_the_whole_trial_job(tmp_path):
    """Optuna's median rule (early stopping Auto) stops the third trial after its first epoch; its job
    ignores SIGTERM, so the whole process group gets SIGKILL after the grace period."""
    spec = TuningSpec.build(
        objective_metric="val_accuracy", ranges={"score": "0.9,0.8,0.1"}, strategy="Grid", max_jobs=None,
        early_stopping="Auto", seed=5,  # Optuna 5.0's grid order for seed 5: 0.9, 0.8, then 0.1
    )  # fmt: skip
    tuning = {
        "HyperParameterTuningJobName": "fake-tune",
        "HyperParameterTuningJobConfig": {"HyperParameterTuningJobObjective": {"MetricName": "val_accuracy"}},
        "TrainingJobDefinition": {
            "StaticHyperParameters": {"epochs": "3", "stubborn": "yes"},
            "AlgorithmSpecification": {"MetricDefinitions": metric_definitions(METRICS)},
            "StoppingCondition": {"MaxRuntimeInSeconds": 120},
        },
    }
    lines: list[str] = []
    started = time.monotonic()
    result = run_local_tuning(tuning, spec, FakeJobRunner(), tmp_path, echo=lines.append, stop_grace=2)
    assert time.monotonic() - started < 30, lines  # the bad trial's 30 s sleeps were cut short
    assert [t.hyperparameters["score"] for t in result.trials] == ["0.9", "0.8", "0.1"]
    assert [t.status for t in result.trials] == ["Completed", "Completed", "Stopped"], lines
    stopped = result.trials[2]
    assert stopped.epochs == [(1, 0.1)] and stopped.seconds < 10
    assert any("early stopping at epoch 1" in line for line in lines)
    assert result.best.hyperparameters["score"] == "0.9" and result.best.objective == 0.9
    # the same surface as a SageMaker tuning job's handle
    assert [t.status for t in result.training_jobs()] == ["Completed", "Completed", "Stopped"]
    assert result.best_training_job().name == result.best.job_name
    assert [e for e, _ in result.trials[0].epochs] == [1, 2, 3]


@pytest.mark.slow
def test_est_tune_with_local_backend_runs_the_trials_here(s3, bucket, tmp_path):
    """The notebook's call: ``est.tune(inputs, ..., backend=LocalBackend())`` shards once, runs every
    trial as a local job reaching the same S3 endpoint, and returns the trials and the best."""
    from sagemaker_dist import LocalBackend, LocalTuningResult

    write_demo_data(f"s3://{bucket}/data/", files=4, records_per_file=16, validation_files=2, client=s3)
    est = demo_estimator(bucket, 1, 1, "Pipe", {"epochs": 1, "batch_size": 8})  # one rank: the cheapest job
    inputs = {"train": f"s3://{bucket}/data/train/", "validation": f"s3://{bucket}/data/validation/"}
    lines: list[str] = []
    result = est.tune(
        inputs, objective_metric="val_accuracy", ranges={"learning_rate": "1e-3,1e-2"}, strategy="Grid",
        max_jobs=None, tuning_job_name="nb-tune", backend=LocalBackend(work_dir=str(tmp_path)),
        printer=lines.append,
    )  # fmt: skip
    assert isinstance(result, LocalTuningResult), lines[-20:]
    assert sorted(float(t.hyperparameters["learning_rate"]) for t in result.trials) == [1e-3, 1e-2]
    assert all(t.status == "Completed" and t.objective is not None for t in result.trials), lines[-40:]
    assert result.best.objective == max(t.objective for t in result.trials)
    assert any(line.startswith("best: nb-tune-") for line in lines)
    # sharded once: one plan under the tuning job's name, shared by both trials
    plans = s3.list_objects_v2(Bucket=bucket, Prefix="jobs/nb-tune/shards/")["Contents"]
    assert sum(o["Key"].endswith("_plan.json") for o in plans) == 2  # train and validation
