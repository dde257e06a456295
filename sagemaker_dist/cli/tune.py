"""``sagemaker-dist tune``: hyperparameter tuning over the same job, on SageMaker (default), this machine
(``--local``, Optuna) or Kubernetes (``--k8s``, a Katib Experiment).

Its own options say what to search; every other option is the ``launch`` command's (SageMaker), the
``local`` command's (``--local``) or the ``k8s`` command's (``--k8s``), parsed by that command's own
parser, so the job is described exactly as it would be launched.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from pathlib import Path

from sagemaker_dist.errors import ConfigurationError

MODES = {"sagemaker": ("sagemaker_dist.cli.launch", "launch"), "local": ("sagemaker_dist.cli.local", "local"),
         "k8s": ("sagemaker_dist.cli.platforms", "k8s")}  # fmt: skip


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "tune",
        help="hyperparameter tuning over the job: SageMaker, this machine (--local) or Katib (--k8s)",
        description=(
            "Tune the job's hyperparameters. Besides the options below, give the options of 'launch' "
            "(SageMaker: entry point, --role, --instance-type, --train, ..., --dry-run prints the request as "
            "JSON), of 'local' with --local (--demo, --entry-point, --hosts, ...; the trials run here, one "
            "at a time by default) or of 'k8s' with --k8s (--demo or --request, --image, ...; prints a Katib "
            "Experiment). The script reports metrics through the runtime's Keras helpers (a line per epoch)."
        ),
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true", help="run the trials here (Optuna)")
    where.add_argument("--k8s", action="store_true", help="write a Katib Experiment (kubeflow.org/v1beta1)")
    p.add_argument("--objective-metric", required=True, help="e.g. val_accuracy (a Keras metric name)")
    p.add_argument("--objective-type", default="Maximize", choices=("Maximize", "Minimize"))
    p.add_argument(
        "--range",
        action="append",
        default=[],
        metavar="NAME=MIN:MAX[:log]|NAME=A,B,C",
        help="a hyperparameter to search (repeatable): integers if both bounds are, scale log, linear, "
        "reverse-log or auto; or categorical values",
    )
    p.add_argument("--max-jobs", type=int, help="trials in all (Grid: default every combination)")
    p.add_argument("--max-parallel-jobs", type=int, default=1, help="trials at a time (default 1)")
    p.add_argument("--strategy", default="Bayesian", choices=("Bayesian", "Random", "Hyperband", "Grid"))
    p.add_argument("--early-stopping", default="Off", choices=("Auto", "Off"))
    p.add_argument(
        "--metric",
        action="append",
        default=[],
        metavar="NAME",
        help="a metric the script's Keras logs report, besides loss, accuracy, val_loss, val_accuracy",
    )
    p.add_argument(
        "--warm-start", action="append", default=[], metavar="TUNING_JOB", help="parent tuning job"
    )
    p.add_argument(
        "--warm-start-type",
        default="IdenticalDataAndAlgorithm",
        choices=("IdenticalDataAndAlgorithm", "TransferLearning"),
    )
    p.add_argument("--seed", type=int, help="the search's random seed")
    p.add_argument("--json", action="store_true", help="--local: end with one JSON object (trials and best)")
    p.add_argument("--katib-setup", type=Path, help="--k8s: also write the RBAC and katib-config Katib needs")
    p.set_defaults(func=tune_command, takes_extra=True)


def _mode_args(mode: str, extra: list[str]) -> argparse.Namespace:
    """``extra`` parsed by the mode's own command parser (launch, local or k8s)."""
    import importlib

    module, command = MODES[mode]
    parser = argparse.ArgumentParser(prog="sagemaker-dist tune")
    sub = parser.add_subparsers(dest="command")
    importlib.import_module(module).register(sub)
    mode_parser = sub.choices[command]
    mode_parser.prog = "sagemaker-dist tune" + ("" if mode == "sagemaker" else f" --{mode}")
    return mode_parser.parse_args(extra)


def _spec(args, drop_metrics: bool = False):
    from sagemaker_dist.aws.tuning import TuningSpec
    from sagemaker_dist.aws.tuning_ranges import parse_range_option
    from sagemaker_dist.contract.metric_line import DEFAULT_METRICS

    warm = {"parents": args.warm_start, "type": args.warm_start_type} if args.warm_start else None
    return TuningSpec.build(
        objective_metric=args.objective_metric,
        objective_type=args.objective_type,
        ranges=[parse_range_option(r) for r in args.range],
        max_jobs=args.max_jobs,
        max_parallel_jobs=args.max_parallel_jobs,
        strategy=args.strategy,
        early_stopping=args.early_stopping,
        metrics=[*DEFAULT_METRICS, *args.metric],
        warm_start=warm,
        seed=args.seed,
    )


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def tune_command(args) -> int:
    mode = "local" if args.local else "k8s" if args.k8s else "sagemaker"
    spec = _spec(args)  # the search is checked before the job's options are even read
    if args.json and mode != "local":
        raise ConfigurationError("--json is for tune --local; --dry-run prints a SageMaker request as JSON")
    if args.katib_setup and mode != "k8s":
        raise ConfigurationError("--katib-setup is for tune --k8s")
    job_args = _mode_args(mode, list(getattr(args, "extra", [])))
    return {"sagemaker": _sagemaker, "local": _local, "k8s": _k8s}[mode](args, job_args, spec)


