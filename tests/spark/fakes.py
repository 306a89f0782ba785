"""Local HTTP servers that answer as the Livy, Databricks and Spark standalone REST APIs are documented.

Each runs a stdlib ThreadingHTTPServer on 127.0.0.1 (free port), records every request, and has
knobs for the failure modes the contract tests need: a slow answer after the work was done
(past the client's read timeout), 429 with Retry-After, forgetting a run (retention), auth.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


@dataclass
class Reply:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    """Sleep this long before answering (the work is already done: a slow answer)."""
    text: str | None = None


class FakeServer:
    """Base: routes (method, path) to `handle`, records requests, serves on a free port."""

    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self.throttle: list[float] = []
        """Retry-After values: the next len(throttle) requests answer 429 with these."""
        self.canned: list[Reply] = []
        """Replies given, in order, to the next requests instead of the API's own answer."""
        self.dropped = 0
        self.down = False
        """An outage: every request is dropped unanswered (the client sees a connection error)."""
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def _serve(self) -> None:
                if outer.down:
                    with outer.lock:
                        outer.dropped += 1
                    self.close_connection = True
                    return
                parsed = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode(errors="replace")
                seen = Seen(
                    self.command, parsed.path, parse_qs(parsed.query), dict(self.headers.items()), body
                )
                with outer.lock:
                    outer.requests.append(seen)
                    wait = outer.throttle.pop(0) if outer.throttle else None
                    canned = outer.canned.pop(0) if outer.canned and wait is None else None
                if canned is not None:
                    reply = canned
                elif wait is not None:
                    reply = Reply(429, outer.throttled_body(), {"Retry-After": f"{wait:g}"})
                else:
                    reply = outer.handle(seen)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                data = (reply.text if reply.text is not None else json.dumps(reply.body or {})).encode()
                try:
                    self.send_response(reply.status)
                    ctype = "text/plain" if reply.text is not None else "application/json"
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(data)))
                    for key, value in reply.headers.items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_DELETE = _serve

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def handle(self, req: Seen) -> Reply:
        raise NotImplementedError

    def throttled_body(self) -> Any:
        return {"message": "Too many requests"}

    def count(self, method: str, pattern: str) -> int:
        return sum(1 for r in self.requests if r.method == method and re.fullmatch(pattern, r.path))


# --- Apache Livy (Synapse / HDInsight) ------------------------------------------------------------


class FakeLivy(FakeServer):
    """`/batches` as Livy documents it; auth: 'entra' (bearer), 'basic' (+ X-Requested-By)."""

    def __init__(
        self, auth: str = "entra", token: str = "entra-token", user: str = "admin", password: str = "pw"
    ) -> None:
        self.auth = auth
        self.token = token
        self.basic = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.batches: dict[int, dict[str, Any]] = {}
        self.forgotten: set[int] = set()
        self.ids = itertools.count(0)
        self.create_delay_s = 0.0
        self.create_status = 201
        super().__init__()

    def throttled_body(self) -> Any:
        return {"msg": "Rate limit exceeded"}

    def handle(self, req: Seen) -> Reply:
        denied = self._auth(req)
        if denied:
            return denied
        path = req.path
        if path == "/batches" and req.method == "POST":
            return self._create(req.body)
        if path == "/batches" and req.method == "GET":
            start = int(req.query.get("from", ["0"])[0])
            size = int(req.query.get("size", ["100"])[0])
            live = [b for i, b in sorted(self.batches.items()) if i not in self.forgotten]
            return Reply(200, {"from": start, "total": len(live), "sessions": live[start : start + size]})
        match = re.fullmatch(r"/batches/(\d+)(/state|/log)?", path)
        if match:
            bid = int(match.group(1))
            if bid not in self.batches or bid in self.forgotten:
                return Reply(404, text=f"Session '{bid}' not found.")
            batch = self.batches[bid]
            if req.method == "DELETE":
                batch["state"] = "killed"
                return Reply(200, {"msg": "deleted"})
            if match.group(2) == "/state":
                return Reply(200, {"id": bid, "state": batch["state"]})
            if match.group(2) == "/log":
                return Reply(200, {"id": bid, "from": 0, "total": len(batch["log"]), "log": batch["log"]})
            return Reply(200, batch)
        return Reply(404, text="not found")

    def _auth(self, req: Seen) -> Reply | None:
        header = req.headers.get("Authorization", "")
        if self.auth == "entra" and header != f"Bearer {self.token}":
            return Reply(401, {"code": "Unauthorized", "message": "bad token"})
        if self.auth == "basic":
            if header != self.basic:
                return Reply(401, text="Unauthorized")
            if req.method != "GET" and not req.headers.get("X-Requested-By"):
                return Reply(400, text="Missing Required Header for CSRF protection.")
        return None

    def _create(self, body: Any) -> Reply:
        if not isinstance(body, dict) or not body.get("file"):
            return Reply(400, {"msg": "Missing 'file' in the request body"})
        if self.auth == "entra" and not body.get("name"):
            return Reply(400, {"msg": "'name' is required"})
        live_names = {b["name"] for i, b in self.batches.items() if i not in self.forgotten}
        if body.get("name") in live_names:
            return Reply(400, {"msg": f"Duplicate session name: {body['name']}"})
        bid = next(self.ids)
        batch = {
            "id": bid,
            "name": body.get("name"),
            "owner": None,
            "proxyUser": None,
            "state": "starting",
            "appId": None,
            "appInfo": {"driverLogUrl": None, "sparkUiUrl": None},
            "log": ["stdout: ", "stderr: "],
            "tags": body.get("tags") or {},
            "request": body,
        }
        self.batches[bid] = batch
        return Reply(self.create_status, batch, delay_s=self.create_delay_s)

    def set_state(self, bid: int, state: str, log: list[str] | None = None) -> None:
        self.batches[bid]["state"] = state
        if log is not None:
            self.batches[bid]["log"] = log


