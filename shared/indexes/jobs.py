"""The jobs index: one Table entity per job, in one table per UTC day of creation.

Table `<ledger container, letters and digits><YYYYMMDD>`, PartitionKey `j`, RowKey newest-first (`shared/index_keys.newest_first`),
properties status, kind, reason code, reason, created_at, updated_at. A page is one query with
`$top` and a server-side filter (status, kind, reason code) on the newest day, continuing into older
days: O(page), whatever the history. A day per table keeps each query to one day's jobs on Azurite
(it scans a table per query) and makes retention a table delete: once every finished record a
day's table lists is past the ledger's retention (the day + JOB_TTL_SECONDS + LEDGER_RETENTION_DAYS
+ a day: `shared/retention.due_day_tables`), the retention run drops the table (`due_tables`, `drop`:
one list-tables query for the due days, one Delete Table each; shared/pipeline/retention_sweep.py, in Azure
too). A page skips a day table that is gone (dropped since its day list was read).

The ledger's store is wrapped (`IndexedStore`): every record write except a claim (`in_progress`)
upserts the job's entity after the ledger write, so the happy path adds one request (at completion).
A running job therefore shows its last indexed status (queued) in lists; its own page reads the ledger.
The index is a view: a failed index write is logged, never fails the ledger write.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from shared.config.retention import day_tables_filter, table_day
from shared.core.documents import Document, DocumentStore, TagQuery
from shared.indexes.keys import (
    MAX_MS,
    clip,
    day_of,
    decode_token,
    encode_token,
    newest_first,
    quoted,
    stamp_ms,
)
from shared.storage.failures import NotFound, StorageError, failure_name
from shared.storage.ports import TableOp, Tables, in_transactions

log = logging.getLogger("jobs.index")
PARTITION = "j"
NOT_INDEXED = frozenset({"in_progress"})
"""Statuses whose write does not touch the index (a claim): the happy path pays one index write."""
DAYS_TTL_S = 10.0
MAX_QUERIES = 8
"""Queries one page may take at most (a filter matching nothing old stops there with a token)."""


@dataclass(frozen=True)
class IndexRow:
    id: str
    status: str
    kind: str
    created_at: str
    updated_at: str
    reason_code: str = ""
    reason: str = ""
    queue: str = ""
    """The declared queue of a job off the default queue ("": the default)."""


@dataclass(frozen=True)
class IndexPage:
    rows: list[IndexRow]
    next_token: str | None
    queries: int


def should_index(data: Mapping[str, Any]) -> bool:
    return isinstance(data.get("id"), str) and str(data.get("status", "")) not in NOT_INDEXED


def entity_of(data: Mapping[str, Any]) -> dict[str, Any]:
    """The job's index entity (pure)."""
    created = str(data.get("created_at") or "")
    queue = str(data.get("queue") or "")  # a queue other than the default (shared/runtime/lanes.py)
    key = f"{queue}/{data['id']}" if queue else str(data["id"])
    return {
        "PartitionKey": PARTITION,
        "RowKey": newest_first(created, key),
        "id": str(data["id"]),
        "queue": clip(queue, 64),  # "" on the default queue: a page of its jobs filters on it
        "status": clip(data.get("status"), 32),
        "kind": clip(data.get("kind"), 64),
        "reason_code": clip(data.get("reason_code") or "", 64),
        "reason": clip(data.get("reason") or data.get("error") or ""),
        "created_at": created,
        "updated_at": clip(data.get("updated_at") or "", 40),
    }


def row_of(entity: Mapping[str, Any]) -> IndexRow:
    return IndexRow(
        id=str(entity.get("id", "")),
        status=str(entity.get("status", "")),
        kind=str(entity.get("kind", "")),
        created_at=str(entity.get("created_at", "")),
        updated_at=str(entity.get("updated_at", "")),
        reason_code=str(entity.get("reason_code", "")),
        reason=str(entity.get("reason", "")),
        queue=str(entity.get("queue", "")),
    )


