"""The poison handler's verdict on a message the host moved (`judge`, pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared import ledger
from shared.core.envelope import Envelope
from shared.ledger import Facts
from shared.poison import judge
from shared.poison.archive import AppReason

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ENV = Envelope(id="j1", kind="noop", created_at=NOW - timedelta(minutes=1), payload={})
FACTS = Facts(NOW, "m1", 1, "host/a")

LIVE = ledger.claimed(None, ENV, FACTS, lease_s=30)
APP = AppReason("bad_input_data: x", "j1", "bad_input_data", under_claim=True)


@pytest.mark.parametrize(
    ("record", "env", "app", "state", "mark", "recheck"),
    [
        (None, None, None, "poisoned", False, False),  # garbage: listed, no record touched
        (LIVE, None, AppReason("bad_envelope: x", "j1", "bad_envelope", False), "poisoned", False, False),
        (
            ledger.completed(LIVE, "j1", FACTS, 0, "", {}, 1),
            ENV,
            None,
            "duplicate_of_completed",
            False,
            False,
        ),
        (LIVE, ENV, APP, "poisoned", True, False),  # the app poisoned it under its claim
        (None, ENV, None, "poisoned", True, False),  # the host moved a job that never got a record
        (LIVE, ENV, None, "rechecked", False, True),  # a live claim: sent back, never dropped
        (ledger.released(LIVE, "j1", FACTS, 0, "boom"), ENV, None, "poisoned", True, False),
        (ledger.retry_scheduled(LIVE, "j1", FACTS, 0, "e", 1, None), ENV, None, "stale", False, False),
    ],
)
def test_judge(
    record: dict[str, object] | None,
    env: Envelope | None,
    app: AppReason | None,
    state: str,
    mark: bool,
    recheck: bool,
) -> None:
    verdict = judge(record, env, app, NOW + timedelta(seconds=1))
    assert (verdict.state, verdict.mark, verdict.recheck_at is not None) == (state, mark, recheck)
    assert verdict.reason
