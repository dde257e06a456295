"""Nothing a local job starts listens beyond loopback: while a job runs, every TCP listener
of its processes is read with ``ss -ltnp`` in the network namespace each process runs in, and none may
be reachable from outside: bound to a loopback address, or in a namespace whose only interface is
``lo`` (the job's own, ``private_net``), where every address is loopback.

One small job per launcher: horovodrun --gloo (Horovod's rendezvous server binds every address) and
tf-mwms (TensorFlow's gRPC servers bind ``[::]``). ``ListenerWatch`` is also used by the image's test
(tests/container/test_container_image.py).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from sagemaker_dist import LocalBackend, run_local
from sagemaker_dist.host.processes import descendants
from sagemaker_dist.local.demo import demo_estimator
from sagemaker_dist.local.demo_data import write_demo_data

SCRIPTS = Path(__file__).resolve().parents[1] / "helpers" / "local_scripts"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a job's own network namespace (and nsenter) needs root"
)


@dataclass(frozen=True)
class Listener:
    """One listening socket of the job: its local address as ss prints it, its process, and the
    interfaces of the network namespace it is in."""

    address: str
    process: str
    netns: str
    interfaces: tuple[str, ...]

    @property
    def loopback(self) -> bool:
        host = self.address.rsplit(":", 1)[0].strip("[]").split("%", 1)[0]
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:  # '*': every address
            return False

    @property
    def exposed(self) -> bool:
        """Reachable from beyond this machine's loopback: a non-loopback address in a namespace with
        an interface other than lo."""
        return not self.loopback and any(name != "lo" for name in self.interfaces)

    def __str__(self) -> str:
        return f"{self.address} {self.process} (netns {self.netns}: {', '.join(self.interfaces)})"


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _interfaces(pid: int) -> tuple[str, ...]:
    """The interfaces of ``pid``'s network namespace (/proc/PID/net/dev is that namespace's)."""
    try:
        lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
    except OSError:
        return ()
    return tuple(sorted(line.split(":", 1)[0].strip() for line in lines))


_USERS = re.compile(r'\("([^"]*)",pid=(\d+),')


class ListenerWatch:
    """Samples, until ``stop``, the TCP listeners of the processes under ``roots()`` (re-read each
    time: the launcher's pid, a container's)."""

    def __init__(self, roots, interval: float = 0.2):
        self.roots, self.interval = roots, interval
        self.seen: set[Listener] = set()
        self.samples = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="listener-watch", daemon=True)

    def start(self) -> ListenerWatch:
        self._thread.start()
        return self

    def stop(self) -> ListenerWatch:
        self._stop.set()
        self._thread.join(30)
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception as exc:  # reported by the test, not lost in a thread
                self.errors.append(repr(exc))
            self._stop.wait(self.interval)

    def sample(self) -> None:
        roots = [pid for pid in self.roots() if pid]
        pids = set(roots) | descendants(roots)
        spaces: dict[str, int] = {}
        for pid in sorted(pids):
            ns = _netns(pid)
            if ns:
                spaces.setdefault(ns, pid)
        for ns, pid in spaces.items():
            done = subprocess.run(
                ["nsenter", "-t", str(pid), "-n", "ss", "-ltnpH"], capture_output=True, text=True, timeout=30
            )
            if done.returncode:
                continue  # the process ended meanwhile
            interfaces = _interfaces(pid)
            for line in done.stdout.splitlines():
                fields = line.split()
                owners = [(name, int(p)) for name, p in _USERS.findall(line)]
                ours = [f"{name}[{p}]" for name, p in owners if p in pids]
                if len(fields) >= 4 and ours:
                    self.seen.add(Listener(fields[3], ",".join(ours), ns, interfaces))
        self.samples += 1

    def exposed(self) -> list[Listener]:
        return sorted((x for x in self.seen if x.exposed), key=str)

    def report(self) -> str:
        return "\n".join(map(str, sorted(self.seen, key=str))) or "no listener seen"


def run_watched(request, **kwargs):
    """``run_local(request, **kwargs)`` with a ListenerWatch on the launcher's process tree; returns
    (result, watch, lines)."""
    lines: list[str] = []
    watch = ListenerWatch(lambda: [])

    def started(group):
        watch.roots = lambda: [group.proc.pid] if group.proc else []
        watch.start()

    try:
        result = run_local(request, echo=lines.append, on_started=started, **kwargs)
    finally:
        watch.stop()
    return result, watch, lines


def check_nothing_exposed(watch: ListenerWatch, lines: list[str], expected: str) -> None:
    """Nothing of the job listened beyond loopback, and the watch did see the job's listeners (at
    least one whose process name contains ``expected``): an empty watch proves nothing."""
    assert not watch.errors, watch.errors
    assert watch.samples > 3, watch.samples
    assert any(expected in x.process for x in watch.seen), watch.report()
    assert not watch.exposed(), (
        "listeners reachable beyond loopback:\n" + "\n".join(map(str, watch.exposed())) + "\nall seen:\n"
        + watch.report() + "\n" + "\n".join(lines[-20:])
    )  # fmt: skip
    assert not any("runs on this machine's network" in line for line in lines), lines


def _data(s3, bucket, records=8):
    write_demo_data(f"s3://{bucket}/data/", files=2, records_per_file=records, validation_files=1, client=s3)


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.tensorflow
def test_a_horovodrun_gloo_job_listens_only_on_loopback(s3, bucket, tmp_path):
    """horovodrun's Gloo rendezvous server binds every address (``('', port)``); the ranks' Gloo pairs
    listen on lo's address. In the job's own namespace, none is reachable from outside."""
    _data(s3, bucket)
    estimator = demo_estimator(
        bucket, 1, 2, "Pipe", {"epochs": 1, "delay": 0.1}, source_dir=SCRIPTS, entry_point="count_records.py"
    )
    request = estimator.prepare({"train": f"s3://{bucket}/data/train/"}, printer=None).request
    _, watch, lines = run_watched(request, source_dir=SCRIPTS, work_dir=tmp_path, timeout=180)
    print(watch.report())
    check_nothing_exposed(watch, lines, "horovodrun")


@pytest.mark.slow
@pytest.mark.tensorflow
def test_a_tf_mwms_job_listens_only_on_loopback(s3, bucket, tmp_path):
    """Each tf-mwms worker's gRPC server binds ``[::]:PORT`` whatever TF_CONFIG says; in the job's own
    namespace that is its loopback only. The workers still reach S3 (the relay): the job ends well."""
    _data(s3, bucket)
    estimator = demo_estimator(
        bucket, 2, 1, "Pipe", {"epochs": 1}, source_dir=SCRIPTS, entry_point="mwms_steps.py",
        distribution="tf-mwms",
    )  # fmt: skip
    inputs = {"train": f"s3://{bucket}/data/train/"}
    request = estimator.prepare(inputs, printer=None, backend=LocalBackend()).request
    _, watch, lines = run_watched(request, source_dir=SCRIPTS, work_dir=tmp_path, timeout=180)
    print(watch.report())
    assert sum("DONE worker=" in line for line in lines) == 2, lines[-30:]
    check_nothing_exposed(watch, lines, "python")


_PROBE = """
import socket, subprocess, sys
server = socket.socket()
server.bind(("", 0))  # every address, as Horovod's rendezvous server binds
server.listen()
print(open("/proc/net/dev").read().count(":"), "interface(s)")
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10) as s3:
    print(s3.recv(100).decode())
