"""The typed record view reads what the transitions write, and tolerates what they never write."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from shared import ledger
from shared.core.envelope import Envelope
from shared.ledger import Facts
from shared.ledger import operator as ledger_operator
from shared.ledger.view import CancelRequest, Continuation, RecordView

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ENV = Envelope(id="j1", kind="noop", created_at=NOW, payload={})


def claimed() -> ledger.Data:
    return ledger.claimed(None, ENV, Facts(NOW, owner="me"), lease_s=30)


def test_a_claimed_record() -> None:
    view = RecordView.of(claimed())
    assert view.status == "in_progress"
    assert view.kind == "noop" and view.owner == "me"
    assert view.lease_end == NOW + timedelta(seconds=30)
    assert view.continuation is None and view.next_continuation_seq == 1 and view.retry_seq is None
    assert view.cancel_request is None and view.progress is None and view.takeovers == 0


def test_continuations_number_on() -> None:
    data = ledger.continued(claimed(), "j1", Facts(NOW), ledger.OFFLOADED, 3, {"run": "r1"}, 30)
    view = RecordView.of(data)
    assert view.status == "offloaded"
    assert view.continuation == Continuation(3, {"run": "r1"})
    assert view.next_continuation_seq == 4 and view.retry_seq == 4
    assert view.lease_end is None


def test_completed_cancelled_and_poisoned_fields() -> None:
    done = ledger.completed(claimed(), "j1", Facts(NOW), 0, "results/j1.json", {"rows": 1}, 0.5)
    assert RecordView.of(done).result_ref == "results/j1.json"
    later = Facts(NOW + timedelta(minutes=5))
    asked = ledger_operator.cancel_requested(claimed(), "j1", later, "ops@example", "wrong input")
    assert RecordView.of(asked).cancel_request == CancelRequest("ops@example", "wrong input")
    poisoned = ledger.poisoned(claimed(), "j1", Facts(NOW), "bad input", "input_error", b"{}")
    assert RecordView.of(poisoned).status == "poisoned" and RecordView.of(poisoned).reason == "bad input"


def test_missing_or_odd_values_read_as_nothing() -> None:
    assert RecordView.of(None).status is None
    odd = RecordView.of({"status": "weird", "continuation": "x", "cancel_requested": 1, "result_ref": ""})
    assert odd.status is None and odd.continuation is None and odd.cancel_request is None
    assert odd.result_ref is None and odd.next_continuation_seq == 1
