"""``sagemaker-dist local`` (run a job here, as SageMaker would) and ``sagemaker-dist demo-data``."""

from __future__ import annotations

from contextlib import ExitStack, nullcontext
from pathlib import Path

from sagemaker_dist.cli import add_distribution_argument
from sagemaker_dist.contract.distributions import distribution
from sagemaker_dist.contract.environment import ENDPOINT_URL, set_variables
from sagemaker_dist.contract.toolkit import DEFAULT_TOOLKIT_VERSION
from sagemaker_dist.contract.training_request import edited_request, request_from_json
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.local.defaults import LOCAL_INSTANCE_TYPE, LOCAL_ROLE
from sagemaker_dist.local.launchers import HOROVODRUN, LAUNCHERS


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "local",
        help="run a Pipe-mode job on this machine (real FIFOs, real Horovod, tf-mwms or torchrun ranks)",
        description=(
            "Run a training job here exactly as SageMaker would run it: an /opt/ml tree per simulated "
            "host, Pipe-mode FIFOs fed from S3, real ranks, model.tar.gz in the output path. "
            "S3 is an embedded moto server unless --bucket (real S3) or --endpoint-url is given."
        ),
    )
    _add_job_arguments(p)
    _add_launcher_arguments(p)
    add_endpoint_args(p)
    p.add_argument("--work-dir", type=Path, help="where the per-host /opt/ml trees go (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the /opt/ml trees after the job")
    p.add_argument("--timeout", type=float, help="stop the job after this many seconds")
    p.add_argument(
        "--interrupt-at",
        type=float,
        action="append",
        metavar="SECONDS",
        help="a spot interruption: SIGTERM every rank SECONDS after the ranks start, wait up to 120 s, then "
        "start the job again with its checkpoints restored (repeatable: one per attempt)",
    )
    p.add_argument(
        "--metrics-file",
        type=Path,
        metavar="PATH",
        help="append each epoch's metrics of rank 0 (its metric line, read with the request's "
        "MetricDefinitions) to PATH as JSON lines, as they come (what tune --local reads of a trial)",
    )
    _register_demo_data(subparsers)  # the command's func: cli/platforms.run_job, the local row


def _add_job_arguments(p) -> None:
    """What job runs: the demo, a request, or a script with its data, hosts and hyperparameters."""
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--demo", action="store_true", help="the CIFAR-10-shaped demo job (writes its data)")
    p.add_argument(
        "--model",
        choices=("cnn", "gpt"),
        help="with --demo: cnn (default), or gpt: a small GPT sharded with FSDP2 on token records "
        "(--distribution torchrun; 2 hosts x 2 ranks unless given)",
    )
    what.add_argument(
        "--request", type=Path, help="a CreateTrainingJob request as JSON (e.g. from launch --dry-run)"
    )
    what.add_argument("--entry-point", help="training script (relative to --source-dir)")
    p.add_argument("--source-dir", type=Path, help="directory with the entry script")
    p.add_argument(
        "--train",
        help="s3:// prefix of the training data (sharded per rank into manifests), or a local folder: "
        "mirrored into the local S3 endpoint first (s3://<bucket>/local-data/<folder name>-<path hash>/)",
    )
    p.add_argument(
        "--validation",
        help="s3:// prefix (or a local folder, as for --train) of the validation data (sharded per rank "
        "like --train; see --validation-spread)",
    )
    p.add_argument(
        "--validation-spread",
        choices=("per-worker", "single"),
        help="per-worker (default): one validation shard per rank; single: one channel every rank "
        "reads in full (File mode, as a Pipe FIFO has one reader)",
    )
    p.add_argument("--job-name", help="job name for --entry-point (default: <script name>-<time stamp>)")
    p.add_argument(
        "--instance-type",
        help=f"instance type the job describes, for --entry-point (default {LOCAL_INSTANCE_TYPE}: ranks run "
        "here on the CPU whatever it says)",
    )
    p.add_argument(
        "--role", help=f"IAM role ARN the request carries, for --entry-point (default {LOCAL_ROLE})"
    )
    p.add_argument("--output-path", help="s3:// prefix for model.tar.gz, checkpoints, TensorBoard logs")
    p.add_argument("--checkpoint-s3-uri", help="s3:// prefix for checkpoints (reuse it to resume a job)")
    p.add_argument(
        "--hosts",
        "--instance-count",
        dest="hosts",
        type=int,
        help="simulated hosts algo-1..algo-H (default 2; 1 with --launcher toolkit or container)",
    )
    p.add_argument(
        "--processes-per-host",
        type=int,
        help="ranks per simulated host (default 1; 2 with --launcher toolkit or container, for Horovod)",
    )
    p.add_argument("--input-mode", choices=("Pipe", "File"), help="default Pipe")
    p.add_argument(
        "--shuffle-seed",
        type=int,
        help="SageMaker's ShuffleConfig on the job's channels, as launch --shuffle-seed: another object "
        "order each epoch of a Pipe channel (before ShardedByS3Key splits the objects among hosts)",
    )
    add_distribution_argument(p)
    p.add_argument(
        "--hyperparameter",
        "-p",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="hyperparameter for the entry script (repeatable)",
    )
    p.add_argument("--epochs", type=int, help="shorthand for -p epochs=N")


