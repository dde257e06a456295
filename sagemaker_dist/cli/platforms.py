"""``sagemaker-dist pipe-agent`` (one node's Pipe-mode feeder, any platform) and ``sagemaker-dist k8s``
(the job as a Kubeflow MPIJob)."""

from __future__ import annotations

import threading
from pathlib import Path

from sagemaker_dist.cli.local import add_endpoint_args, endpoint_for, ensure_bucket, read_request
from sagemaker_dist.contract.distributions import DEFAULT, REGISTRY, distribution
from sagemaker_dist.contract.paths import opt_ml_root
from sagemaker_dist.errors import ConfigurationError

DEFAULT_IMAGE = "sagemaker-dist:latest"
JOBS_DIR = "sagemaker-dist-jobs"  # under the current directory: one folder per job that 'slurm' writes


def _add_job_source(p, runs) -> None:
    """The job to run elsewhere: the demo (of a distribution the platform ``runs``: a predicate on its
    registry entry), or a request written before (``launch --dry-run``)."""
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--demo", action="store_true", help="the CIFAR-10-shaped demo job (writes its data)")
    what.add_argument("--request", type=Path, help="a CreateTrainingJob request as JSON (launch --dry-run)")
    names = [d.name for d in REGISTRY.values() if runs(d)]
    p.add_argument("--distribution", choices=names, help=f"for --demo: its distribution (default {DEFAULT})")


def register(subparsers) -> None:
    _register_pipe_agent(subparsers)
    _register_k8s(subparsers)
    _register_slurm(subparsers)


def _register_pipe_agent(subparsers) -> None:
    a = subparsers.add_parser(
        "pipe-agent",
        help="feed one node's Pipe-mode FIFOs from S3 (Slurm, Kubernetes, any machine)",
        description=(
            "The SageMaker platform's part on one node: write the /opt/ml config files the runtime reads, "
            "unpack the source package, then stream each of the node's channels into <channel>_<epoch> "
            "FIFOs (the next once the previous is closed) until stopped by SIGTERM/SIGINT, --until-pid "
            "exiting, or --epochs fed. S3 is boto3's usual configuration (AWS_ENDPOINT_URL honoured)."
        ),
    )
    a.add_argument("--spec", required=True, help="the CreateTrainingJob request: a JSON file or s3:// URI")
    a.add_argument("--node-index", type=int, required=True, help="this node's index, 0..InstanceCount-1")
    a.add_argument("--ranks", help="the ranks on this node, checked against the job (e.g. 0-7 or 8,9)")
    a.add_argument(
        "--root",
        type=Path,
        help="the node's /opt/ml root (default $SAGEMAKER_DIST_OPT_ML, else /opt/ml); the ranks must see the "
        "same (set SAGEMAKER_DIST_OPT_ML for them)",
    )
    a.add_argument(
        "--private-root",
        action="store_true",
        help="make the root and its parent this user's alone (0700; refused if another user owns either), "
        "replacing a stale root of the same path (the sbatch script's node trees)",
    )
    a.add_argument("--epochs", type=int, help="stop after feeding this many epochs (default: until stopped)")
    a.add_argument(
        "--shuffle-seed", type=int, help="shuffle every channel's objects per epoch with this seed"
    )
    a.add_argument(
        "--until-pid", type=int, help="stop when this process exits (e.g. the node's rank launcher)"
    )
    a.add_argument(
        "--drain",
        type=float,
        default=0.0,
        help="on SIGTERM (scancel, preemption, a pod's deletion: the ranks get it too), keep feeding and "
        "syncing checkpoints until this node's ranks have ended (they agree on a step and checkpoint it), "
        "this many seconds at most; SIGINT, --until-pid or --epochs still end it at once (default 0: "
        "SIGTERM ends it at once)",
    )
    a.set_defaults(func=pipe_agent_command)


