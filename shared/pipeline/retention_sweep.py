"""Retention applied by the app where no lifecycle policy runs (Azurite): the CLI's `retention`
command and the sweep timer with RETENTION_BY_APP on (issue 21). The rules: shared/config/retention.py.

Cost, per run: finished ledger records come from one Find Blobs by Tags query (`done_at <
cutoff`; the completing write sets the tag with `state=done`), which returns only the due
records, a page per `page` of them. The other rules list their prefix (one request per `page`
blobs, with last-modified: the storage keeps no cheaper index of them). Each due blob costs one
Delete Blob, conditional on If-Unmodified-Since the cutoff, so a blob written again after it was
listed is kept (counted `changed`). Nothing outside the rules' prefixes is listed: the archive's
`edits/` and `console/metrics/`, and ledger records not finished, are never seen.

The Table indexes (`apply_tables`; no lifecycle policy deletes table data, so this part runs in
Azure too, from the sweep timer whatever RETENTION_BY_APP says): the jobs index's day tables whose
records are all past the ledger's retention (one list-tables query for the due days, one Delete
Table each) and the entry index's rows whose entries are past the archive's (per state, one query
and one transaction per 100 due rows; `EntryIndex.prune`). With nothing due a run costs 1 + one
query per entry state (9 requests: 8 states). The audit table is never touched.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime
from itertools import islice
from typing import Protocol

from shared.config.retention import Rule, day_tables_last_due, due_day_tables, entry_rows_cutoff
from shared.core.documents import DocumentStore, TagQuery
from shared.indexes.entries import EntryIndex
from shared.indexes.entry_rows import Pruned
from shared.indexes.jobs import JobIndex
from shared.poison.bulk import PURGE_STATES
from shared.poison.parking import PARKED
from shared.runtime.wiring import Runtime, get_runtime
from shared.storage.failures import StorageError, failure_name
from shared.storage.ports import Blobs

log = logging.getLogger("jobs.retention")
PAGE = 500
"""Blobs per listing or query page: each page's due blobs are deleted before the next is read."""
TIMER_LIMIT = 5_000
"""Deletions per timer run at most (the next run goes on): a run stays well inside its timeout."""
TIMER_EVERY_S = 300.0
"""The sweep timer runs every 30 s locally; retention, whose ages are days, at most this often."""
TABLES_EVERY_S = 3_600.0
"""The index tables' part of the timer, at most this often (their ages are days too)."""
TIMER_TABLES_LIMIT = 100
"""Day tables dropped per timer run at most (one a day is due in steady state)."""
ENTRY_STATES = (*PURGE_STATES, PARKED)
"""Every state an archive entry can be in: the entry index's partitions that retention queries."""
_last_timer_run: dict[int, datetime] = {}
_last_tables_run: dict[int, datetime] = {}

Progress = Callable[[str, int, int], None]
"""(rule name, blobs seen so far, blobs due so far), after each page."""


class RetentionTarget(Protocol):
    """The three operations retention needs from one container."""

    def found(self, query: TagQuery, page: int) -> Iterator[list[str]]:
        """Pages of the names whose index tags match `query` (one request a page)."""

    def listed(self, prefix: str, page: int) -> Iterator[list[tuple[str, datetime | None]]]:
        """Pages of (name, last modified) under `prefix` (one request a page)."""

    def delete_unmodified(self, name: str, cutoff: datetime) -> bool:
        """Delete unless written after `cutoff` (or gone): False when kept."""


class BlobTarget:
    """A container of the storage account (Azurite locally)."""

    def __init__(self, blobs: Blobs) -> None:
        self.blobs = blobs

    def found(self, query: TagQuery, page: int) -> Iterator[list[str]]:
        return self.blobs.found(query, page)

    def listed(self, prefix: str, page: int) -> Iterator[list[tuple[str, datetime | None]]]:
        for blobs in self.blobs.pages(prefix, page):
            yield [(blob.name, blob.last_modified) for blob in blobs]

    def delete_unmodified(self, name: str, cutoff: datetime) -> bool:
        return self.blobs.delete(name, cutoff)


class DocumentTarget:
    """A `DocumentStore` (the simulation's memory store): the same decisions, not atomic."""

    def __init__(self, store: DocumentStore) -> None:
        self.store = store

    def found(self, query: TagQuery, page: int) -> Iterator[list[str]]:
        names = iter(list(self.store.find(query)))
        while batch := list(islice(names, page)):
            yield batch

    def listed(self, prefix: str, page: int) -> Iterator[list[tuple[str, datetime | None]]]:
        found = iter(list(self.store.names(prefix)))
        while batch := list(islice(found, page)):
            yield batch

    def delete_unmodified(self, name: str, cutoff: datetime) -> bool:
        found = dict(self.store.names(name))
        if name not in found or (found[name] or cutoff) > cutoff:
            return False
        self.store.delete(name)
        return True


