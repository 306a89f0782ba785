"""Issue 21: what the ledger's index tags say, and which ended claims recovery re-sends (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared import ledger
from shared.core.documents import TagQuery
from shared.core.envelope import Envelope, isoformat
from shared.ledger import Facts
from shared.ledger import view as ledger_view
from shared.pipeline.recovery import GRACE_S, ended_claims_query
from shared.storage.memory_documents import MemoryDocuments

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ENV = Envelope(id="j1", kind="noop", created_at=NOW, payload={"x": 1}, attempt=2)


def claimed(at: datetime = NOW, lease_s: float = 30.0) -> ledger.Data:
    return ledger.claimed(None, ENV, Facts(at, "m1", 1, "host/a"), lease_s)


def test_a_claim_keeps_its_envelope_and_tags_its_end() -> None:
    data = claimed()
    assert data[ledger.CLAIM_ENVELOPE] == ENV.to_dict()
    assert ledger_view.index_tags(data) == {"lease_until": isoformat(NOW + timedelta(seconds=30))}
    beat = ledger.renewed(data, Facts(NOW + timedelta(seconds=10), owner="host/a"), 30.0)
    assert ledger_view.index_tags(beat) == {"lease_until": isoformat(NOW + timedelta(seconds=40))}
    assert beat[ledger.CLAIM_ENVELOPE] == ENV.to_dict()


@pytest.mark.parametrize(
    ("end", "tags"),
    [
        (
            lambda d, f: ledger.completed(d, "j1", f, 2, "", {}, 1.0),
            {"state": "done", "done_at": isoformat(NOW + timedelta(seconds=5))},
        ),
        (lambda d, f: ledger.poisoned(d, "j1", f, "bad", "x", b"{}"), {"state": "poisoned"}),
        (lambda d, f: ledger.released(d, "j1", f, 2, "boom"), {}),
        (lambda d, f: ledger.retry_scheduled(d, "j1", f, 2, "later", 5, None), {}),
        (lambda d, f: ledger.continued(d, "j1", f, "offloaded", 1, {}, 5), {}),
    ],
)
def test_every_write_that_ends_a_claim_clears_its_tag_and_envelope(end, tags) -> None:  # type: ignore[no-untyped-def]
    data = end(claimed(), Facts(NOW + timedelta(seconds=5), owner="host/a"))
    assert ledger_view.index_tags(data) == tags
    assert ledger.CLAIM_ENVELOPE not in data


@pytest.mark.parametrize(
    ("after_s", "expected"),
    [(0, False), (30, False), (30 + GRACE_S - 1, False), (30 + GRACE_S, True), (600, True)],
)
def test_only_a_claim_ended_for_the_grace_is_recovered(after_s: float, expected: bool) -> None:
    found = ledger_view.claim_to_recover(claimed(), NOW + timedelta(seconds=after_s), GRACE_S)
    assert (found == ENV.to_dict()) is expected


def test_records_that_moved_on_or_keep_no_envelope_are_not_recovered() -> None:
    late = NOW + timedelta(minutes=5)
    done = ledger.completed(claimed(), "j1", Facts(NOW), 2, "", {}, 1.0)
    old_style = {k: v for k, v in claimed().items() if k != ledger.CLAIM_ENVELOPE}
    other_attempt = {**claimed(), "attempt": 3}
    for data in (None, done, old_style, other_attempt):
        assert ledger_view.claim_to_recover(data, late, GRACE_S) is None


def test_the_tag_query_orders_iso_times_as_text() -> None:
    query = ended_claims_query(NOW + timedelta(seconds=60))
    assert query.expression() == "\"lease_until\" < '2026-01-01T00:00:50.000000Z'"
    assert query.matches({"lease_until": isoformat(NOW + timedelta(seconds=30))})
    assert not query.matches({"lease_until": isoformat(NOW + timedelta(seconds=50))})
    assert not query.matches({"state": "done"})
    with pytest.raises(ValueError):
        TagQuery("k", "<>", "v")
    with pytest.raises(ValueError):
        TagQuery("k", "=", "it's")


def test_memory_documents_keep_tags_per_write_and_find_them() -> None:
    store = MemoryDocuments(lambda: NOW, tags=ledger_view.index_tags)
    doc = store.create("j1.json", claimed())
    assert list(store.find(ended_claims_query(NOW + timedelta(minutes=1)))) == ["j1.json"]
    store.replace("j1.json", doc, ledger.completed(doc.data, "j1", Facts(NOW), 2, "", {}, 1.0))
    assert list(store.find(ended_claims_query(NOW + timedelta(minutes=1)))) == []
    assert list(store.find(TagQuery("state", "=", "done"))) == ["j1.json"]
