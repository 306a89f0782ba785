"""Ledger transitions and writes that survive a lost answer (no I/O)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from azure.core.exceptions import ServiceResponseError

from shared import ledger
from shared.core.documents import Conflict, DocumentChanged
from shared.core.envelope import Envelope, isoformat
from shared.core.errors import StorageThrottled
from shared.ledger import Decision, Facts, Ledger
from shared.ledger import operator as ledger_operator
from shared.storage.memory_documents import MemoryDocuments

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ENV = Envelope(id="j1", kind="noop", created_at=NOW - timedelta(minutes=1), payload={})
FACTS = Facts(NOW, "m1", 1, "host/a")


def test_claim_then_complete_keeps_one_story() -> None:
    claimed = ledger.claimed(None, ENV, FACTS, lease_s=30)
    assert claimed["status"] == ledger.IN_PROGRESS and claimed["owner"] == "host/a"
    assert claimed["lease_until"] == isoformat(NOW + timedelta(seconds=30))
    assert claimed["created_at"] == isoformat(ENV.created_at)
    done = ledger.completed(claimed, "j1", FACTS, 0, "results/j1.json", {"rows": 1}, 0.5)
    assert done["status"] == ledger.COMPLETED and "lease_until" not in done
    assert [h["event"] for h in done["history"]] == ["claimed", "completed"]
    assert ledger.decide(done, 0, None, NOW) is Decision.DUPLICATE


def test_renewal_moves_only_the_lease_and_only_for_the_owner() -> None:
    claimed = ledger.claimed(None, ENV, FACTS, lease_s=30)
    later = Facts(NOW + timedelta(seconds=10), owner="host/a")
    renewed = ledger.renewed(claimed, later, lease_s=30)
    assert renewed["lease_until"] == isoformat(NOW + timedelta(seconds=40))
    assert renewed["history"] == claimed["history"] and renewed["renewals"] == 1
    with pytest.raises(Conflict):
        ledger.renewed(claimed, Facts(NOW, owner="host/b"), lease_s=30)
    with pytest.raises(Conflict):
        ledger.renewed(ledger.released(claimed, "j1", FACTS, 0, "boom"), later, lease_s=30)


def test_release_lets_the_next_delivery_run_at_once() -> None:
    claimed = ledger.claimed(None, ENV, FACTS, lease_s=30)
    assert ledger.decide(claimed, 0, None, NOW) is Decision.BUSY
    released = ledger.released(claimed, "j1", FACTS, 0, "RuntimeError: boom")
    assert released["status"] == ledger.FAILED and ledger.decide(released, 0, None, NOW) is Decision.RUN


def test_retry_keeps_a_continuation_and_moves_its_seq() -> None:
    claimed = ledger.claimed(None, ENV, FACTS, lease_s=30)
    offloaded = ledger.continued(claimed, "j1", FACTS, ledger.OFFLOADED, 1, {"run": "r1"}, 10)
    retry = ledger.retry_scheduled(offloaded, "j1", FACTS, 0, "503", 4, seq=2)
    assert retry["attempt"] == 1 and retry["continuation"] == {"seq": 2, "state": {"run": "r1"}}
    assert ledger.decide(retry, 1, 2, NOW) is Decision.RESUME
    assert ledger.decide(retry, 0, 1, NOW) is Decision.STALE


def test_poisoned_then_replayed() -> None:
    claimed = ledger.claimed(None, ENV, FACTS, lease_s=30)
    poisoned = ledger.poisoned(claimed, "j1", FACTS, "bad_input_data: x", "bad_input_data", b"x" * 20_000)
    assert poisoned["status"] == ledger.POISONED and poisoned["body"].endswith("(20000 chars)")
    replayed = ledger_operator.replayed(poisoned, ENV, FACTS)
    assert replayed["status"] == ledger.QUEUED and replayed["attempt"] == 0
    assert (
        replayed["last_reason"] == "bad_input_data: x" and "reason" not in replayed and "body" not in replayed
    )
    assert ledger.decide(replayed, 0, None, NOW) is Decision.RUN


# -- writes that survive "applied, but the answer was lost" ----------------------------------


class LoseAnswers:
    """A fault hook for MemoryDocuments: the listed operations are applied, then raise."""

    def __init__(self, *ops: str) -> None:
        self.ops = list(ops)

    def __call__(self, op: str, name: str) -> Callable[[], None] | None:
        if self.ops and self.ops[0] == op:
            self.ops.pop(0)

            def lose() -> None:
                raise ServiceResponseError("answer lost")

            return lose
        return None


def test_a_create_applied_without_an_answer_is_recognised() -> None:
    store = MemoryDocuments(lambda: NOW, LoseAnswers("ledger.create"), "ledger")
    record = Ledger(store).write("j1", None, lambda prev: ledger.claimed(prev, ENV, FACTS, 30))
    assert record.data["owner"] == "host/a" and record.etag == "1"


def test_an_earlier_unanswered_write_of_ours_is_built_on() -> None:
    store = MemoryDocuments(lambda: NOW, None, "ledger")
    book = Ledger(store)
    mine: set[str] = set()
    first = book.write("j1", None, lambda prev: ledger.claimed(prev, ENV, FACTS, 30), mine)
    store.before = _lose_then_fail_read()
    with pytest.raises(StorageThrottled):  # a renewal: applied, answer lost, and the read-back failed too
        book.write("j1", first, lambda prev: ledger.renewed(prev, FACTS, 30), mine)
    store.before = None
    done = book.write("j1", first, lambda prev: ledger.completed(prev, "j1", FACTS, 0, "", {}, 1.0), mine)
    assert done.status == ledger.COMPLETED and done.data["renewals"] == 1


def _lose_then_fail_read() -> Callable[[str, str], Callable[[], None] | None]:
    lose = LoseAnswers("ledger.replace")

    def hook(op: str, name: str) -> Callable[[], None] | None:
        if op == "ledger.read":
            raise ServiceResponseError("still down")
        return lose(op, name)

    return hook


def test_someone_elses_write_is_a_conflict() -> None:
    store = MemoryDocuments(lambda: NOW, None, "ledger")
    book = Ledger(store)
    first = book.write("j1", None, lambda prev: ledger.claimed(prev, ENV, FACTS, 30))
    book.write("j1", first, lambda prev: ledger.released(prev, "j1", FACTS, 0, "x"))
    with pytest.raises(DocumentChanged):
        book.write("j1", first, lambda prev: ledger.completed(prev, "j1", FACTS, 0, "", {}, 1.0))


def test_a_cancelled_run_is_recorded_before_the_poison() -> None:
    claimed = ledger.claimed(None, ENV, FACTS, lease_s=30)
    run = {"backend": "livy", "submission_id": "7", "cancelled": True}
    data = ledger.poisoned(
        ledger.run_cancelled(claimed, "j1", FACTS, run), "j1", FACTS, "expired", "expired", b"{}"
    )
    assert data["status"] == ledger.POISONED and data["cancelled_run"] == run
    assert [h["event"] for h in data["history"]][-2:] == ["run_cancelled", "poisoned"]
    assert data["history"][-2]["submission_id"] == "7" and data["history"][-2]["cancelled"] is True


def test_cancel_is_refused_when_done_or_running_and_replay_forgets_it() -> None:
    claimed = ledger.claimed(None, ENV, FACTS, lease_s=30)
    with pytest.raises(Conflict, match="running now"):
        ledger_operator.cancel_requested(claimed, "j1", FACTS, "ops", "")
    later = Facts(NOW + timedelta(seconds=31), owner="ops")
    asked = ledger_operator.cancel_requested(claimed, "j1", later, "ops", "wrong input")
    assert asked["cancel_requested"]["by"] == "ops" and asked["history"][-1]["event"] == "cancel_requested"
    done = ledger.completed(claimed, "j1", FACTS, 0, "results/j1.json", {}, 0.1)
    with pytest.raises(Conflict, match="nothing to cancel"):
        ledger_operator.cancel_requested(done, "j1", later, "ops", "")
    assert "cancel_requested" not in ledger_operator.replayed(asked, ENV, later)
