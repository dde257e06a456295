"""The job as an sbatch script, as text: one pipe agent per node in the background, then one ``srun``
task per rank, each in its node's /opt/ml tree, started as the job's distribution says (its registry
entry's ``slurm``): Horovod with ``--mpi=pmix`` (an MPI-built Horovod), torchrun jobs with torchrun's
variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` the first node's address,
``MASTER_PORT`` a port of the job's own) so that each rank is what torchrun would start. Pure: no I/O.

Every node's tree is ``$SD_ROOT/node-<SLURM_NODEID>`` (under ``$TMPDIR``, else ``/tmp``, by default;
0700, the job user's alone; the node id keeps trees apart where several slurmds share one file system).
Ranks get it as
``$SAGEMAKER_DIST_OPT_ML`` and start in its ``code/``, with the arguments the sagemaker-training
toolkit would pass. ``srun --kill-on-bad-exit=1 --label`` stops every rank when one fails and says
which (``srun: error: n2: task 1: Exited with exit code 3``); the script exits with the step's code.
Checkpoints (CheckpointConfig.S3Uri) are synced by each node's agent; rank 0 syncs TensorBoard.

Stops: ``#SBATCH --signal=TERM@120`` sends SIGTERM to every step's tasks (the ranks and the agents, not
srun itself) 120 s before the time limit, as SageMaker stops a job at MaxRuntimeInSeconds: the ranks
agree on a step, rank 0 checkpoints it and they end 0. ``scancel --signal=TERM <job>`` does the same at
any time. A plain ``scancel`` or a preemption also sends SIGTERM, with the cluster's KillWait (default
30 s) or the partition's GraceTime before SIGKILL. The agents (``--drain``) keep feeding and syncing
checkpoints after their SIGTERM, until the script ends them with SIGINT once the ranks have ended.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from sagemaker_dist.contract import toolkit
from sagemaker_dist.contract.distributions import distribution
from sagemaker_dist.contract.stop_window import AGENT_DRAIN_S, STOP_WINDOW_S
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.host.job_spec import JobSpec
from sagemaker_dist.platforms.node_plan import check_slurm_job
from sagemaker_dist.platforms.pipe_agent import READY_FILE

AGENT_STEP = "sagemaker-dist-pipe-agents"  # the agents' step name, to signal that step alone
# Expanded by the batch shell: the job's own temporary directory where Slurm gives one ($TMPDIR), made
# private (0700) by the first agent; one another user already owns is refused.
DEFAULT_ROOT_BASE = "${TMPDIR:-/tmp}/sagemaker-dist-$SLURM_JOB_ID"
# the rendezvous port of a torchrun job: one of 10000 below Linux's ephemeral ports (32768-60999), per
# job id, so that jobs sharing a node differ
MASTER_PORT = "$((20000 + SLURM_JOB_ID % 10000))"


class SlurmJobError(ConfigurationError):
    """A job that cannot run under Slurm as asked; the message says what to change."""


@dataclass(frozen=True)
class SlurmOptions:
    """What the request does not say: where the spec is, which Python, the allocation's extras."""

    spec: str  # the request: a path every node can read, or an s3:// URI
    python: str = "python3"  # with Horovod built with MPI, TensorFlow and sagemaker-dist
    gpus_per_node: int = 0
    efa: bool = False  # the nodes have EFA: libfabric's efa provider for NCCL and Open MPI
    partition: str | None = None
    output: str = "%x-%j.out"
    root_base: str = DEFAULT_ROOT_BASE
    endpoint_url: str | None = None
    agent_ready_seconds: int = 300
    toolkit_version: str = toolkit.DEFAULT_TOOLKIT_VERSION


def check_tasks(tasks_per_node: int, gpus_per_node: int, title: str = "Horovod") -> None:
    """One rank per GPU: more tasks per node than GPUs is refused (0 GPUs: a CPU job, any count)."""
    if tasks_per_node < 1:
        raise SlurmJobError(f"--tasks-per-node {tasks_per_node}: give at least 1")
    if gpus_per_node and tasks_per_node > gpus_per_node:
        raise SlurmJobError(
            f"{tasks_per_node} tasks per node but {gpus_per_node} GPU(s) per node: {title} runs one rank per "
            f"GPU, so use --tasks-per-node {gpus_per_node} or fewer"
        )


