"""The replay driver's decisions and its pacing (shared/poison/replay.py, pacing.py): pure."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import pytest

from shared import ledger
from shared.core.documents import Document
from shared.indexes.entry_rows import EntryState
from shared.ledger import Record
from shared.poison.archive import StoredEntry
from shared.poison.audited import target_of
from shared.poison.entry import ArchiveEntry
from shared.poison.pacing import TICK_ITEMS, TICK_S, Pacer, per_window
from shared.poison.replay import (
    COMPLETED_MEANWHILE,
    EXPIRED_HINT,
    ReplayReport,
    entry_refusal,
    expiry_refusal,
    fixed_refusal,
    record_refusal,
)

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def record(status: str) -> Record:
    return Record({"id": "j1", "status": status}, "etag")


def stored(name: str, state: EntryState) -> StoredEntry:
    entry = ArchiveEntry.parse(
        {"state": str(state), "body_b64": base64.b64encode(b"x").decode(), "archived_at": "2026-12-01"}
    )
    return StoredEntry(name, entry, Document(entry.to_data(), "etag"))


def test_only_a_listed_entry_under_its_job_is_replayed() -> None:
    assert entry_refusal("jobs/j1/d.json", EntryState.POISONED) == ""
    for state in set(EntryState) - {EntryState.POISONED}:
        assert entry_refusal("jobs/j1/d.json", state) == f"entry is {state}"
    assert "fix and replay it from the entry page" in entry_refusal("unparsed/d.json", EntryState.POISONED)


def test_only_a_poisoned_job_or_one_without_a_record_is_replayed() -> None:
    assert record_refusal(None) == "" and record_refusal(record(ledger.POISONED)) == ""
    assert record_refusal(record(ledger.COMPLETED)) == COMPLETED_MEANWHILE
    assert record_refusal(record(ledger.QUEUED)) == "the job is queued, not poisoned"


def test_an_expired_envelope_is_replayed_only_once_edited() -> None:
    assert expiry_refusal(None, NOW) == "" and expiry_refusal(NOW + timedelta(seconds=1), NOW) == ""
    refused = expiry_refusal(NOW, NOW)
    assert refused.startswith("expired at 2026-12-07T12:00:00+00:00") and refused.endswith(EXPIRED_HINT)


def test_only_a_listed_unparsed_entry_is_fixed_and_submitted() -> None:
    assert fixed_refusal(stored("unparsed/d.json", EntryState.POISONED)) == ""
    assert fixed_refusal(stored("unparsed/d.json", EntryState.REPLAYED)) == "not a listed unparsed entry"
    assert fixed_refusal(stored("jobs/j1/d.json", EntryState.POISONED)) == "not a listed unparsed entry"
    assert fixed_refusal(None) == "not a listed unparsed entry"


def test_the_report_files_each_outcome_with_its_reason() -> None:
    report = ReplayReport()
    report.add_entry_outcome("a", "replayed", "")
    report.add_entry_outcome("b", "skipped", COMPLETED_MEANWHILE)
    report.add_entry_outcome("c", "skipped", "entry is parked")
    report.add("d", "not_found")
    assert (report.replayed, report.skipped_completed, report.skipped_invalid, report.not_found) == (
        ["a"], ["b"], ["c"], ["d"],
    )  # fmt: skip
    assert report.reasons == {
        "b": COMPLETED_MEANWHILE,
        "c": "entry is parked",
        "d": "no listed poison archive entry for this job",
    }


def test_one_pacer_keeps_every_rate_item_k_starts_k_over_the_rate_after_the_first() -> None:
    now = [10.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    pacer = Pacer(40, clock=lambda: now[0])
    for k in range(100):
        pacer.wait(k, sleep)
    assert now[0] == pytest.approx(10.0 + 99 / 40), "100 items at 40/s: 99 intervals"
    slow = Pacer(40, clock=lambda: now[0])
    now[0] += 1.0  # the first item took a second: the next ones are due, none waits
    before = len(slept)
    slow.wait(1, sleep)
    assert len(slept) == before


def test_a_window_holds_what_the_rate_allows_at_least_one_at_most_its_cap() -> None:
    assert per_window(25, TICK_S, TICK_ITEMS) == 12 and per_window(1000, TICK_S, TICK_ITEMS) == TICK_ITEMS
    assert per_window(0.5, TICK_S, TICK_ITEMS) == 1 and per_window(0, TICK_S, TICK_ITEMS) == TICK_ITEMS
    assert per_window(5, 5.0, 1000) == 25


def test_an_operator_action_is_recorded_against_its_job_else_its_entry_else_its_operation() -> None:
    assert target_of("j1", "jobs/j1/d.json", None) == "j1"
    assert target_of(None, "unparsed/d.json", None) == "unparsed/d.json"
    assert target_of(None, None, "20261207T120000-ab12cd34") == "op:20261207T120000-ab12cd34"
    assert target_of(None, None, None) == ""
