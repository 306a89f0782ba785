"""Issue 21: retention rules per container and the settings check that keeps idempotency (pure)."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest

from shared import ledger
from shared.config import retention
from shared.config.retention import RetentionDays
from shared.config.settings import Settings
from shared.core import archive_layout as archive
from shared.core.envelope import Envelope, isoformat
from shared.core.errors import SettingsError
from shared.core.messages import NEVER_EXPIRE
from shared.indexes import entry_rows as entry_index
from shared.indexes.entry_rows import EntryState
from shared.ledger import Facts
from shared.ledger import view as ledger_view
from shared.pipeline.retention_sweep import ENTRY_STATES, DocumentTarget, apply
from shared.poison.entry import ArchiveEntry
from shared.poison.parking import parked_ttl_s
from shared.storage.memory_documents import MemoryDocuments

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


def test_finished_records_are_found_by_their_done_at_tag_strictly_before_the_cutoff() -> None:
    [rule] = [r for r in Settings.from_env({"AzureWebJobsStorage": CONN}).retention_rules() if r.tag]
    query = rule.due_query(NOW)
    assert query is not None and query.expression() == "\"done_at\" < '2026-01-30T00:00:00.000000Z'"
    assert query.matches({"state": "done", "done_at": "2026-01-29T23:59:59.999999Z"})
    assert not query.matches({"state": "done", "done_at": "2026-01-30T00:00:00.000000Z"})
    assert not query.matches({"state": "poisoned"}) and not query.matches({"lease_until": "2020-01-01"})
    assert retention.Rule("results", "results", "", 30).due_query(NOW) is None  # listed by prefix


def test_a_completed_record_carries_its_finish_time_as_a_tag() -> None:
    env = Envelope(id="j1", kind="noop", created_at=NOW, payload={})
    claimed = ledger.claimed(None, env, Facts(NOW, "m", 1, "h/1"), 30.0)
    done = ledger.completed(claimed, "j1", Facts(NOW + timedelta(seconds=5)), 1, "", {}, 1.0)
    assert ledger_view.index_tags(done) == {"state": "done", "done_at": "2026-03-01T00:00:05.000000Z"}


def test_apply_on_a_memory_store_deletes_only_due_blobs_and_bounds_a_run() -> None:
    clock = FakeNow(NOW - timedelta(days=40))
    store = MemoryDocuments(clock, tags=ledger_view.index_tags)
    for name in ("a", "b"):
        store.upsert(f"{name}.json", {"status": ledger.COMPLETED, "finished_at": isoformat(clock())})
    store.upsert("live.json", {"status": ledger.IN_PROGRESS, "lease_until": isoformat(clock())})
    store.upsert("poisoned.json", {"status": ledger.POISONED})
    clock.now = NOW - timedelta(days=10)
    store.upsert("c.json", {"status": ledger.COMPLETED, "finished_at": isoformat(clock())})
    rules = retention.rules(RetentionDays(), "ledger", "r", "p", "a")[:1]

    def target(_: str) -> DocumentTarget:
        return DocumentTarget(store)

    dry = apply(target, rules, NOW, dry_run=True)
    assert (dry.due, dry.deleted, set(store.docs)) == (
        2,
        0,
        {"a.json", "b.json", "c.json", "live.json", "poisoned.json"},
    )
    first = apply(target, rules, NOW, dry_run=False, limit=1)
    assert (first.deleted, first.stopped_at_limit) == (1, True)
    apply(target, rules, NOW, dry_run=False)
    assert set(store.docs) == {"c.json", "live.json", "poisoned.json"}


class FakeNow:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


# -- the index tables (the jobs index's day tables, the entry index's rows) ---------------------

SHIPPED = Settings.from_env({"AzureWebJobsStorage": CONN})


def test_a_day_table_goes_once_every_finished_record_it_lists_is_gone_with_the_shipped_settings() -> None:
    """Shipped: JOB_TTL_SECONDS 7 days, LEDGER_RETENTION_DAYS 30: the day's end + 7 + 30 + a day."""
    s = SHIPPED
    assert (s.retention.ledger, s.job_ttl_s) == (30, 7 * 86_400)
    last = retention.day_tables_last_due(NOW, s.retention.ledger, s.job_ttl_s)
    assert last == date(2026, 1, 21)  # 2026-03-01 - 39 days
    # the last job of 2026-01-21 (created 23:59:59) completes by its TTL, 2026-01-28, its record
    # goes 30 days after: 2026-02-27; the table goes on 2026-03-01, a day after the policy's day
    newest_record_gone = datetime(2026, 1, 22, tzinfo=UTC) + timedelta(seconds=s.job_ttl_s, days=30)
    assert newest_record_gone + timedelta(days=retention.TABLE_MARGIN_DAYS) <= NOW
    names = [f"ledger{d}" for d in ("20260120", "20260121", "20260122", "20260301")]
    assert retention.due_day_tables(names, "ledger", last) == names[:2]


