"""What a producer may send, and the pure transitions of a producer's record (no I/O)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from shared import ledger
from shared.core.documents import Conflict
from shared.core.envelope import Envelope, isoformat, parse_dict
from shared.core.errors import EnvelopeError
from shared.ledger import Decision, Facts, view
from shared.ledger import operator as ledger_operator
from shared.ledger import send as ledger_send
from shared.pipeline.submit import request_digest

KINDS = {"noop"}
NOW = datetime(2026, 1, 1, tzinfo=UTC)
ENV = Envelope(id="j1", kind="noop", created_at=NOW, payload={"a": 1})
FACTS = Facts(NOW)


def problems(data: dict[str, object], producer: bool) -> list[str]:
    try:
        parse_dict(data, KINDS, require_id=False, producer=producer)
    except EnvelopeError as exc:
        return exc.problems
    return []


@pytest.mark.parametrize("field", ["attempt", "continuation_seq"])
@pytest.mark.parametrize("value", [0, 1, 7, "x", None])
def test_a_producer_may_not_set_the_apps_fields(field: str, value: object) -> None:
    found = problems({"kind": "noop", "payload": {}, field: value}, producer=True)
    assert found == [f"{field}: set by the app, not by producers"]


def test_both_fields_are_named_with_the_other_problems() -> None:
    found = problems({"kind": "nope", "payload": {}, "attempt": 1, "continuation_seq": 2}, producer=True)
    assert "attempt: set by the app, not by producers" in found
    assert "continuation_seq: set by the app, not by producers" in found
    assert any(p.startswith("kind:") for p in found) and len(found) == 3


def test_the_queue_side_still_reads_the_apps_own_messages() -> None:
    env = parse_dict({"id": "j", "kind": "noop", "payload": {}, "attempt": 2, "continuation_seq": 3}, KINDS)
    assert (env.attempt, env.continuation_seq) == (2, 3)


def test_the_same_request_has_the_same_digest_whatever_its_time() -> None:
    later = replace(ENV, created_at=NOW + timedelta(minutes=5))
    assert request_digest(later) == request_digest(ENV)
    assert request_digest(replace(ENV, payload={"a": 2})) != request_digest(ENV)
    assert request_digest(replace(ENV, expires_at=NOW)) != request_digest(ENV)
    assert request_digest(replace(ENV, payload={"b": 1, "a": 1})) == request_digest(
        replace(ENV, payload={"a": 1, "b": 1})
    )


def queued() -> ledger.Data:
    return ledger_send.queued(ENV, FACTS, request="d1", submitter="r1", send_lease_s=30)


def test_the_producers_record_is_pending_until_sent() -> None:
    data = queued()
    assert data["status"] == ledger.QUEUED and ledger_send.send_is_pending(data)
    assert ledger_send.send_lease_end(data) == NOW + timedelta(seconds=30)
    assert ledger.decide(data, 0, None, NOW) is Decision.RUN  # a delivery may take it at once
    done = ledger_send.sent(data, "j1", FACTS, "r1")
    assert not ledger_send.send_is_pending(done) and ledger_send.send_lease_end(done) is None
    assert done["request_digest"] == "d1" and [h["event"] for h in done["history"]] == ["queued", "sent"]


def test_only_the_submitter_clears_or_releases_its_send() -> None:
    with pytest.raises(Conflict):
        ledger_send.sent(queued(), "j1", FACTS, "r2")
    with pytest.raises(Conflict):
        ledger_send.send_failed(queued(), "j1", FACTS, "r2", "boom")
    with pytest.raises(Conflict):
        ledger_send.sent(ledger_send.sent(queued(), "j1", FACTS, "r1"), "j1", FACTS, "r1")


def test_a_failed_send_ends_the_lease_and_a_retry_takes_it_over() -> None:
    failed = ledger_send.send_failed(
        queued(), "j1", Facts(NOW + timedelta(seconds=1)), "r1", "StorageThrottled: x"
    )
    assert ledger_send.send_lease_end(failed) == NOW + timedelta(seconds=1) and ledger_send.send_is_pending(
        failed
    )
    later = Facts(NOW + timedelta(seconds=2))
    resumed = ledger_send.send_resumed(failed, "j1", later, "r2", 30)
    assert resumed["submitter"] == "r2" and ledger_send.send_lease_end(resumed) == later.now + timedelta(
        seconds=30
    )
    assert "send_pending" not in ledger_send.sent(resumed, "j1", later, "r2")
    with pytest.raises(Conflict):
        ledger_send.send_resumed(ledger_send.sent(resumed, "j1", later, "r2"), "j1", later, "r3", 30)


def test_a_delivery_claim_drops_the_markers_and_keeps_who_submitted() -> None:
    claimed = ledger.claimed(queued(), ENV, Facts(NOW, "m1", 1, "host/a"), lease_s=30)
    assert not any(key in claimed for key in ledger.SEND_MARKERS)
    assert claimed["submitter"] == "r1" and claimed["request_digest"] == "d1"
    assert claimed["created_at"] == isoformat(NOW)
    with pytest.raises(Conflict):  # the submitter's late clear: the delivery is there already
        ledger_send.sent(claimed, "j1", FACTS, "r1")


def test_a_replay_drops_the_markers() -> None:
    poisoned = ledger.poisoned(queued(), "j1", FACTS, "x", "bad_input_data", b"{}")
    replayed = ledger_operator.replayed(poisoned, ENV, FACTS)
    assert replayed["status"] == ledger.QUEUED and not ledger_send.send_is_pending(replayed)


# -- the API's message, sent by the Functions host (7-day time to live) ------------------------


def host_queued() -> ledger.Data:
    return ledger_send.queued(ENV, FACTS, request="d1", submitter="r1", send_lease_s=30, host_sends=True)


def test_a_host_sent_record_keeps_its_envelope_and_when_to_send_it_again() -> None:
    data = host_queued()
    assert ledger_send.send_is_pending(data) and data["envelope"] == ENV.to_dict()
    due = NOW + timedelta(seconds=ledger_send.RESEND_AFTER_S)
    assert ledger_send.RESEND_AFTER_S == 6 * 24 * 3600  # a day before the queue's default 7-day TTL
    assert data["resend_at"] == isoformat(due)
    assert view.index_tags(data) == {view.TAG_RESEND: isoformat(due)}
    plain = queued()  # this request sends it itself, never expiring: nothing to keep
    assert "envelope" not in plain and "resend_at" not in plain and view.index_tags(plain) == {}


def test_an_unclaimed_host_sent_job_is_due_at_resend_at_and_not_before() -> None:
    data = host_queued()
    due = NOW + timedelta(seconds=ledger_send.RESEND_AFTER_S)
    assert ledger_send.unclaimed_to_resend(data, due - timedelta(seconds=1)) is None
    assert ledger_send.unclaimed_to_resend(data, due) == ENV.to_dict()
    assert ledger_send.unclaimed_to_resend(None, due) is None
    assert (
        ledger_send.unclaimed_to_resend({**data, "envelope": {**ENV.to_dict(), "id": "other"}}, due) is None
    )
    assert ledger_send.unclaimed_to_resend({**data, "resend_at": "soon"}, due) is None
    assert ledger_send.unclaimed_to_resend({k: v for k, v in data.items() if k != "envelope"}, due) is None


def test_the_first_claim_ends_it_and_so_does_a_resend() -> None:
    data = host_queued()
    due = NOW + timedelta(seconds=ledger_send.RESEND_AFTER_S)
    claimed = ledger.claimed(data, replace(ENV, recorded=True), Facts(NOW, owner="w"), lease_s=60)
    assert "resend_at" not in claimed and not ledger_send.send_is_pending(claimed)
    assert set(view.index_tags(claimed)) == {view.TAG_LEASE}  # the claim's write replaces the tag
    assert ledger_send.unclaimed_to_resend(claimed, due) is None
    again = ledger_send.resent(data, "j1", Facts(due))
    assert not ledger_send.send_is_pending(again) and "envelope" not in again and "resend_at" not in again
    assert view.index_tags(again) == {} and again["history"][-1]["event"] == "resent"
    assert ledger.decide(again, 0, None, due) is Decision.RUN  # the re-sent message runs it
    with pytest.raises(Conflict):  # a claim came first: nothing pending to end
        ledger_send.resent(claimed, "j1", Facts(due))
    sent = ledger_send.sent(data, "j1", FACTS, "r1")  # a retry that sent it itself
    assert "envelope" not in sent and view.index_tags(sent) == {}


def test_a_failed_host_send_keeps_nothing_to_send_later_and_its_retry_keeps_it_again() -> None:
    failed = ledger_send.send_failed(host_queued(), "j1", FACTS, "r1", "boom")  # the caller got 503
    assert ledger_send.send_is_pending(failed) and view.index_tags(failed) == {}
    assert "envelope" not in failed and "resend_at" not in failed
    later = NOW + timedelta(days=30)
    assert ledger_send.unclaimed_to_resend(failed, later) is None  # not run unbidden
    retry_at = NOW + timedelta(minutes=5)
    resumed = ledger_send.send_resumed(failed, "j1", Facts(retry_at), "r2", 30, ENV)
    due = retry_at + timedelta(seconds=ledger_send.RESEND_AFTER_S)
    assert view.index_tags(resumed) == {view.TAG_RESEND: isoformat(due)}
    assert ledger_send.unclaimed_to_resend(resumed, due) == ENV.to_dict()
    itself = ledger_send.send_resumed(failed, "j1", Facts(retry_at), "r2", 30)  # a request that sends it
    assert view.index_tags(itself) == {} and "envelope" not in itself