"""


def _endpoint():
    """A stand-in for the S3 endpoint on this machine's loopback: says hello to each connection."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"hello from this machine")

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_the_launcher_gets_a_namespace_with_only_lo_and_reaches_the_endpoint_through_the_relay():
    from sagemaker_dist.local.launchers.private_net import PrivateNet

    server = _endpoint()
    port = server.getsockname()[1]
    lines: list[str] = []
    net = PrivateNet({"AWS_ENDPOINT_URL": f"http://localhost:{port}"}, lines.append)
    command = [sys.executable, "-c", _PROBE, str(port)]
    proc = net.start(lambda: subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
    out = proc.communicate(timeout=60)[0]
    net.close()
    server.close()
    assert proc.returncode == 0 and net.isolated and not lines, (out, lines)
    assert out.split() == ["1", "interface(s)", "hello", "from", "this", "machine"], out


def test_without_a_loopback_endpoint_the_job_says_it_runs_on_this_machines_network():
    """Real S3 cannot be reached from the job's own namespace: the launcher runs on this machine's
    network, and says so in one line."""
    from sagemaker_dist.local.launchers.private_net import PrivateNet

    lines: list[str] = []
    net = PrivateNet({"AWS_ENDPOINT_URL": "https://s3.us-east-1.amazonaws.com"}, lines.append)
    code = "print(open('/proc/net/dev').read().count(':'))"
    proc = net.start(
        lambda: subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    )
    out = proc.communicate(timeout=60)[0]
    net.close()
    assert not net.isolated and len(lines) == 1, lines
    assert lines[0].startswith("local mode: the job runs on this machine's network (its S3 endpoint "), lines
    assert int(out) == Path("/proc/net/dev").read_text().count(":")  # this machine's interfaces
    assert PrivateNet({}, print).why_not.startswith("its S3 is AWS's")
