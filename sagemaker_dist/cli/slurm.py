"""Slurm as a platform: ``sagemaker-dist slurm`` writes an sbatch script (a pipe agent per node, the
ranks with srun), submits it with ``--submit`` and waits with ``--wait``. Slurm runs no tuning."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from sagemaker_dist.cli.local import add_endpoint_args, read_request
from sagemaker_dist.cli.platform_jobs import (
    add_job_source,
    refuse_with_request,
    request_and_spec_uri,
    upload_spec,
    write_atomically,
)
from sagemaker_dist.contract.distributions import distribution
from sagemaker_dist.contract.training_request import TrainingRequest
from sagemaker_dist.errors import ConfigurationError

JOBS_DIR = "sagemaker-dist-jobs"  # under the current directory: one folder per job that 'slurm' writes


@dataclass(frozen=True)
class SlurmJob:
    """The job rendered for Slurm: its request, where the pipe agents read it, the sbatch script."""

    request: dict
    spec_uri: str
    out_dir: Path
    script_path: Path
    script: str


class SlurmPlatform:
    """A job as an sbatch script; a job id to wait for once submitted."""

    name = "slurm"
    command = "slurm"
    tune_option = None  # Slurm runs no tuning
    tune_help = None
    tune_only: dict[str, str] = {}

    def register(self, subparsers):
        s = subparsers.add_parser(
            "slurm",
            help="write (and submit) an sbatch script: a pipe agent per node, the ranks with srun --mpi=pmix",
            description=(
                "Plan the job as for SageMaker (shards, manifests, source package and the request, uploaded "
                "to S3), then write an sbatch script: one pipe agent per node in the background, one srun "
                "task per rank (Horovod: --mpi=pmix, an MPI-built Horovod; torchrun: torchrun's variables, "
                "the ranks meeting at the first node), a failing rank failing the job. --submit runs sbatch "
                "on the cluster $SLURM_CONF names; --wait waits and exits with the job's exit code. S3 as "
                "for 'local': embedded (only with --wait: it lives as long as this command) unless --bucket "
                f"or --endpoint-url. Files go to --out-dir (default ./{JOBS_DIR}/<job name>/), nowhere else."
            ),
        )
        add_job_source(s, lambda d: d.slurm is not None)
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
            f"<job name>-<job id>.out (default ./{JOBS_DIR}/<job name>/, or the folder of -o; for the "
            "output, on a filesystem the nodes share)",
        )
        s.add_argument("-o", "--output", type=Path, help="the script's path (default DIR/<job name>.sbatch)")
        s.add_argument("--submit", action="store_true", help="run sbatch on the cluster $SLURM_CONF names")
        s.add_argument(
            "--wait", action="store_true", help="with --submit: wait, print its output, exit with its code"
        )
        s.add_argument("--timeout", type=float, help="with --wait: cancel the job after this many seconds")
        add_endpoint_args(s)
        return s

    def add_tune_options(self, p) -> None:
        pass  # no tuning here

    def render(self, args, stack) -> SlurmJob:
        from sagemaker_dist.platforms.node_plan import efa_interfaces
        from sagemaker_dist.platforms.slurm import SlurmOptions, sbatch_script

        request, nodes, tasks, gpus = _checked_shape(args)  # every check before anything is written
        request, spec_uri = request_and_spec_uri(stack, args, request, nodes, tasks, args.instance_type)
        job_name = TrainingRequest.parse(request).name
        out_dir = _out_dir(args, job_name)
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
        script_path = args.output.resolve() if args.output else out_dir / f"{job_name}.sbatch"
        return SlurmJob(request, spec_uri, out_dir, script_path, script)

    def submit(self, args, job: SlurmJob) -> str | None:
        """The spec uploaded and the script written; with --submit, sbatch's job id to wait for."""
        from sagemaker_dist.platforms.slurm_submit import submit

        upload_spec(job.request, job.spec_uri)
        job.out_dir.mkdir(parents=True, exist_ok=True)  # Slurm writes the job's output there, makes no folder
        write_atomically(job.script_path, job.script, 0o755)
        print(f"wrote {job.script_path}; the job spec is {job.spec_uri}", file=sys.stderr)
        if not args.submit:
            return None
        job_id = submit(job.script_path)
        print(f"submitted slurm job {job_id}", file=sys.stderr)
        return job_id if args.wait else None

    def wait(self, args, job_id: str) -> int:
        """Until the job ends (--timeout cancels it): its output on stdout, its exit code returned."""
        from sagemaker_dist.platforms.slurm_submit import wait_for_job

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

    def tune(self, args, job_args, spec) -> int:
        raise ConfigurationError("Slurm runs no tuning: tune on SageMaker, here (--local) or Katib (--k8s)")


def _checked_shape(args) -> tuple[dict | None, int, int, int]:
    """The options checked before anything is written or submitted: the request given (None: the
    demo's), the nodes, ranks per node and GPUs per node."""
    from sagemaker_dist.platforms.node_plan import ranks_per_node
    from sagemaker_dist.platforms.slurm import check_tasks, directive_value
    from sagemaker_dist.platforms.slurm_submit import check_slurm_client

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
        refuse_with_request({**flags, "--distribution": args.distribution})
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
    return request, nodes, tasks, gpus


def _out_dir(args, job_name: str) -> Path:
    """Where ``slurm`` writes: --out-dir, else the folder of -o, else ./sagemaker-dist-jobs/<job name>/
    (a folder of its own, never the current directory's top level)."""
    if args.out_dir:
        return args.out_dir.resolve()
    if args.output:
        return args.output.resolve().parent
    return (Path(JOBS_DIR) / job_name).resolve()


SLURM = SlurmPlatform()
