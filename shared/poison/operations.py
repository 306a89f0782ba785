"""Operator reads of the poison archive without the entry index: every entry, listed from the
archive's blobs (`list_poisoned`: small archives, repairs and tests), and the messages still on
the poison queue (`peek_poison_queue`). Replay is shared/poison/replay.py; purge,
shared/poison/purge.py."""

from __future__ import annotations

import base64
from typing import Any

from shared.core.archive_layout import ENTRY_PREFIXES
from shared.core.envelope import best_effort_id
from shared.indexes.entry_rows import EntryRow
from shared.poison.archive import read_entry
from shared.runtime.wiring import Runtime


def list_poisoned(rt: Runtime, include_done: bool = False) -> list[EntryRow]:
    """Archived poison entries (oldest first), listed from the archive and read one by one: a
    request per entry (the entry index's `page` lists without reading). No message is taken."""
    entries = []
    for prefix in ENTRY_PREFIXES:
        for name, _ in rt.archive.names(prefix):
            found = read_entry(rt.archive, name)
            if found is None or (not include_done and not found.entry.listed):
                continue
            entries.append(found.row)
    return sorted(entries, key=lambda e: e.archived_at)


def peek_poison_queue(rt: Runtime, limit: int = 32) -> list[dict[str, Any]]:
    """Messages still on <queue>-poison (not yet archived), without taking them."""
    out = []
    for msg in rt.poison_queue.peek_messages(max_messages=min(32, limit)):
        text = str(msg.content or "")
        try:
            job_id = best_effort_id(base64.b64decode(text, validate=True))
        except ValueError:
            job_id = None
        out.append(
            {
                "queue_message_id": msg.id,
                "job_id": job_id,
                "inserted_on": str(msg.inserted_on),
                "dequeue_count": msg.dequeue_count,
                "chars": len(text),
            }
        )
    return out
