"""The several-host container job's pure parts, without podman: the network plan, what the toolkit's log
says about SSH, and the relay of the S3 endpoint into another network namespace (root only)."""

from __future__ import annotations

import http.server
import ipaddress
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sagemaker_dist.local.launchers.cluster_log import (
    HostProgress,
    hosts_not_reached,
    note_line,
    ssh_wait_report,
)
from sagemaker_dist.local.launchers.cluster_plan import (
    INTERFACE,
    ClusterPlanError,
    choose_subnet,
    loopback_endpoint_port,
    plan_cluster,
)
from sagemaker_dist.local.launchers.netns_relay import NetnsRelay, RelayError, listen_in_netns

TOKEN = "7b18ebe2" + "0" * 24
LOG = "2026-11-24 16:20:48,711 sagemaker-training-toolkit INFO     "  # the toolkit's log format


def test_the_plan_gives_each_host_a_name_an_address_and_its_ranks():
    plan = plan_cluster("sagemaker-dist-demo-1", ["algo-1", "algo-2"], 2, TOKEN, [], 9000)
    assert plan.network == "sagemaker-dist-demo-1-7b18ebe2"
    subnet = ipaddress.ip_network(plan.subnet)
    assert subnet.prefixlen == 24 and subnet.subnet_of(ipaddress.ip_network("10.213.0.0/16"))
    assert [h.address for h in plan.hosts] == [
        str(subnet.network_address + 11),
        str(subnet.network_address + 12),
    ]
    assert [h.ranks for h in plan.hosts] == [(0, 1), (2, 3)]
    assert plan.host_of_rank(3).name == "algo-2" and plan.host_of_rank(4) is None
    assert plan.host_lines() == [f"{h.address} {h.name}" for h in plan.hosts]
    network = plan.network_create_args()
    assert network[:4] == ["podman", "network", "create", "--internal"] and plan.subnet in network
    create = plan.create_args(plan.hosts[1], "img:1", Path("/t/algo-2"), ["B", "A"])
    assert create[-2:] == ["img:1", "train"] and "--rm" in create
    joined = " ".join(create)
    assert f"--network {plan.network} --ip {plan.hosts[1].address} --hostname algo-2" in joined
    assert all(f"--add-host={h.name}:{h.address}" in create for h in plan.hosts)
    assert "--volume /t/algo-2:/opt/ml" in joined and "--env A --env B" in joined  # names only, no values
    assert plan.interface == INTERFACE == "eth0"


def test_a_job_name_not_ours_gets_the_prefix_and_a_long_one_is_cut():
    plan = plan_cluster("my job/with spaces" + "x" * 80, ["algo-1", "algo-2"], 1, TOKEN, [], 80)
    assert plan.network.startswith("sagemaker-dist-my-job-with-spaces") and plan.network.endswith("-7b18ebe2")
    assert len(plan.network) <= 64


def test_the_subnet_avoids_those_in_use_and_one_host_is_refused():
    first = choose_subnet([], 0)
    assert str(first) == "10.213.0.0/24"
    assert choose_subnet([first], 0) == ipaddress.ip_network("10.213.1.0/24")
    assert choose_subnet([ipaddress.ip_network("10.213.0.0/17")], 5) == ipaddress.ip_network(
        "10.213.128.0/24"
    )
    with pytest.raises(ClusterPlanError, match="every /24"):
        choose_subnet([ipaddress.ip_network("10.0.0.0/8")], 3)
    with pytest.raises(ClusterPlanError, match="two hosts or more"):
        plan_cluster("j", ["algo-1"], 1, TOKEN, [], 80)


