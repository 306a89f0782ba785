"""One message's life: claim, duplicates, retries, poison; on the in-memory account and on Azurite."""

from __future__ import annotations

import base64
import json
from datetime import timedelta

import pytest

from shared.core.envelope import isoformat, utcnow
from shared.pipeline.processing import process_message
from shared.runtime.wiring import Runtime
from tests.integration.backends import Backend
from tests.integration.effects import count_effects
from tests.integration.helpers import drain_raw, message, queue_length


@pytest.fixture
def rt(storage_backend: Backend) -> Runtime:
    return storage_backend.runtime(MAX_ATTEMPTS="3", RETRY_BASE_SECONDS="2")


def effects(rt: Runtime, job_id: str) -> int:
    """Executions that reached the side effect (the effect itself is applied at most once)."""
    counted = count_effects(rt.account.blobs(rt.settings.results_container))
    assert counted.applied[job_id] == (1 if counted.runs[job_id] else 0)
    return counted.runs[job_id]


def job(job_id: str, **payload: object) -> dict[str, object]:
    return {"id": job_id, "kind": "fault", "payload": {"effect": True, **payload}}


def test_completes_once_and_acknowledges_redelivery(rt: Runtime) -> None:
    process_message(message(job("a1")), rt)
    record = rt.ledger.get("a1")
    assert record is not None and record.status == "completed"
    assert record.data["attempt"] == 0 and "lease_until" not in record.data
    process_message(message(job("a1"), dequeue_count=2), rt)  # redelivery after a lost delete
    assert effects(rt, "a1") == 1
    events = [h["event"] for h in rt.ledger.get("a1").data["history"]]  # type: ignore[union-attr]
    assert events == ["claimed", "completed"]


def test_live_claim_by_another_owner_leaves_a_recheck_and_changes_nothing(rt: Runtime) -> None:
    lease = isoformat(utcnow() + timedelta(minutes=5))
    rt.ledger.create(
        "b1", {"id": "b1", "status": "in_progress", "attempt": 0, "owner": "other", "lease_until": lease}
    )
    process_message(message(job("b1")), rt)  # acknowledged: no dequeue count is spent
    assert rt.ledger.get("b1").data["owner"] == "other"  # type: ignore[union-attr]
    assert effects(rt, "b1") == 0
    # the delivery left a re-check message, invisible until the claim's lease ends
    assert queue_length(rt, rt.settings.jobs_queue) == 1
    assert drain_raw(rt, rt.settings.jobs_queue) == []


def test_expired_claim_is_taken_over(rt: Runtime) -> None:
    lease = isoformat(utcnow() - timedelta(seconds=1))
    rt.ledger.create(
        "c1", {"id": "c1", "status": "in_progress", "attempt": 0, "owner": "dead", "lease_until": lease}
    )
    process_message(message(job("c1")), rt)
    assert rt.ledger.get("c1").status == "completed"  # type: ignore[union-attr]
    assert effects(rt, "c1") == 1


def test_queued_record_from_the_api_is_taken(rt: Runtime) -> None:
    rt.ledger.create("d1", {"id": "d1", "status": "queued", "attempt": 0})
    process_message(message(job("d1")), rt)
    assert rt.ledger.get("d1").status == "completed"  # type: ignore[union-attr]


def test_permanent_error_poisons_after_one_run(rt: Runtime) -> None:
    body = job("e1", permanent=True)
    process_message(message(body), rt)  # returns: the invocation completes
    record = rt.ledger.get("e1")
    assert record is not None and record.status == "poisoned"
    assert record.data["reason"].startswith("bad_input_data: fault: permanent failure")
    assert [h["event"] for h in record.data["history"]] == ["claimed", "poisoned"]
    assert [json.loads(b) for b in drain_raw(rt, rt.settings.poison_queue)] == [body]
    process_message(message(body, dequeue_count=2), rt)  # a redelivery does not run again
    assert queue_length(rt, rt.settings.poison_queue) == 0


def test_transient_error_schedules_a_delayed_retry_then_poisons(rt: Runtime) -> None:
    body = job("f1", transient_failures=10)
    process_message(message(body), rt)
    record = rt.ledger.get("f1")
    assert record is not None and record.status == "retry_scheduled" and record.data["attempt"] == 1
    assert "DownstreamUnavailable" in record.data["error"]
    assert drain_raw(rt, rt.settings.jobs_queue) == []  # not visible yet: it has a delay
    process_message(message({**body, "attempt": 0}, dequeue_count=2), rt)  # the old message again: stale
    assert rt.ledger.get("f1").data["attempt"] == 1  # type: ignore[union-attr]
    process_message(message({**body, "attempt": 1}), rt)
    assert rt.ledger.get("f1").data["attempt"] == 2  # type: ignore[union-attr]
    process_message(message({**body, "attempt": 2}), rt)  # MAX_ATTEMPTS=3: the third failure poisons
    record = rt.ledger.get("f1")
    assert record is not None and record.status == "poisoned"
    assert record.data["reason"].startswith("gave up after 3 attempts")
    assert effects(rt, "f1") == 0