@dataclass
class RuleReport:
    """What one rule found and did."""

    rule: Rule
    due: int = 0
    """Past the rule when listed (deleted, or would be in a dry run, unless `changed`)."""
    deleted: int = 0
    changed: int = 0
    """Due when listed, written again (or gone) before its delete: kept."""
    kept: int | None = 0
    """Listed and not due; None where the query returns due blobs only (nothing else is read)."""
    requests: int = 0


@dataclass
class TablesReport:
    """What one run did to the index tables."""

    last_due_day: date | None = None
    """The newest day whose jobs-index table was due (None: the ledger keeps records forever)."""
    tables_due: list[str] = field(default_factory=list)
    tables_dropped: int = 0
    rows_cutoff: datetime | None = None
    """Entry-index rows written before this were due (None: entries are kept forever)."""
    rows: Pruned = field(default_factory=Pruned)
    requests: int = 0
    stopped_at_limit: bool = False
    error: str | None = None
    """The storage error that ended the run early (the next run goes on)."""


@dataclass
class RetentionReport:
    """One run over every rule."""

    now: datetime
    dry_run: bool
    rules: list[RuleReport] = field(default_factory=list)
    stopped_at_limit: bool = False
    tables: TablesReport | None = None
    """The index tables' part (None: not run)."""

    @property
    def due(self) -> int:
        return sum(r.due for r in self.rules)

    @property
    def deleted(self) -> int:
        return sum(r.deleted for r in self.rules)

    @property
    def requests(self) -> int:
        return sum(r.requests for r in self.rules)


def apply(
    target: Callable[[str], RetentionTarget],
    rules: list[Rule],
    now: datetime,
    *,
    dry_run: bool,
    page: int = PAGE,
    limit: int | None = None,
    progress: Progress | None = None,
) -> RetentionReport:
    """Apply `rules` as of `now` (`target` gives a container's operations); a dry run only
    counts. At most `limit` blobs due in all (the run stops there: the next one goes on)."""
    report = RetentionReport(now, dry_run)
    for rule in rules:
        done = RuleReport(rule, kept=None if rule.due_query(now) is not None else 0)
        report.rules.append(done)
        room = limit - report.due if limit is not None else None
        if room is not None and room <= 0:
            report.stopped_at_limit = True
            continue
        report.stopped_at_limit |= _apply_rule(
            target(rule.container), rule, now, done, dry_run, page, room, progress
        )
    return report


def _apply_rule(
    target: RetentionTarget,
    rule: Rule,
    now: datetime,
    done: RuleReport,
    dry_run: bool,
    page: int,
    room: int | None,
    progress: Progress | None,
) -> bool:
    """One rule, page by page; True when it stopped at `room`."""
    cutoff = rule.cutoff(now)
    query = rule.due_query(now)
    pages: Iterator[list[tuple[str, datetime | None]]] = (
        ([(name, None) for name in names] for names in target.found(query, page))
        if query is not None
        else target.listed(rule.prefix, page)
    )
    seen = 0
    for batch in pages:
        done.requests += 1
        for name, modified in batch:
            seen += 1
            if query is None and (modified is None or not rule.due(modified, now)):
                done.kept = (done.kept or 0) + 1
                continue
            if room is not None and done.due >= room:
                return True
            done.due += 1
            if dry_run:
                continue
            done.requests += 1
            if target.delete_unmodified(name, cutoff):
                done.deleted += 1
            else:
                done.changed += 1
        if progress is not None:
            progress(rule.name, seen, done.due)
    return False


def apply_tables(
    job_index: JobIndex,
    entry_index: EntryIndex,
    now: datetime,
    *,
    ledger_days: int,
    archive_days: int,
    job_ttl_s: float,
    dry_run: bool,
    table_limit: int | None = None,
    row_limit: int | None = None,
    states: tuple[str, ...] = ENTRY_STATES,
) -> TablesReport:
    """Drop the jobs index's due day tables and delete the entry index's due rows as of `now` (a
    dry run only counts); at most `table_limit` tables and `row_limit` rows. A storage error ends the run
    (logged, in `error`): what is left is due again at the next."""
    done = TablesReport()
    try:
        drop_day_tables(done, job_index, now, ledger_days, job_ttl_s, dry_run, table_limit)
        prune_entry_rows(done, entry_index, now, archive_days, dry_run, row_limit, states)
    except StorageError as exc:
        done.error = failure_name(exc)
        log.warning("retention of the index tables stopped (%s); the next run goes on", done.error)
    return done