def test_a_day_table_follows_changed_settings() -> None:
    """Twin of the shipped test: a 10-day ledger and a 1-day TTL make a table due 13 days after its day."""
    names = ["jobs20260216", "jobs20260217", "jobs20260218"]

    def due(now: datetime) -> list[str]:
        last = retention.day_tables_last_due(now, 10, 86_400)
        assert last is not None
        return retention.due_day_tables(names, "jobs", last)

    assert due(NOW) == ["jobs20260216"]
    assert due(NOW + timedelta(hours=23)) == ["jobs20260216"]
    assert due(NOW + timedelta(days=1)) == names[:2]


def test_only_day_tables_of_the_prefix_are_due_and_a_ledger_kept_forever_keeps_them() -> None:
    names = [
        "ledger20200101",
        "ledger2020010",  # not a day
        "ledger20201345",  # not a date
        "ledgerentries",
        "ledger2x20200101",  # another app's prefix
        "ledger202001011",
    ]
    last = retention.day_tables_last_due(NOW, 30, 0)
    assert last is not None and retention.due_day_tables(names, "ledger", last) == ["ledger20200101"]
    assert retention.day_tables_last_due(NOW, 0, 0) is None  # a ledger kept forever: no day is due
    assert retention.table_day("ledger20260101", "ledger") == date(2026, 1, 1)


def test_the_list_tables_query_returns_the_due_days_only() -> None:
    where = retention.day_tables_filter("ledger", date(2026, 1, 21))
    assert where == "TableName ge 'ledger0' and TableName le 'ledger20260121'"
    from shared.storage.memory_tables import MemoryTables

    tables = MemoryTables()
    for name in ("ledger20260120", "ledger20260121", "ledger20260122", "ledgerentries", "ledgeraudit"):
        tables.table(name).create()
    assert tables.names(where) == ["ledger20260120", "ledger20260121"]


def test_entry_rows_are_due_a_day_after_their_entries_with_the_shipped_settings() -> None:
    assert SHIPPED.retention.archive == 90
    assert retention.entry_rows_cutoff(NOW, SHIPPED.retention.archive) == NOW - timedelta(days=91)
    assert retention.entry_rows_cutoff(NOW, 0) is None
    assert retention.entry_rows_cutoff(NOW, 5) == NOW - timedelta(days=6)  # twin: a changed setting


def test_the_entry_rows_query_is_a_key_range_and_a_write_time() -> None:
    cutoff = NOW - timedelta(days=91)
    where = entry_index.expired_filter("poisoned", cutoff)
    prefix, timestamp = where.split(" and Timestamp lt ")
    assert timestamp == "datetime'2025-11-30T00:00:00.000000Z'"
    low = prefix.split("RowKey ge ")[1].strip("'")
    before = ArchiveEntry.parse({"archived_at": isoformat(cutoff - timedelta(milliseconds=1))}).key(
        "jobs/a/1.json"
    )
    at = ArchiveEntry.parse({"archived_at": isoformat(cutoff)}).key("jobs/a/1.json")
    assert before >= low > at  # archived before the cutoff: in the range; at it: not
    assert prefix.startswith("PartitionKey eq 'poisoned' and ")


def test_retention_queries_every_state_an_entry_can_be_in() -> None:
    """The entry index's partitions are its entries' states: the code writes states as EntryState
    members only (no raw string), and retention queries every member."""
    root = Path(__file__).resolve().parents[3] / "shared"
    raw: set[str] = set()
    used: set[str] = set()
    for path in [*root.glob("poison/*.py"), root / "interfaces" / "console" / "actions.py"]:
        text = path.read_text()
        raw |= set(re.findall(r'Verdict\(\s*"(\w+)"', text))
        raw |= set(re.findall(r'(?:set_state|_mark)\([^)]*?"(\w+)"', text))
        used |= set(re.findall(r"EntryState\.([A-Z_]+)", text))
    assert raw == set(), "states written as strings"
    assert {"POISONED", "REPLAYED", "SKIPPED_COMPLETED", "STALE", "DUPLICATE_OF_COMPLETED", "PARKED"} <= used
    assert set(EntryState) == set(ENTRY_STATES)


def test_a_parked_message_expires_with_the_archive_retention() -> None:
    shipped = RetentionDays().archive
    assert parked_ttl_s(shipped) == shipped * 86_400 == 7_776_000
    assert parked_ttl_s(1) == 86_400
    assert parked_ttl_s(0) == NEVER_EXPIRE, "entries kept forever: so is their parked message"
