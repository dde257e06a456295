"""A network namespace of the job's own, for every launcher that runs on this machine (horovodrun,
mpirun, tf-mwms's workers, the toolkit, the one container of a one-host image job): nothing the job
starts listens beyond this machine's loopback.

What the job's processes open binds every address of the namespace they run in: Horovod's Gloo
rendezvous server (``''``), TensorFlow's gRPC servers (``[::]``), mpirun's daemons, the image's sshd
(its root key pair is the DLC's, baked into the image). So the launcher is started inside a fresh
network namespace whose only interface is its loopback (up), and every address there is loopback.
The S3 endpoint on this machine's loopback (the embedded one) is relayed onto the namespace's
loopback at the same port (``netns_relay``), so ``AWS_ENDPOINT_URL`` is the same URL inside.

How: a short-lived thread ``unshare``s a new network namespace (only that thread moves), brings its
loopback up, makes the relay's listening socket there and starts the launcher, which inherits the
namespace; the thread then ends, and the namespace lives as long as the launcher's processes and the
listener do. The relay's own thread runs here, on this machine's network.

Where that cannot be done it falls back, saying so in one line: without root (``CAP_SYS_ADMIN``), or
when the job must reach an S3 endpoint off this machine's loopback (real S3: the namespace has no route
out).
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import subprocess
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from sagemaker_dist.contract.environment import s3_endpoint
from sagemaker_dist.local.launchers.netns_relay import (
    CLONE_NEWNET,
    NetnsRelay,
    in_throwaway_thread,
    loopback_listener,
)

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
FALLBACK = "local mode: the job runs on this machine's network"  # the one line's start


class PrivateNetError(OSError):
    """The namespace could not be made (not root, no network namespaces here)."""


def loopback_endpoint(env: Mapping[str, str]) -> tuple[int | None, str | None]:
    """(port, None) for an S3 endpoint on this machine's loopback (relayed into the namespace);
    (None, why) when the job's S3 is elsewhere (real S3, another machine), which it could not reach."""
    endpoint = s3_endpoint(env)
    if endpoint is None:
        return None, "its S3 is AWS's (no AWS_ENDPOINT_URL), which a private network cannot reach"
    name, given = endpoint
    url = urlsplit(given)
    host = url.hostname or ""
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError:
        return None, f"{name}={given!r} has no valid port"
    if host == "localhost" or host.startswith("127."):
        return port, None
    return (
        None,
        f"its S3 endpoint {given} is off this machine's loopback: a private network cannot reach it",
    )


def _loopback_up() -> None:
    """Bring ``lo`` up in the calling thread's network namespace (``ip link set lo up``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(s, _SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


def _unshare_net() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise PrivateNetError(err, f"unshare(CLONE_NEWNET): {os.strerror(err)}")


def spawn_in_new_netns(
    start: Callable[[], subprocess.Popen], port: int | None
) -> tuple[subprocess.Popen, socket.socket | None]:
    """Run ``start`` (which starts a process) in a thread moved into a new network namespace with its
    loopback up and, given ``port``, a socket listening on 127.0.0.1:``port`` there. Returns the
    process and the listener. Raises PrivateNetError when the namespace cannot be made (nothing was
    started then)."""

    def work():
        try:
            _unshare_net()
            _loopback_up()
            listener = loopback_listener(port) if port is not None else None
        except OSError as exc:
            raise PrivateNetError(f"a network namespace of the job's own could not be made: {exc}") from exc
        try:
            return start(), listener
        except BaseException:  # the launcher's own failure to start: raised as is
            if listener is not None:
                listener.close()
            raise

    return in_throwaway_thread(work, "private-net")


class PrivateNet:
    """Where a launcher's processes run: a network namespace of their own (``start``), with the S3
    endpoint relayed in, or, where that cannot be, this machine's network, said in one line."""

    def __init__(self, env: Mapping[str, str], echo: Callable[[str], None] = print):
        self.port, self.why_not = loopback_endpoint(env)
        self.echo = echo
        self.relay: NetnsRelay | None = None
        self.isolated = False

    def start(self, start: Callable[[], subprocess.Popen]) -> subprocess.Popen:
        """Start the launcher with ``start``: in a namespace of its own where possible."""
        if self.why_not is None:
            try:
                proc, listener = spawn_in_new_netns(start, self.port)
            except PrivateNetError as exc:
                self.why_not = str(exc)
            else:
                self.isolated = True
                if listener is not None:
                    self.relay = NetnsRelay(listener, self.port, "s3").start()
                return proc
        self.echo(
            f"{FALLBACK} ({self.why_not}): what its processes open (Horovod's rendezvous server, "
            "TensorFlow's gRPC servers, MPI's ports) listens on every interface"
        )
        return start()

    def close(self) -> None:
        """Stop the relay (after the job's processes have ended)."""
        if self.relay is not None:
            self.relay.close()
            self.relay = None