def _add_launcher_arguments(p) -> None:
    """How the ranks start: the launcher, and the image or environment it runs them in."""
    p.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default=HOROVODRUN,
        help="horovodrun (Gloo) or mpirun: our rank entry sets up each rank; toolkit: AWS's "
        "sagemaker-training entry point runs the host as in the DLC and starts mpirun itself (root, one "
        "host; needs the container environment, see --container-python), or for distribution torchrun "
        "torchrun on each of several hosts; container: the "
        "training image runs each host as on SageMaker, podman run IMAGE train (see --image); several "
        "hosts are one container each on a private podman network, with SSH between them; torchrun: "
        "torchrun once per simulated host (distribution torchrun, its default)",
    )
    p.add_argument(
        "--image",
        help="launcher container: the training image, in podman's storage (scripts/container-test.sh "
        "builds container/Dockerfile as localhost/sagemaker-dist:test)",
    )
    p.add_argument(
        "--container-python",
        type=Path,
        help="the Python of the image's environment, which the ranks (or, with launcher toolkit, the "
        "toolkit) run with; e.g. a TF 2.21 venv for a tf-mwms job. Default: this Python; for launcher "
        "toolkit $SAGEMAKER_DIST_CONTAINER_PYTHON, else the .venv-toolkit that scripts/setup.sh makes",
    )
    p.add_argument(
        "--toolkit-version",
        default=DEFAULT_TOOLKIT_VERSION,
        help="the image's sagemaker-training version: the entry script gets its arguments as that toolkit "
        f"passes them (before 5.0 through /bin/sh; default {DEFAULT_TOOLKIT_VERSION}, the TF DLCs')",
    )


def _register_demo_data(subparsers) -> None:
    d = subparsers.add_parser(
        "demo-data",
        help="write a small generated CIFAR-10-shaped TFRecord dataset to the S3 endpoint",
        description="Generated data (no download): 32x32x3 uint8 images, int64 labels, tf.train.Example.",
    )
    d.add_argument("--prefix", help="s3:// prefix (default s3://<bucket>/cifar10-demo/)")
    d.add_argument("--files", type=int, default=8)
    d.add_argument("--records-per-file", type=int, default=64)
    d.add_argument("--validation-files", type=int, default=2)
    d.add_argument("--seed", type=int, default=0)
    add_endpoint_args(d)
    d.set_defaults(func=demo_data_command)


def add_endpoint_args(p) -> None:
    from sagemaker_dist.local.demo import DEMO_BUCKET
    from sagemaker_dist.local.endpoint import DEFAULT_STATE_DIR

    p.add_argument(
        "--bucket",
        help=f"use real S3 (your credentials) and this bucket (default {DEMO_BUCKET} "
        "on the embedded endpoint)",
    )
    p.add_argument("--endpoint-url", help="an S3 endpoint that is already running (e.g. a moto server)")
    p.add_argument(
        "--s3-state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help=f"where the embedded endpoint keeps its buckets between commands (default {DEFAULT_STATE_DIR})",
    )


def endpoint_for(args):
    """The embedded moto server unless a real bucket or an endpoint URL was given."""

    from sagemaker_dist.local.endpoint import embedded_s3

    if args.endpoint_url:
        set_variables({ENDPOINT_URL: args.endpoint_url})
        return nullcontext(args.endpoint_url)
    if args.bucket:
        return nullcontext(None)
    return embedded_s3(args.s3_state_dir)


def ensure_bucket(bucket: str) -> None:
    """On a local endpoint the output bucket may not exist yet; create it. Only called with an
    embedded or explicit endpoint: buckets on real S3 are never created."""
    from sagemaker_dist.aws.s3_objects import s3_client

    client = s3_client()
    try:
        client.head_bucket(Bucket=bucket)
    except client.exceptions.ClientError:
        client.create_bucket(Bucket=bucket)


