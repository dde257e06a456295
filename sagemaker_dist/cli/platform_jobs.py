"""What the platforms' job commands share: the job to run elsewhere (the demo, or a request written
before), its spec uploaded for the nodes' pipe agents, files written whole, and the demo's defaults
giving way to a tuned range."""

from __future__ import annotations

import sys
from pathlib import Path

from sagemaker_dist.cli.local import endpoint_for, ensure_bucket
from sagemaker_dist.contract.distributions import DEFAULT, REGISTRY
from sagemaker_dist.contract.training_request import TrainingRequest, edited_request
from sagemaker_dist.errors import ConfigurationError


def err(line: str) -> None:
    """A line of progress: stderr, so that stdout carries only what the command produces."""
    print(line, file=sys.stderr, flush=True)


def add_job_source(p, runs) -> None:
    """The job to run elsewhere: the demo (of a distribution the platform ``runs``: a predicate on its
    registry entry), or a request written before (``launch --dry-run``)."""
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--demo", action="store_true", help="the CIFAR-10-shaped demo job (writes its data)")
    what.add_argument("--request", type=Path, help="a CreateTrainingJob request as JSON (launch --dry-run)")
    names = [d.name for d in REGISTRY.values() if runs(d)]
    p.add_argument("--distribution", choices=names, help=f"for --demo: its distribution (default {DEFAULT})")


def refuse_with_request(flags: dict) -> None:
    """Options that build a job cannot change a request file, which is run as written."""
    given = [flag for flag, value in flags.items() if value is not None]
    if given:
        raise ConfigurationError(
            f"{', '.join(given)} cannot be combined with --request: the request says it "
            "(ResourceConfig, HyperParameters); edit it instead"
        )


def request_and_spec_uri(stack, args, request, nodes: int, tasks: int, instance_type: str | None):
    """The job's request (the demo's, its data written first, or the one given) and its spec's S3 URI.

    The S3 endpoint (the embedded one where no other is given) stays up until ``stack`` closes.
    """
    from sagemaker_dist.local.demo import DEMO_BUCKET

    bucket = args.bucket or DEMO_BUCKET
    url = stack.enter_context(endpoint_for(args))
    if url and args.demo:  # the demo writes its data into this bucket; a request brings its own
        ensure_bucket(bucket)
    if args.demo:
        request = _demo_request(args, bucket, nodes, tasks, instance_type)
    return request, args.spec_uri or default_spec_uri(request)


def _demo_request(args, bucket: str, nodes: int, tasks: int, instance_type: str | None) -> dict:
    from sagemaker_dist.local.demo import prepare_demo_job

    hps = {"epochs": args.epochs} if args.epochs is not None else {}
    request = prepare_demo_job(
        bucket, nodes, tasks, hyperparameters=hps, printer=None, distribution=args.distribution or DEFAULT
    ).request
    return edited_request(request, instance_type=instance_type)  # the demo plans for CPU; run on these


def default_spec_uri(request: dict) -> str:
    """Where the pipe agents read the request unless --spec-uri says: beside the job's output."""
    read = TrainingRequest.parse(request)
    if not read.output_path.startswith("s3://"):
        raise ConfigurationError("the request has no OutputDataConfig.S3OutputPath; give --spec-uri s3://...")
    return f"{read.output_path}/{read.name}/spec/request.json"


def upload_spec(request: dict, spec_uri: str) -> None:
    import json

    from botocore.exceptions import BotoCoreError, ClientError

    from sagemaker_dist.aws.s3_objects import describe_client_error, s3_client, unreachable

    bucket, _, key = spec_uri.removeprefix("s3://").partition("/")
    action = f"upload the job spec to {spec_uri}"
    try:
        s3_client().put_object(Bucket=bucket, Key=key, Body=json.dumps(request).encode())
    except ClientError as exc:
        raise describe_client_error(exc, bucket, action) from None
    except BotoCoreError as exc:
        raise unreachable(exc, action) from None


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """Write to a temporary file beside ``path``, then rename it there: a reader (sbatch, kubectl, a
    second run) sees the old file or the whole new one, never a part; a failure leaves no part behind."""
    import os
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def drop_demo_defaults(request: dict, spec, given: dict) -> dict:
    """The demo's request without its own defaults (epochs, batch size) of what ``spec`` tunes: they give
    way to a range; the user's -p values do not."""
    spec.check_static(given, "hyperparameter given with -p/--epochs")
    return edited_request(request, without_hyperparameters=spec.names)
