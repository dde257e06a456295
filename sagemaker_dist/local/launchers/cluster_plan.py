"""The plan of a several-host container job, as pure data: a private podman network with a subnet of
its own, one container per host (``algo-N`` at a fixed address, every other host in its /etc/hosts),
the podman arguments that make them, and the S3 endpoint each host reaches on its own loopback.

Pure: it takes names, the subnets already in use and a random token, and returns the plan; the
launcher (``cluster``) does the I/O. Kept apart so the rules (which subnet, which address, which
names) can be read and tested without podman.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from sagemaker_dist.contract.environment import s3_endpoint
from sagemaker_dist.contract.paths import DEFAULT_ROOT
from sagemaker_dist.errors import ConfigurationError

ENGINE = "podman"
# The name podman's CNI bridge gives a container's interface, and SageMaker's own: resourceconfig.json's
# network_interface_name, which the toolkit hands to mpirun (btl/oob_tcp_if_include, NCCL_SOCKET_IFNAME).
INTERFACE = "eth0"
# Private /24s are drawn from here; the network is --internal, so none of them is ever routed.
SUBNET_POOL = ipaddress.IPv4Network("10.213.0.0/16")
FIRST_HOST_OCTET = 11  # algo-1 is .11, algo-2 .12, ...: readable in a trace
LABEL = "sagemaker-dist.cluster"  # on the network and every container: what a clean-up may remove


class ClusterPlanError(ConfigurationError):
    """A several-host job that cannot be laid out as asked; the message says what to change."""


@dataclass(frozen=True)
class ClusterHost:
    """One host of the job: its name, address, container and the ranks it runs."""

    name: str
    address: str
    container: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class ClusterPlan:
    network: str
    subnet: str
    hosts: tuple[ClusterHost, ...]
    endpoint_port: int
    interface: str = INTERFACE

    @property
    def master(self) -> ClusterHost:
        return self.hosts[0]

    def host_lines(self) -> list[str]:
        """/etc/hosts lines every container gets: each host by name."""
        return [f"{h.address} {h.name}" for h in self.hosts]

    def network_create_args(self) -> list[str]:
        """``podman network create``: a bridge with no gateway and no route out (--internal)."""
        return [ENGINE, "network", "create", "--internal", "--subnet", self.subnet,
                "--label", f"{LABEL}={self.network}", self.network]  # fmt: skip

    def create_args(self, host: ClusterHost, image: str, tree: Path, env_names: Iterable[str]) -> list[str]:
        """``podman create`` of one host as SageMaker runs it: ``IMAGE train``, its tree at /opt/ml, its
        hostname and address on the job's network, every host by name; the variables are passed by
        name, so their values stay out of the command line."""
        command = [ENGINE, "create", "--rm", "--name", host.container, "--label", f"{LABEL}={self.network}",
                   "--network", self.network, "--ip", host.address, "--hostname", host.name]  # fmt: skip
        command += [f"--add-host={h.name}:{h.address}" for h in self.hosts]
        command += ["--volume", f"{tree}:{DEFAULT_ROOT}"]
        for key in sorted(env_names):
            command += ["--env", key]
        return [*command, image, "train"]

    def host_of_rank(self, rank: int) -> ClusterHost | None:
        return next((h for h in self.hosts if rank in h.ranks), None)


def choose_subnet(taken: Iterable[ipaddress.IPv4Network], token: int) -> ipaddress.IPv4Network:
    """A /24 of ``SUBNET_POOL`` that overlaps none of ``taken`` (podman's networks, this machine's
    routes), starting at a place ``token`` picks so that two jobs started together rarely try the same."""
    taken = list(taken)
    candidates = list(SUBNET_POOL.subnets(new_prefix=24))
    start = token % len(candidates)
    for subnet in candidates[start:] + candidates[:start]:
        if not any(subnet.overlaps(other) for other in taken):
            return subnet
    raise ClusterPlanError(
        f"every /24 of {SUBNET_POOL} is in use on this machine; remove unused podman networks"
    )


def loopback_endpoint_port(env: Mapping[str, str]) -> int:
    """The port of the S3 endpoint on this machine's loopback that the hosts will reach on theirs.

    The job's network is --internal: no host can leave it, so the endpoint must be one this machine
    serves on 127.0.0.1 (the embedded one, or --endpoint-url http://127.0.0.1:PORT); it is relayed
    into each host's own loopback at the same port, so the URL is the same everywhere."""
    endpoint = s3_endpoint(env)
    if endpoint is None:
        raise ClusterPlanError(
            "several hosts in containers run on a private network with no route out, so they cannot reach "
            "real S3: use the embedded S3 endpoint (leave out --bucket) or --endpoint-url http://127.0.0.1:PORT"
        )
    name, given = endpoint
    url = urlsplit(given)
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError:
        raise ClusterPlanError(f"{name}={given!r} has no valid port") from None
    loopback = url.hostname == "localhost" or (url.hostname or "").startswith("127.")
    if not loopback:
        raise ClusterPlanError(
            f"{name}={given} is not on this machine's loopback; several hosts in containers run on a "
            "private network with no route out and reach only an endpoint served on 127.0.0.1 here "
            "(the embedded one, or --endpoint-url http://127.0.0.1:PORT)"
        )
    return port


def network_name(job_name: str, token: str) -> str:
    """A network (and container-name) stem podman accepts, unique per run, naming the job."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", job_name)[:40].strip("-.") or "job"
    return f"{stem if stem.startswith('sagemaker-dist') else 'sagemaker-dist-' + stem}-{token[:8]}"


def plan_cluster(
    job_name: str,
    host_names: list[str],
    per_host: int,
    token: str,
    taken: Iterable[ipaddress.IPv4Network],
    endpoint_port: int,
) -> ClusterPlan:
    """The network, addresses and containers of a job on ``host_names``, ranks filled host by host
    (mpirun's ``-map-by slot``). ``token``: random hex that makes the names and the subnet this run's."""
    if len(host_names) < 2:
        raise ClusterPlanError("a cluster plan is for two hosts or more; one host runs on the host network")
    if len(host_names) > 254 - FIRST_HOST_OCTET:
        raise ClusterPlanError(f"{len(host_names)} hosts do not fit one /24 subnet here")
    subnet = choose_subnet(taken, int(token[:8], 16))
    network = network_name(job_name, token)
    hosts = tuple(
        ClusterHost(
            name=name,
            address=str(subnet.network_address + FIRST_HOST_OCTET + i),
            container=f"{network}-{name}",
            ranks=tuple(range(i * per_host, (i + 1) * per_host)),
        )
        for i, name in enumerate(host_names)
    )
    return ClusterPlan(network=network, subnet=str(subnet), hosts=hosts, endpoint_port=endpoint_port)
