"""The handler test kit: run a job kind's handler as the app runs it, on an in-memory account.

- `kit_runtime(handlers, **settings)`: the app's runtime on a `MemoryAccount`; the
  account and the runtime share one clock that skips ahead (`SkippingClock`): expiry, retries and
  `ctx.now()` see the skipped time. By default with the app's registry (`shared.jobs.registry`).
  `set_function_timeout(kit, seconds)`: the deadline of the runs that follow.
- `submit_job(kit, kind, payload)`: POST /api/jobs's path (validation: `EnvelopeError` is the 400).
- `drain(kit)`: what the host does until no message is left, skipping the clock to each delayed
  message (retries, Retry-After, continuations): the waits skipped are returned.
- `settle(kit)`: `drain`, then the poison function archives each poisoned message (as the
  console lists it); `replay(kit, job)`, `edited_replay(kit, job, payload)`: an operator's
  replay from the archive (the edit gets new idempotency keys), then `settle`; `archived(kit, job)`:
  the archived envelope.
- `run_handler(handler, payload, **settings)`: submit and drain for one handler; a `JobRun` to
  read (and to replay).
- `assert_hidden(secret, *texts)`, `assert_sent(secret, values)`: checks that never print a secret.
- `receiver` (a pytest fixture, registered by tests/conftest.py): a real HTTP server on a free
  loopback port answering what the test scripts (per path with `route`), recording every request;
  `module_receiver`: one for a module's local host.

The in-memory account is the app's own (`shared.storage.memory_account`, held to Azure's answers
by tests/integration/test_port_contract.py); the kit lives under tests/ for its pytest fixture and
HTTP receiver.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import azure.functions as func
import pytest

from shared.config.settings import Settings
from shared.core.errors import EnvelopeError as EnvelopeError  # the 400 of `submit_job`, for tests
from shared.interfaces.console.actions import replay_edited
from shared.interfaces.console.queries import job_view
from shared.jobs import registry
from shared.jobs.base import Handler
from shared.net.destinations import destination
from shared.pipeline.processing import process_message
from shared.pipeline.submit import submit, validate_request
from shared.poison.handler import handle_poison_message
from shared.poison.replay import replay_jobs
from shared.runtime.wiring import Runtime, ensure_console_resources
from shared.storage.accounts import ensure_resources
from shared.storage.memory_account import MemoryAccount, SkippingClock

KIT_SETTINGS = {"AzureWebJobsStorage": "UseDevelopmentStorage=true"}


@dataclass
class Kit:
    """The app on an in-memory account."""

    rt: Runtime
    account: MemoryAccount
    clock: SkippingClock


def kit_runtime(handlers: Mapping[str, Handler] | None = None, /, **settings: str) -> Kit:
    """The app's runtime on a fresh in-memory account; `settings` are app settings."""
    clock = SkippingClock()
    account = MemoryAccount(clock)
    app_settings = Settings.from_env({**KIT_SETTINGS, **settings})
    ensure_resources(account, app_settings)
    rt = Runtime.over(app_settings, account, dict(handlers) if handlers is not None else registry(), "kit:1")
    rt.clock = clock  # one clock: expiry, retries, leases and `ctx.now()` see the skipped time too
    ensure_console_resources(rt)
    return Kit(rt, account, clock)


def submit_job(kit: Kit, kind: str, payload: Mapping[str, Any], job_id: str | None = None) -> str:
    """Validate and submit as POST /api/jobs does (EnvelopeError: the 400); the job's id."""
    body = {"id": job_id or uuid.uuid4().hex, "kind": kind, "payload": dict(payload)}
    env = validate_request(kit.rt, body)
    submit(kit.rt, env)
    return env.id


def drain(kit: Kit, max_deliveries: int = 200) -> list[float]:
    """Process every message of the jobs queue as the host would, following retries: when only
    delayed messages are left, the account's time skips to the first. The skipped waits."""
    queue = kit.account.raw_queue(kit.rt.settings.jobs_queue)
    skipped: list[float] = []
    for _ in range(max_deliveries):
        batch = list(queue.receive_messages(max_messages=1, visibility_timeout=600))
        if batch:
            msg = batch[0]
            body = base64.b64decode(msg.content)
            process_message(
                func.queue.QueueMessage(  # type: ignore[no-untyped-call]
                    id=msg.id, body=body, dequeue_count=msg.dequeue_count, pop_receipt="r"
                ),
                kit.rt,
            )
            queue.delete_message(msg)
            continue
        visible_at = queue.next_visible()
        if visible_at is None:
            return skipped
        wait = max(0.0, (visible_at - kit.clock()).total_seconds()) + 0.001
        kit.clock.advance(wait)
        skipped.append(round(wait, 3))
    raise AssertionError(f"the queue was not drained in {max_deliveries} deliveries")


