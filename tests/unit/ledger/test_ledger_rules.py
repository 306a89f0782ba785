"""The ledger's state machine (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared.core.envelope import isoformat
from shared.ledger import HISTORY_LIMIT, Decision, Facts, claim_is_live, decide, released

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LATER = isoformat(NOW + timedelta(minutes=5))
EARLIER = isoformat(NOW - timedelta(seconds=1))


@pytest.mark.parametrize(
    ("data", "attempt", "seq", "expected"),
    [
        (None, 0, None, Decision.RUN),
        ({"status": "queued", "attempt": 0}, 0, None, Decision.RUN),
        ({"status": "failed", "attempt": 0}, 0, None, Decision.RUN),
        ({"status": "retry_scheduled", "attempt": 2}, 2, None, Decision.RUN),
        ({"status": "retry_scheduled", "attempt": 2}, 1, None, Decision.STALE),
        ({"status": "completed", "attempt": 0}, 0, None, Decision.DUPLICATE),
        ({"status": "completed", "attempt": 3}, 0, None, Decision.DUPLICATE),
        ({"status": "poisoned", "attempt": 0}, 0, None, Decision.ALREADY_POISONED),
        ({"status": "in_progress", "attempt": 0, "lease_until": LATER}, 0, None, Decision.BUSY),
        ({"status": "in_progress", "attempt": 0, "lease_until": EARLIER}, 0, None, Decision.RUN),
        ({"status": "in_progress", "attempt": 0, "lease_until": "garbage"}, 0, None, Decision.RUN),
        ({"status": "offloaded", "attempt": 0, "continuation": {"seq": 2}}, 0, 2, Decision.RESUME),
        ({"status": "offloaded", "attempt": 0, "continuation": {"seq": 2}}, 0, 1, Decision.STALE),
        ({"status": "offloaded", "attempt": 0, "continuation": {"seq": 2}}, 0, None, Decision.STALE),
        ({"status": "in_progress", "continuation": {"seq": 2}, "lease_until": LATER}, 0, 2, Decision.BUSY),
        (
            {"status": "in_progress", "continuation": {"seq": 2}, "lease_until": EARLIER},
            0,
            2,
            Decision.RESUME,
        ),
    ],
)
def test_decide(data: dict[str, object] | None, attempt: int, seq: int | None, expected: Decision) -> None:
    assert decide(data, attempt, seq, NOW) is expected


def test_claim_is_live_only_for_in_progress() -> None:
    assert claim_is_live({"status": "in_progress", "lease_until": LATER}, NOW)
    assert not claim_is_live({"status": "completed", "lease_until": LATER}, NOW)


def test_history_is_bounded() -> None:
    data = None
    for i in range(HISTORY_LIMIT + 10):
        data = released(data, "j", Facts(NOW, queue_message_id=None), attempt=i, error="e")
    assert data is not None
    history = data["history"]
    assert isinstance(history, list) and len(history) == HISTORY_LIMIT
    assert history[-1]["attempt"] == HISTORY_LIMIT + 9 and "queue_message_id" not in history[-1]
