"""End to end through the local Functions host: HTTP API, queue trigger, poison, claim check."""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.azurite import Azurite
from devstack.hostproc import REPO_ROOT, HostProcess, host_env, init_storage
from tests.integration.effects import count_effects
from tests.integration.helpers import host_call, unique

pytestmark = pytest.mark.integration
FAST_QUEUES = {
    "batchSize": 8,
    "newBatchThreshold": 4,
    "maxPollingInterval": "00:00:01",
    "visibilityTimeout": "00:00:02",
    "maxDequeueCount": 3,
}
"""Faster timing than shipped; the shipped messageEncoding (none) is kept."""


def app_dir(tmp_path: Path, queues: dict[str, Any]) -> Path:
    """The same app with another host.json (as a different deployment would have)."""
    target = tmp_path / "app"
    target.mkdir()
    for name in ("function_app.py", "shared"):
        os.symlink(REPO_ROOT / name, target / name)
    host = json.loads((REPO_ROOT / "host.json").read_text())
    host["extensions"]["queues"].update(queues)
    (target / "host.json").write_text(json.dumps(host))
    return target


@pytest.fixture(params=["one-queue", "second-queue"])
def start_host(
    azurite: Azurite, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., HostProcess]]:
    """The app with one queue, or with two (JOBS_QUEUES) where the tests use the second one:
    everything that works for one queue works for each (issue 46)."""
    hosts: list[HostProcess] = []
    queues = (
        {"JOBS_QUEUE": unique("e2e")}
        if request.param == "one-queue"
        else {"JOBS_QUEUES": f"{unique('e2e')},{unique('second')}"}
    )
    settings = {
        **queues,
        "LEDGER_CONTAINER": unique("ledger"),
        "RESULTS_CONTAINER": unique("res"),
        "PAYLOADS_CONTAINER": unique("pay"),
        "POISON_ARCHIVE_CONTAINER": unique("arch"),
        "ENABLE_TEST_KINDS": "1",
        "MAX_ATTEMPTS": "3",
        "RETRY_BASE_SECONDS": "1",
    }
    directory = app_dir(tmp_path, FAST_QUEUES)
    env = host_env(azurite.connection_string, settings)
    init_storage(env)

    def start(name: str = "host-1") -> HostProcess:
        host = HostProcess(
            env, instance_id=name, log_path=tmp_path / f"{name}.log", extra_args=["--app-dir", str(directory)]
        )
        hosts.append(host.start())
        return host

    yield start
    for host in hosts:
        host.stop()


def lane(host: HostProcess) -> str | None:
    """The queue the tests use: the second of JOBS_QUEUES when declared, else the default (None)."""
    declared = host.env.get("JOBS_QUEUES", "")
    return declared.split(",")[1] if declared else None


def job_key(host: HostProcess, job_id: str) -> str:
    """How the job's effects are named: `<queue>/<id>` on a queue other than the default."""
    queue = lane(host)
    return f"{queue}/{job_id}" if queue else job_id


