"""Search, reason-code groups and the jobs page's time range: the pure parts."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from shared.indexes.entry_rows import (
    EntryRow,
    count_changes,
    counts_of,
    entity_of,
    matches,
    reason_code_of,
    shard_of,
)
from shared.indexes.jobs import day_span, query_filter, time_keys
from shared.indexes.keys import newest_first
from shared.interfaces.console.actions import ActionRefused, where_of
from shared.interfaces.console.queries import parse_when, time_range
from shared.poison.entry import ArchiveEntry


def test_an_entry_reason_code_is_the_apps_else_read_from_its_reason() -> None:
    assert reason_code_of("anything", "bad_payload") == "bad_payload"
    assert reason_code_of("input_missing: blob data/x.csv does not exist") == "input_missing"
    assert (
        reason_code_of("the host moved it after maxDequeueCount failed runs; last error: E") == "max_dequeue"
    )
    assert reason_code_of("gave up after 5 attempts; last error: Timeout") == "transient"
    assert reason_code_of("Weird: Capitalised is no code") == "other" and reason_code_of(None) == "other"
    old = ArchiveEntry.parse({"state": "poisoned", "reason": "bad_envelope: id: required"})
    row = entity_of(old.row("jobs/a/1.json"))
    assert row["reason_code"] == "bad_envelope", "entries archived before codes get theirs from the text"


def test_counts_follow_entries_into_and_out_of_the_listed_state() -> None:
    listed = EntryRow("jobs/a/1.json", "poisoned", "a", "r", "", 1, 1, "k", "bad_payload")
    assert count_changes(None, listed) == [("bad_payload", 1)]
    assert count_changes(listed, replace(listed, state="parked")) == [("bad_payload", -1)]
    assert count_changes(replace(listed, state="parked"), listed) == [("bad_payload", 1)]
    assert count_changes(listed, listed) == [], "archived again in the same state: no change"
    assert count_changes(replace(listed, state="replayed"), replace(listed, state="deleted")) == []
    assert count_changes(listed, None) == [("bad_payload", -1)]
    assert count_changes(listed, replace(listed, reason_code="expired")) == [
        ("bad_payload", -1),
        ("expired", 1),
    ]
    rows = [
        {"RowKey": "bad_payload|03", "n": 2},
        {"RowKey": "bad_payload|11", "n": 5},
        {"RowKey": "expired|00", "n": 9},
        {"RowKey": "gone|00", "n": 0},
    ]
    assert list(counts_of(rows).items()) == [("expired", 9), ("bad_payload", 7)]
    assert counts_of([{"RowKey": "x|00", "n": 4}, {"RowKey": "x|05", "n": -1}]) == {"x": 3}
    assert 0 <= shard_of("jobs/a/1.json") < 16 and shard_of("jobs/a/1.json") == shard_of("jobs/a/1.json")


def test_search_matches_reason_job_id_or_name_ignoring_case() -> None:
    row = {
        "reason": "input_missing: blob Data/Sales.csv does not exist",
        "job_id": "job-42",
        "name": "jobs/job-42/d.json",
    }
    assert matches("sales.CSV", row) and matches("JOB-4", row) and not matches("timeout", row)


def test_a_time_range_is_a_row_key_range_and_a_span_of_day_tables() -> None:
    since, until = "2026-11-24T10:00:00Z", "2026-11-25T12:00:00Z"
    low, high = time_keys(since, until)
    inside = newest_first("2026-11-25T11:59:59Z", "a")
    assert low <= inside < high
    assert not newest_first("2026-11-25T12:00:01Z", "a") >= low, "newer than `until` sorts before the range"
    assert not newest_first("2026-11-24T09:59:59Z", "a") < high, "older than `since` sorts after it"
    assert newest_first(since, "zz-~") < high and newest_first(until, "0") >= low, "both ends inclusive"
    assert time_keys() == ("", "")
    assert day_span(["20261126", "20261125", "20261124", "20261123"], since, until) == [
        "20261125",
        "20261124",
    ]
    assert day_span(["20261126", "20261125"], "", until) == ["20261125"]
    where = query_filter(status="failed", since=since)
    assert where == f"PartitionKey eq 'j' and RowKey lt '{high}' and status eq 'failed'"


def test_operators_times_are_utc_and_a_bare_date_covers_its_day() -> None:
    assert parse_when("2026-11-25") == "2026-11-25T00:00:00.000Z"
    assert parse_when("2026-11-25", end=True) == "2026-11-25T23:59:59.999Z"
    assert parse_when("2026-11-25T10:00") == "2026-11-25T10:00:00.000Z"
    assert parse_when("2026-11-25T12:00+02:00") == "2026-11-25T10:00:00.000Z"
    assert parse_when(" ") == ""
    with pytest.raises(ValueError):
        parse_when("yesterday")
    assert time_range("2026-11-25", "2026-11-25")[2] == []
    assert time_range("nope", "")[2] == ["from: a UTC time such as 2026-11-25T10:00 or a date"]
    assert time_range("2026-11-26", "2026-11-25")[2] == ["from: must not be after to"]


def test_an_operation_filter_is_a_reason_code_and_or_text() -> None:
    assert where_of(None) is None
    assert where_of({"reason_code": "bad_payload", "text": " csv "}) == {
        "reason_code": "bad_payload",
        "text": "csv",
    }
    assert where_of({"reason_code": "", "text": ""}) is None
    for bad in ({"names": ["x"]}, {"text": 3}, {"reason_code": "x" * 65}, "bad_payload"):
        with pytest.raises(ActionRefused):
            where_of(bad)


def test_an_audit_row_keeps_an_edits_old_and_new_values_and_sorts_newest_first() -> None:
    from shared.indexes.audit import backfill_rows, change_values, entity_of, row_of

    before = {"id": "a", "payload": {"limit": 5, "note": "x"}, "expires_at": "2026-01-01T00:00:00Z"}
    after = {"id": "a", "payload": {"limit": 50}, "expires_at": "2026-12-01T00:00:00Z"}
    assert change_values(before, after, ["expires_at", "payload.limit", "payload.note"]) == [
        {"field": "expires_at", "old": '"2026-01-01T00:00:00Z"', "new": '"2026-12-01T00:00:00Z"'},
        {"field": "payload.limit", "old": "5", "new": "50"},
        {"field": "payload.note", "old": '"x"', "new": "null"},
    ]
    now = datetime(2026, 11, 25, 10, tzinfo=UTC)
    older = entity_of(now, "alice", "park", "jobs/a/1.json", {"entry": "jobs/a/1.json"}, "u1")
    newer = entity_of(now + timedelta(seconds=1), "bob", "replay", "", {"ids": ["a"]}, "u2")
    assert newer["RowKey"] < older["RowKey"] and row_of(older).details == {"entry": "jobs/a/1.json"}
    rows = backfill_rows(
        [
            (
                "edits/a/d.json",
                {"job_id": "a", "by": "alice", "at": "2026-11-20T10:00:00Z", "changes": ["payload.x"]},
            )
        ],
        [
            {
                "id": "op1",
                "by": "bob",
                "created_at": "2026-11-21T10:00:00Z",
                "kind": "purge",
                "states": ["poisoned"],
            }
        ],
    )
    assert [(r["action"], r["by"], r["target"]) for r in rows] == [
        ("replay_edited", "alice", "a"),
        ("op_start", "bob", "op:op1"),
    ]
    assert (
        backfill_rows([], [{"id": "op1", "created_at": "2026-11-21T10:00:00Z"}])[0]["RowKey"]
        == rows[1]["RowKey"]
    )


def test_an_operations_page_names_its_filter_escaped() -> None:
    from shared.interfaces.console import pages

    op = {"id": "x", "kind": "replay", "states": ["poisoned"], "status": "done", "counts": {}}
    html = pages.op_page({**op, "where": {"reason_code": "bad_payload", "text": "<b>"}})
    assert "id=op-where>over poisoned entries matching reason_code=&#x27;bad_payload&#x27;" in html
    assert "&lt;b&gt;" in html and "<b>" not in html.split("op-where")[1].split("</p>")[0]
    assert "op-where" not in pages.op_page(op)
