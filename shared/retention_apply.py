"""Retention applied by the app where no lifecycle policy runs (Azurite): the CLI's `retention`
command and the sweep timer with RETENTION_BY_APP on (issue 21). The rules: shared/retention.py.

Cost, per run: finished ledger records come from one Find Blobs by Tags query (`done_at <
cutoff`; the completing write sets the tag with `state=done`), which returns only the due
records, a page per `page` of them. The other rules list their prefix (one request per `page`
blobs, with last-modified: the storage keeps no cheaper index of them). Each due blob costs one
Delete Blob, conditional on If-Unmodified-Since the cutoff, so a blob written again after it was
listed is kept (counted `changed`). Nothing outside the rules' prefixes is listed: the archive's
`edits/` and `console/metrics/`, and ledger records not finished, are never seen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from typing import Protocol

from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError
from azure.storage.blob import ContainerClient

from shared.documents import DocumentStore, TagQuery
from shared.retention import Rule
from shared.runtime import Runtime, get_runtime

log = logging.getLogger("jobs.retention")
PAGE = 500
"""Blobs per listing or query page: each page's due blobs are deleted before the next is read."""
TIMER_LIMIT = 5_000
"""Deletions per timer run at most (the next run goes on): a run stays well inside its timeout."""
TIMER_EVERY_S = 300.0
"""The sweep timer runs every 30 s locally; retention, whose ages are days, at most this often."""
_last_timer_run: dict[int, datetime] = {}

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

    def __init__(self, container: ContainerClient) -> None:
        self.container = container

    def found(self, query: TagQuery, page: int) -> Iterator[list[str]]:
        pages = self.container.find_blobs_by_tags(query.expression(), results_per_page=page).by_page()
        for blobs in pages:
            yield [blob.name for blob in blobs]

    def listed(self, prefix: str, page: int) -> Iterator[list[tuple[str, datetime | None]]]:
        pages = self.container.list_blobs(name_starts_with=prefix or None, results_per_page=page).by_page()
        for blobs in pages:
            yield [(blob.name, blob.last_modified) for blob in blobs]

    def delete_unmodified(self, name: str, cutoff: datetime) -> bool:
        try:
            self.container.delete_blob(name, if_unmodified_since=cutoff)
        except (ResourceModifiedError, ResourceNotFoundError):
            return False
        return True


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
class RetentionReport:
    """One run over every rule."""

    now: datetime
    dry_run: bool
    rules: list[RuleReport] = field(default_factory=list)
    stopped_at_limit: bool = False

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
        room = None if limit is None else limit - report.due
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


def blob_targets(rt: Runtime) -> Callable[[str], RetentionTarget]:
    """The runtime's containers as retention targets."""
    return lambda name: BlobTarget(rt.storage.container(name))


def run(
    rt: Runtime,
    now: datetime | None = None,
    *,
    dry_run: bool = False,
    limit: int | None = None,
    progress: Progress | None = None,
) -> RetentionReport:
    """The settings' rules on the runtime's account, as of `now` (default: the clock)."""
    return apply(
        blob_targets(rt),
        rt.settings.retention_rules(),
        now or rt.clock(),
        dry_run=dry_run,
        limit=limit,
        progress=progress,
    )


def on_timer(rt: Runtime | None = None) -> RetentionReport | None:
    """From the sweep timer: with RETENTION_BY_APP on (the local stack), a run of at most
    TIMER_LIMIT deletions, at most every TIMER_EVERY_S; otherwise nothing, not even a request."""
    rt = rt or get_runtime()
    if not rt.settings.retention_by_app:
        return None
    now = rt.clock()
    last = _last_timer_run.get(id(rt))
    if last is not None and (now - last).total_seconds() < TIMER_EVERY_S:
        return None
    _last_timer_run[id(rt)] = now
    report = run(rt, now, limit=TIMER_LIMIT)
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