def time_keys(since: str = "", until: str = "") -> tuple[str, str]:
    """RowKey bounds of jobs created in [since, until] (ISO stamps, either may be ""): keys from
    the first (inclusive) below the second (exclusive); "" for an open end (pure)."""
    low = f"{MAX_MS - stamp_ms(until):013d}_" if until else ""
    high = f"{MAX_MS - stamp_ms(since):013d}_~" if since else ""
    return low, high


def day_span(days: list[str], since: str = "", until: str = "") -> list[str]:
    """The day tables (newest first) that can hold jobs created in [since, until] (pure)."""
    first = day_of(since) if since else ""
    last = day_of(until) if until else ""
    return [d for d in days if (not first or d >= first) and (not last or d <= last)]


def query_filter(
    status: str = "",
    kind: str = "",
    reason_code: str = "",
    id_prefix: str = "",
    since: str = "",
    until: str = "",
    queue: str | None = None,
) -> str:
    """The OData filter of a page; an id prefix is a range (ids are letters, digits and `._:-`,
    all below `~`); a time range is a RowKey range (keys are newest-first creation stamps);
    `queue`: one queue's jobs ("": the default queue's; rows written before queues were
    indexed have no `queue` and are listed only without this filter)."""
    parts = [f"PartitionKey eq {quoted(PARTITION)}"]
    low, high = time_keys(since, until)
    if low:
        parts.append(f"RowKey ge {quoted(low)}")
    if high:
        parts.append(f"RowKey lt {quoted(high)}")
    for name, value in (("status", status), ("kind", kind), ("reason_code", reason_code)):
        if value:
            parts.append(f"{name} eq {quoted(value)}")
    if id_prefix:
        parts.append(f"id ge {quoted(id_prefix)} and id lt {quoted(id_prefix + '~')}")
    if queue is not None:
        parts.append(f"queue eq {quoted(queue)}")
    return " and ".join(parts)