# ----- SageMaker -----


def _sagemaker(args, job, spec) -> int:
    from sagemaker_dist.cli.launch import _estimator, _pairs
    from sagemaker_dist.launch.tuning_handle import TuningJobFailed
    from sagemaker_dist.launch.tuning_job import draft_tuning_request, launch_tuning

    inputs = {"train": job.train, **_pairs(job.channel, "--channel")}
    for role in ("validation", "eval"):
        if getattr(job, role):
            inputs[role] = getattr(job, role)
    est = _estimator(job)
    if job.dry_run:
        for line in [*est.plan(inputs).explain(), *spec.describe()]:
            _err(line)
        request, notes = draft_tuning_request(est, inputs, spec, job.job_name)
        for note in notes:
            _err(f"note: {note}")
        print(json.dumps(request, indent=2))
        return 0
    try:
        handle = launch_tuning(est, inputs, spec, job.job_name, wait=not job.no_wait, printer=_err)
    except TuningJobFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not job.no_wait:
        from sagemaker_dist.errors import AwsError

        try:
            trials = handle.training_jobs()
        except AwsError as exc:  # the report without the table; the job itself is done
            _err(f"note: could not list the training jobs: {exc}")
            trials = None
        for line in handle.report_lines(trials=trials):
            print(line)
    print(handle.arn)
    return 0


# ----- this machine -----


def _drop_demo_defaults(request: dict, spec, given: dict) -> None:
    """The demo's own defaults (epochs, batch size) give way to a range; the user's -p values do not."""
    spec.check_static(given, "hyperparameter given with -p/--epochs")
    for name in spec.names:
        request["HyperParameters"].pop(name, None)


def _local(args, job, spec) -> int:
    from sagemaker_dist import LocalBackend
    from sagemaker_dist.aws.tuning import (
        default_tuning_job_name,
        render_tuning_request,
    )
    from sagemaker_dist.aws.tuning_validation import validate_tuning_request
    from sagemaker_dist.cli.local import (
        _ENTRY_POINT_ONLY,
        _check_request_options,
        _given,
        _hyperparameters,
        endpoint_for,
        ensure_bucket,
        entry_point_estimator,
        local_job_shape,
        read_request,
    )
    from sagemaker_dist.local.demo import DEMO_BUCKET, DEMO_JOB_DIR, prepare_demo_job
    from sagemaker_dist.local.tuning import _optuna

    _optuna()  # before anything starts: Optuna is there
    if job.demo and _given(job, _ENTRY_POINT_ONLY):
        raise ConfigurationError(f"{', '.join(_given(job, _ENTRY_POINT_ONLY))} apply to --entry-point jobs")
    base = None
    if job.request:
        _check_request_options(job)
        base = read_request(job.request)
        spec.check_static(base.get("HyperParameters") or {}, "hyperparameter in the request")
    hosts, per_host = local_job_shape(job)  # the defaults of 'local', the distribution's among them
    bucket = job.bucket or DEMO_BUCKET
    with ExitStack() as stack:
        url = stack.enter_context(endpoint_for(job))
        _err(f"S3 endpoint: {url}" if url else f"S3: real S3, bucket {bucket}")
        if url:
            ensure_bucket(bucket)
        given = _hyperparameters(job)
        if job.demo:
            demo = prepare_demo_job(bucket, hosts, per_host, job.input_mode or "Pipe", given, printer=_err,
                                    distribution=job.distribution)  # fmt: skip
            _drop_demo_defaults(demo.request, spec, given)
            base, source_dir, stem = demo.request, str(DEMO_JOB_DIR), "demo-tune"
        elif base is not None:
            source_dir, stem = job.source_dir, base.get("TrainingJobName", "tune")[:18]
        else:
            if not job.train:
                raise ConfigurationError(
                    "--entry-point needs --train s3://bucket/prefix/ (the training data)"
                )
            est = entry_point_estimator(job, bucket, hosts, per_host, job.input_mode or "Pipe")
            spec.check_static(est.hyperparameters, "hyperparameter given with -p/--epochs")
            inputs = {"train": job.train, **({"validation": job.validation} if job.validation else {})}
            prepared = est.prepare(inputs, job.job_name, backend=LocalBackend(), printer=_err)
            base, source_dir, stem = prepared.request, est.source_dir, est.base_job_name
        name = default_tuning_job_name(stem)
        request, notes = render_tuning_request(base, spec, name)
        validate_tuning_request(request, spec)
        for line in [*spec.describe(), *(f"note: {n}" for n in notes)]:
            _err(line)
        backend = LocalBackend(
            launcher=job.launcher, work_dir=job.work_dir, keep_work_dir=job.keep,
            toolkit_version=job.toolkit_version, container_python=job.container_python, image=job.image,
        )  # fmt: skip
        result = backend.run_trials(request, spec, source_dir=source_dir, timeout=job.timeout, printer=_err)
    for line in result.table_lines():
        print(line)
    if args.json:
        print(json.dumps(result.to_json()))
    return 0 if result.best is not None else 1