# --- Databricks Jobs API 2.2 ----------------------------------------------------------------------


class FakeDatabricks(FakeServer):
    """`/api/2.2/jobs/runs/*` with idempotency tokens, as documented."""

    def __init__(self, token: str = "dapi0123456789abcdef0123") -> None:
        self.token = token
        self.runs: dict[int, dict[str, Any]] = {}
        self.tokens: dict[str, int] = {}
        self.outputs: dict[int, dict[str, Any]] = {}
        self.ids = itertools.count(1001)
        self.submit_delay_s: list[float] = []
        """Delays of successive submits (the run is created first, then the answer is slow)."""
        super().__init__()

    def throttled_body(self) -> Any:
        return {"error_code": "REQUEST_LIMIT_EXCEEDED", "message": "Too many requests"}

    def handle(self, req: Seen) -> Reply:
        if req.headers.get("Authorization") != f"Bearer {self.token}":
            return Reply(401, {"error_code": "UNAUTHENTICATED", "message": "Invalid access token."})
        path = req.path.removeprefix("/api/2.2/jobs")
        if path == "/runs/submit" and req.method == "POST":
            return self._submit(req.body)
        if path == "/runs/get" and req.method == "GET":
            run_id = int(req.query.get("run_id", ["0"])[0])
            if run_id not in self.runs:
                return Reply(
                    400, {"error_code": "INVALID_PARAMETER_VALUE", "message": f"Run {run_id} does not exist."}
                )
            return Reply(200, self.runs[run_id])
        if path == "/runs/get-output" and req.method == "GET":
            task_run = int(req.query.get("run_id", ["0"])[0])
            return Reply(200, self.outputs.get(task_run, {"metadata": {}}))
        if path == "/runs/cancel" and req.method == "POST":
            run_id = int((req.body or {}).get("run_id", 0))
            if run_id in self.runs:
                self.set_state(run_id, "TERMINATED", "CANCELED", "Run cancelled.")
            return Reply(200, {})
        return Reply(404, {"error_code": "ENDPOINT_NOT_FOUND", "message": "No API found"})

    def _submit(self, body: Any) -> Reply:
        if not isinstance(body, dict) or not body.get("tasks"):
            return Reply(
                400, {"error_code": "INVALID_PARAMETER_VALUE", "message": "At least one task is required."}
            )
        token = body.get("idempotency_token")
        if token and len(token) > 64:
            return Reply(
                400, {"error_code": "INVALID_PARAMETER_VALUE", "message": "idempotency_token too long"}
            )
        delay = self.submit_delay_s.pop(0) if self.submit_delay_s else 0.0
        if token and token in self.tokens:
            return Reply(200, {"run_id": self.tokens[token]}, delay_s=delay)
        run_id = next(self.ids)
        task_run = run_id * 10
        self.runs[run_id] = {
            "run_id": run_id,
            "run_name": body.get("run_name"),
            "state": {"life_cycle_state": "PENDING", "state_message": "Waiting for cluster"},
            "tasks": [{"run_id": task_run, "task_key": body["tasks"][0].get("task_key")}],
            "request": body,
        }
        if token:
            self.tokens[token] = run_id
        return Reply(200, {"run_id": run_id}, delay_s=delay)

    def set_state(self, run_id: int, life: str, result: str | None = None, message: str = "") -> None:
        state: dict[str, Any] = {"life_cycle_state": life, "state_message": message}
        if result:
            state["result_state"] = result
        self.runs[run_id]["state"] = state

    def forget(self, run_id: int) -> None:
        del self.runs[run_id]


