"""The poison archive's index: one Table entity per archive entry, partitioned by state.

Table `<archive container, letters and digits>entries`, PartitionKey = the entry's state (poisoned / parked / replayed / deleted /
...), RowKey = newest-first archive stamp + the entry name (`index_key`, kept in the entry so every
later change finds the same row). A page of a state is one query with `$top`; a change of state
moves the row (delete + upsert: two requests). Names and reasons are enough to draw the page, so
no entry blob is read to list. Actions address entries by name (one read each), never by listing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceExistsError, ResourceNotFoundError
from azure.data.tables import TableServiceClient, UpdateMode

from shared.index_keys import clip, newest_first, quoted

log = logging.getLogger("jobs.index")
SUFFIX = "entries"
MAX_QUERIES = 8
TRANSACTION_SIZE = 100
"""Entities one entity group transaction may hold (Table storage's limit)."""


@dataclass(frozen=True)
class EntryRow:
    name: str
    state: str
    job_id: str
    reason: str
    archived_at: str
    attempts: int
    body_bytes: int
    key: str


def index_key(name: str, entry: Mapping[str, Any]) -> str:
    """The entry's RowKey: its own when it has one, else from its first archival."""
    return str(entry.get("index_key") or newest_first(str(entry.get("archived_at") or ""), name))


def entity_of(name: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    history = entry.get("history") or []
    return {
        "PartitionKey": str(entry.get("state") or "poisoned"),
        "RowKey": index_key(name, entry),
        "name": name,
        "job_id": clip(entry.get("job_id") or "", 128),
        "reason": clip(entry.get("reason")),
        "archived_at": clip(entry.get("archived_at") or "", 40),
        "attempts": int(entry.get("attempt") or len(history) or 0),
        "body_bytes": int(entry.get("body_bytes") or 0),
    }


def row_of(entity: Mapping[str, Any]) -> EntryRow:
    return EntryRow(
        name=str(entity.get("name", "")),
        state=str(entity.get("PartitionKey", "")),
        job_id=str(entity.get("job_id", "")),
        reason=str(entity.get("reason", "")),
        archived_at=str(entity.get("archived_at", "")),
        attempts=int(entity.get("attempts") or 0),
        body_bytes=int(entity.get("body_bytes") or 0),
        key=str(entity.get("RowKey", "")),
    )


def best_effort(name: str, action: Callable[..., None], *args: Any) -> None:
    """Run an index write; a failure is logged, never raised: the entry blob is the truth, and a
    poison handler must not fail (and retry) because the view could not be updated."""
    try:
        action(name, *args)
    except AzureError as exc:
        log.warning("poison entry %s: index not updated (%s)", name, exc.__class__.__name__)


class EntryIndex:
    """Reads and writes the `poisonentries` table."""

    def __init__(self, service: TableServiceClient, name: str) -> None:
        self.name = name
        self.table = service.get_table_client(name)
        self.service = service

    def ensure(self) -> None:
        with contextlib.suppress(ResourceExistsError):
            self.service.create_table(self.name)

    def put(self, name: str, entry: Mapping[str, Any]) -> None:
        """Upsert the entry's row in its state's partition."""
        entity = entity_of(name, entry)
        try:
            self.table.upsert_entity(entity, mode=UpdateMode.REPLACE)
        except ResourceNotFoundError:
            self.ensure()
            self.table.upsert_entity(entity, mode=UpdateMode.REPLACE)

    def remove(self, name: str, entry: Mapping[str, Any]) -> None:
        state = str(entry.get("state") or "poisoned")
        with contextlib.suppress(ResourceNotFoundError):
            self.table.delete_entity(
                state, index_key(name, entry), match_condition=MatchConditions.Unconditionally
            )

    def move(self, name: str, before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
        """The row follows the entry from its old state's partition to the new one."""
        self.put(name, after)
        if str(before.get("state") or "") != str(after.get("state") or ""):
            self.remove(name, before)

    def move_many(self, moves: Iterable[tuple[str, Mapping[str, Any], Mapping[str, Any]]]) -> int:
        """`move` for many entries (name, before, after): the upserts as entity group transactions
        per new state (100 a transaction), then the deletes per old state; a transaction that fails
        (a row already gone, a reset connection) is done row by row. Best effort, like `best_effort`.
        Returns the requests sent."""
        puts: dict[str, dict[str, tuple[str, Mapping[str, Any]]]] = {}
        removes: dict[str, dict[str, tuple[str, Mapping[str, Any]]]] = {}
        for name, before, after in moves:
            new = entity_of(name, after)
            puts.setdefault(new["PartitionKey"], {})[new["RowKey"]] = (name, after)
            old_state = str(before.get("state") or "poisoned")
            if old_state != new["PartitionKey"]:
                removes.setdefault(old_state, {})[index_key(name, before)] = (name, before)
        sent = 0
        for kind, groups in (("upsert", puts), ("delete", removes)):
            for state, keyed in groups.items():
                rows = list(keyed.items())
                for i in range(0, len(rows), TRANSACTION_SIZE):
                    chunk = rows[i : i + TRANSACTION_SIZE]
                    sent += 1
                    try:
                        self.table.submit_transaction(
                            [
                                ("upsert", entity_of(name, entry), {"mode": UpdateMode.REPLACE})
                                if kind == "upsert"
                                else ("delete", {"PartitionKey": state, "RowKey": key})
                                for key, (name, entry) in chunk
                            ]
                        )
                        continue
                    except AzureError:
                        pass
                    for _, (name, entry) in chunk:
                        sent += 1
                        best_effort(name, self.put if kind == "upsert" else self.remove, entry)
        return sent

    def page(self, state: str, after_key: str = "", size: int = 50, job_id: str = "") -> list[EntryRow]:
        """Up to `size` rows of `state`, newest first, after RowKey `after_key`: one query, more
        only when the service answers a short page with a continuation (at most `MAX_QUERIES`)."""
        where = f"PartitionKey eq {quoted(state)}"
        if after_key:
            where += f" and RowKey gt {quoted(after_key)}"
        if job_id:
            where += f" and job_id eq {quoted(job_id)}"
        rows: list[EntryRow] = []
        cont: Any = None
        try:
            for _ in range(MAX_QUERIES):
                pager = self.table.query_entities(where, results_per_page=size - len(rows)).by_page(
                    continuation_token=cont
                )
                rows.extend(row_of(e) for e in list(next(pager, []))[: size - len(rows)])
                cont = getattr(pager, "continuation_token", None)
                if len(rows) >= size or not cont:
                    break
        except ResourceNotFoundError:
            return []
        return rows