# ----- Kubernetes -----


def _k8s(args, job, spec) -> int:
    from sagemaker_dist.aws.tuning import (
        render_tuning_request,
        trial_training_request,
    )
    from sagemaker_dist.aws.tuning_validation import validate_tuning_request
    from sagemaker_dist.cli.local import read_request
    from sagemaker_dist.cli.platforms import (
        _refuse_with_request,
        _request_and_spec_uri,
        _upload_spec,
        _write_atomically,
    )
    from sagemaker_dist.platforms.k8s_pods import K8sJobOptions, to_yaml_stream
    from sagemaker_dist.platforms.katib import (
        ExperimentOptions,
        KatibError,
        check_experiment_spec,
        plan_experiment,
    )
    from sagemaker_dist.platforms.katib_rules import experiment_problems
    from sagemaker_dist.platforms.node_plan import ranks_per_node

    request = None
    if job.request:
        flags = {"--instance-type": job.instance_type, "--instance-count": job.instance_count}
        _refuse_with_request({**flags, "--epochs": job.epochs})
        request = read_request(job.request)
        spec.check_static(request.get("HyperParameters") or {}, "hyperparameter in the request")
    instance_type = job.instance_type or "ml.p4d.24xlarge"
    count = 2 if job.instance_count is None else job.instance_count
    per_host = None
    if job.demo:
        if count < 1:
            raise ConfigurationError(f"--instance-count {count}: give at least 1 worker")
        per_host, _ = ranks_per_node(instance_type, job.processes_per_host)
    with ExitStack() as stack:
        request, _ = _request_and_spec_uri(stack, job, request, count, per_host, instance_type)
        if job.demo:
            _drop_demo_defaults(request, spec, {"epochs": job.epochs} if job.epochs is not None else {})
        name = request["TrainingJobName"].lower()
        check_experiment_spec(spec, name)
        tuning, _ = render_tuning_request(request, spec, name[:32].rstrip("-"))
        validate_tuning_request(tuning, spec)
        static = trial_training_request(tuning, request["TrainingJobName"], {})  # what the pipe agents read
        spec_uri = job.spec_uri or _spec_uri(static)
        options = K8sJobOptions(
            image=job.image, spec_uri=spec_uri, namespace=job.namespace,
            service_account=job.service_account, backoff_limit=job.backoff_limit,
            ttl_seconds_after_finished=job.ttl, endpoint_url=job.endpoint_url,
            processes_per_host=job.processes_per_host,
        )  # fmt: skip
        documents = plan_experiment(tuning, spec, options, ExperimentOptions(namespace=job.namespace))
        problems = experiment_problems(documents[-1])
        if problems:
            raise KatibError(
                "the Experiment would be refused by Katib:\n" + "\n".join(f"  - {p}" for p in problems)
            )
        text = to_yaml_stream(documents)  # a TrainJob's runtime, then the Experiment
        _upload_spec(static, spec_uri)
    _katib_setup(args, documents[-1])
    if job.output:
        _write_atomically(job.output, text)
        _err(f"wrote {job.output}; the job spec is {spec_uri}")
    else:
        sys.stdout.write(text)
    return 0


def _katib_setup(args, experiment: dict) -> None:
    """What Katib needs before it runs the trials: nothing for TrainJobs; for v2beta1 MPIJobs its config
    and RBAC, written with --katib-setup."""
    from sagemaker_dist.cli.platforms import _write_atomically
    from sagemaker_dist.platforms.k8s_pods import to_yaml_stream
    from sagemaker_dist.platforms.katib import katib_setup_documents

    if experiment["spec"]["trialTemplate"]["trialSpec"]["kind"] == "TrainJob":
        _err(
            "Katib v0.19 runs TrainJob trials as installed (its katib-config lists "
            "TrainJob.v1alpha1.trainer.kubeflow.org); apply the TrainingRuntime with the Experiment"
            + ("; --katib-setup is for MPIJob trials: nothing written there" if args.katib_setup else "")
        )
    elif args.katib_setup:
        setup = to_yaml_stream(katib_setup_documents())
        _write_atomically(args.katib_setup, setup)
        _err(
            f"wrote {args.katib_setup}: RBAC and katib-config for MPIJob v2beta1 trials (then restart "
            "katib-controller)"
        )
    else:
        _err("Katib runs MPIJob v2beta1 trials once its config lists them: --katib-setup FILE writes that")


def _spec_uri(request: dict) -> str:
    output = (request.get("OutputDataConfig") or {}).get("S3OutputPath", "").rstrip("/")
    if not output.startswith("s3://"):
        raise ConfigurationError("the request has no OutputDataConfig.S3OutputPath; give --spec-uri s3://...")
    return f"{output}/{request['TrainingJobName']}/spec/request.json"
