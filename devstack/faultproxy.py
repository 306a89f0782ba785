"""A fault-injecting HTTP/1.1 proxy in front of Azurite, for tests.

Requests are forwarded byte for byte (request line, headers, body), so shared-key signatures
still verify. Rules answer with an error instead, or forward and then drop the answer, or delay.
Set them in process (`FaultProxy.add`) or over HTTP on any of the proxy's ports:
`POST /_faults` (a rule as JSON, or a list), `GET /_faults`, `DELETE /_faults[/<id>]`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import re
import select
import signal
import socket
import socketserver
import struct
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from email.utils import formatdate
from typing import Any, Literal, cast, get_args
from urllib.parse import urlsplit, urlunsplit

from devstack.azurite import Azurite
from devstack.http_framing import (
    CHUNKED,
    Broken,
    Head,
    Sink,
    body_length,
    copy_body,
    discard,
    read_head,
    response,
)

CONTROL_PATH = "/_faults"
Action = Literal["error", "drop_answer", "delay"]
Since = Literal["set", "first_fault"]
UPSTREAM_IDLE_S = 2.0
"""A kept-alive upstream connection idle longer is reopened (Azurite closes them after 5 s)."""
UPSTREAM_TIMEOUT_S = 120.0
CLIENT_IDLE_S = 300.0
_random = random.Random()


@dataclass(eq=False)
class FaultRule:
    """Which requests to fault, and how. Counters are updated in place while the rule is set."""

    action: Action
    methods: tuple[str, ...] = ()
    """HTTP methods to match; any when empty."""
    path: str = ""
    """Regex searched in the request path as sent (percent-encoded, without the query)."""
    has_header: tuple[str, ...] = ()
    """Match only requests carrying at least one of these headers (e.g. If-Match, If-None-Match)."""
    service: str | None = None
    """Match only requests to this upstream ("blob", "queue"); any when None."""
    nth: int = 1
    """Matching requests before the nth (1-based) pass through untouched."""
    count: int | None = None
    """Faults to inject, then the rule is spent; no limit when None."""
    for_s: float | None = None
    """Inject only during this many seconds; no limit when None."""
    since: Since = "first_fault"
    """Where `for_s` starts: when the rule is set ("set") or at its first fault ("first_fault")."""
    chance: float = 1.0
    """Each eligible request is faulted with this probability (so an SDK's retries may get through)."""
    status: int = 503
    """`error`: the status answered."""
    error_code: str = "ServerBusy"
    """`error`: the `x-ms-error-code` header and the XML body's Code."""
    delay_s: float = 0.0
    """`delay`: seconds to wait before forwarding."""

    id: int = field(default=0, init=False)
    matched: int = field(default=0, init=False)
    """Requests that matched the filters (methods, path, has_header, service) while set."""
    injected: int = field(default=0, init=False)
    """Faults injected."""
    dropped_statuses: dict[int, int] = field(default_factory=dict, init=False)
    """`drop_answer`: the upstream status of each dropped answer -> how many."""
    _window_start: float | None = field(default=None, init=False, repr=False)
    _path_re: re.Pattern[str] = field(default=re.compile(""), init=False, repr=False)

    def __post_init__(self) -> None:
        if self.action not in get_args(Action):
            raise ValueError(f"action must be one of {get_args(Action)}, not {self.action!r}")
        if self.since not in get_args(Since):
            raise ValueError(f"since must be one of {get_args(Since)}, not {self.since!r}")
        if isinstance(self.methods, str):
            self.methods = (self.methods,)
        if isinstance(self.has_header, str):
            self.has_header = (self.has_header,)
        self.methods = tuple(m.upper() for m in self.methods)
        self.has_header = tuple(h.lower() for h in self.has_header)
        if self.nth < 1 or (self.count is not None and self.count < 1):
            raise ValueError("nth and count must be >= 1")
        if not 100 <= self.status <= 599:
            raise ValueError(f"status {self.status} is not an HTTP status")
        if not 0.0 < self.chance <= 1.0:
            raise ValueError("chance must be in (0, 1]")
        self._path_re = re.compile(self.path)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FaultRule:
        """A rule from its JSON form (the `__init__` arguments; lists for tuples)."""
        known = {f.name for f in fields(cls) if f.init}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown rule fields: {sorted(unknown)}")
        args: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**args)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        out.update(id=self.id, matched=self.matched, injected=self.injected)
        out["dropped_statuses"] = {str(k): v for k, v in self.dropped_statuses.items()}
        out["methods"], out["has_header"] = list(self.methods), list(self.has_header)
        return out

    def matches(self, service: str, method: str, path: str, header_names: set[str]) -> bool:
        return (
            (self.service is None or self.service == service)
            and (not self.methods or method in self.methods)
            and (not self.has_header or any(h in header_names for h in self.has_header))
            and self._path_re.search(path) is not None
        )

    def fire(self, now: float) -> bool:
        """Called after a match: True (and counted) when this request gets the fault."""
        if self.matched < self.nth or (self.count is not None and self.injected >= self.count):
            return False
        if self.chance < 1.0 and _random.random() >= self.chance:
            return False
        if self.for_s is not None:
            if self._window_start is None:
                self._window_start = now
            if now - self._window_start >= self.for_s:
                return False
        self.injected += 1
        return True


