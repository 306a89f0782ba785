"""Issue 21: retention rules per container and the settings check that keeps idempotency (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared import retention
from shared.errors import SettingsError
from shared.poison import archive
from shared.retention import RetentionDays
from shared.settings import Settings

CONN = "UseDevelopmentStorage=true"
NOW = datetime(2026, 3, 1, tzinfo=UTC)


def test_default_rules_per_container_and_prefix() -> None:
    rules = {r.name: r for r in Settings.from_env({"AzureWebJobsStorage": CONN}).retention_rules()}
    assert rules["ledger-finished"].tag == ("state", "done") and rules["ledger-finished"].days == 30
    assert (rules["results"].days, rules["payloads"].days) == (30, 30)
    assert rules["archive-jobs"].prefix == archive.JOBS_PREFIX and rules["archive-jobs"].days == 90
    assert rules["archive-unparsed"].prefix == archive.UNPARSED_PREFIX
    assert rules["archive-reasons"].prefix == archive.REASONS_PREFIX and rules["archive-reasons"].days == 97
    archive_prefixes = {r.prefix for r in rules.values() if r.container == "poison-archive"}
    assert not any(p.startswith(("edits/", "console/")) for p in archive_prefixes)  # audit, counters: never


def test_a_rule_is_due_strictly_after_its_days() -> None:
    rule = retention.Rule("results", "results", "", 30)
    assert not rule.due(NOW - timedelta(days=30), NOW)
    assert rule.due(NOW - timedelta(days=30, seconds=1), NOW)


def test_zero_keeps_forever() -> None:
    days = RetentionDays(ledger=0, results=0, payloads=0, archive=0)
    assert retention.rules(days, "l", "r", "p", "a") == []


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"LEDGER_RETENTION_DAYS": "7"}, "LEDGER_RETENTION_DAYS (7) must exceed JOB_TTL_SECONDS"),
        ({"JOB_TTL_SECONDS": str(30 * 86400)}, "LEDGER_RETENTION_DAYS (30) must exceed"),
        ({"PAYLOADS_RETENTION_DAYS": "3"}, "PAYLOADS_RETENTION_DAYS (3)"),
        ({"RESULTS_RETENTION_DAYS": "60"}, "must not exceed LEDGER_RETENTION_DAYS"),
        ({"ARCHIVE_RETENTION_DAYS": "-1"}, "ARCHIVE_RETENTION_DAYS"),
    ],
)
def test_settings_that_break_idempotency_are_refused_at_start_up(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        Settings.from_env({"AzureWebJobsStorage": CONN, **env})


def test_a_longer_ttl_with_a_longer_ledger_retention_is_accepted() -> None:
    s = Settings.from_env(
        {
            "AzureWebJobsStorage": CONN,
            "JOB_TTL_SECONDS": str(30 * 86400),
            "LEDGER_RETENTION_DAYS": "45",
            "PAYLOADS_RETENTION_DAYS": "45",
        }
    )
    assert s.retention.ledger == 45