def drop_day_tables(
    done: TablesReport,
    job_index: JobIndex,
    now: datetime,
    ledger_days: int,
    job_ttl_s: float,
    dry_run: bool,
    table_limit: int | None = None,
) -> TablesReport:
    """The jobs index's part of `apply_tables`, noted in `done` (StorageError raised)."""
    last = day_tables_last_due(now, ledger_days, job_ttl_s)
    if last is None:
        return done
    done.last_due_day = last
    listed = job_index.due_tables(last)
    done.requests += 1 + len(listed) // 1000
    due = due_day_tables(listed, job_index.prefix, last)
    if table_limit is not None and len(due) > table_limit:
        due, done.stopped_at_limit = due[:table_limit], True
    done.tables_due = due
    for name in [] if dry_run else due:
        done.requests += 1
        job_index.drop(name)
        done.tables_dropped += 1
    return done


def prune_entry_rows(
    done: TablesReport,
    entry_index: EntryIndex,
    now: datetime,
    archive_days: int,
    dry_run: bool,
    row_limit: int | None = None,
    states: tuple[str, ...] = ENTRY_STATES,
) -> TablesReport:
    """The entry index's part of `apply_tables`, noted in `done` (StorageError raised)."""
    cutoff = entry_rows_cutoff(now, archive_days)
    if cutoff is None:
        return done
    done.rows_cutoff = cutoff
    done.rows = entry_index.prune(states, cutoff, limit=row_limit or 10**9, dry_run=dry_run)
    done.requests += done.rows.requests
    done.stopped_at_limit |= done.rows.stopped_at_limit
    return done


def run_tables(
    rt: Runtime,
    now: datetime,
    *,
    dry_run: bool = False,
    table_limit: int | None = None,
    row_limit: int | None = None,
) -> TablesReport:
    """`apply_tables` with the runtime's indexes and settings."""
    return apply_tables(
        rt.job_index,
        rt.entry_index,
        now,
        ledger_days=rt.settings.retention.ledger,
        archive_days=rt.settings.retention.archive,
        job_ttl_s=rt.settings.job_ttl_s,
        dry_run=dry_run,
        table_limit=table_limit,
        row_limit=row_limit,
    )


def blob_targets(rt: Runtime) -> Callable[[str], RetentionTarget]:
    """The runtime's containers as retention targets."""
    return lambda name: BlobTarget(rt.account.blobs(name))


def run(
    rt: Runtime,
    now: datetime | None = None,
    *,
    dry_run: bool = False,
    limit: int | None = None,
    progress: Progress | None = None,
) -> RetentionReport:
    """The settings' rules on the runtime's account, and the index tables, as of `now` (default:
    the clock)."""
    now = now or rt.clock()
    report = apply(
        blob_targets(rt),
        rt.settings.retention_rules(),
        now,
        dry_run=dry_run,
        limit=limit,
        progress=progress,
    )
    report.tables = run_tables(rt, now, dry_run=dry_run, table_limit=limit, row_limit=limit)
    return report


def _due(runs: dict[int, datetime], rt: Runtime, now: datetime, every_s: float) -> bool:
    last = runs.get(id(rt))
    if last is not None and (now - last).total_seconds() < every_s:
        return False
    runs[id(rt)] = now
    return True


def on_timer(rt: Runtime | None = None) -> RetentionReport | None:
    """From the sweep timer. The index tables (no lifecycle policy deletes them, in Azure either):
    at most every TABLES_EVERY_S, at most TIMER_TABLES_LIMIT tables and TIMER_LIMIT rows. The blob
    rules with RETENTION_BY_APP on (the local stack): at most every TIMER_EVERY_S, at most
    TIMER_LIMIT deletions. None when neither part was due."""
    rt = rt or get_runtime()
    now = rt.clock()
    blobs = rt.settings.retention_by_app and _due(_last_timer_run, rt, now, TIMER_EVERY_S)
    tables = _due(_last_tables_run, rt, now, TABLES_EVERY_S)
    if not blobs and not tables:
        return None
    report = (
        apply(blob_targets(rt), rt.settings.retention_rules(), now, dry_run=False, limit=TIMER_LIMIT)
        if blobs
        else RetentionReport(now, dry_run=False)
    )
    if tables:
        report.tables = run_tables(rt, now, table_limit=TIMER_TABLES_LIMIT, row_limit=TIMER_LIMIT)
        done = report.tables
        if done is not None and (done.tables_dropped or done.rows.due):
            log.info(
                "retention: %d jobs-index day tables dropped, %d entry-index rows deleted "
                "(%d written since, kept; %d requests)%s",
                done.tables_dropped,
                done.rows.deleted,
                done.rows.changed,
                done.requests,
                "; more at the next run" if done.stopped_at_limit else "",
            )
    if report.due:
        log.info(
            "retention: %d due, %d deleted, %d written since (%d requests)%s",
            report.due,
            report.deleted,
            sum(r.changed for r in report.rules),
            report.requests,
            "; more at the next run" if report.stopped_at_limit else "",
        )
    return report
