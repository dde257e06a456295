"""Run an MPIJob's own commands on this machine, as mpi-operator and the kubelet would run them: the
check that the manifest's wiring (launcher command, hostfile, sidecar agents, the shared /opt/ml)
trains the job, before a cluster is involved.

Each worker pod is a directory whose ``opt_ml`` is bind-mounted at ``/opt/ml`` in a private mount
namespace (as the ``emptyDir`` is mounted in both of the pod's containers). The sidecar's command runs
in one such namespace, with ``$(NODE_INDEX)`` expanded as the kubelet expands it from the replica-index
label. The launcher's command runs as written, with the environment mpi-operator gives it and a
hostfile in its format; Open MPI reaches each "worker" through this module's ``ssh`` stand-in, which
starts the remote command in that worker's namespace with the worker container's environment (what
sshd would give it). Needs root and ``unshare`` (as local mode's toolkit launcher).

Each pod also has a private UTS namespace whose hostname is the pod's name (``<job>-worker-<N>``, as
mpi-operator names it). The pods share this machine's /tmp and /dev/shm, where Open MPI names what a
host's daemon and ranks share after the hostname (``/tmp/ompi.<hostname>.<uid>/jf.<job family>``):
under one hostname both workers' orteds wrote the topology copy for their ranks to one ``hwloc.sm`` at
once, each building hwloc's structures in pages the other was overwriting, and now and then one
crashed inside hwloc.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sagemaker_dist.contract.paths import DEFAULT_ROOT, ROOT_ENV
from sagemaker_dist.errors import ConfigurationError
from sagemaker_dist.local.launchers.toolkit import check_toolkit_host
from sagemaker_dist.local.launchers.toolkit_host import prepare_host
from sagemaker_dist.platforms.pipe_agent import wait_ready

SCRIPT = str(Path(__file__).resolve())  # run as a script (tests/ is on no pod's path): __name__ is __main__
SIM_DIR_ENV = "SAGEMAKER_DIST_K8S_SIM_DIR"  # tells the ssh stand-in where the worker pods are
_WORKER = re.compile(r"-worker-(\d+)(\.|$)")
AGENT_READY_S = 120.0
STOP_GRACE_S = 10.0


class SimulationError(ConfigurationError):
    """The manifest cannot be simulated here; says why."""


@dataclass
class SimulationResult:
    returncode: int
    launcher_output: str
    agent_outputs: list[str]
    worker_roots: list[Path]


def hostfile_text(manifest: dict) -> str:
    """``/etc/mpi/hostfile`` as mpi-operator writes it for Open MPI (``<worker>.<job>.<ns>.svc slots=N``)."""
    meta, spec = manifest["metadata"], manifest["spec"]
    name, namespace = meta["name"], meta.get("namespace", "default")
    workers = spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    slots = spec.get("slotsPerWorker", 1)
    return "".join(f"{name}-worker-{i}.{name}.{namespace}.svc slots={slots}\n" for i in range(workers))


def _containers(manifest: dict, replica: str) -> dict[str, dict]:
    spec = manifest["spec"]["mpiReplicaSpecs"][replica]["template"]["spec"]
    return {c["name"]: c for c in spec["containers"]}


def _container_env(container: dict, values: dict[str, str]) -> dict[str, str]:
    """A container's ``env``: plain values, and ``valueFrom`` entries from ``values`` (the downward API)."""
    env = {}
    for item in container.get("env", []):
        env[item["name"]] = item["value"] if "value" in item else values[item["name"]]
    return env


