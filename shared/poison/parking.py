"""Park, unpark and delete one archive entry: the console's single actions and the bulk operations
share these (an entry's state, its index row and its parked message change together).

Parking sends the body to `<queue>-parked` (the queue the entry came from) and keeps the message's id and pop receipt in the entry;
nothing else receives from that queue, so the receipt stays good and unpark deletes the message
directly, whatever the queue's depth (no scan).

A parked message lives as long as its entry: its time-to-live is the archive's retention
(`ARCHIVE_RETENTION_DAYS`), counted from the park, which is also the entry's last write, so
retention (the lifecycle policy, or the app) deletes the entry no sooner than the queue drops the
message: no parked message outlives its entry. With retention 0 (entries kept forever) it never
expires."""

from __future__ import annotations

from shared.core.documents import Conflict
from shared.core.messages import NEVER_EXPIRE
from shared.indexes.entry_rows import EntryState
from shared.poison.archive import IndexWrites, StoredEntry, change, set_state
from shared.poison.entry import ArchiveEntry
from shared.runtime.wiring import Runtime
from shared.storage.failures import NotFound, StorageError

PARKED = EntryState.PARKED
DAY_S = 86_400
DELETED = EntryState.DELETED


def parked_ttl_s(archive_retention_days: int) -> int:
    """A parked message's time-to-live in seconds: the archive's retention, or never (0 days) (pure)."""
    return archive_retention_days * DAY_S if archive_retention_days > 0 else NEVER_EXPIRE


def parked_queue_of(rt: Runtime, entry: ArchiveEntry) -> str:
    """Where an entry's parked copy goes: `<queue>-parked` of the queue it came from (in the
    app's storage account, whichever account holds that queue) (pure)."""
    return f"{entry.queue or rt.settings.queue_set.default.name}-parked"


def park_entry(rt: Runtime, stored: StoredEntry, by: str, writes: IndexWrites) -> tuple[str, str]:
    """(outcome, reason): `parked`, or `skipped` with why."""
    entry = stored.entry
    if not entry.listed:
        return "skipped", f"entry is {entry.state}, not {EntryState.POISONED}"
    queue = rt.account.raw_queue(parked_queue_of(rt, entry))
    ttl = parked_ttl_s(rt.settings.retention.archive)
    sent = queue.send_message(entry.body_b64, time_to_live=ttl)
    parked = entry.parked(
        stored.name, getattr(sent, "id", None), getattr(sent, "pop_receipt", None), rt.clock(), by
    )
    try:
        change(rt.archive, stored, parked, writes)
    except Conflict:
        queue.delete_message(sent)
        return "skipped", "the entry changed meanwhile"
    return PARKED, ""


def drop_parked_message(rt: Runtime, entry: ArchiveEntry) -> str:
    """Delete an entry's parked message by id and pop receipt: "" when done, else what happened."""
    msg_id, receipt = entry.parked_message_id, entry.parked_pop_receipt
    if not msg_id or not receipt:
        return "parked before receipts were kept: its parked message is left on the queue"
    try:
        rt.account.raw_queue(parked_queue_of(rt, entry)).delete_message(msg_id, receipt)
    except NotFound:
        return "its parked message was already gone (expired with the archive's retention, or deleted)"
    except StorageError as exc:
        if not exc.answered:  # no answer from the service: not a refusal to note
            raise
        return f"its parked message could not be deleted ({exc.error_code or exc.status_code})"
    return ""


def unpark_entry(rt: Runtime, stored: StoredEntry, by: str, writes: IndexWrites) -> tuple[str, str]:
    """(outcome, note): `unparked` (the note says when its parked message could not be deleted),
    or `not_found` when the entry is not parked."""
    entry = stored.entry
    if entry.state != PARKED:
        return "not_found", f"entry is {entry.state}, not parked"
    try:
        change(rt.archive, stored, entry.unparked(stored.name, rt.clock(), by), writes)
    except Conflict:
        return "not_found", "the entry changed meanwhile"
    return "unparked", drop_parked_message(rt, entry)


def delete_entry(rt: Runtime, stored: StoredEntry, by: str, writes: IndexWrites) -> tuple[str, str]:
    """Mark an entry deleted (no longer listed; purge removes it); a parked one's message goes too."""
    entry = stored.entry
    if entry.state == DELETED:
        return "not_found", "already deleted"
    note = drop_parked_message(rt, entry) if entry.state == PARKED else ""
    set_state(rt.archive, stored.name, DELETED, rt.clock(), writes, by, current=stored)
    return DELETED, note
