"""Issue 19: a job whose every run kills its worker process is poisoned at the takeover limit.

The local host with the SHIPPED host.json and the default claim settings, against a real
Azurite. Each run of the job calls `os._exit` in the worker: the host restarts the worker and
fails the invocation, the message comes back after visibilityTimeout, meets the dead run's claim
and leaves a re-check message (a new message, dequeue count 1), so maxDequeueCount never
triggers; the ledger's takeover count must. The test prints the time from submit to poisoned.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.azurite import Azurite
from devstack.hostproc import HostProcess, host_env, init_storage
from shared.config.settings import DEFAULT_MAX_TAKEOVERS
from tests.integration.helpers import host_call as call
from tests.integration.helpers import unique

pytestmark = pytest.mark.integration
SAFETY_S = 900.0
"""How long the test waits at most before it fails (not an objective: the time is printed)."""


@pytest.fixture
def host(azurite: Azurite, tmp_path: Path) -> Iterator[HostProcess]:
    settings = {
        "JOBS_QUEUE": unique("tko"),
        "LEDGER_CONTAINER": unique("ledger"),
        "RESULTS_CONTAINER": unique("res"),
        "PAYLOADS_CONTAINER": unique("pay"),
        "POISON_ARCHIVE_CONTAINER": unique("arch"),
        "ENABLE_TEST_KINDS": "1",
    }
    env = host_env(azurite.connection_string, settings)
    init_storage(env)
    proc = HostProcess(env, instance_id="host-tko", log_path=tmp_path / "host.log")  # the shipped host.json
    yield proc.start()
    proc.stop()


def wait_poisoned(host: HostProcess, job_id: str, since: float) -> dict[str, Any]:
    record: dict[str, Any] = {}
    while time.monotonic() - since < SAFETY_S:
        status, record = call(host, "GET", f"jobs/{job_id}")
        if status == 200 and record.get("status") == "poisoned":
            return record
        time.sleep(1.0)
    raise AssertionError(f"{job_id} not poisoned after {SAFETY_S:.0f} s: {record}")


def wait_listed(host: HostProcess, job_id: str, since: float) -> list[dict[str, Any]]:
    """The job's entries in `GET /api/poison` once the poison handler has archived its copy."""
    while time.monotonic() - since < SAFETY_S:
        status, listing = call(host, "GET", "poison")
        listed = [e for e in listing["archived"] if e["job_id"] == job_id] if status == 200 else []
        if listed:
            return listed
        time.sleep(1.0)
    raise AssertionError(f"{job_id} not listed in the poison archive after {SAFETY_S:.0f} s")


def worker_restarts(host: HostProcess) -> int:
    assert host.log_path is not None
    return host.log_path.read_text().count("devhost.worker: The worker process (pid")


@pytest.mark.timeout(2400)
def test_a_job_that_kills_its_worker_every_run_is_poisoned_at_the_takeover_limit(host: HostProcess) -> None:
    job_id = unique("dies-")
    started = time.monotonic()
    assert (
        call(host, "POST", "jobs", {"id": job_id, "kind": "fault", "payload": {"exit_worker": True}})[0]
        == 202
    )
    record = wait_poisoned(host, job_id, started)
    took = time.monotonic() - started

    limit = DEFAULT_MAX_TAKEOVERS
    assert record["reason_code"] == "runs_died"
    assert f"runs died {limit} times in a row without finishing" in record["reason"]
    assert "worker crash, host kill or function timeout" in record["reason"]
    claims = [h for h in record["history"] if h["event"] == "claimed"]
    assert len(claims) == limit + 1 and sum(1 for h in claims if h.get("takeover_of")) == limit
    assert all(h.get("dequeue_count", 1) <= 2 for h in record["history"])  # never near maxDequeueCount
    listed = wait_listed(host, job_id, started)
    assert len(listed) == 1 and "runs_died" in listed[0]["reason"], listed
    print(
        f"\n{job_id}: poisoned {took:.0f} s after submit, listed {time.monotonic() - started:.0f} s, "
        f"{worker_restarts(host)} worker deaths; reason: {record['reason']}"
    )

    # the host goes on: a job sent now completes
    good = unique("ok-")
    sent = time.monotonic()
    assert call(host, "POST", "jobs", {"id": good, "kind": "noop", "payload": {}})[0] == 202
    while (call(host, "GET", f"jobs/{good}")[1] or {}).get("status") != "completed":
        assert time.monotonic() - sent < SAFETY_S
        time.sleep(0.5)

    # replayable through the real host, and the replay counts afresh: its first run claims the job
    # without a takeover, and that run dies like the others. The rest of the second round (the
    # same number of deaths again, then poisoned and listed again) is the simulation's
    # test_runs_that_keep_dying_are_poisoned_at_the_takeover_limit_and_replay_counts_afresh, with
    # the shipped lease, visibilityTimeout and maxDequeueCount (`test_the_simulation_uses_what_ships`):
    # a second round here would take another ~165 s for the same pure ledger rule.
    replayed_at = time.monotonic()
    status, answer = call(host, "POST", "poison/replay", {"ids": [job_id]})
    # the replayed job is picked up within ~100 ms and kills the worker, which may still be
    # answering this call: its answer can be lost (5xx); the ledger below says whether it replayed
    assert (status, (answer or {}).get("replayed")) == (200, [job_id]) or status >= 500, (status, answer)
    while True:
        assert time.monotonic() - replayed_at < SAFETY_S, "the replayed job never ran"
        status, record = call(host, "GET", f"jobs/{job_id}")
        events = [h["event"] for h in record.get("history", [])] if status == 200 else []
        after = events[len(events) - 1 - events[::-1].index("replayed") :] if "replayed" in events else []
        if "claimed" in after and worker_restarts(host) > limit:
            break
        time.sleep(0.5)
    assert record["status"] != "poisoned" and not record.get("takeovers")
    history = record["history"]
    first_claim = next(h for h in history[len(history) - len(after) :] if h["event"] == "claimed")
    assert not first_claim.get("takeover_of")
    print(
        f"{job_id}: replayed, run again {time.monotonic() - replayed_at:.0f} s later (its worker died again)"
    )
