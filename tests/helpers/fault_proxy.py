"""An HTTP proxy in front of the moto server that answers chosen requests with a canned error (test helper).

Real HTTP end to end: boto3 sees exactly what a failing AWS endpoint would send, with no patching.
"""

from __future__ import annotations

import http.client
import http.server
import threading
from collections.abc import Callable
from contextlib import contextmanager

# (method, path, headers, body) -> None to forward, or (status, content type, body) to answer with.
Rule = Callable[[str, str, dict, bytes], "tuple[int, str, bytes] | None"]


class _FaultProxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str, rule: Rule):
        self.upstream = upstream.removeprefix("http://")
        self.rule = rule
        self.answered = 0
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        canned = self.server.rule(self.command, self.path, dict(self.headers.items()), body)
        if canned is not None:
            self.server.answered += 1
            status, content_type, data = canned
            self._reply(status, [("Content-Type", content_type)], data)
            return
        conn = http.client.HTTPConnection(self.server.upstream, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        headers["Host"] = self.server.upstream
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        self._reply(resp.status, resp.getheaders(), resp.read())

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _handle


@contextmanager
def fault_proxy(upstream: str, rule: Rule):
    """Yield (proxy, url); ``proxy.answered`` counts the requests the rule answered."""
    with _FaultProxy(upstream, rule) as proxy:  # closes the socket on exit
        serving = threading.Thread(target=proxy.serve_forever, daemon=True)
        serving.start()
        try:
            yield proxy, "http://{}:{}".format(*proxy.server_address)
        finally:
            proxy.shutdown()
            serving.join(timeout=5)
