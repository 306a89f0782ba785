"""The fair share on the local stack (issue 46): the local host with the shipped host.json and
settings (24 worker threads), two queues on Azurite, `http` jobs against a real loopback
downstream that holds the flood's calls until the test lets them go.

Two flooded queues hold more invocations stuck at their downstream (16 each: batchSize) than the
worker has threads; a POST is still answered and the third queue's job still runs to completion:
the floods' jobs run on the fair share's own threads, their jobs over their shares wait holding no
thread (shared/pipeline/fair_share.py). Then the floods are let go and every job completes, each
called once.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from azure.storage.queue import QueueClient

from devstack.azurite import Azurite
from devstack.hostproc import REPO_ROOT, HostProcess, host_env
from shared.core.envelope import isoformat
from shared.pipeline.fair_share import worker_slots
from tests.integration.helpers import unique

pytestmark = pytest.mark.integration


class Downstream:
    """`/flood` answers once `release` is set; `/small` at once. Counts calls and the most
    flood calls in flight."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls: Counter[str] = Counter()
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                flood = self.path.startswith("/flood")
                with lock:
                    outer.calls[self.headers.get("Idempotency-Key") or ""] += 1
                    if flood:
                        outer.in_flight += 1
                        outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                if flood:
                    outer.release.wait(60)
                    with lock:
                        outer.in_flight -= 1
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{path}"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def downstream() -> Iterator[Downstream]:
    ds = Downstream()
    yield ds
    ds.close()


BATCH = 16
"""The shipped host.json's batchSize: each flood's listener holds this many of its messages."""


@dataclass
class Stack:
    host: HostProcess
    small: str
    floods: list[str]
    flood_jobs: dict[str, str]
    """Each flood job's id and queue, put on the queues before the host started."""


@pytest.fixture
def stack(azurite: Azurite, downstream: Downstream, tmp_path: Any) -> Iterator[Stack]:
    settings = {
        "JOBS_QUEUES": ",".join((unique("small"), unique("flood"), unique("flood"))),
        "LEDGER_CONTAINER": unique("ledger"),
        "RESULTS_CONTAINER": unique("res"),
        "PAYLOADS_CONTAINER": unique("pay"),
        "POISON_ARCHIVE_CONTAINER": unique("arch"),
        "HTTP_ALLOWED_HOSTS": f"127.0.0.1:{downstream.server.server_address[1]}",
    }
    env = host_env(azurite.connection_string, settings)
    assert env.get("FAIR_SHARE", "true") == "true"  # the shipped default
    subprocess.run(
        [sys.executable, "-m", "shared.interfaces.cli", "init"],
        env=env,
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    )
    small, *floods = settings["JOBS_QUEUES"].split(",")
    flood_jobs = {unique("f"): floods[n % len(floods)] for n in range(len(floods) * BATCH)}
    payload = {"url": downstream.url("flood"), "timeout_seconds": 120}
    for job, queue in flood_jobs.items():  # on the queues before the host starts: no POST to wait for
        body = {"id": job, "kind": "http", "payload": payload, "created_at": isoformat(datetime.now(UTC))}
        QueueClient.from_connection_string(azurite.connection_string, queue).send_message(json.dumps(body))
    process = HostProcess(env, instance_id="fair-host", log_path=tmp_path / "host.log").start()
    try:
        yield Stack(process, small, floods, flood_jobs)
    finally:
        downstream.release.set()
        process.stop()


def call(host: HostProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{host.url}/api/{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def status_of(host: HostProcess, job: str, queue: str) -> str:
    status, record = call(host, "GET", f"jobs/{job}?queue={queue}")
    assert status == 200, record
    return str(record["status"])


def wait_until(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.2)


def counted(host: HostProcess, queues: list[str], counter: str) -> int:
    """The host's listener counter (`received`, `deletes`) summed over `queues`."""
    counters = host.stats().get("queues") or {}
    return sum(int((counters.get(q) or {}).get(counter, 0)) for q in queues)


def received(host: HostProcess, queues: list[str]) -> int:
    return counted(host, queues, "received")


def deleted(host: HostProcess, queues: list[str]) -> int:
    return counted(host, queues, "deletes")


def test_floods_stuck_at_their_downstream_hold_no_worker_thread(stack: Stack, downstream: Downstream) -> None:
    host, small, floods, flood_jobs = stack.host, stack.small, stack.floods, stack.flood_jobs
    threads = worker_slots(host.env)
    assert threads == 24 and len(flood_jobs) > threads  # the shipped settings sample
    wait_until(lambda: received(host, floods) >= len(flood_jobs), 60, "every flood message delivered")
    wait_until(lambda: downstream.in_flight >= BATCH, 60, "the floods' calls held")

    # more flood invocations stuck than the worker has threads: a POST and the other queue still go
    status, body = call(
        host, "POST", "jobs", {"kind": "http", "queue": small, "payload": {"url": downstream.url("small")}}
    )
    assert status == 202, body
    wait_until(lambda: status_of(host, body["id"], small) == "completed", 60, "the small queue's job")
    assert downstream.in_flight >= BATCH  # the floods were still stuck all along
    assert downstream.max_in_flight < len(flood_jobs)  # the floods' jobs over their shares waited

    downstream.release.set()
    wait_until(lambda: deleted(host, floods) >= len(flood_jobs), 120, "the floods acknowledged")
    assert all(status_of(host, job, queue) == "completed" for job, queue in flood_jobs.items())
    assert len(downstream.calls) == len(flood_jobs) + 1 and set(downstream.calls.values()) == {1}
