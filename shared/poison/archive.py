"""The poison archive's layout, in one place.

In the poison-archive container:
  jobs/<job id>/<body digest>.json   one entry per distinct poisoned body of a job
  unparsed/<body digest>.json        bodies that are not their job's: not base64, JSON or UTF-8,
                                     no readable id, or an id whose record is another body's
  reasons/<body digest>.json         why the app itself poisoned a body (written before the copy)
  edits/<job id>/<body digest>.json  an operator's edit of a job's envelope, replayed
                                     (shared/poison/replay.py `replay_edit`)
Beside them, not entries: ops/ (bulk operations, shared/poison/bulk.py) and the overview's
counters without a table (shared/observability/overview_counters.py).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.core.documents import Conflict, Document, DocumentStore
from shared.core.envelope import body_digest, isoformat
from shared.indexes.entries import EntryIndex, best_effort
from shared.indexes.entry_rows import EntryState, index_key, reason_code_of

JOBS_PREFIX = "jobs/"
UNPARSED_PREFIX = "unparsed/"
REASONS_PREFIX = "reasons/"
EDITS_PREFIX = "edits/"
ENTRY_PREFIXES = (JOBS_PREFIX, UNPARSED_PREFIX)
"""The namespaces of entries (listed, replayed, purged); reasons and edits are not entries."""
LISTED_STATE = EntryState.POISONED
"""Entries in this state are listed and replayable; the others are kept for the record."""


def entry_name(job_id: str | None, digest: str, owned: bool = True) -> str:
    """Entries of valid envelopes, and of invalid ones whose job record they created, go under
    their job; other bodies under unparsed/ (the id they carry, if any, is kept in the entry but
    cannot be trusted to be theirs)."""
    return f"{JOBS_PREFIX}{job_id}/{digest}.json" if job_id and owned else f"{UNPARSED_PREFIX}{digest}.json"


def reason_name(digest: str) -> str:
    return f"{REASONS_PREFIX}{digest}.json"


def edit_name(job_id: str, digest: str) -> str:
    """Where an operator's edit of the job's envelope is kept (`replay_edit`)."""
    return f"{EDITS_PREFIX}{job_id}/{digest}.json"


def is_entry_name(name: str) -> bool:
    return name.startswith(ENTRY_PREFIXES)


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


def new_entry(
    body: bytes,
    job_id: str | None,
    parsed: bool,
    state: EntryState,
    reason: str,
    *,
    now: datetime,
    queue_message_id: str | None,
    dequeue_count: int | None,
    record: dict[str, Any] | None,
    owned: bool | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """An archive entry; `body_b64` keeps the body byte for byte; `reason_code` is `code`, else
    read from the reason (`reason_code_of`)."""
    return {
        "job_id": job_id,
        "parsed": parsed,
        "owned": parsed if owned is None else owned,
        "digest": body_digest(body),
        "state": state,
        "reason": reason,
        "reason_code": reason_code_of(reason, code),
        "queue_message_id": queue_message_id,
        "dequeue_count": dequeue_count,
        "archived_at": isoformat(now),
        "body_b64": base64.b64encode(body).decode("ascii"),
        "body_bytes": len(body),
        "history": (record or {}).get("history") or [],
        "attempt": (record or {}).get("attempt"),
        "events": [{"at": isoformat(now), "event": state}],
    }


def write_entry(archive: DocumentStore, entry: dict[str, Any], index: EntryIndex | None = None) -> str:
    """Create the entry; when it exists (the same body archived again), merge into it (its index
    row follows it). Its name."""
    name = entry_name(entry["job_id"], entry["digest"], bool(entry.get("owned", entry.get("parsed", True))))
    entry = {**entry, "index_key": index_key(name, entry)}
    try:
        archive.create(name, entry)
        if index is not None:
            best_effort(name, index.add, entry)
        return name
    except Conflict:
        pass
    for _ in range(5):
        old = archive.read(name)
        if old is None:
            try:
                archive.create(name, entry)
                if index is not None:
                    best_effort(name, index.add, entry)
                return name
            except Conflict:
                continue
        merged = {
            **entry,
            "index_key": index_key(name, old.data),
            "events": (old.data.get("events") or []) + entry["events"],
        }
        try:
            archive.replace(name, old, merged)
            if index is not None:
                best_effort(name, index.move, old.data, merged)
            return name
        except Conflict:
            continue
    raise Conflict(f"archive entry {name} kept changing")


def set_state(
    archive: DocumentStore,
    name: str,
    state: EntryState,
    now: datetime,
    index: EntryIndex | None = None,
    by: str | None = None,
    current: Document | None = None,
) -> dict[str, Any] | None:
    """Mark an entry (replayed, skipped_completed, parked, ...) and move its index row; a
    concurrent change is retried. `current`: the entry as just read (saves the first read). The
    entry as written, or None when there is none."""
    for _ in range(5):
        old, current = current or archive.read(name), None
        if old is None:
            return None
        data = {**old.data, "state": state, "index_key": index_key(name, old.data)}
        event: dict[str, Any] = {"at": isoformat(now), "event": state}
        if by:
            event["by"] = by
        data["events"] = [*(old.data.get("events") or []), event]
        try:
            archive.replace(name, old, data)
        except Conflict:
            continue
        if index is not None:
            best_effort(name, index.move, old.data, data)
        return data
    return None
