"""Limits end to end on the local stack: the local host (shipped host.json) on Azurite, `http`
jobs against a real loopback downstream that records how many calls it serves at once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from devstack.azurite import Azurite
from devstack.hostproc import HostProcess
from tests.integration.helpers import host_call as call
from tests.integration.helpers import local_host, unique

pytestmark = pytest.mark.integration
LIMIT = 2
LATENCY_S = 0.6


class Downstream:
    """Answers 200 after LATENCY_S; records the most calls in flight and each key's calls."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.max_in_flight = 0
        self.keys: Counter[str] = Counter()
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                    outer.keys[self.headers.get("Idempotency-Key") or ""] += 1
                time.sleep(LATENCY_S)
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

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/call"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def downstream() -> Iterator[Downstream]:
    ds = Downstream()
    yield ds
    ds.close()


@pytest.fixture(scope="module")
def host(
    azurite: Azurite, downstream: Downstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HostProcess]:
    settings = {
        "JOBS_QUEUE": unique("lim"),
        "LEDGER_CONTAINER": unique("ledger"),
        "RESULTS_CONTAINER": unique("res"),
        "PAYLOADS_CONTAINER": unique("pay"),
        "POISON_ARCHIVE_CONTAINER": unique("arch"),
        "PERMITS_CONTAINER": unique("permits"),
        "HTTP_ALLOWED_HOSTS": f"127.0.0.1:{downstream.server.server_address[1]}",
        "HTTP_MAX_CONCURRENT_PER_HOST": str(LIMIT),
    }
    log = tmp_path_factory.mktemp("limits-host") / "host.log"
    with local_host(azurite, settings, log, instance_id="limits-host") as process:
        yield process


def test_at_most_the_hosts_limit_in_flight_every_job_once_and_the_wait_explained(
    host: HostProcess, downstream: Downstream
) -> None:
    jobs = []
    for n in range(8):
        status, body = call(
            host, "POST", "jobs", {"kind": "http", "payload": {"url": downstream.url, "body": {"n": n}}}
        )
        assert status == 202, body
        jobs.append(body["id"])
    reasons: set[str] = set()
    deadline = time.monotonic() + 120
    done: dict[str, dict[str, Any]] = {}
    while len(done) < len(jobs) and time.monotonic() < deadline:
        for job in jobs:
            if job in done:
                continue
            status, record = call(host, "GET", f"jobs/{job}")
            assert status == 200, record
            if record.get("waiting"):
                reasons.add(record["waiting"]["reason"])
            if record["status"] in ("completed", "poisoned"):
                done[job] = record
        time.sleep(0.1)
    assert {r["status"] for r in done.values()} == {"completed"}, done
    assert len(done) == len(jobs)
    assert downstream.max_in_flight == LIMIT  # never more, and the limit was used
    assert sorted(downstream.keys.values()) == [1] * len(jobs)  # every job called once
    assert any(
        r.startswith(f"waiting for a permit of http:127.0.0.1: {LIMIT} of {LIMIT} held by ") for r in reasons
    ), reasons
