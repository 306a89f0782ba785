"""Retention of the Table indexes (issue 20), on the in-memory account and on Azurite: the jobs
index's day tables go once every record they list is past the ledger's retention, the entry
index's rows once their entries are past the archive's; what is not due stays, with its entities.

The run's clock is fixed at NOW (100 days after the test's start). An entry-index row is due by
its RowKey (first archival) and by the service's `Timestamp` (its last write: the test's start,
which the test cannot move), so the stamps below are relative to both."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.core import archive_layout
from shared.core.envelope import isoformat
from shared.indexes.entry_rows import COUNT_PARTITION, LISTED, EntryState
from shared.indexes.jobs import JobIndex
from shared.pipeline import retention_sweep as retention_apply
from shared.poison import archive
from shared.poison.entry import ArchiveEntry
from shared.runtime.wiring import Runtime
from tests.integration.backends import Backend

START = datetime.now(UTC)
NOW = START + timedelta(days=100)
SHIPPED_TTL_S = 7 * 86_400.0


@pytest.fixture
def rt(storage_backend: Backend) -> Runtime:
    return storage_backend.runtime()


def _job(job_id: str, created: datetime) -> dict[str, str]:
    stamp = isoformat(created)
    return {"id": job_id, "status": "completed", "kind": "noop", "created_at": stamp, "updated_at": stamp}


def _tables(rt: Runtime) -> list[str]:
    prefix = rt.job_index.prefix
    return sorted(rt.job_index.tables.names(f"TableName ge '{prefix}0' and TableName lt '{prefix}9~'"))


def _entry(rt: Runtime, job_id: str, state: str, archived: datetime) -> str:
    entry = ArchiveEntry.new(
        f'{{"id": "{job_id}"}}'.encode(),
        job_id,
        True,
        EntryState(state),
        f"bad_input: {job_id}",
        now=archived,
        queue_message_id="q",
        dequeue_count=1,
        record=None,
    )
    with archive.index_writes(rt) as writes:
        return archive.write_entry(rt.archive, entry, writes)


def _rows(rt: Runtime) -> dict[str, set[str]]:
    rows = [e for e in rt.entry_index.table.rows("PartitionKey ne '~count'")]
    found: dict[str, set[str]] = {}
    for e in rows:
        found.setdefault(str(e["PartitionKey"]), set()).add(str(e["name"]))
    return found


def test_due_day_tables_are_dropped_and_the_jobs_page_keeps_working(rt: Runtime) -> None:
    assert rt.settings.retention.ledger == 30
    ages = {"a60": 60, "a40": 40, "a39": 39, "a38": 38, "a1": 1}  # days before NOW
    for job_id, days in ages.items():
        rt.job_index.put(_job(job_id, NOW - timedelta(days=days, hours=0)))
    day = {
        job_id: rt.job_index.table_name((NOW - timedelta(days=d)).strftime("%Y%m%d"))
        for job_id, d in ages.items()
    }
    assert _tables(rt) == sorted(day.values())
    assert [r.id for r in rt.job_index.page(size=50).rows] == [
        "a1",
        "a38",
        "a39",
        "a40",
        "a60",
    ]  # days cached

    # another process's run (its own index object): this one's day list is stale meanwhile
    other = JobIndex(rt.job_index.tables, rt.job_index.prefix)
    dry = retention_apply.drop_day_tables(
        retention_apply.TablesReport(), other, NOW, ledger_days=30, job_ttl_s=SHIPPED_TTL_S, dry_run=True
    )
    assert dry.tables_due == sorted([day["a60"], day["a40"], day["a39"]]) and _tables(rt) == sorted(
        day.values()
    )
    done = retention_apply.drop_day_tables(
        retention_apply.TablesReport(), other, NOW, ledger_days=30, job_ttl_s=SHIPPED_TTL_S, dry_run=False
    )
    assert (done.tables_dropped, done.requests, done.error) == (3, 4, None)  # one listing, one delete each
    assert _tables(rt) == sorted([day["a38"], day["a1"]])
    page = rt.job_index.page(size=50)  # the cached list still names the dropped days
    assert [r.id for r in page.rows] == ["a1", "a38"] and page.next_token is None
    assert [r.id for r in rt.job_index.page(size=50).rows] == ["a1", "a38"]
    again = retention_apply.drop_day_tables(
        retention_apply.TablesReport(), other, NOW, ledger_days=30, job_ttl_s=SHIPPED_TTL_S, dry_run=False
    )
    assert (again.tables_due, again.requests) == ([], 1)  # nothing due: one query

    # a job written later to a dropped day (an old job's record changing) recreates its table
    rt.job_index.put(_job("a40-late", NOW - timedelta(days=40)))
    assert day["a40"] in _tables(rt)


def test_due_entry_rows_are_deleted_in_bounded_batches_and_the_counts_follow(rt: Runtime) -> None:
    assert rt.settings.retention.archive == 90
    ancient = [_entry(rt, f"ancient{i}", LISTED, START - timedelta(days=200)) for i in range(3)]
    replayed = _entry(rt, "old-replayed", "replayed", START - timedelta(days=5))
    parked = _entry(rt, "old-parked", "parked", START - timedelta(days=5))
    recent = _entry(rt, "recent", LISTED, NOW - timedelta(days=10))
    assert rt.entry_index.counts() == {"bad_input": 4}
    before = _rows(rt)
    assert before == {LISTED: {*ancient, recent}, "replayed": {replayed}, "parked": {parked}}

    def run(now: datetime, limit: int | None = None, dry_run: bool = False) -> retention_apply.TablesReport:
        return retention_apply.prune_entry_rows(
            retention_apply.TablesReport(),
            rt.entry_index,
            now,
            archive_days=90,
            dry_run=dry_run,
            row_limit=limit,
        )

    # 60 days after the start: the ancient rows' keys are old, but they were written at the start
    early = run(START + timedelta(days=60))
    assert (early.rows.due, early.requests) == (0, len(retention_apply.ENTRY_STATES))  # a query per state
    assert _rows(rt) == before

    dry = run(NOW, dry_run=True)
    assert (dry.rows.due, dry.rows.deleted) == (5, 0) and _rows(rt) == before
    first = run(NOW, limit=2)
    assert (first.rows.due, first.rows.deleted, first.stopped_at_limit) == (2, 2, True)
    rest = run(NOW)
    assert (rest.rows.due, rest.rows.deleted, rest.rows.changed, rest.stopped_at_limit) == (3, 3, 0, False)
    assert _rows(rt) == {LISTED: {recent}}
    assert rt.entry_index.counts() == {"bad_input": 1}, "listed counts follow the rows"
    counters = list(rt.entry_index.table.rows(f"PartitionKey eq '{COUNT_PARTITION}'"))
    assert sum(int(c["n"]) for c in counters) == 1
    assert {n for n, _ in rt.archive.names(archive_layout.JOBS_PREFIX)} >= {*ancient, replayed, parked}, (
        "rows only: the blobs are the blob rules' (lifecycle policy or the blob part of the run)"
    )
    assert run(NOW).rows.due == 0


def test_the_sweep_timer_runs_the_table_part_without_retention_by_app(rt: Runtime) -> None:
    """Azure: the lifecycle policy deletes blobs, nothing deletes tables but this timer."""
    assert not rt.settings.retention_by_app
    rt.job_index.put(_job("old", NOW - timedelta(days=60)))
    rt.job_index.put(_job("new", NOW - timedelta(days=1)))
    rt.clock = lambda: NOW
    report = retention_apply.on_timer(rt)
    assert report is not None and report.rules == [] and report.tables is not None
    assert report.tables.tables_dropped == 1 and [r.id for r in rt.job_index.page().rows] == ["new"]
    assert retention_apply.on_timer(rt) is None  # at most every TABLES_EVERY_S


def test_a_row_written_between_the_query_and_the_delete_is_kept(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transaction deletes If-Match each row's ETag: one row written since the query fails it,
    the rows are then deleted one by one, and the written one stays (counted `written since`),
    its reason-code count with it."""
    index = rt.entry_index
    assert index is not None
    names = [_entry(rt, f"raced{i}", LISTED, START - timedelta(days=200)) for i in range(3)]
    submit = index.table.transact

    def write_one_first(operations: Any) -> Any:
        stored = archive.read_entry(rt.archive, names[1])
        assert stored is not None
        index.put(stored.row)  # the row written again: a new ETag
        return submit(operations)

    monkeypatch.setattr(index.table, "transact", write_one_first)
    done = retention_apply.prune_entry_rows(
        retention_apply.TablesReport(), index, NOW, archive_days=90, dry_run=False
    )
    assert (done.rows.due, done.rows.deleted, done.rows.changed, done.error) == (3, 2, 1, None)
    assert _rows(rt) == {LISTED: {names[1]}}
    assert index.counts() == {"bad_input": 1}


def test_a_table_in_the_due_range_that_is_not_a_day_table_is_never_dropped(rt: Runtime) -> None:
    """The list-tables query is a name range (`<prefix>0` to `<prefix><last due day>`): another
    table whose name falls in it (another container's prefix, digits that are no date) is
    returned and must stay; the jobs page does not read it either."""
    prefix = rt.job_index.prefix
    others = [f"{prefix}1entries", f"{prefix}19991301", f"{prefix}199912311"]
    for name in others:
        rt.job_index.tables.table(name).create()
    rt.job_index.put(_job("old", NOW - timedelta(days=60)))
    done = retention_apply.drop_day_tables(
        retention_apply.TablesReport(),
        rt.job_index,
        NOW,
        ledger_days=30,
        job_ttl_s=SHIPPED_TTL_S,
        dry_run=False,
    )
    assert done.tables_dropped == 1 and done.error is None
    assert _tables(rt) == sorted(others)
    assert rt.job_index.days(fresh=True) == [] and rt.job_index.page().rows == []
