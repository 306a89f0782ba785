"""A loopback HTTP/1.1 proxy in front of Azurite's blob port that notes every request: what a
reader asks of the storage (how many GETs, of what sizes, how many in flight at once).

For one untimed run of a contender (bench/bench_parquet.py): the proxy copies every byte in
Python, so it slows what goes through it. SharedKey signatures stay valid (the path is kept; the
host is not signed).

    with RequestLog(az.blob_port) as log:
        ...  # a client pointed at log.endpoint(account)
    log.summary()  # {"requests": ..., "gets": ..., "mb": ..., "max_in_flight": ...}
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOP: frozenset[str] = frozenset({"connection", "keep-alive", "transfer-encoding", "proxy-connection"})
COPY: int = 1 << 20


class RequestLog:
    """The proxy and what it saw: (method, response bytes) per request, the most in flight."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.seen: list[tuple[str, int]] = []
        self.in_flight = self.max_in_flight = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="request-log", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def endpoint(self, account: str) -> str:
        return f"http://127.0.0.1:{self.port}/{account}"

    def __enter__(self) -> RequestLog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def begin(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def end(self, method: str, size: int) -> None:
        with self._lock:
            self.in_flight -= 1
            self.seen.append((method, size))

    def summary(self) -> dict[str, Any]:
        gets = sorted(size for method, size in self.seen if method == "GET")
        return {
            "requests": len(self.seen),
            "gets": len(gets),
            "mb": round(sum(gets) / 1e6, 1),
            "get_mb_median": round(gets[len(gets) // 2] / 1e6, 2) if gets else 0.0,
            "get_mb_max": round(gets[-1] / 1e6, 2) if gets else 0.0,
            "max_in_flight": self.max_in_flight,
        }


def _handler(log: RequestLog) -> type[BaseHTTPRequestHandler]:
    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _forward(self) -> None:
            log.begin()
            sent = 0
            try:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                upstream = http.client.HTTPConnection("127.0.0.1", log.target_port, timeout=120)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    resp = upstream.getresponse()
                    whole = None if resp.getheader("Content-Length") else resp.read()  # chunked
                    self.send_response(resp.status, resp.reason)
                    for key, value in resp.getheaders():
                        if key.lower() not in HOP:
                            self.send_header(key, value)
                    if whole is not None:
                        self.send_header("Content-Length", str(len(whole)))
                    self.end_headers()
                    if whole is not None:
                        self.wfile.write(whole)
                        sent = len(whole)
                    while whole is None and self.command != "HEAD":
                        chunk = resp.read(COPY)
                        if not chunk:
                            break
                        self.wfile.write(chunk)
                        sent += len(chunk)
                finally:
                    upstream.close()
            finally:
                log.end(self.command, sent)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    return Forward
