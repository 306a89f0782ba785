"""Purge, in one place: every caller (the CLI, the admin API and the console) starts the same bulk
operation (shared/poison/bulk.py), which takes the entries due from the entry index (the states
`PURGE_STATES`, archived before the cutoff: a RowKey range, newest first) a step at a time and
deletes each with `purge_entry`. Starting one is two requests whatever the archive's size; a dry
run counts what the purge would delete, in the app, and changes nothing.

Per entry: its read, its delete, its recorded reason's delete (3 requests); the index rows go with
the step's transactions (shared/poison/archive.py `IndexWrites`).
"""

from __future__ import annotations

from typing import Any

from shared.core.archive_layout import reason_name
from shared.poison import bulk
from shared.poison.archive import IndexWrites, StoredEntry
from shared.poison.parking import PARKED
from shared.runtime.wiring import Runtime


def purge_entry(rt: Runtime, stored: StoredEntry, writes: IndexWrites) -> tuple[str, str]:
    """Delete one entry (never a parked one), its recorded reason and its index row: (outcome, reason)."""
    if stored.entry.state == PARKED:
        return "skipped", "parked entries are never purged"
    rt.archive.delete(stored.name)
    rt.archive.delete(reason_name(stored.entry.digest))
    writes.remove(stored.row)
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
