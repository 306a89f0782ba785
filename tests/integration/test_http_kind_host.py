"""The `http` kind end to end on the local stack: the local host with the shipped host.json, on
Azurite, calling a scripted receiver on a free loopback port (allowed by HTTP_ALLOWED_HOSTS)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.azurite import Azurite
from devstack.hostproc import HostProcess, host_env, init_storage
from tests.handlerkit import Receiver, Reply, assert_hidden, assert_sent
from tests.integration.helpers import host_call as call
from tests.integration.helpers import local_host, unique

pytestmark = pytest.mark.integration
SECRET = "partner-token-5f1c0e9a77d2"


@pytest.fixture
def receiver(module_receiver: Receiver) -> Receiver:
    """The module's receiver, its script and requests emptied for each test."""
    return module_receiver.reset()


@pytest.fixture(scope="module")
def host(
    azurite: Azurite, module_receiver: Receiver, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HostProcess]:
    """One local host for the module, on the repo's own host.json."""
    settings = {
        "JOBS_QUEUE": unique("http"),
        "LEDGER_CONTAINER": unique("ledger"),
        "RESULTS_CONTAINER": unique("res"),
        "PAYLOADS_CONTAINER": unique("pay"),
        "POISON_ARCHIVE_CONTAINER": unique("arch"),
        "HTTP_ALLOWED_HOSTS": module_receiver.allow,
        "HTTP_RETRY_BASE_SECONDS": "1",
        "HTTP_RETRY_MAX_SECONDS": "30",
        "HTTP_SECRET_PARTNER": SECRET,
        "HTTP_SECRET_PARTNER_HOSTS": module_receiver.allow,
    }
    log = tmp_path_factory.mktemp("http-host") / "host.log"
    with local_host(azurite, settings, log, instance_id="http-host") as process:
        yield process


def submit(host: HostProcess, payload: dict[str, Any]) -> str:
    status, body = call(host, "POST", "jobs", {"kind": "http", "payload": payload})
    assert status == 202, body
    return str(body["id"])


def wait_status(host: HostProcess, job_id: str, wanted: set[str], timeout_s: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    record: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status, record = call(host, "GET", f"jobs/{job_id}")
        if status == 200 and record["status"] in wanted:
            return record
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} not in {wanted} after {timeout_s}s: {record}")


def test_503_503_200_completes_after_three_calls_with_one_key(host: HostProcess, receiver: Receiver) -> None:
    receiver.reply(Reply(503, "busy"), Reply(503, "busy"), Reply(200, {"accepted": True}))
    job = submit(host, {"url": receiver.url(), "body": {"order": 1}})
    wait_status(host, job, {"completed"})
    assert len(receiver.requests) == 3
    assert len({r.headers["Idempotency-Key"] for r in receiver.requests}) == 1
    status, result = call(host, "GET", f"jobs/{job}/result")
    assert status == 200 and result["status"] == 200 and result["attempts"] == 3
    assert result["body"] == {"accepted": True} and result["duration_s"] >= 0


def test_400_is_poisoned_at_once_naming_it(host: HostProcess, receiver: Receiver) -> None:
    receiver.reply(Reply(400, "amount is missing"))
    job = submit(host, {"url": receiver.url()})
    record = wait_status(host, job, {"poisoned"})
    assert len(receiver.requests) == 1
    assert "HTTP 400" in record["reason"] and "amount is missing" in record["reason"]


def test_429_retry_after_15_delays_the_next_call(host: HostProcess, receiver: Receiver) -> None:
    receiver.reply(Reply(429, headers={"Retry-After": "15"}))
    job = submit(host, {"url": receiver.url()})
    wait_status(host, job, {"completed"}, timeout_s=60)
    first, second = receiver.requests
    assert second.at - first.at >= 15


def test_a_downstream_taking_8s_within_timeout_10_is_called_once(
    host: HostProcess, receiver: Receiver
) -> None:
    receiver.reply(Reply(200, "slow but fine", delay_s=8))
    job = submit(host, {"url": receiver.url(), "timeout_seconds": 10})
    wait_status(host, job, {"completed"}, timeout_s=60)
    assert len(receiver.requests) == 1


