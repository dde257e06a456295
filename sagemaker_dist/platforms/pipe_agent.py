"""The Pipe-mode agent of one node, for any platform (Slurm, Kubernetes, a plain machine): what the
SageMaker platform does on each host before and while the ranks run.

Given the job's CreateTrainingJob request and the node's index, it checks that it can read every
channel it feeds (before anything starts), writes the /opt/ml config files the runtime reads under
the node's root (``$SAGEMAKER_DIST_OPT_ML``, ``/opt/ml`` by default), unpacks the source package into
``<root>/code``, restores and syncs checkpoints, and feeds ``<channel>_<epoch>`` FIFOs with local
mode's feeder (next FIFO once the previous is closed, per-epoch shuffle, Range resume) until it is
stopped: SIGTERM/SIGINT, the ``until_pid`` process exiting, or every feeder done with its epochs.
On a platform's stop it can outlive the ranks' SIGTERM by a drain period (``stop_on_signals``).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import threading
import time
from pathlib import Path

from sagemaker_dist.aws.s3_objects import S3AccessError, s3_client
from sagemaker_dist.contract.s3_uri import parse_s3_uri
from sagemaker_dist.contract.training_request import request_from_json
from sagemaker_dist.errors import ConfigurationError, DataError
from sagemaker_dist.host.feeder import ChannelFeeder, FeedError, resolve_objects
from sagemaker_dist.host.job_spec import JobSpecError, NodePlan, plan_node
from sagemaker_dist.host.lifecycle import HostLifecycle
from sagemaker_dist.host.processes import pid_running
from sagemaker_dist.platforms.node_plan import parse_ranks

READY_FILE = "pipe_agent_ready"  # in the node's root once config, code and FIFOs are in place
POLL_S = 0.2


class AgentS3AccessError(ConfigurationError):
    """The agent cannot read a channel's data; found before anything starts."""


class PipeAgentError(DataError):
    """A channel could not be fed while the job ran; names the node, channel and S3 object."""