# --- Spark standalone REST (+ master JSON and worker log on the same fake) -------------------------


class FakeStandalone(FakeServer):
    """`/v1/submissions/*`, the master UI's `/json/` and the worker's `/log/` endpoint."""

    def __init__(self, jws_check: Callable[[str], bool] | None = None) -> None:
        self.drivers: dict[str, dict[str, Any]] = {}
        self.seq = itertools.count(0)
        self.create_delay_s = 0.0
        self.create_forwards = True
        """False: a timed-out create never reached the master (nothing is created)."""
        self.jws_check = jws_check
        super().__init__()

    def handle(self, req: Seen) -> Reply:
        path = req.path
        if path.startswith("/v1/") and self.jws_check is not None:
            header = req.headers.get("Authorization", "")
            if not header.startswith("Bearer ") or not self.jws_check(header[7:]):
                return Reply(403, text="Forbidden")
        if path == "/v1/submissions/create" and req.method == "POST":
            return self._create(req.body)
        match = re.fullmatch(r"/v1/submissions/(status|kill)/(.+)", path)
        if match:
            sid = match.group(2)
            driver = self.drivers.get(sid)
            action = "SubmissionStatusResponse" if match.group(1) == "status" else "KillSubmissionResponse"
            if driver is None:
                return Reply(200, {"action": action, "submissionId": sid, "success": False})
            if match.group(1) == "kill":
                driver["state"] = "KILLED"
                return Reply(
                    200,
                    {
                        "action": action,
                        "submissionId": sid,
                        "success": True,
                        "message": "Kill request submitted",
                    },
                )
            body = {"action": action, "submissionId": sid, "success": True, "driverState": driver["state"]}
            if driver.get("message"):
                body["message"] = driver["message"]
            return Reply(200, body)
        if path == "/json/":
            drivers = [
                {"id": sid, "state": d["state"], "worker": d.get("worker", "worker-1") or "None",
                 "starttime": str(int(d["at"] * 1000)),
                 "mainclass": "org.apache.spark.deploy.PythonRunner"}
                for sid, d in self.drivers.items()
            ]  # fmt: skip
            active = [d for d in drivers if d["state"] in ("SUBMITTED", "RUNNING", "RELAUNCHING")]
            done = [d for d in drivers if d not in active]
            workers = [{"id": "worker-1", "webuiaddress": self.url, "state": "ALIVE"}]
            return Reply(200, {"workers": workers, "activedrivers": active, "completeddrivers": done})
        if path == "/log/":
            sid = req.query.get("driverId", [""])[0]
            driver = self.drivers.get(sid)
            if driver is None:
                return Reply(404, text="no such driver")
            return Reply(200, text=driver["log"])
        return Reply(468, {"action": "ErrorResponse", "message": "Unknown protocol version"})

    def _create(self, body: Any) -> Reply:
        if not isinstance(body, dict) or body.get("action") != "CreateSubmissionRequest":
            return Reply(400, {"action": "ErrorResponse", "message": "Malformed request"})
        if not self.create_forwards:
            return Reply(200, {"success": False}, delay_s=self.create_delay_s)
        sid = f"driver-20260101000000-{next(self.seq):04d}"
        props = body.get("sparkProperties", {})
        launch = " ".join(f'"-D{k}={v}"' for k, v in props.items())
        args = " ".join(f'"{a}"' for a in body.get("appArgs", []))
        self.drivers[sid] = {
            "state": "RUNNING",
            "at": time.time(),
            "body": body,
            "log": f'Launch Command: "java" {launch} "org.apache.spark.deploy.worker.DriverWrapper" {args}\n',
        }
        reply = {"action": "CreateSubmissionResponse", "success": True, "submissionId": sid,
                 "message": f"Driver successfully submitted as {sid}"}  # fmt: skip
        return Reply(200, reply, delay_s=self.create_delay_s)
