"""``launcher="container"`` on several hosts: one container of the training image per host, as SageMaker
runs a multi-instance job, on a private podman network the job creates and removes.

Each host is ``IMAGE train`` with its own tree at /opt/ml, hostname ``algo-N`` at a fixed address of
an --internal bridge (no route out of this machine), every other host in its /etc/hosts, and
``network_interface_name`` = the container's interface in resourceconfig.json. The image's toolkit
does the rest as on SageMaker: sshd on every host, the master's mpirun over SSH across hosts (or, for
tf-mwms, ``TF_CONFIG`` and one worker per host; for torchrun, torchrun on each host against
``algo-1:7777``), the status file. The S3 endpoint on this machine's
loopback is relayed onto each host's loopback at the same port (``netns_relay``), so
``AWS_ENDPOINT_URL`` is the same URL everywhere.

Local mode bounds what the toolkit leaves unbounded and says which wait ran out: the master's wait for
every worker's SSH (``SSH_WAIT_S``; the toolkit's is an hour), the workers' end after the master's
(``WORKERS_END_WAIT_S``), each podman command (``PODMAN_TIMEOUT_S``). A host whose container dies stops
the job at once, naming the host and its ranks.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

from sagemaker_dist.contract.distributions import Distribution, distribution
from sagemaker_dist.contract.environment import inherited
from sagemaker_dist.host.job_spec import JobHosts
from sagemaker_dist.local.launchers.base import RankGroup, describe_exit
from sagemaker_dist.local.launchers.cluster_log import (
    HostProgress,
    hosts_not_reached,
    note_line,
    ssh_wait_report,
)
from sagemaker_dist.local.launchers.cluster_plan import (
    ENGINE,
    ClusterHost,
    ClusterPlan,
    ClusterPlanError,
    loopback_endpoint_port,
    plan_cluster,
)
from sagemaker_dist.local.launchers.container import (
    ContainerLauncherError,
    container_environment,
    stop_containers,
    toolkit_host_env,
)
from sagemaker_dist.local.launchers.mpi import mpi_tagged_lines
from sagemaker_dist.local.launchers.netns_relay import NetnsRelay, RelayError, listen_in_netns
from sagemaker_dist.local.launchers.torchrun import TorchrunFailure, tee_tagged
from sagemaker_dist.local.supervision import rank_failure, time_limit_reached

SSH_WAIT_S = 90.0  # from the master's "Waiting for MPI workers": every worker's SSH lets it in
WORKERS_END_WAIT_S = 60.0  # after the master ended well: each worker's toolkit (its own 30 s sleep) ends
PODMAN_TIMEOUT_S = 60.0  # one podman command: create, init, inspect, network create / rm
DEATH_SETTLE_S = 2.0  # after the master failed: time for a worker's death at the same moment to show
_STOP_TIMEOUT_S = 60.0  # `podman rm` itself, beyond the containers' stop grace
_SUBNET_TRIES = 5


def _podman(*args: str, env: dict | None = None, what: str) -> str:
    """Run one podman command, bounded; its stdout, or ContainerLauncherError naming ``what`` failed."""
    try:
        done = subprocess.run(
            [ENGINE, *args], capture_output=True, text=True, timeout=PODMAN_TIMEOUT_S, env=env
        )
    except subprocess.TimeoutExpired:
        raise ContainerLauncherError(
            f"{what}: podman did not answer within {PODMAN_TIMEOUT_S:.0f} s"
        ) from None
    if done.returncode:
        raise ContainerLauncherError(f"{what} failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


def check_cluster_endpoint(env) -> int:
    """Refuse, before anything starts, an S3 endpoint the hosts' private network cannot reach."""
    try:
        return loopback_endpoint_port(env)
    except ClusterPlanError as exc:
        raise ContainerLauncherError(str(exc)) from None


def _taken_subnets() -> list[ipaddress.IPv4Network]:
    """The subnets of podman's networks in this storage (podman refuses to overlap them)."""
    names = _podman("network", "ls", "--quiet", what="listing podman's networks").split()
    if not names:
        return []
    taken = []
    for network in json.loads(_podman("network", "inspect", *names, what="reading podman's networks")):
        for subnet in network.get("subnets") or []:
            try:
                taken.append(ipaddress.ip_network(subnet.get("subnet", ""), strict=False))
            except ValueError:
                continue
    return [n for n in taken if n.version == 4]