def private_directory(path: Path) -> Path:
    """``path`` as a directory only this user can enter: made 0700 if absent, else checked.

    On a shared node another user could create a predictable path first (job ids are sequential)
    and then read the data, take bytes from a FIFO or swap the code the ranks run: refuse it.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigurationError(
            f"{path} exists and is not a directory (a symlink?): remove it or use another root"
        )
    if info.st_uid != os.geteuid():
        raise ConfigurationError(
            f"{path} exists and belongs to uid {info.st_uid}, not to this user ({os.geteuid()}): another "
            "user may have created it to read or replace the job's files. Remove it, or set another root"
        )
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(path, 0o700)  # ours, but others could enter it: close it before anything goes in
    return path


def fresh_private_root(root: Path) -> Path:
    """A new, empty node root in a private parent (a stale tree of the same job id is removed)."""
    private_directory(root.parent)
    if root.is_symlink() or root.is_file():
        root.unlink()
    elif root.exists():
        shutil.rmtree(root)
    return private_directory(root)


def load_job_spec(source: str, client=None) -> dict:
    """The CreateTrainingJob request in a JSON file or at an ``s3://`` URI (as ``sagemaker-dist k8s``
    uploads it)."""
    if source.startswith("s3://"):
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, key = parse_s3_uri(source)
        try:
            text = client.get_object(Bucket=bucket, Key=key)["Body"].read().decode()
        except (ClientError, BotoCoreError) as exc:
            raise JobSpecError(
                f"cannot read the job spec {source}: {_error_code(exc)}. {_access_hint(bucket)}"
            ) from exc
    else:
        try:
            text = Path(source).read_text()
        except OSError as exc:
            raise JobSpecError(f"cannot read the job spec file {source}: {exc.strerror or exc}") from exc
    return request_from_json(text, f"the job spec {source}", JobSpecError)


def _error_code(exc) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code") or exc)


def _access_hint(bucket: str) -> str:
    return (
        f"Give this node read access to bucket {bucket!r} (s3:ListBucket on arn:aws:s3:::{bucket}, "
        f"s3:GetObject on arn:aws:s3:::{bucket}/*): on EKS through the pod's service account (IRSA or "
        "EKS Pod Identity), on Slurm or EC2 through the instance profile or AWS_* credentials; check "
        "AWS_ENDPOINT_URL if you use another S3 endpoint"
    )


def check_s3_access(plan: NodePlan, client) -> dict[str, list]:
    """List every channel the node feeds and HEAD its first object: no access fails here, naming the
    channel, the object and what to grant, not minutes later inside a FIFO. Returns the objects."""
    from botocore.exceptions import BotoCoreError, ClientError

    found = {}
    for spec in plan.channels:
        where = spec.s3_uri
        try:
            items = resolve_objects(spec, client)
            where = items[0].uri
            client.head_object(Bucket=items[0].bucket, Key=items[0].key)
        except (ClientError, BotoCoreError, S3AccessError) as exc:
            bucket, _ = parse_s3_uri(where)
            raise AgentS3AccessError(
                f"node {plan.node_index}: the pipe agent cannot read channel {spec.name!r} "
                f"({where}): {_error_code(exc)}. {_access_hint(bucket)}"
            ) from exc
        except FeedError as exc:
            raise AgentS3AccessError(f"node {plan.node_index}: {exc}") from exc
        found[spec.name] = items
    return found


def serve_node(
    spec: str,
    node_index: int,
    root: Path,
    *,
    ranks: str | None = None,
    epochs: int | None = None,
    shuffle_seed: int | None = None,
    private_root: bool = False,
    drain: float = 0.0,
    until_pid: int | None = None,
    echo=print,
) -> None:
    """``sagemaker-dist pipe-agent``: node ``node_index`` of the job in ``spec`` (a JSON file or an
    ``s3://`` URI) planned (``ranks``, as ``"0-7"``, checked against it), then run (``run_agent``) under
    ``root`` (made this user's alone first where ``private_root``) until a signal stops it
    (``stop_on_signals``, with ``drain``), ``until_pid`` exits or ``epochs`` are fed."""
    if private_root:
        fresh_private_root(root)
    client = s3_client()
    asked = parse_ranks(ranks) if ranks else None
    plan = plan_node(load_job_spec(spec, client), node_index, asked, epochs, shuffle_seed)
    stop = threading.Event()
    stop_on_signals(stop, root, drain, echo)
    run_agent(plan, root, client, stop, until_pid, echo=echo)


def run_agent(
    plan: NodePlan,
    root: Path,
    client,
    stop: threading.Event | None = None,
    until_pid: int | None = None,
    echo=print,
) -> None:
    """Check access, write the node's tree, then feed until ``stop`` is set, ``until_pid`` exits or
    every feeder has fed its epochs. Raises PipeAgentError naming the object that could not be fed."""
    root = Path(root)
    items = check_s3_access(plan, client)
    echo(f"pipe agent: {plan.describe()}; root {root}")
    ready = root / READY_FILE
    root.mkdir(parents=True, exist_ok=True)
    host = HostLifecycle(
        plan.job, root, client, echo, node=plan.node_index, channels=plan.channels, items=items,
        stop=stop, max_epochs=plan.epochs, label="pipe agent: ", announce_uploads=True,
    )  # fmt: skip
    with host:
        try:
            host.start()
            ready.write_text(str(os.getpid()))
            _wait(plan, host.feeds, host.errors, host.stop, until_pid, echo)
        finally:
            ready.unlink(missing_ok=True)
    for feed in host.feeds:
        s = feed.stats
        echo(f"pipe agent: {s.channel}: {s.epochs} epoch(s), {s.objects} object(s), {s.bytes} bytes")
    if host.errors:
        raise PipeAgentError("; ".join(host.errors))
    host.upload_outputs()  # the job's first node: its model and output


def node_ranks_running(root: Path) -> bool:
    """Whether a rank of this node's tree runs: a process ``host/stop_forwarding.is_rank`` names, in the
    agent's PID namespace (the same node on Slurm, the same pod with ``shareProcessNamespace`` on
    Kubernetes), whose ``SAGEMAKER_DIST_OPT_ML`` is ``root`` or which works in ``root``/code (the same
    directory, whatever the mount namespace: the ranks start there)."""
    from sagemaker_dist.host.stop_forwarding import is_rank

    want, pid_ns = os.path.realpath(root), os.readlink("/proc/self/ns/pid")
    try:
        code = os.stat(Path(root) / "code")
        code_id = (code.st_dev, code.st_ino)
    except OSError:
        code_id = None
    for environ_file in Path("/proc").glob("[0-9]*/environ"):
        proc = environ_file.parent
        try:
            if os.readlink(proc / "ns" / "pid") != pid_ns or not is_rank(
                os.readlink(proc / "exe"), environ := environ_file.read_bytes()
            ):
                continue
            pairs = dict(e.split(b"=", 1) for e in environ.split(b"\0") if b"=" in e)
            if b"SAGEMAKER_DIST_OPT_ML" in pairs:
                if os.path.realpath(pairs[b"SAGEMAKER_DIST_OPT_ML"].decode()) == want:
                    return True
            elif code_id is not None:
                cwd = os.stat(proc / "cwd")
                if (cwd.st_dev, cwd.st_ino) == code_id:
                    return True
        except OSError:
            continue
    return False


def stop_on_signals(stop: threading.Event, root: Path, drain: float = 0.0, echo=print) -> None:
    """SIGINT sets ``stop``; so does SIGTERM, at once, or with ``drain`` > 0 once this node's ranks have
    ended (``node_ranks_running``), ``drain`` seconds at most (a second SIGTERM: at once). A platform's
    stop (scancel, preemption, a pod's deletion) sends SIGTERM to the agent and the ranks alike: the ranks
    then agree on a step and rank 0 checkpoints it, which needs the FIFOs fed to that step and the
    checkpoint synced to S3 after it, so the agent must outlive them."""
    draining: list[threading.Thread] = []

    def drain_then_stop(deadline: float) -> None:
        while not stop.is_set() and time.monotonic() < deadline and node_ranks_running(root):
            stop.wait(0.5)
        stop.set()

    def on_term(signum, frame):
        if drain <= 0 or draining:
            stop.set()
            return
        thread = threading.Thread(target=drain_then_stop, args=(time.monotonic() + drain,), daemon=True)
        draining.append(thread)
        thread.start()
        echo(
            f"pipe agent: SIGTERM: feeding and syncing checkpoints until this node's ranks end "
            f"({drain:g} s at most)"
        )

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, lambda signum, frame: stop.set())


def _wait(plan: NodePlan, feeds, errors, stop, until_pid, echo) -> None:
    pipes = [f for f in feeds if isinstance(f, ChannelFeeder)]
    while not stop.wait(POLL_S):
        if errors:
            return
        if until_pid is not None and not pid_running(until_pid):
            echo(f"pipe agent: process {until_pid} has exited; stopping")
            return
        if plan.epochs is not None and not any(f.is_alive() for f in pipes):
            echo(f"pipe agent: fed {plan.epochs} epoch(s) of every channel; stopping")
            return
    echo("pipe agent: stopped")


def wait_ready(root: Path, timeout: float, agent=None) -> None:
    """Wait until the agent of ``root`` is feeding (its ready file exists); for launchers and tests."""
    deadline = time.monotonic() + timeout
    while not (Path(root) / READY_FILE).exists():
        if agent is not None and agent.poll() is not None:
            raise PipeAgentError(
                f"the pipe agent for {root} exited with code {agent.returncode} before it was ready"
            )
        if time.monotonic() > deadline:
            raise PipeAgentError(f"the pipe agent for {root} was not ready after {timeout:.0f} s")
        time.sleep(0.05)
