"""The launchers under which the image's toolkit entry point starts the ranks, as in the DLC:

- ``Toolkit``: AWS's sagemaker-training ``train`` in a namespace of its own per simulated host, in the
  container environment (``toolkit``, ``toolkit_host``; torchrun's toolkit: one toolkit host per
  simulated host, side by side, under ``torchrun``'s host supervisor);
- ``Container``: the training image itself (``podman run IMAGE train``, ``container``); several hosts
  are one container each on a network of the job's own (``cluster``).

Both give each host the source dir at /opt/ml/code where one is given (the toolkit downloads
``sagemaker_submit_directory`` from S3 otherwise), and both add the toolkit's own verdict (its
/opt/ml/output/failure) to the failure local mode saw.
"""

from __future__ import annotations

import sys
from abc import abstractmethod
from pathlib import Path

from sagemaker_dist.contract.distributions import distribution
from sagemaker_dist.contract.environment import inherited
from sagemaker_dist.local.launchers import CONTAINER, TOOLKIT
from sagemaker_dist.local.launchers.base import Launcher, LocalJobError, RankGroup, rank_echo
from sagemaker_dist.local.launchers.cluster import (
    check_cluster_endpoint,
    cluster_group,
    copy_code,
    supervise_cluster,
)
from sagemaker_dist.local.launchers.cluster_plan import INTERFACE
from sagemaker_dist.local.launchers.container import (
    ContainerGroup,
    check_container_image,
    container_environment,
    sshd_stub,
    toolkit_host_env,
)
from sagemaker_dist.local.launchers.private_net import PrivateNet, loopback_endpoint
from sagemaker_dist.local.launchers.toolkit import (
    blame_the_rank_that_raised,
    check_toolkit_host,
    toolkit_environment,
    toolkit_outcome,
)
from sagemaker_dist.local.launchers.toolkit_host import toolkit_host_command
from sagemaker_dist.local.launchers.torchrun import host_group_command
from sagemaker_dist.local.rank_entry import JOB_ENV, write_job_file
from sagemaker_dist.local.supervision import supervise


class ToolkitHosts(Launcher):
    """The toolkit starts the ranks; local mode supervises its hosts."""

    defaults_to_one_host = True

    @property
    def each_host(self) -> bool:
        """The toolkit runs on every simulated host, side by side (torchrun's: no SSH from a master)."""
        return False

    def _check_hosts(self) -> None:
        if self.job.hosts != 1 and not self.each_host:
            raise LocalJobError(
                f"launcher {self.name!r} simulates one host (its ranks started by the toolkit's mpirun); "
                f"this job has {self.job.hosts}. Use --instance-count 1 with --processes-per-host for the "
                "ranks, launcher 'container' (the image, one container per host), or 'horovodrun' or 'mpirun'"
            )

    @abstractmethod
    def _host_group(self, setup) -> RankGroup:
        """The one simulated host (or the toolkit host per simulated host), not yet started."""

    def group(self, setup) -> RankGroup:
        """The hosts, not yet started, in a network namespace of the job's own; with no mpirun (one
        worker alone, untagged) its lines count as rank 0's."""
        copy_code(setup.given_source, setup.trees)
        group = self._host_group(setup)
        if self.job.world == 1 and not self.each_host:
            group.untagged_rank = 0
        group.network = PrivateNet(group.env, setup.echo)
        return group

    def _wait(self, group, feed_errors, trees, started) -> str | None:
        job = self.job
        return supervise(group, feed_errors, trees, started, job.timeout)

    def supervise(self, group, feed_errors, trees, started) -> str | None:
        """Local mode's verdict, the toolkit's own added (the failure file it wrote)."""
        failure = self._wait(group, feed_errors, trees, started)
        group.finish_output()
        failure = blame_the_rank_that_raised(failure, group, trees)
        return toolkit_outcome(failure, trees if self.each_host else trees[:1])


class Toolkit(ToolkitHosts):
    """AWS's toolkit in the container environment (``container_python``), a namespace per host."""

    name = TOOLKIT
    python: Path  # the container Python, once checked

    @property
    def each_host(self) -> bool:
        return distribution(self.job.distribution).toolkit_starts_each_host

    def check(self) -> None:
        """The container environment and this machine's namespaces; Horovod under the toolkit's mpirun
        needs Horovod with MPI (the entry's ``mpi``)."""
        entry = distribution(self.job.distribution)
        self.python = check_toolkit_host(
            self.options.container_python,
            horovod=entry.mpi,
            work_dir=self.options.work_dir,
            training_module=entry.toolkit_training_module,
        )
        self._check_hosts()

    def _host_group(self, setup) -> RankGroup:
        job, work, trees = self.job, setup.work, setup.trees
        entry = distribution(job.distribution)
        state = work / "namespace"
        env = toolkit_environment(
            inherited(), self.python, job.container_variables, entry.toolkit_training_module
        )
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        env.update(toolkit_host_env(job.distribution, setup.extra_env, env))
        if self.each_host:  # a toolkit host per simulated host, under our host supervisor
            env[JOB_ENV] = str(work / "job.json")
            write_job_file(Path(env[JOB_ENV]), trees)
            command = host_group_command(sys.executable, self.python, state)
        else:
            command = toolkit_host_command(self.python, trees[0].root, state, [t.name for t in trees])
        pid_dir = work / "ranks"  # stays empty: the toolkit starts the ranks, not our entry
        pid_dir.mkdir()
        show = rank_echo(trees, setup.echo)
        return RankGroup(command, env, pid_dir, job.world, show)


class Container(ToolkitHosts):
    """The training image (``image``) is each host; several hosts are a cluster of containers."""

    name = CONTAINER
    image: str  # the training image, once checked

    @property
    def cluster(self) -> bool:
        """One container per host on a network of its own."""
        return self.job.hosts > 1

    @property
    def interface(self) -> str:
        return INTERFACE if self.cluster else "lo"

    def check(self) -> None:
        self.image = check_container_image(self.options.image)
        if self.cluster:
            check_cluster_endpoint(inherited())

    def group(self, setup) -> RankGroup:
        """Several hosts: the job's network (released by ``setup.stack``) and its containers, which
        have their network; one host: the container, in a namespace of the job's own."""
        if self.cluster:
            trees, code, work, echo = setup.trees, setup.given_source, setup.work, setup.echo
            return cluster_group(setup.stack, self.job, trees, code, work, setup.extra_env, echo, self.image)
        return super().group(setup)

    def _host_group(self, setup) -> RankGroup:
        job, work, trees = self.job, setup.work, setup.trees
        pid_dir = work / "ranks"  # stays empty, as the toolkit's
        pid_dir.mkdir()
        host_env = toolkit_host_env(job.distribution, setup.extra_env)
        env = container_environment(inherited(), job.container_variables, host_env)
        show = rank_echo(trees, setup.echo)
        # S3 off this machine's loopback: the container shares this machine's network (private_net),
        # so its sshd, which would listen there as root, is a stub
        _, off_loopback = loopback_endpoint({**inherited(), **env})
        stub = sshd_stub(work) if off_loopback else None
        group = ContainerGroup(
            self.image, trees[0].root, [t.name for t in trees], job.name, env, pid_dir, job.world, show, stub
        )
        if distribution(job.distribution).toolkit_starts_each_host:  # the toolkit's torchrun, --tee 3
            group.tee_first_rank = 0
        return group

    def _wait(self, group, feed_errors, trees, started) -> str | None:
        if self.cluster:
            return supervise_cluster(group, feed_errors, started, self.job.timeout)
        return super()._wait(group, feed_errors, trees, started)