@contextmanager
def cluster_network(job_name: str, host_names: list[str], per_host: int, endpoint_port: int, echo):
    """Create the job's --internal network (another subnet if podman says one is in use); yield its
    plan; remove it (with any container still on it) on the way out."""
    taken = _taken_subnets()
    for attempt in range(_SUBNET_TRIES):
        plan = plan_cluster(job_name, host_names, per_host, uuid.uuid4().hex, taken, endpoint_port)
        echo("$ " + " ".join(plan.network_create_args()))
        try:
            done = subprocess.run(
                plan.network_create_args(), capture_output=True, text=True, timeout=PODMAN_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise ContainerLauncherError(
                f"podman network create {plan.network} did not answer within {PODMAN_TIMEOUT_S:.0f} s"
            ) from None
        if not done.returncode:
            break
        if attempt + 1 == _SUBNET_TRIES or "subnet" not in done.stderr:
            raise ContainerLauncherError(
                f"podman network create {plan.network} failed: {done.stderr.strip()}"
            )
        taken.append(ipaddress.ip_network(plan.subnet))
    try:
        yield plan
    finally:
        try:
            subprocess.run([ENGINE, "network", "rm", "--force", plan.network], capture_output=True,
                           timeout=PODMAN_TIMEOUT_S + _STOP_TIMEOUT_S)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            pass


def _remove_containers(names: list[str], grace: float, timeout: float) -> bool:
    """``podman rm --force`` of ``names`` (SIGKILL after ``grace``); False if podman did not answer."""
    try:
        subprocess.run([ENGINE, "rm", "--force", "--ignore", "--time", str(max(0, round(grace))), *names],
                       capture_output=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return False
    except OSError:
        pass
    return True


def copy_code(code_dir: Path | None, trees) -> None:
    """A source dir given here goes to every host's /opt/ml/code, where its toolkit looks first (each
    host's toolkit downloads ``sagemaker_submit_directory`` from S3 otherwise, as on SageMaker)."""
    if code_dir is not None:
        for tree in trees:
            shutil.copytree(code_dir, tree.root / "code")


class ClusterGroup(RankGroup):
    """Every host of the job as a running container; the master's output carries the ranks' (mpirun
    --tag-output), or each host's its own ranks' (torchrun --tee, one worker per host); each host's own
    toolkit lines are kept apart with the host in front."""

    def __init__(self, plan: ClusterPlan, image: str, trees: JobHosts, container_env: dict[str, str],
                 pid_dir: Path, entry: Distribution, echo):  # fmt: skip
        self.plan, self.trees, self.echo = plan, trees, echo
        # the master's toolkit starts every rank with mpirun; or each host's toolkit starts torchrun
        # (its lines tagged with local ranks), or its one worker (untagged)
        self.mpi, self.tee = entry.mpi, entry.toolkit_starts_each_host
        self.torchrun_failures = {h.name: TorchrunFailure() for h in plan.hosts}
        self.creates = [plan.create_args(h, image, t.root, container_env) for h, t in zip(plan.hosts, trees)]
        super().__init__(self.creates[0], {**inherited(), **container_env}, pid_dir, trees.world, self._show)
        self.progress = {h.name: HostProgress(h.name) for h in plan.hosts}
        self.host_lines: dict[str, list[str]] = {h.name: [] for h in plan.hosts}
        self.procs: dict[str, subprocess.Popen] = {}
        self.ended: dict[str, tuple[int, float]] = {}  # host -> (exit code, when first seen)
        self.relays: list[NetnsRelay] = []
        self._readers: list[threading.Thread] = []
        self._lock = threading.Lock()

    def _show(self, rank, text) -> None:  # RankGroup's on_line, for the ranks' lines
        host = self.plan.host_of_rank(rank)
        self.echo(f"[rank {rank} {host.name if host else '?'}] {text}")

    def _ranks_of_line(self, host: ClusterHost, line: str, stdout: bool) -> list[tuple[int, str]]:
        """The toolkit logs to stderr and ``print``s what it runs to stdout: mpirun's (tagged by rank) on
        the master, torchrun's (tagged by local rank) on each host, a tf-mwms host's one worker untagged."""
        if not stdout:
            return []
        if self.mpi:
            return mpi_tagged_lines(line) or []
        if self.tee:
            tagged = tee_tagged(line, host.ranks[0])
            return [tagged] if tagged else []
        return [(host.ranks[0], line)]

    def _host_line(self, host: ClusterHost, line: str, stdout: bool) -> None:
        """One line of a host's container."""
        with self._lock:
            if host is self.plan.master:
                self.output.append(line)
            ranks = self._ranks_of_line(host, line, stdout)
            for rank, text in ranks:
                self.rank_lines.setdefault(rank, []).append(text)
                self.on_line(rank, text)  # _show, unless local mode wrapped it
            if ranks:
                return
            if self.tee:
                self.torchrun_failures[host.name].note(line)
            note_line(self.progress[host.name], line, time.monotonic())
            self.host_lines[host.name].append(line)
            if line.strip():
                self.echo(f"[toolkit {host.name}] {line}")

    def _relay_host(self, host: ClusterHost, stream, stdout: bool) -> None:
        for raw in stream:
            self._host_line(host, raw.rstrip("\n"), stdout)

    def start(self) -> None:
        """Create every container, relay the S3 endpoint onto its loopback, then start them all."""
        for host, create in zip(self.plan.hosts, self.creates):
            if host is not self.plan.master:
                self.echo("$ " + " ".join(create))
            _podman(*create[1:], env=self.env, what=f"creating the container of {host.name}")
            _podman("init", host.container, what=f"setting up the container of {host.name}")
            netns = _podman("inspect", "--format", "{{.NetworkSettings.SandboxKey}}", host.container,
                            what=f"finding the network namespace of {host.name}").strip()  # fmt: skip
            try:
                listener, interfaces = listen_in_netns(netns, self.plan.endpoint_port)
            except RelayError as exc:
                raise ContainerLauncherError(
                    f"the S3 endpoint cannot be relayed into {host.name}: {exc}"
                ) from None
            self.relays.append(NetnsRelay(listener, self.plan.endpoint_port, host.name).start())
            if self.plan.interface not in interfaces:
                raise ContainerLauncherError(
                    f"the container of {host.name} has no interface {self.plan.interface!r} (it has "
                    f"{', '.join(interfaces)}), which resourceconfig.json names for mpirun"
                )
        for host in reversed(
            self.plan.hosts
        ):  # the master last: the workers then wait for it, as on SageMaker
            proc = subprocess.Popen(
                [ENGINE, "start", "--attach", host.container], env=self.env, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, bufsize=1, start_new_session=True, errors="replace",
            )  # fmt: skip
            self.procs[host.name] = proc
            for stream, stdout in ((proc.stdout, True), (proc.stderr, False)):
                reader = threading.Thread(target=self._relay_host, args=(host, stream, stdout), daemon=True)
                reader.start()
                self._readers.append(reader)
        self.proc = self.procs[self.plan.master.name]

    def finish_output(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))

    def observe(self) -> None:
        """Note each host whose container has ended, with its code and when it was first seen."""
        now = time.monotonic()
        for name, proc in self.procs.items():
            code = proc.poll()
            if code is not None and name not in self.ended:
                self.ended[name] = (code, now)

    def stop_like_sagemaker(self, grace: float) -> subprocess.Popen:
        """``podman stop --time grace`` of every host's container (``stop_containers``)."""
        return stop_containers([h.container for h in self.plan.hosts], grace)

    def kill(self, grace: float = 3.0) -> None:
        """Stop and remove every container (SIGTERM, SIGKILL after ``grace``), then the podman clients,
        then the relays: the containers' processes are no children of the clients."""
        names = [h.container for h in self.plan.hosts]
        removed = _remove_containers(names, grace, grace + _STOP_TIMEOUT_S)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        if not removed:  # podman did not answer in time: once more, its attached clients gone
            _remove_containers(names, 0, PODMAN_TIMEOUT_S)
        for relay in self.relays:
            relay.close()

    # what went wrong, in words

    def host_failure(self, host: ClusterHost, what: str, why: str | None = None) -> str:
        ranks = ", ".join(map(str, host.ranks))
        parts = [f"host {host.name} (rank(s) {ranks}) {what}; the job was stopped", *([why] if why else [])]
        for rank in host.ranks:
            tail = self.rank_lines.get(rank, [])[-8:]
            if tail:
                parts.append(f"Last output of rank {rank}:\n" + "\n".join(f"  {line}" for line in tail))
        tail = [line for line in self.host_lines[host.name] if line.strip()][-8:]
        if tail:
            parts.append(f"Last lines of {host.name}'s toolkit:\n" + "\n".join(f"  {line}" for line in tail))
        if host is not self.plan.master:  # the master's is added by toolkit.toolkit_outcome
            parts += self._failure_file(host)
        return "\n".join(parts)

    def _failure_file(self, host: ClusterHost) -> list[str]:
        path = self.trees[self.plan.hosts.index(host)].output_dir / "failure"
        if not path.is_file():
            return []
        text = path.read_text(errors="replace").strip().splitlines()[-15:]
        return [f"{host.name}'s /opt/ml/output/failure says:\n" + "\n".join(f"  {line}" for line in text)]

    def death(self, host: ClusterHost, code: int, when: str = "while the job ran") -> str:
        """A host's container that ended non-zero on its own (nothing of ours stopped it yet)."""
        failed = bool(self._failure_file(host))
        if not self.mpi and failed:  # its worker (or the rank torchrun blames) failed; the toolkit says why
            blamed = self.torchrun_failures[host.name]
            rank = blamed.rank if blamed.rank in host.ranks else host.ranks[0]
            what = f"exited with {describe_exit(blamed.code if blamed.rank in host.ranks else code)}"
            said = [] if host is self.plan.master else self._failure_file(host)
            return "\n".join([rank_failure(self, rank, what, self.trees), *said])
        if failed:
            return self.host_failure(host, f"ended: its toolkit exited with {describe_exit(code)} {when}")
        return self.host_failure(host, f"died: its container exited with {describe_exit(code)} {when}")

    def ssh_wait_ran_out(self, now: float) -> str | None:
        """The master's wait for the workers' SSH, bounded: the first worker it never reached, named."""
        master = self.progress[self.plan.master.name]
        since = master.waiting_for_workers_since
        if since is None or master.mpirun_started or now - since <= SSH_WAIT_S:
            return None
        workers = [h.name for h in self.plan.hosts[1:]]
        missing = hosts_not_reached(master, workers)
        if not missing:
            return None
        host = next(h for h in self.plan.hosts if h.name == missing[0])
        report = ssh_wait_report(master, self.progress[host.name], now - since)
        return self.host_failure(host, "was never reached by SSH", report)


def supervise_cluster(group: ClusterGroup, feed_errors: list[str], started: float, timeout: float | None):
    """Wait for the job's hosts; return an error message naming the host (and rank) or None when the
    job succeeded. The several-host counterpart of ``supervision.supervise``."""
    master = group.plan.master
    workers = group.plan.hosts[1:]
    while True:
        group.observe()
        now = time.monotonic()
        dead = _died(group, workers)
        if dead and master.name not in group.ended:
            group.finish_output(1.0)
            return group.death(dead[0], group.ended[dead[0].name][0])
        if master.name in group.ended:
            return _master_ended(group, workers)
        if feed_errors:
            group.kill()
            return f"input failed, the job was stopped: {feed_errors[0]}"
        ssh = group.ssh_wait_ran_out(now)
        if ssh:
            return ssh
        if timeout is not None and now - started > timeout:
            group.kill()
            return time_limit_reached(timeout)
        time.sleep(0.05)


def _died(group: ClusterGroup, hosts) -> list[ClusterHost]:
    """The hosts whose container ended non-zero, the first seen first."""
    dead = [h for h in hosts if h.name in group.ended and group.ended[h.name][0] != 0]
    return sorted(dead, key=lambda h: group.ended[h.name][1])


def _master_ended(group: ClusterGroup, workers) -> str | None:
    master = group.plan.master
    code, when = group.ended[master.name]
    if code != 0:
        deadline = time.monotonic() + DEATH_SETTLE_S  # a worker that died at the same moment is the cause
        while time.monotonic() < deadline and any(h.name not in group.ended for h in workers):
            group.observe()
            time.sleep(0.05)
        group.finish_output()
        dead = _died(group, workers)
        if dead and group.ended[dead[0].name][1] <= when + DEATH_SETTLE_S:
            return group.death(dead[0], group.ended[dead[0].name][0])
        if not group.mpi:
            return group.death(master, code)
        reported = group.failed_rank()
        if reported:
            rank, rank_code = reported
            return rank_failure(group, rank, f"exited with {describe_exit(rank_code)}", group.trees)
        if not group.progress[master.name].mpirun_started:
            return group.death(master, code, "before mpirun started")
        return group.death(master, code)
    # the master ended well: each worker's toolkit ends after its own 30 s sleep
    deadline = time.monotonic() + WORKERS_END_WAIT_S
    while time.monotonic() < deadline and any(h.name not in group.ended for h in workers):
        group.observe()
        time.sleep(0.1)
    group.finish_output()
    for host in workers:
        if host.name not in group.ended:
            group.kill()
            return group.host_failure(
                host,
                f"did not end within {WORKERS_END_WAIT_S:.0f} s of {master.name}, whose job had ended well",
            )
        if group.ended[host.name][0] != 0:
            return group.death(host, group.ended[host.name][0])
    return None


def cluster_group(stack, job, trees, code_dir: Path | None, work: Path, extra_env, echo, image: str):
    """The job's network (removed when ``stack`` closes, after the containers) and its hosts, not yet
    started."""
    env = container_environment(
        inherited(), job.container_variables, toolkit_host_env(job.distribution, extra_env)
    )
    port = check_cluster_endpoint(env)
    plan = stack.enter_context(cluster_network(job.name, [t.name for t in trees], job.processes_per_host,
                                               port, echo))  # fmt: skip
    copy_code(code_dir, trees)
    pid_dir = work / "ranks"  # stays empty: the toolkits start the ranks
    pid_dir.mkdir()
    entry = distribution(job.distribution)
    return ClusterGroup(plan, image, trees, env, pid_dir, entry, echo)
