"""Purge, in one place: every caller (the CLI, the admin API and the console) starts the same bulk
operation (shared/poison/bulk.py), which takes the entries due from the entry index (the states
`PURGE_STATES`, archived before the cutoff: a RowKey range, newest first) a step at a time and
deletes each with `purge_entry`. Starting one is two requests whatever the archive's size; a dry
run counts what the purge would delete, in the app, and changes nothing.

Per entry: its read, its delete, its recorded reason's delete (3 requests); the index rows go with
the step's transactions (shared/poison/bulk_pacing.py `StepWrites`).
"""

from __future__ import annotations

from typing import Any

from shared.core.documents import Document
from shared.poison import bulk
from shared.poison.archive import reason_name
from shared.poison.bulk_pacing import StepWrites
from shared.poison.parking import PARKED
from shared.runtime.wiring import Runtime


def purge_entry(rt: Runtime, name: str, doc: Document, writes: StepWrites | None = None) -> tuple[str, str]:
    """Delete one entry (never a parked one), its recorded reason and its index row (left in
    `writes` when given): (outcome, reason)."""
    if doc.data.get("state") == PARKED:
        return "skipped", "parked entries are never purged"
    rt.archive.delete(name)
    rt.archive.delete(reason_name(str(doc.data.get("digest"))))
    if writes is not None:
        writes.remove(name, doc.data)
    else:
        rt.entry_index.remove(name, doc.data)
    return "purged", ""


def start_purge(rt: Runtime, older_than_days: float, by: str, *, dry_run: bool = False) -> dict[str, Any]:
    """Start the purge of entries archived more than `older_than_days` ago (parked ones, edits,
    operations, the audit and counters are never touched): the operation's document."""
    return bulk.start(
        rt,
        "purge",
        by,
        states=list(bulk.PURGE_STATES),
        older_than_days=older_than_days,
        rate_per_s=0,
        dry_run=dry_run,
    )