def test_destinations_it_may_not_call_and_timeouts_that_cannot_fit_are_400(
    host: HostProcess, receiver: Receiver
) -> None:
    for url in (
        "https://169.254.169.254/metadata/instance",
        "https://10.0.0.5/hook",
        f"http://localhost:{receiver.port}/hook",  # loopback, but not the host listed
        f"https://127.0.0.2:{receiver.port}/hook",
        f"http://127.0.0.1:{receiver.port % 65535 + 1}/hook",  # the host listed, another port
        "https://2130706433/hook",  # 127.0.0.1 as one number
        "https://[::1/hook",
    ):
        status, body = call(host, "POST", "jobs", {"kind": "http", "payload": {"url": url}})
        assert status == 400 and any("payload.url" in p for p in body["problems"]), (url, body)
    secret_elsewhere = {
        "url": "https://partner.example/hook",
        "headers": {"A": {"secret": "HTTP_SECRET_PARTNER"}},
    }
    status, body = call(host, "POST", "jobs", {"kind": "http", "payload": secret_elsewhere})
    assert (
        status == 400 and "HTTP_SECRET_PARTNER" in json.dumps(body) and "partner.example" in json.dumps(body)
    )
    status, body = call(
        host, "POST", "jobs", {"kind": "http", "payload": {"url": receiver.url(), "timeout_seconds": 500}}
    )
    assert status == 400 and "cannot fit" in json.dumps(body)
    assert receiver.requests == []


def test_a_secret_header_is_sent_and_never_shown(host: HostProcess, receiver: Receiver) -> None:
    job = submit(
        host, {"url": receiver.url(), "headers": {"Authorization": {"secret": "HTTP_SECRET_PARTNER"}}}
    )
    wait_status(host, job, {"completed"})
    assert_sent(SECRET, [receiver.requests[0].headers["Authorization"]])
    shown = [call(host, "GET", f"jobs/{job}"), call(host, "GET", f"jobs/{job}/result")]
    assert host.log_path is not None
    assert_hidden(SECRET, json.dumps(shown), Path(host.log_path).read_text(encoding="utf-8"))


def test_a_hung_call_is_tried_again_well_before_it_ends_with_the_same_key(
    host: HostProcess, receiver: Receiver
) -> None:
    """timeout_seconds 5: the client waits 7 s, then the job is retried (1-2 s later) while the
    first call still hangs (45 s)."""
    receiver.reply(Reply(200, "too late", delay_s=45))
    job = submit(host, {"url": receiver.url(), "timeout_seconds": 5})
    wait_status(host, job, {"completed"}, timeout_s=40)
    first, second = receiver.requests
    assert second.at - first.at < 30
    assert first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"]


def test_the_same_envelope_queued_three_times_at_once_calls_once(
    host: HostProcess, receiver: Receiver, azurite: Azurite
) -> None:
    from azure.storage.queue import QueueClient

    receiver.reply(Reply(200, "ok", delay_s=2))
    job = unique("dup")
    queue = QueueClient.from_connection_string(azurite.connection_string, host.env["JOBS_QUEUE"])
    text = json.dumps({"id": job, "kind": "http", "payload": {"url": receiver.url()}})
    for _ in range(3):
        queue.send_message(text)
    wait_status(host, job, {"completed"})
    time.sleep(5)  # the copies that met the live claim come back as re-checks: they must not call
    assert len(receiver.requests) == 1


@pytest.mark.timeout(300)
def test_kill_9_during_a_call_completes_after_recovery_with_the_same_key(
    azurite: Azurite, receiver: Receiver, tmp_path: Path
) -> None:
    """The host and its worker killed (kill -9) while the downstream holds the call; a host
    started again finds the ended claim (a 6-s lease here) and the job calls again, same key."""
    import os
    import signal

    settings = {
        "JOBS_QUEUE": unique("kill"),
        "LEDGER_CONTAINER": unique("ledger"),
        "RESULTS_CONTAINER": unique("res"),
        "PAYLOADS_CONTAINER": unique("pay"),
        "POISON_ARCHIVE_CONTAINER": unique("arch"),
        "HTTP_ALLOWED_HOSTS": receiver.allow,
        "CLAIM_LEASE_SECONDS": "6",
        "RECOVERY_INTERVAL_SECONDS": "5",
    }
    env = host_env(azurite.connection_string, settings)
    init_storage(env)
    first = HostProcess(env, instance_id="kill-1", log_path=tmp_path / "kill-1.log").start()
    receiver.reply(Reply(200, "never seen", delay_s=60))
    job = submit(first, {"url": receiver.url(), "timeout_seconds": 90})
    deadline = time.monotonic() + 60
    while not receiver.requests and time.monotonic() < deadline:
        time.sleep(0.1)
    assert receiver.requests and first.process is not None
    os.killpg(first.process.pid, signal.SIGKILL)  # the host and its worker: kill -9
    first.kill()
    second = HostProcess(env, instance_id="kill-2", log_path=tmp_path / "kill-2.log").start()
    try:
        wait_status(second, job, {"completed"}, timeout_s=180)
    finally:
        second.stop()
    keys = [r.headers["Idempotency-Key"] for r in receiver.requests]
    assert len(keys) == 2 and len(set(keys)) == 1