def set_function_timeout(kit: Kit, seconds: float) -> Kit:
    """Runs from now on have host.json's functionTimeout = `seconds`: `ctx.deadline` is the run's
    start plus that, less the margin (a tenth, 2 to 30 s), and the HTTP client's calls are cut to it."""
    kit.rt.settings = replace(kit.rt.settings, function_timeout_s=seconds)
    return kit


def settle(kit: Kit) -> list[float]:
    """`drain`, then hand each poison-queue message to the poison function (the host's
    `<queue>-poison` trigger): poisoned jobs are archived, as the console lists them."""
    waits = drain(kit)
    queue = kit.rt.poison_queue
    for msg in list(queue.receive_messages(max_messages=32, visibility_timeout=60)):
        body = base64.b64decode(msg.content)
        handle_poison_message(
            func.queue.QueueMessage(  # type: ignore[no-untyped-call]
                id=msg.id, body=body, dequeue_count=msg.dequeue_count, pop_receipt="r"
            ),
            kit.rt,
        )
        queue.delete_message(msg)
    return waits


def archived(kit: Kit, job_id: str) -> dict[str, Any] | None:
    """The job's newest archived envelope (what the console's editor opens), None if none."""
    view = job_view(kit.rt, job_id)
    return None if view is None else view.envelope


def replay(kit: Kit, job_id: str) -> list[float]:
    """An operator's plain replay of a poisoned, archived job (same idempotency keys), then `settle`."""
    report = replay_jobs(kit.rt, [job_id], by="kit")
    assert report.replayed == [job_id], f"not replayed: {report}"
    return settle(kit)


def edited_replay(kit: Kit, job_id: str, payload: Mapping[str, Any]) -> list[float]:
    """An operator's edit and replay (a new payload version: new idempotency keys), then `settle`."""
    envelope = archived(kit, job_id)
    assert envelope is not None, f"job {job_id} has no archived envelope to edit"
    replay_edited(kit.rt, job_id, json.dumps({**envelope, "payload": dict(payload)}), by="kit")
    return settle(kit)


@dataclass
class JobRun:
    """A job run by the kit, to read."""

    kit: Kit
    job_id: str
    waits: list[float] = field(default_factory=list)

    @property
    def record(self) -> dict[str, Any]:
        found = self.kit.rt.ledger.get(self.job_id)
        assert found is not None, f"job {self.job_id} has no ledger record"
        return dict(found.data)

    @property
    def status(self) -> str:
        return str(self.record.get("status"))

    @property
    def reason(self) -> str:
        return str(self.record.get("reason") or "")

    @property
    def attempts(self) -> int:
        """Runs of the job: the claims in its history."""
        return sum(1 for h in self.record.get("history", []) if h.get("event") == "claimed")

    @property
    def retry_delays(self) -> list[int]:
        """The delay of each retry scheduled, in seconds, as the ledger's history has them."""
        history = self.record.get("history", [])
        return [int(h["delay_s"]) for h in history if h.get("event") == "retry_scheduled"]

    def result(self) -> dict[str, Any]:
        """The result document (GET /api/jobs/{id}/result's body)."""
        ref = str(self.record.get("result_ref") or "")
        container, _, name = ref.partition("/")
        raw = self.kit.account.blobs(container).read(name)
        data: dict[str, Any] = json.loads(raw)
        return data

    def settle(self) -> JobRun:
        """Archive it if it was poisoned (`settle`)."""
        self.waits += settle(self.kit)
        return self

    def replay(self) -> JobRun:
        """Replay it as it was (`replay`)."""
        self.waits += replay(self.kit, self.job_id)
        return self

    def edited_replay(self, payload: Mapping[str, Any]) -> JobRun:
        """Replay it with another payload (`edited_replay`)."""
        self.waits += edited_replay(self.kit, self.job_id, payload)
        return self

    def archived(self) -> dict[str, Any] | None:
        return archived(self.kit, self.job_id)

    def blob(self, ref: str) -> bytes:
        container, _, name = ref.partition("/")
        return self.kit.account.blobs(container).read(name)


