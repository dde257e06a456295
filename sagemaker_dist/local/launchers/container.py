"""``launcher="container"``: the simulated host is the training image itself, run the way SageMaker
runs it: ``podman run <image> train`` with the host's tree bind-mounted at ``/opt/ml``. The image's
own entry point (sagemaker-training's ``train`` with the image's ``SAGEMAKER_TRAINING_MODULE``)
reads the tree, starts sshd and mpirun, and writes ``/opt/ml/output/success`` or ``failure``; the
Pipe FIFOs in the tree are fed from this machine, through the bind mount.

The network: podman runs with ``--network host`` inside the job's own network namespace
(``private_net``: the podman client is started there, and a container on the "host" network shares
the namespace podman runs in), whose only interface is loopback. So the image's sshd (the toolkit
always starts ``/usr/sbin/sshd -D``, and the image trusts one baked root key pair, as the DLC does)
and the ranks' listeners are reachable from nowhere but the job itself, and the S3 endpoint on this
machine's loopback (the embedded one) is relayed onto the namespace's at the same port: the toolkit
downloads the source package and the ranks reach S3 at the same URL, as a SageMaker container reaches
S3. Where the job's S3 is off this machine's loopback (real S3), the container shares this machine's
network instead, and its sshd is a stub that only sleeps (``sshd_stub``): one host never needs SSH.

The container gets what SageMaker gives it: the request's ``Environment``, ``TRAINING_JOB_NAME``, S3
credentials, region and endpoint; nothing else of this machine's environment.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path

from sagemaker_dist.contract.distributions import distribution
from sagemaker_dist.contract.environment import inherited
from sagemaker_dist.contract.paths import DEFAULT_ROOT
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.local.launchers.base import RankGroup
from sagemaker_dist.local.launchers.toolkit_host import SSHD_STUB

ENGINE = "podman"
# What the container needs of this machine's AWS settings: credentials, region, endpoint. Not the
# AWS_*_FILE or AWS_CA_BUNDLE paths, which name files of this machine.
_AWS_NAMES = re.compile(
    r"^AWS_(ACCESS_KEY_ID|SECRET_ACCESS_KEY|SESSION_TOKEN|DEFAULT_REGION|REGION|ENDPOINT_URL(_S3)?)$"
)
_STOP_TIMEOUT_S = 60.0  # for `podman rm` itself, beyond the container's stop grace


class ContainerLauncherError(ConfigurationError):
    """The container launcher cannot run here as set up; the message says what to do."""


def check_container_image(image: str | None) -> str:
    """Fail early, naming the fix, where the image cannot be run: no image given, no podman, or an
    image podman does not have. Returns the image."""
    if not image:
        raise ContainerLauncherError(
            "launcher 'container' runs a training image: pass --image NAME (scripts/container-test.sh "
            "builds localhost/sagemaker-dist:test from container/Dockerfile)"
        )
    if not shutil.which(ENGINE):
        raise ContainerLauncherError(
            f"launcher 'container' runs the image with {ENGINE}, which is not installed "
            "(Debian: apt-get install podman runc; see scripts/container-test.sh for its settings)"
        )
    found = subprocess.run([ENGINE, "image", "exists", image], capture_output=True, text=True)
    if found.returncode:
        why = found.stderr.strip() or f"{ENGINE} has no image {image}"
        raise ContainerLauncherError(
            f"launcher 'container': {why}. Build it (scripts/container-test.sh builds "
            "container/Dockerfile as localhost/sagemaker-dist:test) or pull it; podman finds images "
            "through CONTAINERS_STORAGE_CONF"
        )
    return image


def container_environment(
    base: Mapping[str, str], job_variables: Mapping[str, str], extra_env: dict | None
) -> dict[str, str]:
    """The variables the container gets: S3 credentials, region and endpoint from ``base``, what
    SageMaker sets from the request (``job_variables``: ``TrainingRequest.container_variables``), then
    ``extra_env``.
    The image supplies the rest (``PATH``, ``SAGEMAKER_TRAINING_MODULE``).

    ``PYTHONUNBUFFERED=1`` (unless the request says otherwise): the toolkit ``print``s every line of
    mpirun's into a pipe, which Python buffers by 8 KiB, so without it the ranks' lines would come
    minutes late, after the toolkit's own (presumably CloudWatch shows the same on SageMaker)."""
    env = {k: v for k, v in base.items() if _AWS_NAMES.match(k)}
    env["TF_CPP_MIN_LOG_LEVEL"] = base.get("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(job_variables)
    env.update(extra_env or {})
    return env


def toolkit_host_env(
    distribution_name: str, extra_env: Mapping[str, str] | None, shell: Mapping[str, str] | None = None
) -> dict[str, str]:
    """What local mode gives a toolkit host beyond SageMaker's environment: the registry's
    ``local_toolkit_defaults`` that ``shell`` (the environment the host starts from) does not set (the
    MPI ranks' yield), its ``local_toolkit_env`` (torchrun tagging each rank's lines), then
    ``extra_env``."""
    entry, shell = distribution(distribution_name), shell or {}
    env = {name: value for name, value in entry.local_toolkit_defaults if name not in shell}
    return {**env, **dict(entry.local_toolkit_env), **(extra_env or {})}


def container_name(job_name: str) -> str:
    """A name podman accepts, unique per run, that says which job the container belongs to."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", job_name)[:40].strip("-.") or "job"
    return f"sagemaker-dist-{stem}-{uuid.uuid4().hex[:8]}"


def container_host_command(
    image: str, tree: Path, hosts: list[str], name: str, env_names: list[str], sshd_stub: Path | None = None
) -> list[str]:
    """``podman run`` of one simulated host: its tree at /opt/ml, the algo-N names on loopback, the
    named variables passed by name (their values stay out of the command line), the image's
    ``train``; given ``sshd_stub``, that file in place of the image's /usr/sbin/sshd."""
    command = [ENGINE, "run", "--rm", "--name", name, "--network", "host"]
    command += [f"--add-host={host}:127.0.0.1" for host in hosts]
    command += ["--volume", f"{tree}:{DEFAULT_ROOT}"]
    if sshd_stub is not None:
        command += ["--volume", f"{sshd_stub}:/usr/sbin/sshd:ro"]
    for key in env_names:
        command += ["--env", key]
    return [*command, image, "train"]


def stop_containers(names: list[str], grace: float) -> subprocess.Popen:
    """What SageMaker does to stop a job (a stop, a spot interruption): SIGTERM to each container's
    PID 1 (the image's entry point forwards it to the ranks), SIGKILL ``grace`` seconds later. Returns
    the running ``podman stop``, which ends when the containers have."""
    return subprocess.Popen(
        [ENGINE, "stop", "--time", str(max(0, round(grace))), *names],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def sshd_stub(directory: Path) -> Path:
    """An executable in ``directory`` that stands in for the image's sshd: the toolkit's MPI master
    starts ``/usr/sbin/sshd -D`` and never connects to it on one host."""
    path = Path(directory) / "sshd"
    path.write_text(SSHD_STUB)
    path.chmod(0o755)
    return path


class ContainerGroup(RankGroup):
    """The one simulated host as a running container (the toolkit's mpirun starts its ranks)."""

    def __init__(
        self,
        image: str,
        tree: Path,
        hosts: list[str],
        job_name: str,
        container_env: dict[str, str],
        pid_dir: Path,
        world_size: int,
        on_line,
        sshd_stub: Path | None = None,
    ):
        self.name = container_name(job_name)
        command = container_host_command(image, tree, hosts, self.name, sorted(container_env), sshd_stub)
        # podman reads each --env NAME from its own environment; its own settings come from ours
        super().__init__(command, {**inherited(), **container_env}, pid_dir, world_size, on_line)

    def stop_like_sagemaker(self, grace: float) -> subprocess.Popen:
        """``podman stop --time grace`` of the container (``stop_containers``)."""
        return stop_containers([self.name], grace)

    def kill(self, grace: float = 3.0) -> None:
        """Stop and remove the container (SIGTERM, SIGKILL after ``grace``), then the podman client:
        the container's processes are not the client's children, so killing the client alone would
        leave them running."""
        try:
            subprocess.run(
                [ENGINE, "rm", "--force", "--ignore", "--time", str(max(0, round(grace))), self.name],
                capture_output=True,
                timeout=grace + _STOP_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired):
            pass  # the client's kill below is still worth doing
        super().kill(grace)