def test_unexpected_error_is_recorded_then_raised(rt: Runtime) -> None:
    with pytest.raises(RuntimeError, match="unexpected crash"):
        process_message(message(job("g1", crash=True)), rt)
    record = rt.ledger.get("g1")
    assert record is not None and record.status == "failed" and "RuntimeError" in record.data["error"]
    with pytest.raises(RuntimeError):  # the host's retry takes it over again
        process_message(message(job("g1", crash=True), dequeue_count=2), rt)


def test_expired_job_is_poisoned_without_running(rt: Runtime) -> None:
    body = {**job("h1"), "expires_at": isoformat(utcnow() - timedelta(hours=1))}
    process_message(message(body), rt)
    record = rt.ledger.get("h1")
    assert record is not None and record.status == "poisoned" and record.data["reason"].startswith("expired:")
    assert effects(rt, "h1") == 0


def test_bad_envelope_is_poisoned_with_reason_kept(rt: Runtime) -> None:
    process_message(message(b"{not json"), rt)
    poisoned = drain_raw(rt, rt.settings.poison_queue)
    assert poisoned == [b"{not json"]
    archive = rt.account.blobs(rt.settings.poison_archive_container)
    reasons = [json.loads(archive.read(b.name)) for page in archive.pages() for b in page]
    assert reasons[0]["reason"].startswith("bad_envelope: message: body (raw, or base64-decoded) is not JSON")


def test_happy_path_costs_two_ledger_requests_and_one_index_write(
    rt: Runtime, storage_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claim and complete (two conditional PUTs of the record), then the jobs index's upsert at
    completion (the console's index: +1, stated in docs/performance.md). Measured on a second job:
    the first one of a process also lists the day's tables (cached 10 s) and may create today's."""
    process_message(message({"id": "k0", "kind": "noop", "payload": {}}), rt)
    sent = storage_backend.record_requests(monkeypatch)
    process_message(message({"id": "k1", "kind": "noop", "payload": {}}), rt)
    assert len(sent()) == 3, sent()
    assert all(s.startswith("PUT") for s in sent()), sent()
    assert [s.endswith("/k1.json") for s in sent()] == [True, True, False], sent()
    assert "_k1')" in sent()[2], sent()


def test_poison_copy_is_base64_of_the_body_as_received(rt: Runtime) -> None:
    raw = b"\xff\xfe binary"
    process_message(message(raw), rt)
    msgs = list(rt.account.raw_queue(rt.settings.poison_queue).receive_messages())
    assert base64.b64decode(msgs[0].content) == raw


@pytest.mark.parametrize(
    ("stored", "reason"),
    [
        (b'{"effect": true}', ""),
        (
            None,
            "input_missing: payload_ref: blob {payloads}/claims/p.json does not exist (dangling claim check)",
        ),
        (
            b'{"pad": "' + b"y" * 2000 + b'"}',
            "over_limit: payload_ref: blob {payloads}/claims/p.json is 2011 bytes, over MAX_PAYLOAD_BYTES=1024: not read",
        ),
        (b"", "bad_envelope: payload_ref: blob claims/p.json is not JSON"),
        (b"[1, 2]", "bad_envelope: payload_ref: blob claims/p.json must hold a JSON object"),
    ],
    ids=["read", "missing", "too-large", "empty", "not-an-object"],
)
def test_a_claim_checked_payload_is_read_capped_or_poisoned_with_its_reason(
    storage_backend: Backend, stored: bytes | None, reason: str
) -> None:
    rt = storage_backend.runtime(MAX_PAYLOAD_BYTES="1024")
    if stored is not None:
        rt.account.blobs(rt.settings.payloads_container).write("claims/p.json", stored, overwrite=False)
    process_message(message({"id": "cc1", "kind": "fault", "payload_ref": "claims/p.json"}), rt)
    record = rt.ledger.get("cc1")
    assert record is not None
    if not reason:
        assert record.status == "completed" and effects(rt, "cc1") == 1, (
            "the payload it read asked for the effect"
        )
        return
    assert record.status == "poisoned" and effects(rt, "cc1") == 0
    assert record.data["reason"] == reason.format(payloads=rt.settings.payloads_container)