def hyperparameters_of(args) -> dict:
    hps = {}
    for item in args.hyperparameter:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigurationError(f"hyperparameter {item!r} is not KEY=VALUE")
        hps[key] = value
    if args.epochs is not None:
        hps["epochs"] = str(args.epochs)
    return hps


# options that build a job; a --request file is run as written, so they cannot apply to it
_JOB_OPTIONS = {
    "hosts": "--hosts",
    "processes_per_host": "--processes-per-host",
    "input_mode": "--input-mode",
    "shuffle_seed": "--shuffle-seed",
    "epochs": "--epochs",
    "hyperparameter": "--hyperparameter",
    "checkpoint_s3_uri": "--checkpoint-s3-uri",
    "train": "--train",
    "validation": "--validation",
    "validation_spread": "--validation-spread",
    "output_path": "--output-path",
    "job_name": "--job-name",
    "instance_type": "--instance-type",
    "role": "--role",
}
# Options that describe a user's own job; the demo job is fixed and refuses them.
ENTRY_POINT_ONLY = ("validation_spread", "job_name", "instance_type", "role")


def read_request(path: Path) -> dict:
    """The CreateTrainingJob request in ``path``; errors name the file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigurationError(f"request file {path} does not exist") from None
    except OSError as exc:
        raise ConfigurationError(f"request file {path} cannot be read: {exc}") from exc
    return request_from_json(text, f"request file {path}", ConfigurationError)


def given_options(args, keys) -> list[str]:
    """The flags of ``keys`` given on the command line (repeatable options default to [])."""
    return [_JOB_OPTIONS[key] for key in keys if getattr(args, key, None) not in (None, [])]


def check_request_options(args) -> None:
    given = given_options(args, _JOB_OPTIONS)
    if given:
        raise ConfigurationError(
            f"{', '.join(given)} cannot be combined with --request: the request file is run as written. "
            "Edit the request instead (ResourceConfig.InstanceCount, HyperParameters, "
            "CheckpointConfig.S3Uri, InputDataConfig, OutputDataConfig)"
        )


def local_job_shape(args) -> tuple[int, int]:
    """Hosts and processes per host of a local job (``local`` and ``tune --local``): the toolkit and
    container launchers default to one host, so its ranks are processes of that host; a distribution
    with one worker per host (its registry entry) has one process per host unless ``-P`` says."""
    from sagemaker_dist.local.launchers.table import launcher_class

    one_host = launcher_class(args.launcher).defaults_to_one_host
    default_hosts, default_per_host = (1, 2) if one_host else (2, 1)
    default_per_host = distribution(args.distribution).default_processes_per_host() or default_per_host
    hosts = default_hosts if args.hosts is None else args.hosts
    per_host = default_per_host if args.processes_per_host is None else args.processes_per_host
    return hosts, per_host


def run_local_command(args) -> int:
    from sagemaker_dist import LocalBackend, run_local
    from sagemaker_dist.local.demo import DEMO_BUCKET, prepare_demo_job
    from sagemaker_dist.local.trial_metrics import EpochMetricsWriter

    request = None
    if args.model and not args.demo:
        raise ConfigurationError("--model chooses the demo's model: give it with --demo")
    if args.demo:
        given = given_options(args, ENTRY_POINT_ONLY)
        if given:
            raise ConfigurationError(f"{', '.join(given)} apply to --entry-point jobs; the demo job is fixed")
    if args.request:  # before any endpoint starts: a bad file or option fails at once
        check_request_options(args)
        request = read_request(args.request)
    hosts, per_host = local_job_shape(args)
    if args.model == "gpt" and args.processes_per_host is None:
        per_host = 2  # the sharded demo: 2 hosts x 2 ranks
    input_mode = args.input_mode or "Pipe"
    bucket = args.bucket or DEMO_BUCKET
    with ExitStack() as stack:
        url = stack.enter_context(endpoint_for(args))
        if url:
            print(
                f"S3 endpoint: {url}"
                + ("" if args.endpoint_url else f" (embedded; state in {args.s3_state_dir})")
            )
        else:
            print(f"S3: real S3, bucket {bucket}")
        if url:
            ensure_bucket(bucket)
        if args.demo:
            job = prepare_demo_job(
                bucket,
                hosts,
                per_host,
                input_mode,
                hyperparameters_of(args),
                distribution=args.distribution,
                long=bool(args.interrupt_at),
                model=args.model,
                shuffle_seed=args.shuffle_seed,
            )
            request, source_dir = job.request, job.source_dir  # prepare() printed the layout
        elif request is not None:
            source_dir = args.source_dir
        else:
            if not args.train:
                raise ConfigurationError(
                    "--entry-point needs --train s3://bucket/prefix/ (the training data)"
                )
            estimator = entry_point_estimator(args, bucket, hosts, per_host, input_mode)
            inputs = {"train": _data_prefix(args.train, "--train", bucket, url)}
            if args.validation:
                inputs["validation"] = _data_prefix(args.validation, "--validation", bucket, url)
            prepared = estimator.prepare(inputs, args.job_name, backend=LocalBackend())  # no SageMaker job
            request, source_dir = prepared.request, Path(estimator.source_dir)
        if args.demo and args.checkpoint_s3_uri:
            request = edited_request(request, checkpoint_s3_uri=args.checkpoint_s3_uri)
        run = run_local
        if args.interrupt_at:  # managed spot, here: interrupted, then started again from its checkpoints
            from sagemaker_dist.local.spot import run_interrupted

            def run(request, source_dir, **kwargs):
                return run_interrupted(request, source_dir, args.interrupt_at, run=run_local, **kwargs)

        metrics = EpochMetricsWriter(args.metrics_file, request) if args.metrics_file else None
        run(
            request,
            source_dir,
            on_rank_line=metrics,
            launcher=args.launcher,
            work_dir=args.work_dir,
            keep_work_dir=args.keep,
            timeout=args.timeout,
            toolkit_version=args.toolkit_version,
            container_python=args.container_python,
            image=args.image,
        )
    return 0


def _data_prefix(value: str, flag: str, bucket: str, endpoint: str | None) -> str:
    """``value`` if it is an S3 URI; a local folder is mirrored into the local endpoint's bucket first
    (only what changed in size goes up again) under a prefix of its own path, which is returned."""
    if value.startswith("s3://"):
        return value
    import hashlib

    from sagemaker_dist.aws.s3_objects import sync_folder

    folder = Path(value)
    if not folder.is_dir():
        raise ConfigurationError(f"{flag} {value!r} is neither an s3:// prefix nor a local folder")
    if not endpoint:
        raise ConfigurationError(
            f"{flag} {value!r} is a local folder, but this job reads real S3 (--bucket without an endpoint): "
            "upload it yourself (aws s3 sync) and give its s3:// prefix, or leave --bucket out to use the "
            "embedded endpoint"
        )
    where = folder.resolve()
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in where.name) or "data"
    prefix = f"s3://{bucket}/local-data/{name}-{hashlib.sha256(str(where).encode()).hexdigest()[:8]}/"
    files, size = sync_folder(folder, prefix)
    print(f"{flag}: {files} file(s) of {folder} ({size} bytes) in {prefix}")
    return prefix


def demo_data_command(args) -> int:
    from sagemaker_dist.local.demo import DEMO_BUCKET
    from sagemaker_dist.local.demo_data import write_demo_data

    prefix = args.prefix or f"s3://{args.bucket or DEMO_BUCKET}/cifar10-demo/"
    with endpoint_for(args) as url:
        data = write_demo_data(
            prefix,
            files=args.files,
            records_per_file=args.records_per_file,
            validation_files=args.validation_files,
            seed=args.seed,
            create_bucket=bool(url),  # a local endpoint starts empty; real S3 buckets are never created
        )
        where = url or "real S3"
        print(
            f"wrote {data.files} TFRecord files ({data.records} records, {data.bytes / 1e6:.1f} MB) "
            f"to {where}: train {data.train_uri}, validation {data.validation_uri}"
        )
    return 0


def entry_point_estimator(args, bucket: str, hosts: int, per_host: int, input_mode: str):
    """The estimator of a user's ``--entry-point`` job: named after the script, not the demo."""
    from sagemaker_dist.launch.estimator import DistributedEstimator

    entry_point = args.entry_point
    extra = {"checkpoint_s3_uri": args.checkpoint_s3_uri} if args.checkpoint_s3_uri else {}
    return DistributedEstimator(
        entry_point=entry_point,
        source_dir=str(args.source_dir or Path.cwd()),
        role=args.role or LOCAL_ROLE,
        instance_type=args.instance_type or LOCAL_INSTANCE_TYPE,
        instance_count=hosts,
        processes_per_host=per_host,
        hyperparameters=hyperparameters_of(args),
        input_mode=input_mode,
        validation=args.validation_spread or "per-worker",
        distribution=args.distribution,
        output_path=args.output_path or f"s3://{bucket}/jobs",
        base_job_name=Path(entry_point).stem.replace("_", "-") or "job",
        shuffle_seed=args.shuffle_seed,
        **extra,
    )
