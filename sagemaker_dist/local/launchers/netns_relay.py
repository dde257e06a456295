"""Bring a TCP endpoint of this machine's loopback (the S3 endpoint) onto a container's own loopback,
at the same port, without any route between them.

The listening socket is made inside the container's network namespace by a short-lived thread that
joins it (``setns``; only that thread moves, and a socket stays in the namespace it was made in); every
connection it accepts is then joined, from this process, to the endpoint here. So the container's
``http://127.0.0.1:PORT`` is this machine's, no process runs in the container, and the private network
stays --internal. (A Unix socket bind-mounted into the container with a relay process inside would do
the same with one more hop and one more process per host.)
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
from collections.abc import Callable
from typing import TypeVar

CLONE_NEWNET = 0x40000000
_CONNECT_TIMEOUT_S = 10.0
_CHUNK = 64 * 1024
T = TypeVar("T")


class RelayError(OSError):
    """The relay could not be set up in the container's network namespace."""


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise RelayError(err, f"setns into a network namespace failed: {os.strerror(err)}")


def loopback_listener(port: int) -> socket.socket:
    """A socket listening on 127.0.0.1:``port`` in the calling thread's network namespace."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    return listener


def in_throwaway_thread(work: Callable[[], T], name: str) -> T:
    """``work()`` run in a thread of its own, its result returned or its exception raised here: a
    thread that moves into another network namespace (setns, unshare) must be one nothing reuses."""
    result: dict = {}

    def run():
        try:
            result["ok"] = work()
        except BaseException as exc:  # raised again in the caller's thread
            result["raise"] = exc

    thread = threading.Thread(target=run, name=name, daemon=True)  # ends in that namespace
    thread.start()
    thread.join()
    if "raise" in result:
        raise result["raise"]
    return result["ok"]


def listen_in_netns(netns_path: str, port: int) -> tuple[socket.socket, list[str]]:
    """A socket listening on 127.0.0.1:``port`` inside the namespace at ``netns_path``, and the names
    of the interfaces there (to check what resourceconfig.json says)."""

    def work():
        with open(netns_path, "rb") as ns:
            _setns(ns.fileno())
        interfaces = [name for _, name in socket.if_nameindex()]
        return loopback_listener(port), interfaces

    try:
        return in_throwaway_thread(work, "netns-listen")
    except OSError as exc:
        raise RelayError(f"could not listen on 127.0.0.1:{port} in {netns_path}: {exc}") from exc


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(_CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


class NetnsRelay:
    """Accepts on a listener made by ``listen_in_netns`` and joins each connection to
    127.0.0.1:``port`` of this machine, both ways, until ``close``."""

    def __init__(self, listener: socket.socket, port: int, name: str):
        self.listener, self.port, self.name = listener, port, name
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name=f"relay-{name}", daemon=True)

    def start(self) -> NetnsRelay:
        self._thread.start()
        return self

    def _accept(self) -> None:
        while True:
            try:
                inside, _ = self.listener.accept()
            except OSError:
                return  # closed
            try:
                outside = socket.create_connection(("127.0.0.1", self.port), timeout=_CONNECT_TIMEOUT_S)
                outside.settimeout(None)
            except OSError:
                inside.close()  # the endpoint is down: the client sees the connection closed
                continue
            with self._lock:
                if self._closed:
                    inside.close()
                    outside.close()
                    return
                self._conns.update((inside, outside))
            threading.Thread(target=self._join, args=(inside, outside), daemon=True).start()

    def _join(self, inside: socket.socket, outside: socket.socket) -> None:
        """Copy both ways until both sides are done, then close the pair."""
        back = threading.Thread(target=_pump, args=(outside, inside), daemon=True)
        back.start()
        _pump(inside, outside)
        back.join()
        with self._lock:
            self._conns.difference_update((inside, outside))
        inside.close()
        outside.close()

    def close(self) -> None:
        """Stop accepting and cut every open connection."""
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns), set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()
        for sock in conns:
            try:
                sock.close()
            except OSError:
                pass
