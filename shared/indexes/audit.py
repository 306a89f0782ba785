"""The audit of operator actions: one Table row per action, newest first, so its page is one query.

Table `<archive container, letters and digits>audit`, PartitionKey `a`, RowKey newest-first stamp +
a unique suffix (`shared/index_keys.newest_first`). Each row: when (`at`), who (`by`), what
(`action`), on what (`target`: a job id, an entry, an operation) and the details as JSON (for an
edit, each changed field with its old and new value; for an operation, its kind, filter and rate).
Written by every console action, the CLI's bulk starts and changes, and the admin API's replay of
all: one request per action, best effort (an action is never refused because its audit row could
not be written; the `console_action` decision is logged either way).

`backfill` indexes what was recorded before this table existed: the edits (`edits/<job id>/...`) and
the bulk operations (`ops/<id>.json`) in the archive container, listed once (O(history), a one-off),
leaving out those the table already records; rows keep deterministic keys, so running it again
rewrites the same rows. Single park / unpark / delete / replay actions before the table were logged
as `console_action` decisions only (and as events with `by` in their entries): not backfilled.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.core.documents import DocumentStore
from shared.core.envelope import isoformat
from shared.indexes.keys import clip, newest_first, quoted
from shared.storage.failures import NotFound, StorageError, failure_name
from shared.storage.ports import Tables
from shared.storage.tables import query_rows, upsert_creating

log = logging.getLogger("jobs.audit")
SUFFIX = "audit"
PARTITION = "a"
DETAILS_CHARS = 30_000
VALUE_CHARS = 2_000


@dataclass(frozen=True)
class AuditRow:
    at: str
    by: str
    action: str
    target: str
    details: dict[str, Any]
    key: str


def change_values(
    before: Mapping[str, Any], after: Mapping[str, Any], paths: Sequence[str]
) -> list[dict[str, Any]]:
    """For each dotted path (`payload.limit`), its old and new value (JSON text, clipped; `null`
    when absent) (pure)."""

    def at(data: Mapping[str, Any], path: str) -> Any:
        value: Any = data
        for part in path.split("."):
            if not isinstance(value, Mapping) or part not in value:
                return None
            value = value[part]
        return value

    return [
        {
            "field": path,
            "old": clip(json.dumps(at(before, path), default=str), VALUE_CHARS),
            "new": clip(json.dumps(at(after, path), default=str), VALUE_CHARS),
        }
        for path in paths
    ]


def entity_of(
    at: datetime, by: str, action: str, target: str, details: Mapping[str, Any], unique: str
) -> dict[str, Any]:
    """The action's row (pure): newest first, `unique` keeps keys of the same moment apart."""
    stamp = isoformat(at)
    return {
        "PartitionKey": PARTITION,
        "RowKey": newest_first(stamp, unique),
        "at": stamp,
        "by": clip(by, 256),
        "action": clip(action, 64),
        "target": clip(target, 1024),
        "details": clip(json.dumps(dict(details), default=str, sort_keys=True), DETAILS_CHARS),
    }


def row_of(entity: Mapping[str, Any]) -> AuditRow:
    try:
        details = json.loads(str(entity.get("details") or "{}"))
    except ValueError:  # clipped
        details = {"text": str(entity.get("details"))}
    return AuditRow(
        at=str(entity.get("at", "")),
        by=str(entity.get("by", "")),
        action=str(entity.get("action", "")),
        target=str(entity.get("target", "")),
        details=details if isinstance(details, dict) else {"value": details},
        key=str(entity.get("RowKey", "")),
    )


def backfill_rows(
    edits: Iterable[tuple[str, Mapping[str, Any]]],
    ops: Iterable[Mapping[str, Any]],
    known: Iterable[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Rows for edits and operations recorded before the audit table (pure; deterministic keys);
    those the `known` rows already record (an edit by its digest, an operation by its id) are left out."""
    seen = set()
    for row in known:
        details = row_of(row).details
        seen.add(f"edit:{details.get('digest')}" if row.get("action") == "replay_edited" else "")
        seen.add(str(row.get("target")) if row.get("action") == "op_start" else "")
    rows = []
    for name, edit in edits:
        if f"edit:{name.rsplit('/', 1)[-1].removesuffix('.json')}" in seen:
            continue
        at = datetime.fromisoformat(str(edit.get("at") or "1970-01-01T00:00:00+00:00").replace("Z", "+00:00"))
        details = {"changes": edit.get("changes") or [], "edit": name, "backfilled": True}
        rows.append(
            entity_of(
                at,
                str(edit.get("by") or "?"),
                "replay_edited",
                str(edit.get("job_id") or ""),
                details,
                f"edit-{name}",
            )
        )
    for op in ops:
        if f"op:{op.get('id')}" in seen:
            continue
        at = datetime.fromisoformat(
            str(op.get("created_at") or "1970-01-01T00:00:00+00:00").replace("Z", "+00:00")
        )
        details = {
            k: op.get(k)
            for k in ("kind", "states", "where", "rate_per_s", "dry_run", "total")
            if op.get(k) is not None
        }
        rows.append(
            entity_of(
                at,
                str(op.get("by") or "?"),
                "op_start",
                f"op:{op.get('id')}",
                {**details, "backfilled": True},
                f"op-{op.get('id')}",
            )
        )
    return rows


class AuditLog:
    """Writes and reads the audit table."""

    def __init__(self, tables: Tables, name: str) -> None:
        self.name = name
        self.table = tables.table(name)

    def ensure(self) -> None:
        self.table.create()

    def write(self, entity: Mapping[str, Any]) -> None:
        upsert_creating(self.table, entity)

    def record(self, at: datetime, by: str, action: str, target: str = "", **details: Any) -> None:
        """One action's row; a failure is logged, never raised (one request)."""
        try:
            self.write(entity_of(at, by, action, target, details, uuid.uuid4().hex[:12]))
        except StorageError as exc:
            log.warning("audit: %s by %s not recorded (%s)", action, by, failure_name(exc))

    def page(self, after: str = "", size: int = 50, action: str = "") -> tuple[list[AuditRow], str]:
        """Up to `size` actions newest first after RowKey `after` (one query; with an action filter,
        the service may answer short pages: at most 8 queries), and the key to go on from ("" at
        the end)."""
        where = f"PartitionKey eq {quoted(PARTITION)}"
        if after:
            where += f" and RowKey gt {quoted(after)}"
        if action:
            where += f" and action eq {quoted(action)}"
        rows = [row_of(e) for e in query_rows(self.table, where, size, 8)]
        return rows, rows[-1].key if len(rows) == size else ""

    def backfill(self, archive: DocumentStore) -> int:
        """Index the edits and operations recorded in the archive container (O(history), once)."""
        edits = []
        for name, _ in archive.names("edits/"):
            doc = archive.read(name)
            if doc is not None:
                edits.append((name, doc.data))
        ops = [d.data for d in (archive.read(n) for n, _ in archive.names("ops/")) if d is not None]
        try:
            known = list(self.table.rows(f"PartitionKey eq {quoted(PARTITION)}"))
        except NotFound:
            known = []
        rows = backfill_rows(edits, ops, [k for k in known if '"backfilled"' not in str(k.get("details"))])
        for row in rows:
            self.write(row)
        return len(rows)