def _register_k8s(subparsers) -> None:
    k = subparsers.add_parser(
        "k8s",
        help="write the job for Kubernetes: a Kubeflow MPIJob (Horovod) or Trainer TrainJob (torchrun), "
        "with a pipe-agent sidecar per node",
        description=(
            "Plan the job as for SageMaker (shards, manifests, source package and the request, uploaded to "
            "S3), then print what runs it on Kubernetes, one pod per instance with its GPUs (and EFA) and a "
            "pipe-agent sidecar feeding its FIFOs: for Horovod a Kubeflow MPIJob (mpi-operator v0.8, a "
            "launcher running mpirun); for torchrun a Kubeflow Trainer v2.3 TrainJob with a TrainingRuntime "
            "of its own (torchrun on each node). Apply it with kubectl apply -f. S3 as for 'local': "
            "embedded unless --bucket or --endpoint-url."
        ),
    )
    _add_job_source(k, lambda d: d.kubernetes is not None)
    k.add_argument("--instance-type", help="the worker nodes' type, for --demo (default ml.p4d.24xlarge)")
    k.add_argument("--instance-count", type=int, help="workers, for --demo (default 2)")
    k.add_argument("--processes-per-host", type=int, help="ranks per worker (default: its GPUs; CPU types)")
    k.add_argument("--epochs", type=int, help="for --demo: -p epochs=N")
    k.add_argument("--image", default=DEFAULT_IMAGE, help=f"the training image (default {DEFAULT_IMAGE}; "
                   "container/Dockerfile: sshd, mpi4py, Horovod and sagemaker-dist; for torchrun pass the "
                   "PyTorch image, container/build_and_push.sh --pytorch)")  # fmt: skip
    k.add_argument("--namespace", default="default")
    k.add_argument(
        "--service-account", default="sagemaker-dist", help="the pods' service account (S3 access)"
    )
    k.add_argument(
        "--spec-uri", help="where to upload the request (default <output path>/<job>/spec/request.json)"
    )
    k.add_argument("--backoff-limit", type=int, default=0,
                   help="retries of a failed pod: the MPIJob's runPolicy.backoffLimit, the node "
                   "Job's backoffLimit (default 0)")  # fmt: skip
    k.add_argument("--ttl", type=int, default=3600, help="ttlSecondsAfterFinished (default 3600)")
    where = k.add_mutually_exclusive_group()
    where.add_argument("-o", "--output", type=Path, help="write the YAML to this file instead of stdout")
    where.add_argument(
        "--out-dir",
        type=Path,
        metavar="DIR",
        help="write the YAML to DIR/<job name>.yaml instead of stdout (by default no file is written)",
    )
    add_endpoint_args(k)
    k.set_defaults(func=k8s_command)


def _register_slurm(subparsers) -> None:
    s = subparsers.add_parser(
        "slurm",
        help="write (and submit) an sbatch script: a pipe agent per node, the ranks with srun --mpi=pmix",
        description=(
            "Plan the job as for SageMaker (shards, manifests, source package and the request, uploaded to "
            "S3), then write an sbatch script: one pipe agent per node in the background, one srun task per "
            "rank (Horovod: --mpi=pmix, an MPI-built Horovod; torchrun: torchrun's variables, the ranks "
            "meeting at the first node), a failing rank failing the job. --submit runs sbatch on "
            "the cluster $SLURM_CONF names; --wait waits and exits with the job's exit code. S3 as for "
            "'local': embedded (only with --wait: it lives as long as this command) unless --bucket or "
            f"--endpoint-url. Files go to --out-dir (default ./{JOBS_DIR}/<job name>/), nowhere else."
        ),
    )
    _add_job_source(s, lambda d: d.slurm is not None)
    s.add_argument("--nodes", type=int, help="nodes, for --demo (default 2)")
    s.add_argument("--tasks-per-node", type=int, help="ranks per node (default: its GPUs, else 1)")
    gpus = s.add_mutually_exclusive_group()
    gpus.add_argument("--gpus-per-node", type=int, help="GPUs per node (default 0: CPU nodes)")
    gpus.add_argument(
        "--instance-type", help="the nodes' SageMaker type (HyperPod: ml.p5.48xlarge, ...): its GPUs"
    )
    s.add_argument("--epochs", type=int, help="for --demo: -p epochs=N")
    s.add_argument("--python", help="the nodes' Python with the job's framework (Horovod with MPI and "
                   "TensorFlow, or PyTorch) and sagemaker-dist (default: this one)")  # fmt: skip
    s.add_argument("--partition", help="#SBATCH --partition")
    s.add_argument(
        "--spec-uri", help="where to upload the request (default <output path>/<job>/spec/request.json)"
    )
    s.add_argument(
        "--out-dir",
        type=Path,
        metavar="DIR",
        help=f"the folder for the files of this job: the script <job name>.sbatch and Slurm's output "
        f"<job name>-<job id>.out (default ./{JOBS_DIR}/<job name>/, or the folder of -o; for the output, "
        "on a filesystem the nodes share)",
    )
    s.add_argument("-o", "--output", type=Path, help="the script's path (default DIR/<job name>.sbatch)")
    s.add_argument("--submit", action="store_true", help="run sbatch on the cluster $SLURM_CONF names")
    s.add_argument(
        "--wait", action="store_true", help="with --submit: wait, print its output, exit with its code"
    )
    s.add_argument("--timeout", type=float, help="with --wait: cancel the job after this many seconds")
    add_endpoint_args(s)
    s.set_defaults(func=slurm_command)


