"""An HTTP proxy in front of the moto server that breaks chosen downloads mid-stream (test helper)."""

from __future__ import annotations

import http.client
import http.server
import threading
from contextlib import contextmanager


class _CuttingProxy(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str, fail_times: int, match: str):
        self.upstream = upstream.removeprefix("http://")
        self.fail_times, self.match, self.cut = fail_times, match, 0
        super().__init__(("127.0.0.1", 0), _ProxyHandler)


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _forward(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        conn = http.client.HTTPConnection(self.server.upstream, timeout=10)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
        headers["Host"] = self.server.upstream
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        server = self.server
        cut = self.command == "GET" and server.match in self.path and server.cut < server.fail_times
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if cut:  # promise the whole body, send half, drop the connection
            server.cut += 1
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(data)

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _forward


@contextmanager
def cutting_proxy(upstream: str, fail_times: int, match: str = "broken"):
    """Yield (proxy, url): GETs whose path contains ``match`` are cut ``fail_times`` times."""
    proxy = _CuttingProxy(upstream, fail_times, match)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        yield proxy, f"http://127.0.0.1:{proxy.server_address[1]}"
    finally:
        proxy.shutdown()
        proxy.server_close()
