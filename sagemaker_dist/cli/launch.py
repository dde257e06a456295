"""SageMaker as a platform: ``sagemaker-dist launch`` creates a Horovod + Pipe-mode training job from
the command line, and ``tune`` (its default platform) a hyperparameter tuning job.

A thin front for DistributedEstimator; ``--dry-run`` prints the validated request a launch would send
(with S3 reachable, the shard manifests it would write, planned and shown, not written) and creates
nothing.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from sagemaker_dist.cli import add_distribution_argument, add_region_argument, use_region
from sagemaker_dist.cli.platform_jobs import err
from sagemaker_dist.contract.distributions import distribution as registered
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.launch.estimator import DistributedEstimator
from sagemaker_dist.launch.training_job import TrainingJobFailed


def _pairs(values: list[str], what: str) -> dict[str, str]:
    pairs = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigurationError(f"{what} {item!r} is not KEY=VALUE")
        pairs[key] = value
    return pairs


def register(subparsers):
    """The ``launch`` command's parser (the registry of platforms runs it: ``SageMakerPlatform``)."""
    p = subparsers.add_parser(
        "launch",
        help="create a Horovod + Pipe-mode SageMaker training job",
        description="Shard the inputs per worker, pack and upload source_dir, and create the training job.",
    )
    p.add_argument("entry_point", help="training script, relative to --source-dir if given")
    p.add_argument("--source-dir", help="folder to pack as sourcedir.tar.gz (default: the script's folder)")
    p.add_argument("--role", required=True, help="IAM role ARN or name SageMaker assumes")
    p.add_argument("--instance-type", required=True, help="e.g. ml.p3.16xlarge")
    p.add_argument("--instance-count", type=int, default=1)
    p.add_argument("--processes-per-host", type=int, help="default: the instance type's GPU count")
    p.add_argument("--train", required=True, help="S3 prefix of the training data (sharded per worker)")
    p.add_argument("--validation", help="S3 prefix of validation data")
    p.add_argument("--validation-spread", default="single", choices=("single", "per-worker"))
    p.add_argument("--eval", help="S3 prefix of an eval channel every rank reads")
    p.add_argument("--channel", action="append", default=[], metavar="NAME=S3URI", help="extra channel")
    p.add_argument("--hp", action="append", default=[], metavar="KEY=VALUE", help="hyperparameter")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="container environment")
    p.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="job tag")
    p.add_argument(
        "--image-uri",
        help="training image (default: the distribution's: sagemaker-dist, or sagemaker-dist-pytorch for "
        "torchrun, in your ECR from container/build_and_push.sh; AWS's DLC for tf-mwms)",
    )
    add_region_argument(p)
    p.add_argument("--output-path", help="S3 prefix for outputs (default: the SDK session's default bucket)")
    p.add_argument("--job-name")
    p.add_argument("--strategy", default="auto", choices=("auto", "per-rank", "per-local-rank"))
    add_distribution_argument(p)
    p.add_argument("--input-mode", default="Pipe", choices=("Pipe", "File", "FastFile"))
    p.add_argument("--record-wrapper", default="None", choices=("None", "RecordIO"))
    p.add_argument("--shuffle-seed", type=int, help="ShuffleConfig seed: another object order each epoch")
    p.add_argument(
        "--object-order-seed", type=int, help="each worker's manifest in a seeded order (default: name order)"
    )
    p.add_argument("--max-run", type=int, default=24 * 3600, help="seconds")
    p.add_argument("--spot", action="store_true", help="managed spot training (needs --max-wait)")
    p.add_argument("--max-wait", type=int, help="seconds, >= --max-run")
    p.add_argument("--subnet", action="append", default=[])
    p.add_argument("--security-group", action="append", default=[])
    p.add_argument("--mpi-option", action="append", default=[], help="extra mpirun option (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="print the validated request; create nothing")
    p.add_argument("--no-wait", action="store_true", help="return once the job is created")
    return p


def _estimator(args) -> DistributedEstimator:
    """The estimator of a SageMaker job (launch, tune): SageMaker runs some distributions on some
    instance types only (torchrun: GPU, Trainium), refused here before any AWS call, dry runs too."""
    registered(args.distribution).check_sagemaker_instance_type(args.instance_type)
    use_region(args)  # tune parses launch's options itself
    session = None
    if not args.output_path and not args.dry_run:
        from sagemaker.core.helper.session_helper import Session

        session = Session()
    return DistributedEstimator(
        args.entry_point,
        args.role,
        args.instance_type,
        args.instance_count,
        source_dir=args.source_dir,
        image_uri=args.image_uri,
        processes_per_host=args.processes_per_host,
        hyperparameters=_pairs(args.hp, "--hp"),
        input_mode=args.input_mode,
        strategy=args.strategy,
        distribution=args.distribution,
        validation=args.validation_spread,
        record_wrapper=args.record_wrapper,
        shuffle_seed=args.shuffle_seed,
        object_order_seed=args.object_order_seed,
        output_path=args.output_path,
        max_run=args.max_run,
        use_spot=args.spot,
        max_wait=args.max_wait,
        subnets=args.subnet,
        security_group_ids=args.security_group,
        tags=_pairs(args.tag, "--tag"),
        environment=_pairs(args.env, "--env"),
        mpi_options=args.mpi_option,
        sagemaker_session=session,
    )


def _inputs(args) -> dict[str, str]:
    inputs = {"train": args.train, **_pairs(args.channel, "--channel")}
    for role in ("validation", "eval"):
        if getattr(args, role):
            inputs[role] = getattr(args, role)
    return inputs


@dataclass(frozen=True)
class SageMakerJob:
    """The job rendered for SageMaker: the estimator and its inputs (``prepare`` shards and uploads)."""

    estimator: DistributedEstimator
    inputs: dict


class SageMakerPlatform:
    """A job as a CreateTrainingJob request (``--dry-run`` prints it), a ``TrainingJobHandle`` to wait
    for once created; tuning is a SageMaker tuning job. ``tune``'s default platform, so no option of
    ``tune`` names it."""

    name = "sagemaker"
    command = "launch"
    tune_option = None
    tune_help = None
    tune_only: dict[str, str] = {}
    register = staticmethod(register)

    def add_tune_options(self, p) -> None:
        pass  # tune's own options are SageMaker's: none of its own

    def render(self, args, stack) -> SageMakerJob | None:
        """The estimator and inputs; with --dry-run, the plan and the request printed instead (None)."""
        inputs = _inputs(args)
        est = _estimator(args)
        if not args.dry_run:
            return SageMakerJob(est, inputs)
        for line in est.plan(inputs).explain():
            print(line)
        request, planned = est.dry_run(
            inputs, args.job_name, printer=lambda line: print(line, file=sys.stderr)
        )
        for role, uri, objects, size in planned:
            print(f"{role}: {uri}: {objects} object(s), {size} bytes (planned, not written)")
        print(json.dumps(request, indent=2))
        return None

    def submit(self, args, job: SageMakerJob):
        """Shards and source uploaded, the training job created: its handle."""
        return job.estimator.launch(job.inputs, args.job_name, wait=False)

    def wait(self, args, handle) -> int:
        """Its progress until it ends (not with --no-wait), then its ARN; 1 if it failed."""
        if not args.no_wait:
            try:
                handle.wait(poll=30.0, timeout=None, printer=print)
            except TrainingJobFailed as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
        print(handle.arn)
        return 0

    def tune(self, args, job, spec) -> int:
        """A SageMaker tuning job over the job (--dry-run prints its request)."""
        from sagemaker_dist.launch.tuning_handle import TuningJobFailed
        from sagemaker_dist.launch.tuning_job import draft_tuning_request, launch_tuning

        inputs = _inputs(job)
        est = _estimator(job)
        if job.dry_run:
            for line in [*est.plan(inputs).explain(), *spec.describe()]:
                err(line)
            request, notes = draft_tuning_request(est, inputs, spec, job.job_name)
            for note in notes:
                err(f"note: {note}")
            print(json.dumps(request, indent=2))
            return 0
        try:
            handle = launch_tuning(est, inputs, spec, job.job_name, wait=not job.no_wait, printer=err)
        except TuningJobFailed as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        if not job.no_wait:
            from sagemaker_dist.errors import AwsError

            try:
                trials = handle.training_jobs()
            except AwsError as exc:  # the report without the table; the job itself is done
                err(f"note: could not list the training jobs: {exc}")
                trials = None
            for line in handle.report_lines(trials=trials):
                print(line)
        print(handle.arn)
        return 0


SAGEMAKER = SageMakerPlatform()