def directive_value(option: str, value: str) -> str:
    """A value for an ``#SBATCH`` line: sbatch splits those at blanks and ends them at a newline, so a
    blank or a control character would add an option or a line of its own."""
    if not value or any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise SlurmJobError(
            f"{option} {value!r}: an #SBATCH value cannot be empty or hold blanks, newlines or control "
            "characters; use a partition name or path without them"
        )
    return value


def _q(words) -> str:
    return " ".join(shlex.quote(str(w)) for w in words)


def _directives(job: JobSpec, options: SlurmOptions) -> list[str]:
    """The ``#SBATCH`` options: the allocation, the output file, the stop signal, the time limit."""
    directives = [
        f"--job-name={job.name}",
        f"--nodes={job.hosts}",
        f"--ntasks-per-node={job.processes_per_host}",
        f"--output={directive_value('--output', options.output)}",
        f"--signal=TERM@{STOP_WINDOW_S}",  # to the steps' tasks: the ranks stop and checkpoint in time
    ]
    if options.gpus_per_node:
        directives.append(f"--gpus-per-node={options.gpus_per_node}")
    if job.max_runtime:
        directives.append(f"--time={math.ceil(job.max_runtime / 60)}")  # minutes: SageMaker's MaxRuntime
    if options.partition:
        directives.append(f"--partition={directive_value('--partition', options.partition)}")
    return directives


def _rendezvous(start) -> str:
    """torch.distributed's meeting point: the first node's address (as Slurm knows it), a job's port."""
    if not start.rendezvous:
        return ""
    return (
        "# The ranks meet at the first node of the allocation, on a port of this job's own.\n"
        'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)\n'
        'SD_MASTER_ADDR=$(scontrol show node "$first" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)\n'
        f'export SD_MASTER_ADDR="${{SD_MASTER_ADDR:-$first}}" SD_MASTER_PORT="{MASTER_PORT}"\n'
    )


def _task_commands(job: JobSpec, options: SlurmOptions, entry) -> tuple[str, str, str, str, str]:
    """The shell words of each node's pipe agent, how it starts in its node's tree, the wait for it to be
    ready, how a rank's task enters its tree, and the rank's command."""
    argv = toolkit.container_argv(job.hyperparameters, options.toolkit_version)
    agent = _q(
        [
            options.python,
            "-m",
            "sagemaker_dist.cli",
            "pipe-agent",
            "--spec",
            options.spec,
            "--drain",
            AGENT_DRAIN_S,
        ]
    )
    ranks = _q([options.python, job.entry_point, *argv])
    agent_start = (
        'exec "$0" "$@" --node-index "$SLURM_NODEID" --root "$SD_ROOT/node-$SLURM_NODEID" --private-root'
    )
    wait_ready = (
        f"for i in $(seq {options.agent_ready_seconds * 2}); do "
        f'[ -f "$SD_ROOT/node-$SLURM_NODEID/{READY_FILE}" ] && exit 0; sleep 0.5; done; '
        f'echo "node $SLURM_NODEID: its pipe agent was not ready after {options.agent_ready_seconds} s" >&2; '
        "exit 1"
    )
    rank_variables = " ".join(
        f'{name}="{value}"' for name, value in entry.slurm_rank_variables(job.processes_per_host)
    )
    in_tree = (  # each task: its node's tree, its rank's variables from Slurm's (the registry's)
        f'export SAGEMAKER_DIST_OPT_ML="$SD_ROOT/node-$SLURM_NODEID" {rank_variables}; '
        'cd "$SAGEMAKER_DIST_OPT_ML/code" && exec "$0" "$@"'
    )
    return agent, agent_start, wait_ready, in_tree, ranks