def pipe_agent_command(args) -> int:
    from sagemaker_dist.aws.s3_objects import s3_client
    from sagemaker_dist.host.opt_ml import fresh_private_root
    from sagemaker_dist.platforms.node_plan import parse_ranks, plan_node
    from sagemaker_dist.platforms.pipe_agent import load_job_spec, run_agent, stop_on_signals

    root = args.root or opt_ml_root()
    if args.private_root:
        fresh_private_root(root)
    client = s3_client()
    request = load_job_spec(args.spec, client)
    ranks = parse_ranks(args.ranks) if args.ranks else None
    plan = plan_node(request, args.node_index, ranks, args.epochs, args.shuffle_seed)
    stop = threading.Event()
    stop_on_signals(stop, root, args.drain, _echo)
    run_agent(plan, root, client, stop, args.until_pid, echo=_echo)
    return 0


def _echo(line: str) -> None:
    print(line, flush=True)


def k8s_command(args) -> int:
    import sys
    from contextlib import ExitStack

    from sagemaker_dist.platforms.k8s_pods import K8sJobOptions, to_yaml_stream
    from sagemaker_dist.platforms.kubernetes import plan_kubernetes
    from sagemaker_dist.platforms.node_plan import ranks_per_node

    request = None
    if args.request:  # before anything is written: a bad file or option fails at once
        flags = {"--instance-type": args.instance_type, "--instance-count": args.instance_count}
        _refuse_with_request({**flags, "--epochs": args.epochs, "--distribution": args.distribution})
        request = read_request(args.request)
    instance_type = args.instance_type or "ml.p4d.24xlarge"
    count = 2 if args.instance_count is None else args.instance_count
    per_host = None  # --request: the request's own
    if args.demo:
        if count < 1:
            raise ConfigurationError(f"--instance-count {count}: give at least 1 worker")
        per_host, _ = ranks_per_node(instance_type, args.processes_per_host)  # GPU checks before any S3
    with ExitStack() as stack:
        request, spec_uri = _request_and_spec_uri(stack, args, request, count, per_host, instance_type)
        options = K8sJobOptions(
            image=args.image,
            spec_uri=spec_uri,
            namespace=args.namespace,
            service_account=args.service_account,
            backoff_limit=args.backoff_limit,
            ttl_seconds_after_finished=args.ttl,
            endpoint_url=args.endpoint_url,  # the embedded endpoint ends with this command: not for pods
            processes_per_host=args.processes_per_host,
        )
        text = to_yaml_stream(plan_kubernetes(request, options))  # every check before the upload
        _upload_spec(request, spec_uri)
    path = args.output or (args.out_dir / f"{request['TrainingJobName']}.yaml" if args.out_dir else None)
    if path:
        _write_atomically(path, text)
        print(f"wrote {path.resolve()}; the job spec is {spec_uri}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _request_and_spec_uri(stack, args, request, nodes: int, tasks: int, instance_type: str | None):
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
    return request, args.spec_uri or _default_spec_uri(request)


def _demo_request(args, bucket: str, nodes: int, tasks: int, instance_type: str | None) -> dict:
    from sagemaker_dist.local.demo import prepare_demo_job

    hps = {"epochs": args.epochs} if args.epochs is not None else {}
    request = prepare_demo_job(
        bucket, nodes, tasks, hyperparameters=hps, printer=None, distribution=args.distribution or DEFAULT
    ).request
    if instance_type:
        request["ResourceConfig"]["InstanceType"] = instance_type  # the demo plans for CPU; run on these
    return request


def _upload_spec(request: dict, spec_uri: str) -> None:
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


def _write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
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


def _out_dir(args, job_name: str) -> Path:
    """Where ``slurm`` writes: --out-dir, else the folder of -o, else ./sagemaker-dist-jobs/<job name>/
    (a folder of its own, never the current directory's top level)."""
    if args.out_dir:
        return args.out_dir.resolve()
    if args.output:
        return args.output.resolve().parent
    return (Path(JOBS_DIR) / job_name).resolve()


def _refuse_with_request(flags: dict) -> None:
    """Options that build a job cannot change a request file, which is run as written."""
    given = [flag for flag, value in flags.items() if value is not None]
    if given:
        raise ConfigurationError(
            f"{', '.join(given)} cannot be combined with --request: the request says it "
            "(ResourceConfig, HyperParameters); edit it instead"
        )


def slurm_command(args) -> int:
    import sys
    from contextlib import ExitStack

    from sagemaker_dist.platforms.node_plan import efa_interfaces, ranks_per_node
    from sagemaker_dist.platforms.slurm import SlurmOptions, check_tasks, directive_value, sbatch_script
    from sagemaker_dist.platforms.slurm_submit import check_slurm_client, submit, wait_for_job

    # every check before anything is written or submitted
    if args.wait and not args.submit:
        raise ConfigurationError("--wait waits for a submitted job: add --submit")
    if args.submit:
        check_slurm_client()
        if not args.wait and not (args.bucket or args.endpoint_url):
            raise ConfigurationError(
                "--submit without --wait needs S3 that outlives this command (the embedded endpoint stops "
                "with it): give --bucket (real S3) or --endpoint-url, or add --wait"
            )
    if args.partition is not None:
        directive_value("--partition", args.partition)
    if args.out_dir or args.output:  # the job's output goes beside the script: an #SBATCH line too
        directive_value("--output", str(_out_dir(args, "job")))
    request = None
    if args.request:
        flags = {"--nodes": args.nodes, "--epochs": args.epochs, "--tasks-per-node": args.tasks_per_node}
        _refuse_with_request({**flags, "--distribution": args.distribution})
        request = read_request(args.request)
    if args.instance_type:
        tasks, gpus = ranks_per_node(args.instance_type, args.tasks_per_node, "--tasks-per-node")
    else:
        gpus = args.gpus_per_node or 0
        tasks = args.tasks_per_node or gpus or 1
    check_tasks(tasks, gpus, distribution(args.distribution).title)  # --request: checked again from it
    nodes = 2 if args.nodes is None else args.nodes
    if nodes < 1:
        raise ConfigurationError(f"--nodes {nodes}: give at least 1")
    with ExitStack() as stack:
        request, spec_uri = _request_and_spec_uri(stack, args, request, nodes, tasks, args.instance_type)
        job_name = request["TrainingJobName"]
        out_dir = _out_dir(args, job_name)
        script_path = args.output.resolve() if args.output else out_dir / f"{job_name}.sbatch"
        options = SlurmOptions(
            spec=spec_uri,
            python=args.python or sys.executable,
            gpus_per_node=gpus,
            efa=bool(args.instance_type and efa_interfaces(args.instance_type)),
            partition=args.partition,
            output=str(out_dir / "%x-%j.out"),
            endpoint_url=args.endpoint_url,
        )
        script = sbatch_script(request, options)  # checks the request before anything is written
        _upload_spec(request, spec_uri)
        out_dir.mkdir(parents=True, exist_ok=True)  # Slurm writes the job's output there, but makes no folder
        _write_atomically(script_path, script, 0o755)
        print(f"wrote {script_path}; the job spec is {spec_uri}", file=sys.stderr)
        if not args.submit:
            return 0
        job_id = submit(script_path)
        print(f"submitted slurm job {job_id}", file=sys.stderr)
        if not args.wait:
            return 0
        code, fields = wait_for_job(
            job_id, echo=lambda line: print(line, file=sys.stderr), timeout=args.timeout
        )
    output = Path(fields.get("StdOut", ""))
    if output.is_file():
        sys.stdout.write(output.read_text(errors="replace"))
    print(
        f"slurm job {job_id} ended {fields.get('JobState')} with exit code {code}; output {output}",
        file=sys.stderr,
    )
    return code


def _default_spec_uri(request: dict) -> str:
    output = (request.get("OutputDataConfig") or {}).get("S3OutputPath", "").rstrip("/")
    if not output.startswith("s3://"):
        raise ConfigurationError("the request has no OutputDataConfig.S3OutputPath; give --spec-uri s3://...")
    return f"{output}/{request.get('TrainingJobName', 'job')}/spec/request.json"
