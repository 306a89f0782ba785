"""The archive entry's type (shared/poison/entry.py): entries stored in today's format and in
earlier ones read back field for field, and are written back as they were (pure)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from shared.core.archive_layout import entry_name
from shared.core.envelope import body_digest
from shared.indexes.entry_rows import EntryRow, EntryState, entity_of, row_of
from shared.indexes.keys import newest_first
from shared.poison.entry import ArchiveEntry, EntryEvent

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
BODY = b'{"id": "j1", "kind": "noop", "payload": {}}'
NAME = f"jobs/j1/{body_digest(BODY)}.json"
KEY = newest_first("2026-12-01T10:00:00.000000Z", NAME)

# An entry as this version and the one before it write it (a blob's JSON, byte for byte): archived,
# then parked by an operator.
STORED = json.loads(
    json.dumps(
        {
            "job_id": "j1",
            "parsed": True,
            "owned": True,
            "digest": body_digest(BODY),
            "state": "parked",
            "reason": "bad_payload: limit: must be a number",
            "reason_code": "bad_payload",
            "queue_message_id": "m-1",
            "dequeue_count": 5,
            "archived_at": "2026-12-01T10:00:00.000000Z",
            "body_b64": base64.b64encode(BODY).decode("ascii"),
            "body_bytes": len(BODY),
            "history": [
                {"at": "2026-12-01T09:59:00.000000Z", "event": "claimed", "attempt": 0},
                {"at": "2026-12-01T09:59:30.000000Z", "event": "claimed", "attempt": 1},
                {"at": "2026-12-01T10:00:00.000000Z", "event": "poisoned", "reason": "bad_payload: x"},
            ],
            "attempt": 1,
            "events": [
                {"at": "2026-12-01T10:00:00.000000Z", "event": "poisoned"},
                {"at": "2026-12-02T08:00:00.000000Z", "event": "parked", "by": "alice"},
            ],
            "index_key": KEY,
            "parked_message_id": "pm-1",
            "parked_pop_receipt": "receipt-1",
        }
    )
)

# An entry written before `owned`, `reason_code`, `index_key` and `events` were kept.
OLDER: dict[str, Any] = {
    "job_id": None,
    "parsed": False,
    "digest": "d" * 64,
    "state": "poisoned",
    "reason": "the host moved it after maxDequeueCount failed runs",
    "queue_message_id": "m-2",
    "dequeue_count": 5,
    "archived_at": "2025-06-01T00:00:00.000000Z",
    "body_b64": base64.b64encode(b"\xff not json").decode("ascii"),
    "body_bytes": 10,
    "history": [],
    "attempt": None,
}


def test_an_entry_in_todays_format_reads_field_for_field_and_writes_back_as_stored() -> None:
    entry = ArchiveEntry.parse(STORED)
    assert entry.state == EntryState.PARKED and entry.job_id == "j1" and entry.reason_code == "bad_payload"
    assert entry.body() == BODY and entry.body_bytes == len(BODY) and entry.name == NAME
    assert entry.events[-1] == EntryEvent("2026-12-02T08:00:00.000000Z", "parked", "alice")
    assert (entry.parked_message_id, entry.parked_pop_receipt) == ("pm-1", "receipt-1")
    assert entry.attempts() == 2, "the claims in the history it keeps"
    assert entry.acted_by("alice") and not entry.acted_by("bob")
    assert entry.to_data() == STORED
    assert json.dumps(entry.to_data(), sort_keys=True) == json.dumps(STORED, sort_keys=True)


def test_an_entry_of_an_earlier_version_reads_with_the_values_it_meant() -> None:
    entry = ArchiveEntry.parse(OLDER)
    assert entry.owned is False, "owned was parsed"
    assert entry.name == f"unparsed/{'d' * 64}.json"
    assert entry.reason_code == "max_dequeue", "read from its reason"
    assert entry.events == () and entry.index_key == "" and entry.attempts() == 0
    name = entry.name
    assert entry.key(name) == newest_first(OLDER["archived_at"], name), "from its first archival"
    assert entry.body() == b"\xff not json" and entry.listed
    again = ArchiveEntry.parse(entry.to_data())
    assert again == entry, "written in today's format, read back the same"
    assert {k: v for k, v in entry.to_data().items() if k in OLDER} == OLDER, "nothing it had changes"


def test_fields_of_another_version_are_kept_as_they_were() -> None:
    entry = ArchiveEntry.parse({**STORED, "future_field": {"x": 1}})
    assert entry.extra == {"future_field": {"x": 1}}
    assert entry.to_data() == {**STORED, "future_field": {"x": 1}}


def test_a_new_entry_is_what_the_archive_writes() -> None:
    record = {"history": STORED["history"], "attempt": 1}
    entry = ArchiveEntry.new(
        BODY, "j1", True, EntryState.POISONED, "bad_payload: limit: must be a number", now=NOW,
        queue_message_id="m-1", dequeue_count=5, record=record,
    )  # fmt: skip
    assert entry.name == NAME and entry.digest == body_digest(BODY) and entry.reason_code == "bad_payload"
    assert entry.events == (EntryEvent("2026-12-07T12:00:00.000000Z", "poisoned"),)
    assert entry.to_data()["body_b64"] == STORED["body_b64"] and "index_key" not in entry.to_data()
    assert ArchiveEntry.parse(entry.to_data()) == entry
    unowned = ArchiveEntry.new(
        b"{", "j2", False, EntryState.POISONED, "bad_envelope: x", now=NOW, queue_message_id=None,
        dequeue_count=None, record=None, code="bad_json",
    )  # fmt: skip
    assert unowned.name == entry_name("j2", body_digest(b"{"), owned=False)
    assert unowned.name.startswith("unparsed/") and unowned.reason_code == "bad_json"


def test_its_index_row_is_derived_from_it_and_keeps_its_key_across_changes() -> None:
    entry = ArchiveEntry.parse(STORED)
    row = entry.row(NAME)
    assert row == EntryRow(
        name=NAME, state="parked", job_id="j1", reason=STORED["reason"], archived_at=STORED["archived_at"],
        attempts=2, body_bytes=len(BODY), key=KEY, reason_code="bad_payload",
    )  # fmt: skip
    assert row_of(entity_of(row)) == row, "the table keeps the row as it is"
    unparked = entry.unparked(NAME, NOW, "bob")
    assert unparked.listed and unparked.parked_message_id is None and unparked.row(NAME).key == KEY
    assert "parked_message_id" not in unparked.to_data() and unparked.events[-1].event == "unparked"
    replayed = unparked.moved(NAME, EntryState.REPLAYED, NOW)
    assert replayed.state == EntryState.REPLAYED and replayed.events[-1] == EntryEvent(
        "2026-12-07T12:00:00.000000Z", "replayed"
    )
    assert "by" not in replayed.to_data()["events"][-1]
    parked = replayed.parked(NAME, "pm-2", "r-2", NOW, "carol")
    assert (parked.state, parked.parked_message_id, parked.row(NAME).key) == (EntryState.PARKED, "pm-2", KEY)


def test_a_body_archived_again_keeps_the_first_key_and_every_event() -> None:
    old = ArchiveEntry.parse(STORED)
    new = ArchiveEntry.new(
        BODY, "j1", True, EntryState.POISONED, "again", now=NOW, queue_message_id="m-9",
        dequeue_count=5, record=None,
    )  # fmt: skip
    merged = new.merged_into(NAME, old)
    assert merged.key(NAME) == KEY and merged.events == (*old.events, *new.events)
    assert merged.state == EntryState.POISONED and merged.queue_message_id == "m-9"


def test_a_long_reason_and_id_are_clipped_in_the_row_only() -> None:
    entry = ArchiveEntry.parse({**STORED, "reason": "r" * 999})
    assert len(entry.row(NAME).reason) == 256 and len(entry.reason) == 999


@pytest.mark.parametrize("state", list(EntryState))
def test_every_state_reads_back(state: EntryState) -> None:
    assert ArchiveEntry.parse({**STORED, "state": str(state)}).state == state


def test_a_state_no_longer_written_reads_as_it_was() -> None:
    legacy = ArchiveEntry.parse({**STORED, "state": "duplicate_of_running"})
    assert legacy.state == "duplicate_of_running" and not legacy.listed
    assert (
        legacy.row(NAME).state == "duplicate_of_running"
        and legacy.to_data()["state"] == "duplicate_of_running"
    )
