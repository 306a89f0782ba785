"""The poison archive's entries as stored: read (`read_entry`), written (`write_entry`, `change`,
`set_state`), and their index rows, left in an `IndexWrites` that the operation sends at its end
(every writer, one way). The layout is shared/core/archive_layout.py; the entry's type and format,
shared/poison/entry.py. Also the app's recorded reasons (`note_reason`, `read_reason`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from shared.core.archive_layout import is_entry_name, reason_name
from shared.core.documents import Conflict, Document, DocumentStore
from shared.core.envelope import body_digest, isoformat
from shared.indexes.entries import best_effort
from shared.indexes.entry_rows import EntryRow, EntryState
from shared.poison.entry import ArchiveEntry
from shared.runtime.wiring import Runtime

LISTED_STATE = EntryState.POISONED
"""Entries in this state are listed and replayable; the others are kept for the record."""
WRITE_TRIES = 6


@dataclass(frozen=True)
class AppReason:
    """Why the app poisoned a body, noted before its copy went to the poison queue."""

    reason: str
    job_id: str | None
    code: str | None
    under_claim: bool
    """True when the app held the job's claim: the body was the job's current message."""


def note_reason(
    archive: DocumentStore,
    body: bytes,
    reason: str,
    job_id: str | None,
    code: str | None,
    *,
    under_claim: bool,
    now: datetime,
) -> None:
    doc = {"reason": reason, "job_id": job_id, "code": code, "under_claim": under_claim, "at": isoformat(now)}
    archive.upsert(reason_name(body_digest(body)), doc)


def read_reason(archive: DocumentStore, digest: str) -> AppReason | None:
    found = archive.read(reason_name(digest))
    if found is None or not found.data.get("reason"):
        return None
    data = found.data
    return AppReason(str(data["reason"]), data.get("job_id"), data.get("code"), bool(data.get("under_claim")))


# -- the index rows an operation leaves for its end ------------------------------------------


@dataclass
class IndexWrites:
    """The index writes of an operation's entries, sent at its end (`flush`): the entry index's
    rows added, moved (before, after) and removed, and the jobs' new records (the jobs index).
    One entry's are its own requests (as few as for that row); more go as entity group
    transactions. Thread-safe: a bulk step's entries run at once."""

    moves: list[tuple[EntryRow | None, EntryRow]] = field(default_factory=list)
    removes: list[EntryRow] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, row: EntryRow) -> None:
        with self.lock:
            self.moves.append((None, row))

    def move(self, before: EntryRow, after: EntryRow) -> None:
        with self.lock:
            self.moves.append((before, after))

    def remove(self, row: EntryRow) -> None:
        with self.lock:
            self.removes.append(row)

    def record(self, data: dict[str, Any]) -> None:
        with self.lock:
            self.records.append(data)

    def flush(self, rt: Runtime) -> None:
        """Send them (best effort, like every index write: the blobs are the truth) and start
        again empty. A step redone after a crash finds its entries done and leaves their writes again."""
        with self.lock:
            moves, removes, records = self.moves, self.removes, self.records
            self.moves, self.removes, self.records = [], [], []
        index = rt.entry_index
        if len(moves) + len(removes) == 1:  # one row: its own requests (3), no transaction's query
            for before, after in moves:
                if before is None:
                    best_effort(after.name, index.add, after)
                else:
                    best_effort(after.name, index.move, before, after)
            for gone in removes:
                best_effort(gone.name, index.remove, gone)
        elif moves or removes:
            index.move_many(moves, removes)
        if records:
            rt.job_index.put_many(records)


@contextmanager
def index_writes(rt: Runtime) -> Iterator[IndexWrites]:
    """A new `IndexWrites` for the block, sent when it ends (returns or raises)."""
    writes = IndexWrites()
    try:
        yield writes
    finally:
        writes.flush(rt)


# -- entries ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredEntry:
    """An archive entry as read: its name, its content, and the document whose etag guards the
    next change."""

    name: str
    entry: ArchiveEntry
    doc: Document

    @property
    def row(self) -> EntryRow:
        return self.entry.row(self.name)


def read_entry(archive: DocumentStore, name: str) -> StoredEntry | None:
    """The entry `name` (jobs/ or unparsed/ only), or None: one read."""
    if not is_entry_name(name) or ".." in name.split("/"):
        return None
    doc = archive.read(name)
    return StoredEntry(name, ArchiveEntry.parse(doc.data), doc) if doc is not None else None


def write_entry(archive: DocumentStore, entry: ArchiveEntry, writes: IndexWrites) -> str:
    """Create the entry; when it exists (the same body archived again), merge into it (its index
    row follows it). Its name."""
    name = entry.name
    old: StoredEntry | None = None
    for _ in range(WRITE_TRIES):
        if old is None:
            new = replace(entry, index_key=entry.key(name))
            try:
                archive.create(name, new.to_data())
            except Conflict:
                old = read_entry(archive, name)
                continue
            writes.add(new.row(name))
            return name
        merged = entry.merged_into(name, old.entry)
        try:
            archive.replace(name, old.doc, merged.to_data())
        except Conflict:
            old = read_entry(archive, name)
            continue
        writes.move(old.row, merged.row(name))
        return name
    raise Conflict(f"archive entry {name} kept changing")


def change(
    archive: DocumentStore, stored: StoredEntry, new: ArchiveEntry, writes: IndexWrites
) -> StoredEntry:
    """Write `new` over the entry as read (a conditional write: Conflict when it changed
    meanwhile); its index row follows."""
    doc = archive.replace(stored.name, stored.doc, new.to_data())
    writes.move(stored.row, new.row(stored.name))
    return StoredEntry(stored.name, new, doc)


def set_state(
    archive: DocumentStore,
    name: str,
    state: EntryState,
    now: datetime,
    writes: IndexWrites,
    by: str = "",
    current: StoredEntry | None = None,
) -> StoredEntry | None:
    """Mark an entry (replayed, skipped_completed, deleted, ...) and move its index row; a
    concurrent change is retried. `current`: the entry as just read (saves the first read). The
    entry as written, or None when there is none."""
    for _ in range(5):
        stored, current = current or read_entry(archive, name), None
        if stored is None:
            return None
        try:
            return change(archive, stored, stored.entry.moved(name, state, now, by), writes)
        except Conflict:
            continue
    return None
