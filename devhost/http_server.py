"""HTTP triggers on 127.0.0.1 (`/api/<route>`), plus GET /_devhost/stats and /_devhost/health."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import azure.functions as func

from devhost.config import resolve_setting_refs
from devhost.invoker import QueueOutput, resolve_queue_outputs, send_queue_outputs
from devhost.ipc import error_text, failure_details
from devhost.loader import FunctionSpec
from devhost.stats import Stats
from devhost.storage import QueueClients
from devhost.supervisor import Worker

log = logging.getLogger("devhost.http")

_PARAM = re.compile(r"\{([^{}]+)\}")
_CONSTRAINTS = {"int": r"-?\d+", "long": r"-?\d+", "alpha": r"[A-Za-z]+", "bool": r"(?i:true|false)"}


@dataclass
class Route:
    """A compiled route template, e.g. `jobs/{id}/result` or `files/{*path}`."""

    template: str
    pattern: re.Pattern[str]
    names: dict[str, str]  # regex group -> route parameter name
    precedence: tuple[int, ...]

    def match(self, path: str) -> dict[str, str] | None:
        m = self.pattern.match(path)
        if m is None:
            return None
        return {self.names[g]: v for g, v in m.groupdict().items() if v is not None}


def compile_route(template: str) -> Route:
    """Compile an ASP.NET-style template: {name}, {name:int}, {name?}, {*catchall}; literals ignore case."""
    names: dict[str, str] = {}
    precedence: list[int] = []
    regex = ""
    for i, segment in enumerate(template.strip("/").split("/") if template.strip("/") else []):
        slash = "/" if i else ""
        whole = _PARAM.fullmatch(segment)
        if whole:
            spec = whole.group(1)
            group = f"p{len(names)}"
            if spec.startswith("*"):
                names[group] = spec.lstrip("*").split(":")[0]
                regex += f"(?:{slash}(?P<{group}>.*))?"
                precedence.append(4)
                continue
            optional = spec.endswith("?")
            name, _, constraint = spec.rstrip("?").partition(":")
            names[group] = name
            part = f"(?P<{group}>{_CONSTRAINTS.get(constraint.split('(')[0], '[^/]+')})"
            regex += f"(?:{slash}{part})?" if optional else slash + part
            precedence.append(3 if optional else 1 if constraint else 2)
            continue
        regex += slash
        pos = 0
        for m in _PARAM.finditer(segment):
            group = f"p{len(names)}"
            names[group] = m.group(1).rstrip("?").split(":")[0]
            regex += re.escape(segment[pos : m.start()]) + f"(?P<{group}>[^/]+?)"
            pos = m.end()
        regex += re.escape(segment[pos:])
        precedence.append(0 if pos == 0 else 1)
    return Route(template, re.compile(f"^{regex}/?$", re.IGNORECASE), names, tuple(precedence))


@dataclass
class HttpFunction:
    spec: FunctionSpec
    route: Route
    methods: frozenset[str] | None  # None = any method
    outputs: list[QueueOutput]


def build_http_functions(specs: list[FunctionSpec], environ: dict[str, str]) -> list[HttpFunction]:
    out = []
    for spec in specs:
        if spec.kind != "http":
            continue
        template = resolve_setting_refs(str(spec.trigger.get("route") or spec.name), environ, spec.name)
        methods = spec.trigger.get("methods")
        allowed = frozenset(str(m).upper() for m in methods) if methods else None
        out.append(HttpFunction(spec, compile_route(template), allowed, resolve_queue_outputs(spec, environ)))
    # Most specific first: literal segments outrank parameters, which outrank catch-alls.
    out.sort(key=lambda f: (f.route.precedence, -len(f.route.precedence)))
    return out


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


def text_reply(status: int, text: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, {"Content-Type": "text/plain; charset=utf-8", **(headers or {})}, text.encode())


def json_reply(data: Any) -> Reply:
    return Reply(200, {"Content-Type": "application/json"}, json.dumps(data, indent=1, default=str).encode())


def to_reply(value: Any) -> Reply:
    """Turn what an HTTP function returned into a response, as the Python worker does."""
    if isinstance(value, func.HttpResponse):
        headers = {k: v for k, v in value.headers.items()}
        if not any(k.lower() == "content-type" for k in headers):
            headers["Content-Type"] = f"{value.mimetype}; charset={value.charset}"
        return Reply(value.status_code, headers, value.get_body())
    if value is None:
        return Reply(204, {}, b"")
    if isinstance(value, str):
        return text_reply(200, value)
    if isinstance(value, bytes | bytearray):
        return Reply(200, {"Content-Type": "application/octet-stream"}, bytes(value))
    raise TypeError(f"unsupported HTTP function return type {type(value).__name__}")


class HttpApp:
    """Routing and invocation, independent of the socket server."""

    def __init__(
        self,
        functions: list[HttpFunction],
        route_prefix: str,
        stats: Stats,
        clients: QueueClients | None,
        worker: Worker,
        encoding: str,
        notify: Callable[[str], None],
    ) -> None:
        self.functions = functions
        self.prefix = "/" + route_prefix.strip("/") if route_prefix.strip("/") else ""
        self.stats = stats
        self.clients = clients
        self.worker = worker
        self.encoding = encoding
        self.notify = notify
        self.counters = {
            f.spec.name: stats.section("http", f.spec.name, ("requests", "errors")) for f in functions
        }

    def handle(self, method: str, url: str, headers: dict[str, str], body: bytes) -> Reply:
        parts = urlsplit(url)
        path = parts.path
        if method == "GET" and path == "/_devhost/stats":
            return json_reply(self.stats.snapshot())
        if method == "GET" and path == "/_devhost/health":
            return json_reply({"status": "ok", "instance_id": self.stats.instance_id})
        if self.prefix and not (path == self.prefix or path.startswith(self.prefix + "/")):
            return text_reply(404, "Not Found")
        sub = path[len(self.prefix) :].lstrip("/")
        allowed: set[str] = set()
        for fn in self.functions:
            route_params = fn.route.match(sub)
            if route_params is None:
                continue
            if fn.methods is not None and method not in fn.methods:
                allowed |= fn.methods
                continue
            params = dict(parse_qsl(parts.query, keep_blank_values=True))
            return self._invoke(fn, method, url, (method, url, headers, params, route_params, body))
        if allowed:
            return text_reply(405, "Method Not Allowed", {"Allow": ", ".join(sorted(allowed))})
        return text_reply(404, "Not Found")

    def _invoke(self, fn: HttpFunction, method: str, url: str, payload: tuple[Any, ...]) -> Reply:
        """Run the function in the worker (payload: what func.HttpRequest is built from)."""
        counters = self.counters[fn.spec.name]
        counters.incr("requests")
        started = time.monotonic()
        try:
            outcome = self.worker.invoke(fn.spec.name, str(uuid.uuid4()), payload)
            if outcome.http is None:
                raise RuntimeError("the worker sent no HTTP response")
            reply = Reply(*outcome.http)
            if fn.outputs:
                if self.clients is None:
                    raise RuntimeError("queue output binding without a storage connection")
                send_queue_outputs(
                    fn.outputs, outcome.queue_outputs, self.clients, self.encoding, self.notify
                )
        except Exception as exc:
            counters.incr("errors")
            log.error("Executed 'Functions.%s' (Failed, %s %s): %s%s", fn.spec.name, method, url,
                      error_text(exc), failure_details(exc))  # fmt: skip
            name = getattr(exc, "type_name", type(exc).__name__)
            return text_reply(500, f"Function '{fn.spec.name}' failed: {name}")
        elapsed_ms = (time.monotonic() - started) * 1000
        log.info("Executed 'Functions.%s' (Succeeded, %s %s -> %d, Duration=%.0fms)", fn.spec.name,
                 method, urlsplit(url).path, reply.status, elapsed_ms)  # fmt: skip
        return reply


def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks: list[bytes] = []
        while True:
            size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                handler.rfile.readline()
                return b"".join(chunks)
            chunks.append(handler.rfile.read(size))
            handler.rfile.readline()
    length = int(handler.headers.get("Content-Length") or 0)
    return handler.rfile.read(length) if length else b""


def make_server(app: HttpApp, port: int) -> ThreadingHTTPServer:
    """A threading HTTP server bound to 127.0.0.1 only (port 0 = pick a free port)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "devhost"

        def _dispatch(self) -> None:
            body = _read_body(self)
            host = self.headers.get("Host") or "127.0.0.1"
            headers = {k.lower(): v for k, v in self.headers.items()}
            reply = app.handle(self.command, f"http://{host}{self.path}", headers, body)
            self.send_response(reply.status)
            for key, value in reply.headers.items():
                if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(reply.body)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _dispatch

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    return server


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name="devhost-http", daemon=True)
    thread.start()
    return thread
