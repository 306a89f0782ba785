"""The poison archive index's rows, pure: an entry's row (`EntryRow`, as the table keeps it:
`entity_of`, `row_of`), its reason code (`reason_code_of`) and the listed counts' arithmetic
(`count_changes`, `counts_of`); the I/O is shared/indexes/entries.py (`EntryIndex`)."""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from shared.indexes.keys import MAX_MS, clip, quoted


class EntryState(StrEnum):
    """An archive entry's state (its `state` field, its index row's partition). Only `POISONED`
    entries are listed and replayable; the others are kept for the record."""

    POISONED = "poisoned"
    PARKED = "parked"
    REPLAYED = "replayed"
    DELETED = "deleted"
    SKIPPED_COMPLETED = "skipped_completed"
    DUPLICATE_OF_COMPLETED = "duplicate_of_completed"
    STALE = "stale"
    RECHECKED = "rechecked"


SUFFIX = "entries"
MAX_QUERIES = 8
LISTED = EntryState.POISONED
COUNT_PARTITION = "~count"
SHARDS = 16
COUNT_TRIES = 8
SCAN_ROWS = 500
SCAN_QUERIES = 6
SCAN_SECONDS = 0.6
"""A search reads at most SCAN_QUERIES x SCAN_ROWS rows per call (one page of results), and starts
no further query once SCAN_SECONDS have passed (a page answers within about a second)."""
HOST_MOVED = "the host moved it"
_CODE = re.compile(r"^([a-z][a-z0-9_]{1,47}): ")


def reason_code_of(reason: str | None, code: str | None = None) -> str:
    """An entry's reason code: the one the app gave, else the `<code>: ` its reason starts with
    (the app's reasons for permanent errors and invalid envelopes), else `max_dequeue` when the
    host moved it, `transient` when the app gave up retrying, `other` (pure)."""
    if code:
        return clip(code, 48)
    text = str(reason or "")
    found = _CODE.match(text)
    if found:
        return found.group(1)
    if text.startswith(HOST_MOVED):
        return "max_dequeue"
    if text.startswith("gave up after"):
        return "transient"
    return "other"


def matches(text: str, entity: Mapping[str, Any]) -> bool:
    """True when `text` (case-insensitive) is in the row's reason, job id or entry name (pure)."""
    needle = text.casefold()
    return any(needle in str(entity.get(f) or "").casefold() for f in ("reason", "job_id", "name"))


def shard_of(name: str) -> int:
    return zlib.crc32(name.encode()) % SHARDS


def counted_code(code: str, queue: str) -> str:
    """What a listed row counts under: its reason code, and its queue when the row names one
    (`<code>@<queue>`; rows of earlier versions: the code alone, the default queue's) (pure)."""
    return f"{code}@{queue}" if queue else code


def counts_of(
    entities: Iterable[Mapping[str, Any]], queue: str | None = None, default: str = ""
) -> dict[str, int]:
    """Counts per reason code from counter rows (`<code>[@<queue>]|<shard>`, `n`), largest first;
    `queue`: only that queue's (`default`: the default queue's name, which rows without a queue
    count for). A shard may be negative (recount puts a code's count in shard 0), only sums count (pure)."""
    found: dict[str, int] = {}
    for e in entities:
        code, _, named = str(e.get("RowKey", "")).rsplit("|", 1)[0].partition("@")
        if queue is not None and (named or default) != queue:
            continue
        found[code] = found.get(code, 0) + int(e.get("n") or 0)
    return _largest_first(found)


def queue_counts_of(entities: Iterable[Mapping[str, Any]], default: str) -> dict[str, int]:
    """Listed entries per queue from counter rows (rows without a queue: `default`'s) (pure)."""
    found: dict[str, int] = {}
    for e in entities:
        named = str(e.get("RowKey", "")).rsplit("|", 1)[0].partition("@")[2] or default
        found[named] = found.get(named, 0) + int(e.get("n") or 0)
    return _largest_first(found)


def _largest_first(found: Mapping[str, int]) -> dict[str, int]:
    return dict(sorted(((c, n) for c, n in found.items() if n > 0), key=lambda cn: (-cn[1], cn[0])))


def count_changes(before: EntryRow | None, after: EntryRow | None) -> list[tuple[str, int]]:
    """(counted code: `counted_code`, +1/-1) for the listed counts when an entry's row goes from `before` to `after`
    (None: it did not exist / no longer exists) (pure)."""

    def listed_code(row: EntryRow | None) -> str | None:
        if row is None or row.state != LISTED:
            return None
        return counted_code(row.reason_code or reason_code_of(row.reason), row.queue)

    old, new = listed_code(before), listed_code(after)
    if old == new:
        return []
    return [(c, d) for c, d in ((old, -1), (new, 1)) if c is not None]


def counter_key(code: str, name: str) -> str:
    """The RowKey of the counter row (in `COUNT_PARTITION`) that an entry's reason code counts in."""
    return f"{code}|{shard_of(name):02d}"


def add_deltas(deltas: dict[str, int], name: str, changes: list[tuple[str, int]]) -> None:
    """Sum an entry's count changes (`count_changes`) into `deltas`, per counter row."""
    for code, delta in changes:
        key = counter_key(code, name)
        deltas[key] = deltas.get(key, 0) + delta


TRANSACTION_SIZE = 100
"""Entities one entity group transaction may hold (Table storage's limit)."""


def expired_filter(state: str, cutoff: datetime) -> str:
    """The query of `state`'s rows first archived and last written before `cutoff` (pure): a
    RowKey range (keys start with the newest-first archival stamp) and the rows' `Timestamp`."""
    moment = cutoff.astimezone(UTC)
    low = f"{MAX_MS - int(moment.timestamp() * 1000) + 1:013d}"
    stamp = moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"PartitionKey eq {quoted(state)} and RowKey ge {quoted(low)} and Timestamp lt datetime'{stamp}'"


@dataclass
class Pruned:
    """What one retention pass over the entry index found and did."""

    due: int = 0
    deleted: int = 0
    changed: int = 0
    """Due when queried, written since (or moved): kept."""
    requests: int = 0
    stopped_at_limit: bool = False


@dataclass(frozen=True)
class EntryRow:
    """An archive entry as operators see it (the console, the CLI, the API): its index row, as
    listed (`row_of`) or derived from its blob (shared/poison/entry.py `ArchiveEntry.row`)."""

    name: str
    state: str
    job_id: str
    reason: str
    archived_at: str
    attempts: int
    body_bytes: int
    key: str
    reason_code: str = ""
    queue: str = ""
    """The declared queue it came from ("" in rows of earlier versions: the default)."""

    def age_s(self, now: datetime) -> float:
        """Seconds since it was archived (0 when its stamp cannot be read)."""
        try:
            return (now - datetime.fromisoformat(self.archived_at.replace("Z", "+00:00"))).total_seconds()
        except ValueError:
            return 0.0


def entity_of(row: EntryRow) -> dict[str, Any]:
    """The row as the table keeps it (PartitionKey: its state)."""
    return {
        "PartitionKey": row.state,
        "RowKey": row.key,
        "name": row.name,
        "job_id": row.job_id,
        "reason": row.reason,
        "reason_code": row.reason_code or reason_code_of(row.reason),
        "archived_at": row.archived_at,
        "attempts": row.attempts,
        "body_bytes": row.body_bytes,
        **({"queue": row.queue} if row.queue else {}),
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
        reason_code=str(entity.get("reason_code", "")),
        queue=str(entity.get("queue", "")),
    )