def _storage_error(rule: FaultRule, method: str, keep_alive: bool) -> bytes:
    """A storage-style error answer (XML body, x-ms-error-code), as Azure sends them."""
    request_id, date = str(uuid.uuid4()), formatdate(usegmt=True)
    message = f"Injected by faultproxy (rule {rule.id}).\nRequestId:{request_id}\nTime:{date}"
    body = (
        f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{rule.error_code}</Code>'
        f"<Message>{message}</Message></Error>"
    ).encode()
    headers = {
        "Content-Type": "application/xml",
        "Server": "faultproxy",
        "x-ms-request-id": request_id,
        "x-ms-error-code": rule.error_code,
        "Date": date,
    }
    return response(rule.status, b"" if method == "HEAD" else body, headers, keep_alive)


class _Upstream:
    """One kept-alive connection to the upstream port, opened lazily, reopened when stale."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None
        self.rfile: io.BufferedIOBase | None = None
        self.used = 0.0

    def connect(self) -> tuple[socket.socket, io.BufferedIOBase]:
        if self.sock is not None and (
            time.monotonic() - self.used > UPSTREAM_IDLE_S or select.select([self.sock], [], [], 0)[0]
        ):
            self.close()  # idle too long, or closed by the server (readable with no request pending)
        if self.sock is None or self.rfile is None:
            self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=UPSTREAM_TIMEOUT_S)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.rfile = self.sock.makefile("rb")
        self.used = time.monotonic()
        return self.sock, self.rfile

    def close(self) -> None:
        if self.rfile is not None:
            self.rfile.close()
        if self.sock is not None:
            self.sock.close()
        self.sock, self.rfile = None, None


class _Connection:
    """One client connection: a loop of request -> (fault | forward) -> answer."""

    def __init__(self, proxy: FaultProxy, service: str, upstream_port: int, client: socket.socket) -> None:
        self.proxy = proxy
        self.service = service
        self.client = client
        self.rfile: io.BufferedIOBase = client.makefile("rb")
        self.upstream = _Upstream(upstream_port)

    def serve(self) -> None:
        self.client.settimeout(CLIENT_IDLE_S)
        self.client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while self.exchange():
                pass
        except (OSError, Broken):
            self.proxy._count("connection_errors")
        finally:
            self.upstream.close()
            self.rfile.close()

    def exchange(self) -> bool:
        """Serve one request; False when the connection is to be closed."""
        head = read_head(self.rfile)
        if head is None:
            return False
        if len(head.start) != 3:
            raise Broken("malformed request line")
        method, target, _ = head.start
        path = urlsplit(target).path
        if path == CONTROL_PATH or path.startswith(CONTROL_PATH + "/"):
            return self.control(head, method, path)
        length = body_length(head)
        if length is None:
            raise Broken("request body of unknown length")
        rule = self.proxy._decide(self.service, method, path, set(head.headers))
        if rule is not None and rule.action == "error":
            copy_body(self.rfile, length, discard)
            self.client.sendall(_storage_error(rule, method, head.keep_alive()))
            return head.keep_alive()
        if rule is not None and rule.action == "delay":
            time.sleep(rule.delay_s)
        drop = rule is not None and rule.action == "drop_answer"
        return self.forward(head, method, length, rule if drop else None)

    def forward(self, head: Head, method: str, length: int | None, drop: FaultRule | None) -> bool:
        try:
            sock, upstream = self.upstream.connect()
        except OSError:
            self.proxy._count("upstream_unreachable")
            self.reset()  # as near as a proxy gets to "connection refused"
            return False
        sock.sendall(head.raw)
        copy_body(self.rfile, length, sock.sendall)
        sink: Sink = discard if drop else self.client.sendall
        answer = read_head(upstream)
        while answer is not None and len(answer.start) >= 2 and answer.start[1].startswith("1"):
            sink(answer.raw)  # 1xx interim answers (100 Continue) come before the final one
            answer = read_head(upstream)
        if answer is None or len(answer.start) < 2 or not answer.start[1].isdigit():
            raise Broken("no answer from upstream")
        status = int(answer.start[1])
        no_body = method == "HEAD" or status in (204, 304)
        answer_length = body_length(answer, no_body)
        sink(answer.raw)
        copy_body(upstream, answer_length, sink)
        if answer_length is None or not answer.keep_alive():
            self.upstream.close()
        if drop is not None:
            self.proxy._dropped(drop, status)
            self.reset()
            return False
        return answer_length is not None and head.keep_alive() and answer.keep_alive()

    def reset(self) -> None:
        """Close the client connection with a TCP reset, sending nothing more."""
        with contextlib.suppress(OSError):
            self.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.rfile.close()
        self.client.close()

    def control(self, head: Head, method: str, path: str) -> bool:
        """The `/_faults` endpoint: list (GET), add (POST), clear or remove one (DELETE)."""
        length = body_length(head)
        if length is None:
            raise Broken("request body of unknown length")
        body = bytearray()
        copy_body(self.rfile, length, discard if length == CHUNKED else body.extend)
        rule_id = path[len(CONTROL_PATH) + 1 :]
        if length == CHUNKED:
            answer: dict[str, Any] = {"error": "send the body with a Content-Length"}
        else:
            answer = self.control_answer(method, rule_id, bytes(body))
        status = 200
        if "error" in answer:
            status = 404 if answer["error"] == "no such rule" else 400
        elif method == "POST":
            status = 201
        data = json.dumps(answer).encode()
        self.client.sendall(response(status, data, {"Content-Type": "application/json"}, head.keep_alive()))
        return head.keep_alive()

    def control_answer(self, method: str, rule_id: str, body: bytes) -> dict[str, Any]:
        proxy = self.proxy
        if method == "GET" and not rule_id:
            return {**proxy.stats(), "rules": [r.to_json() for r in proxy.rules()]}
        if method == "POST" and not rule_id:
            try:
                data = json.loads(body)
                items = data if isinstance(data, list) else [data]
                rules = [FaultRule.from_json(item) for item in items]
            except (ValueError, TypeError, re.error) as exc:
                return {"error": str(exc)}
            return {"rules": [proxy.add(rule).to_json() for rule in rules]}
        if method == "DELETE" and not rule_id:
            return {"cleared": proxy.clear()}
        if method == "DELETE" and rule_id.isdigit():
            return {"removed": int(rule_id)} if proxy.remove(int(rule_id)) else {"error": "no such rule"}
        return {"error": f"unsupported: {method} {CONTROL_PATH}/{rule_id}".rstrip("/")}


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # hosts open many pooled connections at once

    def __init__(self, proxy: FaultProxy, service: str, upstream_port: int, host: str) -> None:
        self.proxy = proxy
        self.service = service
        self.upstream_port = upstream_port
        super().__init__((host, 0), _Handler)


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        server, sock = self.server, cast(socket.socket, self.request)
        with server.proxy._track(sock):
            _Connection(server.proxy, server.service, server.upstream_port, sock).serve()


class FaultProxy:
    """One listening port per upstream service (e.g. {"blob": 10000, "queue": 10001}), shared rules."""

    def __init__(self, upstreams: Mapping[str, int], host: str = "127.0.0.1") -> None:
        self.host = host
        self._upstreams = dict(upstreams)
        self._servers: dict[str, _Server] = {}
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []
        self._next_id = 1
        self._counts = {"requests": 0, "injected": 0, "connection_errors": 0, "upstream_unreachable": 0}
        self._clients: set[socket.socket] = set()

    @classmethod
    def for_azurite(cls, azurite: Azurite) -> FaultProxy:
        """A proxy for an Azurite's blob and queue ports (not started)."""
        return cls({"blob": azurite.blob_port, "queue": azurite.queue_port})

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> FaultProxy:
        for service, upstream_port in self._upstreams.items():
            server = _Server(self, service, upstream_port, self.host)
            self._servers[service] = server
            threading.Thread(
                target=server.serve_forever, args=(0.05,), name=f"faultproxy-{service}", daemon=True
            ).start()
        return self

    def stop(self) -> None:
        """Stop listening and cut the open client connections."""
        for server in self._servers.values():
            server.shutdown()
            server.server_close()
        self._servers.clear()
        with self._lock:
            clients = list(self._clients)
        for sock in clients:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- addresses -------------------------------------------------------------------------

    def port(self, service: str) -> int:
        return int(self._servers[service].server_address[1])

    def url(self, service: str) -> str:
        return f"http://{self.host}:{self.port(service)}"

    def route(self, connection_string: str) -> str:
        """The connection string with its endpoints for the proxied services pointing at the proxy."""
        parts = []
        routed = set()
        for part in connection_string.split(";"):
            key, sep, value = part.partition("=")
            service = key.removesuffix("Endpoint").lower() if key.endswith("Endpoint") else ""
            if sep and service in self._servers:
                url = urlsplit(value)
                part = f"{key}={urlunsplit(url._replace(netloc=f'{self.host}:{self.port(service)}'))}"
                routed.add(service)
            parts.append(part)
        missing = set(self._servers) - routed
        if missing:
            raise ValueError(f"connection string has no explicit endpoint for {sorted(missing)}")
        return ";".join(parts)

    # -- rules -----------------------------------------------------------------------------

    def add(self, rule: FaultRule) -> FaultRule:
        """Set a rule (checked after those already set); returns it, its counters live."""
        with self._lock:
            rule.id = self._next_id
            self._next_id += 1
            if rule.since == "set" and rule.for_s is not None:
                rule._window_start = time.monotonic()
            self._rules.append(rule)
        return rule

    def remove(self, rule_id: int) -> bool:
        with self._lock:
            kept = [r for r in self._rules if r.id != rule_id]
            found = len(kept) != len(self._rules)
            self._rules = kept
        return found

    def clear(self) -> int:
        """Remove every rule; returns how many there were."""
        with self._lock:
            count, self._rules = len(self._rules), []
        return count

    def rules(self) -> list[FaultRule]:
        with self._lock:
            return list(self._rules)

    def stats(self) -> dict[str, int]:
        """Since start: requests (control ones aside), faults injected, connections cut by errors."""
        with self._lock:
            return dict(self._counts)

    # -- used by connections ---------------------------------------------------------------

    def _decide(self, service: str, method: str, path: str, header_names: set[str]) -> FaultRule | None:
        """The first set rule that fires for this request; every matching rule counts the match."""
        now = time.monotonic()
        chosen: FaultRule | None = None
        with self._lock:
            self._counts["requests"] += 1
            for rule in self._rules:
                if rule.matches(service, method, path, header_names):
                    rule.matched += 1
                    if chosen is None and rule.fire(now):
                        chosen = rule
            self._counts["injected"] += chosen is not None
        return chosen

    def _dropped(self, rule: FaultRule, status: int) -> None:
        with self._lock:
            rule.dropped_statuses[status] = rule.dropped_statuses.get(status, 0) + 1

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    @contextlib.contextmanager
    def _track(self, sock: socket.socket) -> Iterator[None]:
        with self._lock:
            self._clients.add(sock)
        try:
            yield
        finally:
            with self._lock:
                self._clients.discard(sock)


def main() -> None:
    """python -m devstack.faultproxy --blob-port N --queue-port M: serve until SIGTERM / Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--blob-port", type=int, required=True)
    parser.add_argument("--queue-port", type=int, required=True)
    args = parser.parse_args()
    proxy = FaultProxy({"blob": args.blob_port, "queue": args.queue_port}).start()
    print(json.dumps({"blob": proxy.port("blob"), "queue": proxy.port("queue")}), flush=True)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with contextlib.suppress(KeyboardInterrupt):
        signal.pause()
    proxy.stop()


if __name__ == "__main__":
    main()