class JobIndex:
    """Reads and writes the per-day job tables."""

    def __init__(self, tables: Tables, prefix: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.tables = tables
        self.prefix = prefix
        self.clock = clock
        self._lock = threading.Lock()
        self._known: set[str] = set()
        self._days: tuple[float, list[str]] | None = None

    # -- writes ---------------------------------------------------------------------------------

    def put(self, data: Mapping[str, Any]) -> None:
        """Upsert the job's entity (creating its day's table on first use)."""
        entity = entity_of(data)
        name = self.table_name(day_of(entity["created_at"]))
        table = self.tables.table(name)
        try:
            table.upsert(entity)
        except NotFound:  # a new day, or a day table retention dropped
            self.ensure_table(name, fresh=True)
            table.upsert(entity)

    def put_many(self, records: Iterable[Mapping[str, Any]]) -> int:
        """Upsert many jobs' entities: one entity group transaction per day table and 100 jobs (a
        transaction that fails is done entity by entity). Best effort, like every index write: a
        failure is logged. Returns the requests sent."""
        by_table: dict[str, dict[str, tuple[Mapping[str, Any], dict[str, Any]]]] = {}
        for data in records:
            if should_index(data):
                entity = entity_of(data)
                table = by_table.setdefault(self.table_name(day_of(entity["created_at"])), {})
                table[entity["RowKey"]] = (data, entity)  # once per transaction: the last write wins
        record_of = {key: data for keyed in by_table.values() for key, (data, _) in keyed.items()}

        def one(op: TableOp) -> None:  # a missing day table, a reset connection: one by one
            try:
                self.put(record_of[op.entity["RowKey"]])
            except StorageError as exc:
                log.warning("job %s: index not updated (%s)", op.entity["id"], failure_name(exc))

        sent = 0
        for name, keyed in by_table.items():
            ops = [TableOp("upsert", entity) for _, entity in keyed.values()]
            sent += in_transactions(self.tables.table(name), ops, one)
        return sent

    def table_name(self, day: str) -> str:
        return f"{self.prefix}{day}"

    def ensure_table(self, name: str, fresh: bool = False) -> None:
        """Create the table unless this process knows it exists (`fresh`: it was found missing)."""
        if name in self._known and not fresh:
            return
        self.tables.table(name).create()
        with self._lock:
            self._known.add(name)
            self._days = None

    def due_tables(self, last: date) -> list[str]:
        """The day tables of days up to `last`: one list-tables query (a page per 1,000 names)."""
        return self.tables.names(day_tables_filter(self.prefix, last))

    def drop(self, name: str) -> None:
        """Delete a day table (retention): one request; gone already is no error."""
        self.tables.table(name).drop()
        with self._lock:
            self._known.discard(name)
            self._days = None

    # -- reads ----------------------------------------------------------------------------------

    def days(self, fresh: bool = False) -> list[str]:
        """Days that have a table, newest first (one listing, kept `DAYS_TTL_S`)."""
        with self._lock:
            if self._days and not fresh and self.clock() - self._days[0] < DAYS_TTL_S:
                return self._days[1]
        low, high = f"{self.prefix}0", f"{self.prefix}9~"
        names = self.tables.names(f"TableName ge {quoted(low)} and TableName lt {quoted(high)}")
        cut = len(self.prefix)
        days = sorted((n[cut:] for n in names if table_day(n, self.prefix) is not None), reverse=True)
        with self._lock:
            self._days = (self.clock(), days)
        return days

    def page(
        self,
        status: str = "",
        kind: str = "",
        reason_code: str = "",
        token: str | None = None,
        size: int = 50,
        until_day: str = "",
        id_prefix: str = "",
        since: str = "",
        until: str = "",
        queue: str | None = None,
    ) -> IndexPage:
        """Up to `size` jobs newest first from `token` on (None: the newest), and the next token;
        `since`/`until` (ISO stamps) keep to jobs created in that range: only its day tables are
        queried, each with a RowKey range; `queue` to one queue's jobs (`query_filter`)."""
        where = query_filter(status, kind, reason_code, id_prefix, since, until, queue)
        at = decode_token(token) or {}
        days = [d for d in day_span(self.days(), since, until) if (not until_day or d <= until_day)]
        start = str(at.get("day") or (days[0] if days else ""))
        cont: Any = at.get("cont")
        rows: list[IndexRow] = []
        queries = 0
        older = [d for d in days if d <= start]
        for i, day in enumerate(older):
            while True:
                if queries >= MAX_QUERIES:
                    return IndexPage(rows, encode_token({"day": day, "cont": cont}), queries)
                queries += 1
                try:
                    got = self.tables.table(self.table_name(day)).query(
                        where, size=size - len(rows), continuation=cont
                    )
                except NotFound:  # dropped by retention since the day list was read
                    with self._lock:
                        self._days = None
                    break
                rows.extend(row_of(e) for e in got.rows[: size - len(rows)])
                cont = got.continuation
                if len(rows) >= size:
                    if cont:
                        return IndexPage(rows, encode_token({"day": day, "cont": cont}), queries)
                    following = older[i + 1] if i + 1 < len(older) else None
                    return IndexPage(rows, encode_token({"day": following}) if following else None, queries)
                if not cont:
                    break
            cont = None
        return IndexPage(rows, None, queries)


class IndexedStore:
    """A `DocumentStore` (the ledger's) whose writes also upsert the job index, after the write."""

    def __init__(self, inner: DocumentStore, index: JobIndex) -> None:
        self.inner = inner
        self.index = index

    def _indexed(self, doc: Document) -> Document:
        if should_index(doc.data):
            try:
                self.index.put(doc.data)
            except StorageError as exc:  # a view: the ledger write stands
                log.warning("job %s: index not updated (%s)", doc.data.get("id"), failure_name(exc))
        return doc

    def read(self, name: str) -> Document | None:
        return self.inner.read(name)

    def create(self, name: str, data: dict[str, Any]) -> Document:
        return self._indexed(self.inner.create(name, data))

    def replace(self, name: str, current: Document, data: dict[str, Any]) -> Document:
        return self._indexed(self.inner.replace(name, current, data))

    def upsert(self, name: str, data: dict[str, Any]) -> Document:
        return self._indexed(self.inner.upsert(name, data))

    def delete(self, name: str) -> None:
        self.inner.delete(name)

    def names(self, prefix: str) -> Iterator[tuple[str, datetime | None]]:
        return self.inner.names(prefix)

    def find(self, query: TagQuery) -> Iterator[str]:
        return self.inner.find(query)
