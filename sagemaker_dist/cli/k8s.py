"""Kubernetes as a platform: ``sagemaker-dist k8s`` writes the job's manifests (a Kubeflow MPIJob, or a
Trainer TrainJob and its runtime, each pod with a pipe-agent sidecar) and ``tune --k8s`` a Katib
Experiment over them; ``kubectl apply`` submits them.

One row, not one per kind: the kind is not the user's choice but the job's, the distribution's
``kubernetes`` in the registry of distributions (MPIJob for Horovod, TrainJob for torchrun), and the
planners look it up (``platforms.kubernetes.PLANNERS``, ``platforms.katib.TRIALS``). A new kind is a
planner there and the registry's word, not a platform.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from sagemaker_dist.cli.local import add_endpoint_args, read_request
from sagemaker_dist.cli.platform_jobs import (
    add_job_source,
    default_spec_uri,
    drop_demo_defaults,
    err,
    refuse_with_request,
    request_and_spec_uri,
    upload_spec,
    write_atomically,
)
from sagemaker_dist.contract.training_request import TrainingRequest
from sagemaker_dist.errors import ConfigurationError

DEFAULT_IMAGE = "sagemaker-dist:latest"


@dataclass(frozen=True)
class KubernetesJob:
    """The job rendered for Kubernetes: its request, where the pipe agents read it, the YAML stream."""

    request: dict
    spec_uri: str
    text: str


class KubernetesPlatform:
    """A job as the manifests that run it; ``kubectl apply`` submits them, so this command ends once they
    are written. Tuning is a Katib Experiment."""

    name = "k8s"
    command = "k8s"
    tune_option = "--k8s"
    tune_help = "write a Katib Experiment (kubeflow.org/v1beta1)"
    tune_only = {"katib_setup": "--katib-setup is for tune --k8s"}

    def register(self, subparsers):
        k = subparsers.add_parser(
            "k8s",
            help="write the job for Kubernetes: a Kubeflow MPIJob (Horovod) or Trainer TrainJob (torchrun), "
            "with a pipe-agent sidecar per node",
            description=(
                "Plan the job as for SageMaker (shards, manifests, source package and the request, uploaded "
                "to S3), then print what runs it on Kubernetes, one pod per instance with its GPUs (and EFA) "
                "and a pipe-agent sidecar feeding its FIFOs: for Horovod a Kubeflow MPIJob (mpi-operator "
                "v0.8, a launcher running mpirun); for torchrun a Kubeflow Trainer v2.3 TrainJob with a "
                "TrainingRuntime of its own (torchrun on each node). Apply it with kubectl apply -f. S3 as "
                "for 'local': embedded unless --bucket or --endpoint-url."
            ),
        )
        add_job_source(k, lambda d: d.kubernetes is not None)
        k.add_argument("--instance-type", help="the worker nodes' type, for --demo (default ml.p4d.24xlarge)")
        k.add_argument("--instance-count", type=int, help="workers, for --demo (default 2)")
        k.add_argument(
            "--processes-per-host", type=int, help="ranks per worker (default: its GPUs; CPU types)"
        )
        k.add_argument("--epochs", type=int, help="for --demo: -p epochs=N")
        k.add_argument(
            "--image",
            default=DEFAULT_IMAGE,
            help=f"the training image (default {DEFAULT_IMAGE}; container/Dockerfile: sshd, mpi4py, Horovod "
            "and sagemaker-dist; for torchrun pass the PyTorch image, container/build_and_push.sh --pytorch)",
        )
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
        return k

    def add_tune_options(self, p) -> None:
        p.add_argument(
            "--katib-setup", type=Path, help="--k8s: also write the RBAC and katib-config Katib needs"
        )

    def render(self, args, stack) -> KubernetesJob:
        from sagemaker_dist.platforms.k8s_pods import to_yaml_stream
        from sagemaker_dist.platforms.kubernetes import plan_kubernetes

        refused = {"--epochs": args.epochs, "--distribution": args.distribution}
        request, count, per_host, instance_type = _checked_shape(args, refused)
        request, spec_uri = request_and_spec_uri(stack, args, request, count, per_host, instance_type)
        text = to_yaml_stream(plan_kubernetes(request, _job_options(args, spec_uri)))  # checked before upload
        return KubernetesJob(request, spec_uri, text)

    def submit(self, args, job: KubernetesJob) -> None:
        """The spec uploaded and the YAML written (-o, --out-dir) or printed; kubectl applies it."""
        upload_spec(job.request, job.spec_uri)
        name = TrainingRequest.parse(job.request).name
        path = args.output or (args.out_dir / f"{name}.yaml" if args.out_dir else None)
        if path:
            write_atomically(path, job.text)
            print(f"wrote {path.resolve()}; the job spec is {job.spec_uri}", file=sys.stderr)
        else:
            sys.stdout.write(job.text)

    def wait(self, args, handle) -> int:
        return 0  # kubectl applies and watches the job: nothing runs here to wait for

    def tune(self, args, job, spec) -> int:
        """A Katib Experiment over the job (a TrainJob's runtime first), the trials' spec uploaded."""
        from contextlib import ExitStack

        from sagemaker_dist.aws.tuning import render_tuning_request, trial_training_request
        from sagemaker_dist.aws.tuning_validation import validate_tuning_request
        from sagemaker_dist.platforms.k8s_pods import to_yaml_stream
        from sagemaker_dist.platforms.katib import (
            ExperimentOptions,
            KatibError,
            check_experiment_spec,
            plan_experiment,
        )
        from sagemaker_dist.platforms.katib_rules import experiment_problems

        request, count, per_host, instance_type = _checked_shape(job, {"--epochs": job.epochs})
        if request is not None:
            spec.check_static(TrainingRequest.parse(request).hyperparameters, "hyperparameter in the request")
        with ExitStack() as stack:
            request, _ = request_and_spec_uri(stack, job, request, count, per_host, instance_type)
            if job.demo:
                request = drop_demo_defaults(
                    request, spec, {"epochs": job.epochs} if job.epochs is not None else {}
                )
            job_name = TrainingRequest.parse(request).name
            name = job_name.lower()
            check_experiment_spec(spec, name)
            tuning, _ = render_tuning_request(request, spec, name[:32].rstrip("-"))
            validate_tuning_request(tuning, spec)
            static = trial_training_request(tuning, job_name, {})  # what the agents read
            spec_uri = job.spec_uri or default_spec_uri(static)
            experiment = ExperimentOptions(namespace=job.namespace)
            documents = plan_experiment(tuning, spec, _job_options(job, spec_uri), experiment)
            problems = experiment_problems(documents[-1])
            if problems:
                raise KatibError(
                    "the Experiment would be refused by Katib:\n" + "\n".join(f"  - {p}" for p in problems)
                )
            text = to_yaml_stream(documents)  # a TrainJob's runtime, then the Experiment
            upload_spec(static, spec_uri)
        _katib_setup(args, documents[-1])
        if job.output:
            write_atomically(job.output, text)
            err(f"wrote {job.output}; the job spec is {spec_uri}")
        else:
            sys.stdout.write(text)
        return 0


def _checked_shape(args, refused: dict) -> tuple[dict | None, int, int | None, str]:
    """Before anything is written: the request given (None: the demo's; ``refused`` are the options it
    cannot be combined with), the workers, ranks per worker (None: the request's own) and their type."""
    from sagemaker_dist.platforms.node_plan import ranks_per_node

    request = None
    if args.request:  # before anything is written: a bad file or option fails at once
        flags = {"--instance-type": args.instance_type, "--instance-count": args.instance_count}
        refuse_with_request({**flags, **refused})
        request = read_request(args.request)
    instance_type = args.instance_type or "ml.p4d.24xlarge"
    count = 2 if args.instance_count is None else args.instance_count
    per_host = None
    if args.demo:
        if count < 1:
            raise ConfigurationError(f"--instance-count {count}: give at least 1 worker")
        per_host, _ = ranks_per_node(instance_type, args.processes_per_host)  # GPU checks before any S3
    return request, count, per_host, instance_type


def _job_options(args, spec_uri: str):
    from sagemaker_dist.platforms.k8s_pods import K8sJobOptions

    return K8sJobOptions(
        image=args.image,
        spec_uri=spec_uri,
        namespace=args.namespace,
        service_account=args.service_account,
        backoff_limit=args.backoff_limit,
        ttl_seconds_after_finished=args.ttl,
        endpoint_url=args.endpoint_url,  # the embedded endpoint ends with this command: not for pods
        processes_per_host=args.processes_per_host,
    )


def _katib_setup(args, experiment: dict) -> None:
    """What Katib needs before it runs the trials: nothing for TrainJobs; for v2beta1 MPIJobs its config
    and RBAC, written with --katib-setup."""
    from sagemaker_dist.platforms.k8s_pods import to_yaml_stream
    from sagemaker_dist.platforms.katib import katib_setup_documents, needs_katib_setup

    if not needs_katib_setup(experiment):
        err(
            "Katib v0.19 runs TrainJob trials as installed (its katib-config lists "
            "TrainJob.v1alpha1.trainer.kubeflow.org); apply the TrainingRuntime with the Experiment"
            + ("; --katib-setup is for MPIJob trials: nothing written there" if args.katib_setup else "")
        )
    elif args.katib_setup:
        setup = to_yaml_stream(katib_setup_documents())
        write_atomically(args.katib_setup, setup)
        err(
            f"wrote {args.katib_setup}: RBAC and katib-config for MPIJob v2beta1 trials (then restart "
            "katib-controller)"
        )
    else:
        err("Katib runs MPIJob v2beta1 trials once its config lists them: --katib-setup FILE writes that")


KUBERNETES = KubernetesPlatform()