def sbatch_script(request: dict | JobSpec, options: SlurmOptions) -> str:
    """The sbatch script that runs ``request`` on InstanceCount nodes x processes-per-host tasks."""
    job = JobSpec.of(request, options.toolkit_version)
    check_slurm_job(job, "the sbatch script")
    entry = distribution(job.distribution)
    start = entry.slurm
    check_tasks(job.processes_per_host, options.gpus_per_node, entry.title)
    nodes, tasks = job.hosts, job.processes_per_host
    directives = _directives(job, options)
    per_node = f"--nodes={nodes} --ntasks={nodes} --ntasks-per-node=1"
    exports = f"export AWS_ENDPOINT_URL={shlex.quote(options.endpoint_url)}\n" if options.endpoint_url else ""
    exports += "export FI_PROVIDER=efa  # EFA for NCCL and Open MPI\n" if options.efa else ""
    agent, agent_start, wait_ready, in_tree, ranks = _task_commands(job, options, entry)
    rendezvous = _rendezvous(start)
    mpi = f" --mpi={start.mpi}" if start.mpi else ""
    failed = "the training step failed with exit code $STATUS; srun's 'task N' lines above name the rank(s)"
    return f"""#!/bin/bash
# Written by sagemaker-dist slurm: job {job.name}, {nodes} node(s) x {tasks} {entry.title} rank(s),
# Pipe-mode FIFOs fed by one pipe agent per node.
{chr(10).join("#SBATCH " + d for d in directives)}
set -uo pipefail
umask 077  # the job's files are its user's alone (FIFOs, checkpoints, code)
export SD_ROOT="${{SAGEMAKER_DIST_ROOT_BASE:-{options.root_base}}}"  # each node's tree: $SD_ROOT/node-<id>
{exports}{rendezvous}
# One pipe agent per node, in the background: it writes the node's /opt/ml tree and feeds its FIFOs.
# A tree already there is stale (a cancelled job of the same id could not remove its own): it goes;
# $SD_ROOT is made 0700 and refused if another user owns it.
srun --overlap {per_node} --kill-on-bad-exit=1 --label --job-name={AGENT_STEP} \\
  sh -c {shlex.quote(agent_start)} \\
  {agent} &
AGENTS=$!
stop_agents() {{  # SIGINT to each agent: now (a SIGTERM drains; one to srun itself would SIGKILL them)
  local step
  step=$(squeue -h -s -j "$SLURM_JOB_ID" -o "%i %j" | awk '$2 == "{AGENT_STEP}" {{print $1}}')
  if [ -n "$step" ]; then scancel --signal=INT "$step"; else kill "$AGENTS" 2>/dev/null; fi
  wait "$AGENTS"
}}
finish() {{  # stop the agents, remove the trees (outputs are in S3; SAGEMAKER_DIST_KEEP_ROOT=1 keeps them)
  stop_agents
  [ -n "${{SAGEMAKER_DIST_KEEP_ROOT:-}}" ] ||
    srun --overlap {per_node} sh -c 'rm -rf "$SD_ROOT/node-$SLURM_NODEID"; rmdir "$SD_ROOT" 2>/dev/null; true'
  exit "$1"
}}
trap 'finish 143' TERM INT

# Start the ranks once every node's agent is feeding (and stop if an agent fails first).
srun --overlap {per_node} sh -c {shlex.quote(wait_ready)} &
WAITER=$!
while kill -0 "$WAITER" 2>/dev/null; do
  if ! kill -0 "$AGENTS" 2>/dev/null; then
    echo "sagemaker-dist: a pipe agent stopped before the ranks started (its error is above)" >&2
    kill "$WAITER" 2>/dev/null; finish 1
  fi
  sleep 0.5
done
wait "$WAITER" || finish 1

srun --overlap{mpi} --nodes={nodes} --ntasks-per-node={tasks} --kill-on-bad-exit=1 --label \\
  sh -c {shlex.quote(in_tree)} \\
  {ranks}
STATUS=$?
if [ "$STATUS" -ne 0 ]; then
  echo "sagemaker-dist: {failed}" >&2
fi
finish "$STATUS"
"""
