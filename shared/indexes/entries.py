"""The poison archive's index: one Table entity per archive entry, partitioned by state.

Table `<archive container, letters and digits>entries`, PartitionKey = the entry's state (poisoned / parked / replayed / deleted /
...), RowKey = newest-first archive stamp + the entry name (`index_key`, kept in the entry so every
later change finds the same row). A page of a state is one query with `$top`; a change of state
moves the row (delete + upsert: two requests). Names and reasons are enough to draw the page, so
no entry blob is read to list. Actions address entries by name (one read each), never by listing.

Each row carries its reason code (`reason_code_of`). Listed (poisoned) entries are counted per
reason code in partition `~count` of the same table: `SHARDS` counter rows per code (RowKey
`<code>|<shard>`, the shard from the entry name, so concurrent writers rarely meet), changed with
If-Match on the counter's ETag (kept per process: one request when no one else changed that
shard, three when someone did) whenever an entry enters or leaves the listed state. Reading every
count is one query. Counters are best effort like the rows: a failed or interrupted update leaves a
count off by that entry (`recount` rebuilds them from the rows).

Error-text search has no index (Table storage has no substring filter): `scan` reads a state's
partition newest first, 500 rows a query, at most `SCAN_QUERIES` queries and no new query after
`SCAN_SECONDS` a call, and returns the matches with the RowKey reached, from which the next call
goes on.

Retention (`prune`): an entry blob goes once not written for ARCHIVE_RETENTION_DAYS (the lifecycle
policy, or shared/pipeline/retention_sweep.py); its row follows, by the same age a day later. A row's RowKey
starts with its entry's first archival and the service stamps its `Timestamp` at every write, which
follows every write of the entry: the rows due in a state's partition are one range query,
`RowKey ge <cutoff's key> and Timestamp lt <cutoff>` (`expired_filter`), which returns only them
(an entry archived long ago but written since, such as the same body poisoned again, keeps its row).
They are deleted 100 a transaction (one partition each), If-Match their ETag (a row written since
the query is kept); a listed row's reason-code count goes down with it (one request per counter row
changed). Cost: per state, one query per 100 due rows (one when none is due) and one transaction.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from shared.indexes.entry_rows import (
    COUNT_PARTITION,
    COUNT_TRIES,
    LISTED,
    MAX_QUERIES,
    SCAN_QUERIES,
    SCAN_ROWS,
    SCAN_SECONDS,
    TRANSACTION_SIZE,
    EntryRow,
    Pruned,
    add_deltas,
    count_changes,
    counted_code,
    counter_key,
    counts_of,
    entity_of,
    expired_filter,
    matches,
    queue_counts_of,
    reason_code_of,
    row_of,
)
from shared.indexes.keys import quoted
from shared.storage.failures import AlreadyExists, ConditionFailed, NotFound, StorageError, failure_name
from shared.storage.ports import Row, TableOp, Tables, in_transactions
from shared.storage.tables import query_rows, upsert_creating

log = logging.getLogger("jobs.index")


def best_effort(name: str, action: Callable[..., None], *args: Any) -> None:
    """Run an index write; a failure is logged, never raised: the entry blob is the truth, and a
    poison handler must not fail (and retry) because the view could not be updated."""
    try:
        action(*args)
    except StorageError as exc:
        log.warning("poison entry %s: index not updated (%s)", name, failure_name(exc))


def _one_by_one(
    keyed: Mapping[str, EntryRow], action: Callable[[EntryRow], None]
) -> Callable[[TableOp], None]:
    """An operation of a failed transaction done alone: `action` on its row, best effort."""

    def one(op: TableOp) -> None:
        row = keyed[str(op.entity["RowKey"])]
        best_effort(row.name, action, row)

    return one


class EntryIndex:
    """Reads and writes the `poisonentries` table."""

    def __init__(self, tables: Tables, name: str) -> None:
        self.name = name
        self.table = tables.table(name)
        self._lock = threading.Lock()
        self._etags: dict[str, tuple[str, int]] = {}
        self._key_locks: dict[str, threading.Lock] = {}

    def ensure(self) -> None:
        self.table.create()

    def put(self, row: EntryRow) -> None:
        """Upsert the entry's row in its state's partition (counts unchanged: see `add`, `move`)."""
        upsert_creating(self.table, entity_of(row))

    def add(self, row: EntryRow) -> None:
        """A new entry: its row, and its reason code's count when it is listed."""
        self.put(row)
        self.count(row.name, count_changes(None, row))

    def _delete_row(self, row: EntryRow) -> None:
        with contextlib.suppress(NotFound):
            self.table.delete(row.state, row.key)

    def remove(self, row: EntryRow) -> None:
        """The entry is gone: its row, and its count when it was listed."""
        self._delete_row(row)
        self.count(row.name, count_changes(row, None))

    def move(self, before: EntryRow, after: EntryRow) -> None:
        """The row follows the entry from its old state's partition to the new one."""
        self.put(after)
        if before.state != after.state:
            self._delete_row(before)
        self.count(after.name, count_changes(before, after))

    # -- retention -------------------------------------------------------------------------------

    def prune(self, states: Sequence[str], cutoff: datetime, *, limit: int, dry_run: bool = False) -> Pruned:
        """Delete the rows of `states` due at `cutoff` (`expired_filter`), at most `limit` (the next
        run goes on): a query and a transaction per 100 rows; listed rows' counts follow."""
        done = Pruned()
        deltas: dict[str, int] = {}
        try:
            for state in states:
                for rows in self._due_pages(state, cutoff, limit, done):
                    if not dry_run:
                        self._delete_due(state, rows, done, deltas)
                if done.stopped_at_limit:
                    break
        except NotFound:  # no table: nothing indexed
            pass
        for key, delta in deltas.items():
            done.requests += 1
            self._count_key(key, delta)
        return done

    def _due_pages(self, state: str, cutoff: datetime, limit: int, done: Pruned) -> Iterator[list[Row]]:
        """The due rows of one state, a page (<= 100) a query, until `limit` rows are due in all."""
        cont: Any = None
        while True:
            room = limit - done.due
            if room <= 0:
                done.stopped_at_limit = True
                return
            page = self.table.query(
                expired_filter(state, cutoff),
                select=["PartitionKey", "RowKey", "name", "reason_code", "reason"],
                size=min(TRANSACTION_SIZE, room),
                continuation=cont,
            )
            done.requests += 1
            got = page.rows[:room]
            cont = page.continuation
            done.due += len(got)
            if got:
                yield got
            if not cont:
                return

    def _delete_due(self, state: str, rows: list[Row], done: Pruned, deltas: dict[str, int]) -> None:
        """One transaction (one partition, <= 100 rows), If-Match each row's ETag; when it fails (a
        row written or moved since the query) row by row, keeping those written since."""
        gone: list[Row] = []
        done.requests += 1
        try:
            self.table.transact(
                [TableOp("delete", {"PartitionKey": state, "RowKey": str(r["RowKey"])}, r.etag) for r in rows]
            )
            gone = rows
        except StorageError:
            for row in rows:
                done.requests += 1
                try:
                    self.table.delete(state, str(row["RowKey"]), row.etag)
                except (ConditionFailed, NotFound):
                    continue
                except StorageError as exc:
                    log.warning("entry index row %s not deleted (%s)", row.get("name"), failure_name(exc))
                    continue
                gone.append(row)
        done.deleted += len(gone)
        done.changed += len(rows) - len(gone)
        for row in gone:  # the row is its entry as far as its count goes: state, code, reason
            listed = row_of({**row, "PartitionKey": state})
            add_deltas(deltas, listed.name, count_changes(listed, None))

    # -- counts per reason code ----------------------------------------------------------------

    def count(self, name: str, changes: list[tuple[str, int]]) -> None:
        for code, delta in changes:
            self._count_key(counter_key(code, name), delta)

    def _count_key(self, key: str, delta: int) -> None:
        try:
            self._bump(key, delta)
        except StorageError as exc:
            log.warning("poison count %s not updated by %+d (%s)", key, delta, failure_name(exc))

    def _bump(self, key: str, delta: int) -> None:
        """Add `delta` to one counter row, If-Match on its ETag (the one this process last saw
        first: one request when no one else changed it)."""
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:  # this process's threads take turns on a counter (no 412s among themselves)
            self._bump_locked(key, delta)

    def _bump_locked(self, key: str, delta: int) -> None:
        with self._lock:
            known = self._etags.get(key)
        for _ in range(COUNT_TRIES):
            if known is None:
                got = self.table.get(COUNT_PARTITION, key)
                if got is not None:
                    known = (got.etag, int(got.get("n") or 0))
                else:
                    try:
                        made = self.table.insert({"PartitionKey": COUNT_PARTITION, "RowKey": key, "n": delta})
                    except AlreadyExists:
                        continue
                    with self._lock:
                        self._etags[key] = (made, delta)
                    return
            etag, n = known
            value = n + delta  # a shard may go below 0 (its +1 was counted in another): the sum counts
            try:
                done = self.table.update({"PartitionKey": COUNT_PARTITION, "RowKey": key, "n": value}, etag)
            except (ConditionFailed, NotFound):
                known = None
                continue
            with self._lock:
                self._etags[key] = (done, value)
            return
        raise ConditionFailed(f"counter {key} kept changing")

    def counts(self, queue: str | None = None, default: str = "") -> dict[str, int]:
        """Listed entries per reason code, largest first (`queue`: of that queue only; `default`
        names the default queue): one query."""
        return counts_of(self._count_rows(), queue, default)

    def queue_counts(self, default: str) -> dict[str, int]:
        """Listed entries per queue (`default`: the default queue's name): one query."""
        return queue_counts_of(self._count_rows(), default)

    def _count_rows(self) -> list[Row]:
        try:
            rows = list(self.table.rows(f"PartitionKey eq {quoted(COUNT_PARTITION)}"))
        except NotFound:
            return []
        with self._lock:  # the page's next actions then change a counter with one request
            for e in rows:
                if e.etag:
                    self._etags[str(e["RowKey"])] = (e.etag, int(e.get("n") or 0))
        return rows

    def recount(self) -> dict[str, int]:
        """Rebuild the counters from the listed rows: one query per 1,000 listed entries (O(entries),
        for repairs; entries changing meanwhile may be off by those changes)."""
        found: dict[str, int] = {}
        where = f"PartitionKey eq {quoted(LISTED)}"
        for e in self.table.rows(where, select=["reason_code", "reason", "queue"], size=SCAN_ROWS):
            code = counted_code(
                str(e.get("reason_code") or reason_code_of(e.get("reason"))), str(e.get("queue") or "")
            )
            found[code] = found.get(code, 0) + 1
        old = {str(e["RowKey"]) for e in self.table.rows(f"PartitionKey eq {quoted(COUNT_PARTITION)}")}
        for key in old:
            self.table.delete(COUNT_PARTITION, key)
        for code, n in found.items():
            self.table.upsert({"PartitionKey": COUNT_PARTITION, "RowKey": f"{code}|00", "n": n})
        with self._lock:
            self._etags.clear()
        return counts_of({"RowKey": f"{c}|00", "n": n} for c, n in found.items())

    def move_many(
        self,
        moves: Iterable[tuple[EntryRow | None, EntryRow]],
        removes: Iterable[EntryRow] = (),
    ) -> int:
        """`move` for many entries (before, after; before None: `add`) and `remove` for many: the
        upserts as entity group transactions per new state (100 a transaction), then the deletes
        per old state; a transaction that fails (a row already gone, a reset connection) is done
        row by row; the reason-code counts change by the sum of the changes, in one transaction
        (`count_many`). Best effort, like `best_effort`. Returns the requests sent."""
        puts: dict[str, dict[str, EntryRow]] = {}
        deletes: dict[str, dict[str, EntryRow]] = {}
        deltas: dict[str, int] = {}
        for before, after in moves:
            add_deltas(deltas, after.name, count_changes(before, after))
            puts.setdefault(after.state, {})[after.key] = after
            if before is not None and before.state != after.state:
                deletes.setdefault(before.state, {})[before.key] = before
        for gone in removes:
            add_deltas(deltas, gone.name, count_changes(gone, None))
            deletes.setdefault(gone.state, {})[gone.key] = gone
        sent = 0
        for kind, groups in (("upsert", puts), ("delete", deletes)):
            action = self.put if kind == "upsert" else self._delete_row
            for state, keyed in groups.items():
                ops = [
                    TableOp("upsert", entity_of(row))
                    if kind == "upsert"
                    else TableOp("delete", {"PartitionKey": state, "RowKey": key})
                    for key, row in keyed.items()
                ]
                sent += in_transactions(self.table, ops, _one_by_one(keyed, action))
        return sent + self.count_many(deltas)

    def count_many(self, deltas: Mapping[str, int]) -> int:
        """Change many counter rows (RowKey -> delta) at once: the counters' query and one
        transaction (they share a partition), If-Match each row's ETag; a transaction that fails
        (someone changed a counter meanwhile) is tried again, then row by row. Returns the
        requests sent."""
        changed = {k: d for k, d in deltas.items() if d}
        sent = 0
        for _ in range(COUNT_TRIES if len(changed) <= TRANSACTION_SIZE else 0):
            sent += 1
            try:
                current = {
                    str(e["RowKey"]): e for e in self.table.rows(f"PartitionKey eq {quoted(COUNT_PARTITION)}")
                }
            except NotFound:
                current = {}
            operations: list[TableOp] = []
            for key, delta in changed.items():
                row = current.get(key)
                n = int(row.get("n") or 0) if row is not None else 0
                entity = {"PartitionKey": COUNT_PARTITION, "RowKey": key, "n": n + delta}
                operations.append(
                    TableOp("create", entity) if row is None else TableOp("update", entity, row.etag)
                )
            sent += 1
            try:
                answers = self.table.transact(operations)
            except StorageError:
                continue
            with self._lock:
                for op, etag in zip(operations, answers, strict=False):
                    if etag:
                        self._etags[str(op.entity["RowKey"])] = (etag, int(op.entity["n"]))
            return sent
        for key, delta in changed.items():  # many rows, or contended: one by one
            sent += 1
            try:
                self._count_key(key, delta)
            except StorageError as exc:
                log.warning("counter %s not changed (%s)", key, failure_name(exc))
        return sent

    # -- reads ---------------------------------------------------------------------------------

    def page(
        self,
        state: str,
        after_key: str = "",
        size: int = 50,
        job_id: str = "",
        reason_code: str = "",
        queue: str = "",
    ) -> list[EntryRow]:
        """Up to `size` rows of `state` (of `queue`, when given: rows that name it), newest first,
        after RowKey `after_key`: one query, more only when the service answers a short page with
        a continuation (at most `MAX_QUERIES`)."""
        where = f"PartitionKey eq {quoted(state)}"
        if after_key:
            where += f" and RowKey gt {quoted(after_key)}"
        if job_id:
            where += f" and job_id eq {quoted(job_id)}"
        if reason_code:
            where += f" and reason_code eq {quoted(reason_code)}"
        if queue:
            where += f" and queue eq {quoted(queue)}"
        return [row_of(e) for e in query_rows(self.table, where, size, MAX_QUERIES)]

    def scan(
        self,
        state: str,
        after_key: str = "",
        size: int = 50,
        reason_code: str = "",
        text: str = "",
        queries: int | None = None,
        queue: str = "",
    ) -> tuple[list[EntryRow], str]:
        """Rows of `state` (and reason code, and queue) whose reason, job id or name holds `text`,
        newest first after `after_key`: (up to `size` matches, the RowKey to go on from; "" at the
        end). Without `text` it is `page`. With it, at most `queries` queries of `SCAN_ROWS` rows."""
        if not text:
            paged = self.page(state, after_key, size, reason_code=reason_code, queue=queue)
            return paged, paged[-1].key if len(paged) == size else ""
        where = f"PartitionKey eq {quoted(state)}"
        if after_key:
            where += f" and RowKey gt {quoted(after_key)}"
        if reason_code:
            where += f" and reason_code eq {quoted(reason_code)}"
        if queue:
            where += f" and queue eq {quoted(queue)}"
        rows: list[EntryRow] = []
        cont: Any = None
        reached = after_key
        started = time.monotonic()
        try:
            for _ in range(queries or SCAN_QUERIES):
                if time.monotonic() - started > SCAN_SECONDS:
                    break
                page = self.table.query(where, size=SCAN_ROWS, continuation=cont)
                for e in page.rows:
                    reached = str(e.get("RowKey", ""))
                    if matches(text, e):
                        rows.append(row_of(e))
                        if len(rows) >= size:
                            return rows, reached
                cont = page.continuation
                if not cont:
                    return rows, ""
        except NotFound:
            return [], ""
        return rows, reached