def _expand(command: list[str], env: dict[str, str]) -> list[str]:
    """The kubelet's ``$(VAR)`` expansion of a container's command."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), word) for word in command]


def _pod_command(
    python: Path, root: Path, state: Path, hosts: list[str], hostname: str, command: list[str], cwd: str = "/"
) -> list[str]:
    return [
        "unshare", "-m", "-u", str(python), SCRIPT, "pod", "--tree", str(root), "--state", str(state),
        "--hosts", ",".join(hosts), "--hostname", hostname, "--cwd", cwd, "--", *command,
    ]  # fmt: skip


def _image_env(python: Path, base_env: dict[str, str] | None) -> dict[str, str]:
    """What the image and the service account give every container (``base_env``: S3 credentials)."""
    image_env = dict(base_env if base_env is not None else os.environ)
    image_env.setdefault("LD_LIBRARY_PATH", "")  # the image sets it (CUDA); the launcher passes it on
    image_env["PATH"] = os.pathsep.join([str(python.parent), "/usr/local/bin", "/usr/bin", "/bin"])
    for variable in ("PYTHONPATH", ROOT_ENV):  # the pods' /opt/ml is /opt/ml
        image_env.pop(variable, None)
    return image_env


def simulate(
    manifest: dict,
    work: Path,
    python: Path | None = None,
    base_env: dict[str, str] | None = None,
    timeout: float = 600,
    echo=print,
) -> SimulationResult:
    """Run ``manifest``'s agents and launcher here; returns the launcher's exit code and the outputs.

    ``python`` is the image's interpreter (default: local mode's container environment, .venv-toolkit);
    ``base_env`` what the image and the service account give every container (S3 credentials).
    """
    python = check_toolkit_host(python)
    work = Path(work)
    name = manifest["metadata"]["name"]
    workers = manifest["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    hosts = [line.split()[0] for line in hostfile_text(manifest).splitlines()]
    (work / "hostfile").write_text(hostfile_text(manifest))
    image_env = _image_env(python, base_env)
    worker_containers = _containers(manifest, "Worker")
    (agent_container,) = [c for n, c in worker_containers.items() if n == "pipe-agent"]
    roots, agents = [], []
    try:
        for index in range(workers):
            pod, pod_name = work / f"worker-{index}", f"{name}-worker-{index}"
            root = pod / "opt_ml"
            root.mkdir(parents=True)
            roots.append(root)
            worker_env = {**image_env, **_container_env(worker_containers["worker"], {})}
            (pod / "env.json").write_text(json.dumps(worker_env))  # what sshd gives remote commands
            agent_env = {**image_env, **_container_env(agent_container, {"NODE_INDEX": str(index)})}
            command = _expand(agent_container["command"], agent_env)
            with open(pod / "pipe-agent.log", "w") as log:  # a file: a pipe nobody reads could fill up
                agents.append(
                    subprocess.Popen(
                        _pod_command(python, root, pod / "agent-state", hosts, pod_name, command),
                        env=agent_env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        for root, agent in zip(roots, agents):
            wait_ready(root, AGENT_READY_S, agent)  # launcherCreationPolicy: WaitForWorkersReady
        echo(f"k8s simulation: {workers} worker(s) of {name} ready; starting the launcher")
        launcher_env = {
            **image_env,
            **_container_env(_containers(manifest, "Launcher")["launcher"], {}),
            # what mpi-operator sets on the launcher for Open MPI, with this module standing in for ssh
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_orte_default_hostfile": str(work / "hostfile"),
            "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
            "OMPI_MCA_plm_rsh_agent": f"{python} {SCRIPT} ssh",
            SIM_DIR_ENV: str(work),
        }
        (launcher,) = _containers(manifest, "Launcher").values()
        try:
            proc = subprocess.run(
                launcher["command"],
                env=launcher_env,
                cwd=work,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
                start_new_session=True,
            )
            code, out = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired as exc:
            code, out = (
                124,
                (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else "",
            )
        echo(f"k8s simulation: launcher exited with code {code}")
    finally:
        # the worker pods are deleted: SIGTERM
        outputs = [_stop(agent, root.parent / "pipe-agent.log") for agent, root in zip(agents, roots)]
    return SimulationResult(code, out, outputs, roots)


@dataclass
class TrainJobResult:
    returncodes: list[int]  # each node container's
    node_outputs: list[str]
    agent_outputs: list[str]
    node_roots: list[Path]
    isolated: bool  # the pods ran in a network namespace of their own


def simulate_trainjob(
    runtime: dict,
    trainjob: dict,
    work: Path,
    python: Path | None = None,
    base_env: dict[str, str] | None = None,
    timeout: float = 600,
    echo=print,
) -> TrainJobResult:
    """Run a TrainJob's node pods here, as the Trainer's JobSet and the kubelet would: on each node the
    runtime's native-sidecar pipe agent, then (once its startup probe's file is there) the node container
    with the TrainJob's command and the ``PET_*`` variables the Torch plugin sets. The pods share one
    network namespace of their own (each pod's name resolving to its loopback, as the JobSet's headless
    service makes them resolve), with the S3 endpoint relayed in: torchrun's store listens nowhere else."""
    from sagemaker_dist.local.launchers.private_net import PrivateNet
    from sagemaker_dist.platforms.k8s_trainjob import MASTER_PORT, master_address, pod_name

    python = check_toolkit_host(python)
    work = Path(work)
    name, trainer = trainjob["metadata"]["name"], trainjob["spec"]["trainer"]
    nodes = trainer["numNodes"]
    (replicated,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    pod_spec = replicated["template"]["spec"]["template"]["spec"]
    (agent,) = pod_spec["initContainers"]
    (node,) = pod_spec["containers"]
    image_env = _image_env(python, base_env)
    hosts = [master_address(name), *(pod_name(name, i) for i in range(nodes))]
    pods = []
    for index in range(nodes):
        pod = work / f"node-{index}"
        (pod / "opt_ml").mkdir(parents=True)
        agent_env = {**image_env, **_container_env(agent, {"NODE_INDEX": str(index)})}
        node_env = {
            **image_env,
            **_container_env(trainer, {}),
            "PET_NNODES": str(nodes),
            "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
            "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": master_address(name),
            "PET_MASTER_PORT": str(MASTER_PORT),
        }
        pods.append(
            {
                "dir": str(pod),
                "agent": {
                    "command": _pod_command(
                        python,
                        pod / "opt_ml",
                        pod / "agent-state",
                        hosts,
                        pod_name(name, index),
                        _expand(agent["command"], agent_env),
                    ),  # fmt: skip
                    "env": agent_env,
                },
                "node": {
                    "command": _pod_command(
                        python,
                        pod / "opt_ml",
                        pod / "node-state",
                        hosts,
                        pod_name(name, index),
                        _expand(trainer["command"], node_env),
                        node.get("workingDir", "/"),
                    ),  # fmt: skip
                    "env": node_env,
                },
            }
        )
    plan = work / "trainjob-plan.json"
    plan.write_text(json.dumps({"pods": pods, "timeout": timeout}))
    net = PrivateNet(image_env, echo)
    driver = net.start(
        lambda: subprocess.Popen(
            [str(python), SCRIPT, "trainjob", str(plan)], env=image_env, start_new_session=True
        )
    )
    try:
        driver.wait(timeout=timeout + AGENT_READY_S + 3 * STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    finally:
        net.close()
    codes = (
        json.loads((work / "trainjob-codes.json").read_text())
        if (work / "trainjob-codes.json").exists()
        else []
    )
    read = lambda p: p.read_text(errors="replace") if p.exists() else ""  # noqa: E731
    echo(f"k8s simulation: TrainJob {name}'s node containers exited with {codes}")
    return TrainJobResult(
        codes or [124] * nodes,
        [read(work / f"node-{i}" / "node.log") for i in range(nodes)],
        [read(work / f"node-{i}" / "pipe-agent.log") for i in range(nodes)],
        [work / f"node-{i}" / "opt_ml" for i in range(nodes)],
        net.isolated,
    )


def _start_logged(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "w") as out:  # a file: a pipe nobody reads could fill up
        return subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _run_trainjob_pods(plan_file: Path) -> int:
    """In the TrainJob's network namespace: each pod's sidecar, then its node container once the sidecar
    is ready; the node containers' exit codes to ``trainjob-codes.json``; then the sidecars get SIGTERM
    (the kubelet ends a native sidecar after the pod's containers)."""
    plan = json.loads(plan_file.read_text())
    pods = [Path(p["dir"]) for p in plan["pods"]]
    agents = [_start_logged(**p["agent"], log=d / "pipe-agent.log") for p, d in zip(plan["pods"], pods)]
    nodes: list[subprocess.Popen] = []
    try:
        for pod, agent in zip(pods, agents):
            wait_ready(pod / "opt_ml", AGENT_READY_S, agent)  # the sidecar's startup probe
        nodes = [_start_logged(**p["node"], log=d / "node.log") for p, d in zip(plan["pods"], pods)]
        deadline = time.monotonic() + plan["timeout"]
        codes = []
        for node in nodes:
            try:
                codes.append(node.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                codes.append(124)
        (plan_file.parent / "trainjob-codes.json").write_text(json.dumps(codes))
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
        for pod, agent in zip(pods, agents):
            _stop(agent, pod / "pipe-agent.log")
    return 0


def _run_launcher(command: list[str], env: dict[str, str], cwd: Path, timeout: float) -> tuple[int, str]:
    """The launcher's command in a session of its own (mpirun, its ssh stand-ins, the orteds, the
    ranks), all killed if it runs past ``timeout`` (code 124, as timeout(1) reports it)."""
    proc = subprocess.Popen(
        command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return 124, out + f"\nk8s simulation: the launcher ran past {timeout:.0f} s and was killed"


def _stop(agent: subprocess.Popen, log: Path) -> str:
    """SIGTERM (the pod is deleted), SIGKILL after ``STOP_GRACE_S``; returns what the agent printed."""
    if agent.poll() is None:
        os.killpg(agent.pid, signal.SIGTERM)
    try:
        agent.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait()
    return log.read_text(errors="replace")


def _ssh(argv: list[str]) -> None:
    """``ssh [-o opt]... [-x] host command...`` run in that worker's pod, with its container's environment."""
    while argv and argv[0].startswith("-"):
        argv = argv[2:] if argv[0] == "-o" else argv[1:]
    host, command = argv[0], " ".join(argv[1:])
    match = _WORKER.search(host)
    if not match:
        raise SystemExit(f"k8s simulation ssh: {host!r} is not a worker of the simulated MPIJob")
    pod = Path(os.environ[SIM_DIR_ENV]) / f"worker-{match.group(1)}"
    env = json.loads((pod / "env.json").read_text())
    env[SIM_DIR_ENV] = os.environ[SIM_DIR_ENV]
    state = Path(tempfile.mkdtemp(prefix="ssh-", dir=pod))
    pod_name = host.split(".")[0]  # <job>-worker-<N>.<job>.<namespace>.svc
    shell = ["/bin/sh", "-c", command]
    os.execvpe(
        "unshare", _pod_command(Path(sys.executable), pod / "opt_ml", state, [host], pod_name, shell), env
    )


def _pod(argv: list[str]) -> None:
    """Inside new mount and UTS namespaces: the pod's ``/opt/ml`` and hostname (resolving, as the
    kubelet's /etc/hosts makes it), then the container's command."""
    split = argv.index("--")
    options, command = dict(zip(argv[:split:2], argv[1:split:2])), argv[split + 1 :]
    hostname, hosts = options["--hostname"], options["--hosts"].split(",")
    prepare_host(Path(options["--tree"]), Path(options["--state"]), [*hosts, hostname])
    socket.sethostname(hostname)
    if not Path(DEFAULT_ROOT).samefile(options["--tree"]):
        raise SystemExit(f"k8s simulation: {DEFAULT_ROOT} is not the pod's tree after mounting it")
    os.chdir(options.get("--cwd", "/"))  # the container's workingDir
    os.execvp(command[0], command)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["ssh"]:
        _ssh(argv[1:])
    elif argv[:1] == ["pod"]:
        _pod(argv[1:])
    elif argv[:1] == ["trainjob"]:
        raise SystemExit(_run_trainjob_pods(Path(argv[1])))
    else:
        raise SystemExit(
            f"usage: python -m {__name__} ssh HOST COMMAND... | "
            "pod --tree T --state S --hosts H --hostname N [--cwd D] -- CMD | trainjob PLAN"
        )


if __name__ == "__main__":
    main()