def allowing(url: str, *secrets: str) -> dict[str, str]:
    """Settings that let the `http` kind call `url`'s host and port (and send it `secrets`)."""
    entry = str(destination(url))
    return {"HTTP_ALLOWED_HOSTS": entry, **{f"{name}_HOSTS": entry for name in secrets}}


def assert_hidden(secret: str, *texts: str) -> None:
    """Fails when one of `texts` holds `secret`, naming which by position, never showing either
    (no secret in test output)."""
    holding = [i for i, text in enumerate(texts) if secret in text]
    assert not holding, f"texts {holding} hold the secret (not shown)"


def assert_sent(secret: str, values: list[str]) -> None:
    """Fails when a value is not `secret` (the requests' header values), showing neither."""
    wrong = [i for i, value in enumerate(values) if value != secret]
    assert values and not wrong, f"values {wrong} of {len(values)} are not the secret (not shown)"


def run_handler(
    handler: Handler,
    payload: Mapping[str, Any],
    *,
    kind: str = "test",
    job_id: str | None = None,
    **settings: str,
) -> JobRun:
    """Submit one job of `handler` (registered as `kind`) and drain the queue: its run."""
    kit = kit_runtime({kind: handler}, **settings)
    job = submit_job(kit, kind, payload, job_id)
    return JobRun(kit, job, settle(kit))


# -- the fake HTTP receiver --------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes | str | Mapping[str, Any] = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


@dataclass(frozen=True)
class Seen:
    """A request the receiver got."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    at: float


class Receiver:
    """A real HTTP server on 127.0.0.1 (free port). A request to a path with replies of its own
    (`route`) takes the next of those; else the next of `reply`'s; else `default` (200 `{"ok": true}`)."""

    def __init__(self) -> None:
        self.script: list[Reply] = []
        self.routes: dict[str, list[Reply]] = {}
        self.default = Reply(200, {"ok": True})
        self.requests: list[Seen] = []
        self._lock = threading.Lock()
        receiver = self

        class _Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with receiver._lock:
                    receiver.requests.append(
                        Seen(self.command, self.path, dict(self.headers.items()), body, time.monotonic())
                    )
                    own = receiver.routes.get(self.path.split("?")[0])
                    if own:
                        reply = own.pop(0)
                    else:
                        reply = receiver.script.pop(0) if receiver.script else receiver.default
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                data = reply.body
                headers = dict(reply.headers)
                if isinstance(data, Mapping):
                    data = json.dumps(data).encode()
                    headers.setdefault("Content-Type", "application/json")
                elif isinstance(data, str):
                    data = data.encode()
                    headers.setdefault("Content-Type", "text/plain; charset=utf-8")
                try:
                    self.send_response(reply.status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting
                    pass

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _any

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @property
    def allow(self) -> str:
        """The entry that lets a guard call it: `127.0.0.1:<port>` (for `<PREFIX>ALLOWED_HOSTS`)."""
        return f"127.0.0.1:{self.port}"

    def reply(self, *replies: Reply) -> None:
        """Answer the next requests (any path without replies of its own) with these, in order."""
        with self._lock:
            self.script.extend(replies)

    def route(self, path: str, *replies: Reply) -> None:
        """Answer the next requests to `path` (without its query) with these, in order."""
        with self._lock:
            self.routes.setdefault(path, []).extend(replies)

    def reset(self) -> Receiver:
        """Forget the scripted replies and the requests seen (a module's receiver, between tests)."""
        with self._lock:
            self.script.clear()
            self.routes.clear()
            self.requests.clear()
        return self

    def to(self, path: str) -> list[Seen]:
        """The requests it got on `path` (without the query)."""
        return [r for r in self.requests if r.path.split("?")[0] == path]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A scripted HTTP receiver on a free loopback port, stopped after the test."""
    server = Receiver()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def module_receiver() -> Iterator[Receiver]:
    """One receiver for a module's host (its port goes in the host's HTTP_ALLOWED_HOSTS); such a
    module's `receiver` is this one, `reset` for each test."""
    server = Receiver()
    try:
        yield server
    finally:
        server.stop()
