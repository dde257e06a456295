"""The launchers whose every rank enters its simulated host through ``sagemaker_dist.local.rank_entry``
(its /opt/ml tree, ``SM_*``, the script's arguments as the toolkit passes them), all on this machine:

- ``Horovodrun`` and ``Mpirun``: Horovod's or Open MPI's launcher starts every rank (``mpi``);
- ``TfConfig``: a ``tf-mwms`` job's one worker per host with ``TF_CONFIG`` (``tf_config``);
- ``Torchrun``: a ``torchrun`` job's ``torchrun`` once per simulated host (``torchrun``).

Each differs only in its command (``rank_command``) and its checks; the ranks' job description,
environment and supervision are ``EntryRanks``'.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from pathlib import Path

import sagemaker_dist
from sagemaker_dist.contract import toolkit
from sagemaker_dist.contract.distributions import LOCAL_MPI_ENV
from sagemaker_dist.contract.environment import inherited
from sagemaker_dist.contract.shell_words import ShellSyntaxError
from sagemaker_dist.host.job_spec import JobSpec
from sagemaker_dist.local.launchers import HOROVODRUN, MPIRUN, TF_CONFIG, TORCHRUN
from sagemaker_dist.local.launchers.base import Launcher, LocalJobError, RankGroup, rank_echo
from sagemaker_dist.local.launchers.mpi import check_hostname_resolves, horovodrun_command, mpirun_command
from sagemaker_dist.local.launchers.private_net import PrivateNet
from sagemaker_dist.local.launchers.torchrun import host_group_command
from sagemaker_dist.local.rank_entry import JOB_ENV, write_job_file
from sagemaker_dist.local.supervision import supervise


def entry_command(python: str) -> list[str]:
    """One rank: the local rank entry, run with ``python``."""
    return [python, "-u", "-m", "sagemaker_dist.local.rank_entry"]


class EntryRanks(Launcher):
    """A launcher of ours or Horovod's starts the ranks, each in its host through the rank entry."""

    command: list[str]

    @staticmethod
    @abstractmethod
    def rank_command(world_size: int, python: str) -> list[str]:
        """The command that starts ``world_size`` ranks of the rank entry (run with ``python``)."""

    def check(self) -> None:
        self.command = self.rank_command(self.job.world, self.options.python)

    def group(self, setup) -> RankGroup:
        """The ranks, not yet started: their job description file and environment, in a network
        namespace of the job's own."""
        job, work = self.job, setup.work
        pid_dir = work / "ranks"
        pid_dir.mkdir()
        job_file = work / "job.json"
        env = inherited()
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env.update(setup.extra_env or {})
        env.update({JOB_ENV: str(job_file), "PYTHONUNBUFFERED": "1"})
        package_parent = str(Path(sagemaker_dist.__file__).resolve().parents[1])  # where this package is
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH")) if p)
        write_job_file(
            job_file,
            setup.trees,
            source_dir=str(setup.code_dir),
            entry_point=job.entry_point,
            args=script_argv(job, env, setup.code_dir),
            pid_dir=str(pid_dir),
        )
        show = rank_echo(setup.trees, setup.echo)
        group = RankGroup(self.command, env, pid_dir, job.world, show)
        group.reports_pids = True
        group.network = PrivateNet(group.env, setup.echo)
        return group

    def supervise(self, group, feed_errors, trees, started) -> str | None:
        failure = supervise(group, feed_errors, trees, started, self.job.timeout)
        group.finish_output()
        return failure


class Horovodrun(EntryRanks):
    name = HOROVODRUN

    @staticmethod
    def rank_command(world_size: int, python: str) -> list[str]:
        return horovodrun_command(world_size, entry_command(python))

    def check(self) -> None:
        super().check()
        check_hostname_resolves()


class Mpirun(EntryRanks):
    name = MPIRUN

    @staticmethod
    def rank_command(world_size: int, python: str) -> list[str]:
        return mpirun_command(world_size, entry_command(python), python)

    def group(self, setup) -> RankGroup:
        group = super().group(setup)
        for name, value in LOCAL_MPI_ENV:  # the ranks inherit mpirun's environment; a value given wins
            group.env.setdefault(name, value)
        return group


class TfConfig(EntryRanks):
    name = TF_CONFIG

    @staticmethod
    def rank_command(world_size: int, python: str) -> list[str]:
        launcher = [python, "-u", "-m", "sagemaker_dist.local.launchers.tf_config"]
        return [*launcher, "--workers", str(world_size), *entry_command(python)]


class Torchrun(EntryRanks):
    name = TORCHRUN

    @staticmethod
    def rank_command(world_size: int, python: str) -> list[str]:
        """torchrun once per simulated host; each starts its host's ranks."""
        return host_group_command(python, python, rank_cmd=entry_command(python))


def script_argv(job: JobSpec, env: dict, code_dir: Path) -> list[str]:
    """The entry script's arguments exactly as the image's sagemaker-training toolkit passes them."""
    try:
        return toolkit.received_argv(job.toolkit_args, job.toolkit_version, env, str(code_dir))
    except ShellSyntaxError:
        problems = toolkit.changed_hyperparameters(job.hyperparameters, job.toolkit_version, env)
        raise LocalJobError("; ".join(p for p in problems if "broken command line" in p)) from None
