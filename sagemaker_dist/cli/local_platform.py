"""Local mode as a platform: ``sagemaker-dist local`` runs the job here as SageMaker would, and
``tune --local`` runs the trials here, one local job each (Optuna picks the values)."""

from __future__ import annotations

import json
from contextlib import ExitStack

from sagemaker_dist.cli.platform_jobs import drop_demo_defaults, err
from sagemaker_dist.contract.training_request import TrainingRequest
from sagemaker_dist.errors import ConfigurationError


class LocalPlatform:
    """A job run in this process to its end: ``local``'s own command (``cli/local.py``) renders the request
    as it runs it, so submitting it is running it and there is nothing left to wait for."""

    name = "local"
    command = "local"
    tune_option = "--local"
    tune_help = "run the trials here (Optuna)"
    tune_only = {"json": "--json is for tune --local; --dry-run prints a SageMaker request as JSON"}

    def register(self, subparsers):
        from sagemaker_dist.cli.local import register

        register(subparsers)
        return subparsers.choices[self.command]

    def add_tune_options(self, p) -> None:
        p.add_argument(
            "--json", action="store_true", help="--local: end with one JSON object (trials and best)"
        )

    def render(self, args, stack):
        return args  # the request is rendered as the job runs (the demo's data, an entry point's shards)

    def submit(self, args, job) -> int | None:
        """The job run here to its end (a failure raises ``JobFailedError``): a status other than 0, or
        None."""
        from sagemaker_dist.cli.local import run_local_command

        return run_local_command(job) or None

    def wait(self, args, handle: int) -> int:
        return handle  # submit ran the job to its end: its status

    def tune(self, args, job, spec) -> int:
        from sagemaker_dist import LocalBackend
        from sagemaker_dist.aws.tuning import default_tuning_job_name, render_tuning_request
        from sagemaker_dist.aws.tuning_validation import validate_tuning_request
        from sagemaker_dist.cli.local import (
            ENTRY_POINT_ONLY,
            check_request_options,
            endpoint_for,
            ensure_bucket,
            entry_point_estimator,
            given_options,
            hyperparameters_of,
            local_job_shape,
            read_request,
        )
        from sagemaker_dist.local.demo import DEMO_BUCKET, DEMO_JOB_DIR, prepare_demo_job
        from sagemaker_dist.local.tuning import require_optuna

        require_optuna()  # before anything starts: Optuna is there
        if job.demo and given_options(job, ENTRY_POINT_ONLY):
            raise ConfigurationError(
                f"{', '.join(given_options(job, ENTRY_POINT_ONLY))} apply to --entry-point jobs"
            )
        base = None
        if job.request:
            check_request_options(job)
            base = read_request(job.request)
            spec.check_static(TrainingRequest.parse(base).hyperparameters, "hyperparameter in the request")
        hosts, per_host = local_job_shape(job)  # the defaults of 'local', the distribution's among them
        bucket = job.bucket or DEMO_BUCKET
        with ExitStack() as stack:
            url = stack.enter_context(endpoint_for(job))
            err(f"S3 endpoint: {url}" if url else f"S3: real S3, bucket {bucket}")
            if url:
                ensure_bucket(bucket)
            given = hyperparameters_of(job)
            if job.demo:
                demo = prepare_demo_job(bucket, hosts, per_host, job.input_mode or "Pipe", given, printer=err,
                                        distribution=job.distribution,
                                        shuffle_seed=job.shuffle_seed)  # fmt: skip
                base = drop_demo_defaults(demo.request, spec, given)
                source_dir, stem = str(DEMO_JOB_DIR), "demo-tune"
            elif base is not None:
                source_dir, stem = job.source_dir, TrainingRequest.parse(base).name[:18]
            else:
                if not job.train:
                    raise ConfigurationError(
                        "--entry-point needs --train s3://bucket/prefix/ (the training data)"
                    )
                est = entry_point_estimator(job, bucket, hosts, per_host, job.input_mode or "Pipe")
                spec.check_static(est.hyperparameters, "hyperparameter given with -p/--epochs")
                inputs = {"train": job.train, **({"validation": job.validation} if job.validation else {})}
                prepared = est.prepare(inputs, job.job_name, backend=LocalBackend(), printer=err)
                base, source_dir, stem = prepared.request, est.source_dir, est.base_job_name
            name = default_tuning_job_name(stem)
            request, notes = render_tuning_request(base, spec, name)
            validate_tuning_request(request, spec)
            for line in [*spec.describe(), *(f"note: {n}" for n in notes)]:
                err(line)
            backend = LocalBackend(
                launcher=job.launcher, work_dir=job.work_dir, keep_work_dir=job.keep,
                toolkit_version=job.toolkit_version, container_python=job.container_python, image=job.image,
            )  # fmt: skip
            result = backend.run_trials(
                request, spec, source_dir=source_dir, timeout=job.timeout, printer=err
            )
        for line in result.table_lines():
            print(line)
        if args.json:
            print(json.dumps(result.to_json()))
        return 0 if result.best is not None else 1


LOCAL = LocalPlatform()