def call(host: HostProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    queue = lane(host)
    if queue and isinstance(body, dict):
        body = {**body, "queue": queue}
    if queue and path.startswith("jobs/"):
        path = f"{path}?queue={queue}"
    return host_call(host, method, path, body)


def wait_status(host: HostProcess, job_id: str, wanted: set[str], timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    record: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status, record = call(host, "GET", f"jobs/{job_id}")
        if status == 200 and record["status"] in wanted:
            return record
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} not in {wanted} after {timeout_s}s: {record}")


def test_api_submit_status_result_and_errors(start_host: Callable[..., HostProcess]) -> None:
    host = start_host()
    status, body = call(host, "POST", "jobs", {"id": "api-1", "kind": "noop", "payload": {"note": "hi"}})
    url = "/api/jobs/api-1" + (f"?queue={lane(host)}" if lane(host) else "")
    assert status == 202 and body["id"] == "api-1" and body["status_url"].endswith(url)
    record = wait_status(host, "api-1", {"completed"})
    assert record["attempt"] == 0 and record["updated_at"]
    assert call(host, "GET", "jobs/api-1/result") == (200, {"id": "api-1", "summary": {"note": "hi"}})
    assert call(host, "POST", "jobs", {"id": "api-1", "kind": "noop", "payload": {}})[0] == 409
    status, body = call(host, "POST", "jobs", {"kind": "noop", "payload": {}})
    assert status == 202 and len(body["id"]) == 36  # a UUID when the id is absent
    status, body = call(host, "POST", "jobs", {"kind": "median", "payload": [], "attempt": "x"})
    assert status == 400 and len(body["problems"]) == 3, body
    status, body = call(host, "POST", "jobs", b"{not json")
    assert status == 400 and body["error"] == "request body is not JSON"
    assert call(host, "GET", "jobs/unknown-id")[0] == 404
    assert call(host, "GET", "jobs/unknown-id/result")[0] == 404
    assert call(host, "GET", "health")[0] == 200


def test_result_is_409_until_completed(start_host: Callable[..., HostProcess]) -> None:
    host = start_host()
    assert call(host, "POST", "jobs", {"id": "slow-1", "kind": "fault", "payload": {"sleep_s": 3}})[0] == 202
    status, body = call(host, "GET", "jobs/slow-1/result")
    assert status == 409 and body["status"] in ("queued", "in_progress")
    wait_status(host, "slow-1", {"completed"})
    assert call(host, "GET", "jobs/slow-1/result")[0] == 200


def test_payload_over_the_queue_limit_travels_by_claim_check(start_host: Callable[..., HostProcess]) -> None:
    host = start_host()
    big = {"id": "big-1", "kind": "noop", "payload": {"note": "x" * 80_000}}
    status, body = call(host, "POST", "jobs", big)
    assert status == 202 and body["claim_checked"] is True
    record = wait_status(host, "big-1", {"completed"})
    assert record["payload_ref"].startswith("big-1/")


def test_keeps_failing_reaches_poison_after_max_dequeue_count(start_host: Callable[..., HostProcess]) -> None:
    host = start_host()
    assert (
        call(host, "POST", "jobs", {"id": "crash-1", "kind": "fault", "payload": {"crash": True}})[0] == 202
    )
    record = wait_status(host, "crash-1", {"poisoned"}, timeout_s=90)
    claims = [h for h in record["history"] if h["event"] == "claimed"]
    assert [c["dequeue_count"] for c in claims] == [1, 2, 3]  # maxDequeueCount = 3 runs
    gaps = [(b["at"], a["at"]) for a, b in itertools.pairwise(claims)]
    assert all(_seconds(b) - _seconds(a) >= 1.0 for b, a in gaps), gaps  # spaced by visibilityTimeout (2 s)
    assert "maxDequeueCount" in record["reason"] and "RuntimeError" in record["reason"]


def test_permanent_error_is_poisoned_after_one_run(start_host: Callable[..., HostProcess]) -> None:
    host = start_host()
    assert (
        call(host, "POST", "jobs", {"id": "perm-1", "kind": "fault", "payload": {"permanent": True}})[0]
        == 202
    )
    record = wait_status(host, "perm-1", {"poisoned"})
    assert [h["event"] for h in record["history"]].count("claimed") == 1
    assert record["reason"].startswith("bad_input_data:")


def test_transient_error_retries_with_jitter_then_completes(start_host: Callable[..., HostProcess]) -> None:
    host = start_host()
    payload = {"transient_failures": 2, "effect": True}
    assert call(host, "POST", "jobs", {"id": "tr-1", "kind": "fault", "payload": payload})[0] == 202
    record = wait_status(host, "tr-1", {"completed"}, timeout_s=60)
    retries = [h for h in record["history"] if h["event"] == "retry_scheduled"]
    assert [r["attempt"] for r in retries] == [0, 1] and all(r["delay_s"] >= 1 for r in retries)
    assert record["attempt"] == 2


def test_two_hosts_given_the_same_job_apply_it_once(
    start_host: Callable[..., HostProcess], azurite: Azurite
) -> None:
    from azure.storage.queue import QueueClient, TextBase64EncodePolicy

    first, second = start_host("host-a"), start_host("host-b")
    queue_name = lane(first) or first.env["JOBS_QUEUE"]
    queue = QueueClient.from_connection_string(
        azurite.connection_string, queue_name, message_encode_policy=TextBase64EncodePolicy()
    )
    envelope = json.dumps({"id": "twin-1", "kind": "fault", "payload": {"sleep_s": 2, "effect": True}})
    for _ in range(4):  # the same job delivered four times at once (producer retries)
        queue.send_message(envelope)
    wait_status(first, "twin-1", {"completed"})
    deadline = time.monotonic() + 60
    while queue.get_queue_properties().approximate_message_count and time.monotonic() < deadline:
        time.sleep(0.5)
    from azure.storage.blob import ContainerClient

    results = ContainerClient.from_connection_string(
        azurite.connection_string, first.env["RESULTS_CONTAINER"]
    )
    counted = count_effects(results)
    key = job_key(first, "twin-1")
    assert counted.applied[key] == 1 and counted.runs[key] == 1 and not counted.repeats
    invocations = sum(q.get("invocations", 0) for h in (first, second) for q in h.stats()["queues"].values())
    assert invocations >= 4


def _seconds(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