def test_only_an_endpoint_on_this_machines_loopback_reaches_the_hosts():
    assert loopback_endpoint_port({"AWS_ENDPOINT_URL": "http://127.0.0.1:4566"}) == 4566
    assert loopback_endpoint_port({"AWS_ENDPOINT_URL": "http://localhost"}) == 80
    assert loopback_endpoint_port({"AWS_ENDPOINT_URL_S3": "http://127.0.0.1:1", "AWS_ENDPOINT_URL": "x"}) == 1
    with pytest.raises(ClusterPlanError, match="cannot reach real S3"):
        loopback_endpoint_port({})
    with pytest.raises(ClusterPlanError, match="not on this machine's loopback"):
        loopback_endpoint_port({"AWS_ENDPOINT_URL": "http://10.0.0.5:9000"})


def _log(progress: HostProgress, text: str) -> None:
    for line in text.splitlines():
        note_line(progress, line, now=100.0)


def test_the_toolkits_log_tells_who_waits_for_whom():
    master, worker = HostProgress("algo-1"), HostProgress("algo-2")
    _log(master, (
        f"{LOG}Waiting for MPI workers to establish their SSH connections\n"
        f"{LOG}Cannot connect to host algo-2\n"
        f"{LOG}Connection failed with exception: \n"
        " [Errno None] Unable to connect to port 22 on 10.213.226.12.   Can be ignored for worker when master"
        " completes and exits."
    ))  # fmt: skip
    _log(worker, (
        f"{LOG}Cannot connect to host algo-1\n"
        f"{LOG}Connection failed with exception: \n"
        " Authentication failed..              Can be ignored for worker when master completes and exits."
    ))  # fmt: skip
    assert master.waiting_for_workers_since == 100.0 and not master.mpirun_started
    assert master.last_refusal == {"algo-2": "[Errno None] Unable to connect to port 22 on 10.213.226.12"}
    assert worker.last_refusal == {"algo-1": "Authentication failed."}
    assert hosts_not_reached(master, ["algo-2"]) == ["algo-2"]
    report = ssh_wait_report(master, worker, 90)
    assert report.startswith("Its SSH did not let algo-1 in within 90 s")
    assert (
        "algo-1's toolkit last said: cannot connect to host algo-2: [Errno None] Unable to connect" in report
    )
    assert "algo-2's toolkit is still waiting to log into algo-1 (Authentication failed.)" in report
    _log(
        master,
        f"{LOG}Worker algo-2 available for communication",
    )
    _log(master, "mpirun --host algo-1:2,algo-2:2 -np 4 --allow-run-as-root")
    assert hosts_not_reached(master, ["algo-2"]) == [] and master.mpirun_started
    _log(
        worker,
        f"{LOG}MPI Master online, creating SSH daemon.",
    )
    assert "algo-2's toolkit reached algo-1 and started its sshd" in ssh_wait_report(master, worker, 5)


needs_netns = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="a network namespace needs root and unshare"
)


@needs_netns
def test_the_relay_brings_this_machines_endpoint_onto_another_namespaces_loopback(tmp_path):
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"from this machine")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # a namespace of its own (loopback up, nothing else), held by a sleeping process
    holder = subprocess.Popen(["unshare", "-n", "sh", "-c", "ip link set lo up 2>/dev/null; exec sleep 60"])
    try:
        netns = f"/proc/{holder.pid}/ns/net"
        deadline = time.monotonic() + 10
        while os.readlink(netns) == os.readlink("/proc/self/ns/net") and time.monotonic() < deadline:
            time.sleep(0.05)
        listener, interfaces = listen_in_netns(netns, port)
        assert "lo" in interfaces and INTERFACE not in interfaces
        relay = NetnsRelay(listener, port, "test").start()
        try:
            url = f"http://127.0.0.1:{port}/"
            get = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read())"
            inside = subprocess.run(["nsenter", f"--net={netns}", sys.executable, "-c", get],
                                    capture_output=True, text=True, timeout=60)  # fmt: skip
            assert inside.stdout.strip() == "b'from this machine'", inside.stderr
        finally:
            relay.close()
        with pytest.raises(RelayError, match="could not listen"):
            listen_in_netns(str(tmp_path / "no-such-netns"), port)
    finally:
        holder.kill()
        holder.wait()
        server.shutdown()
