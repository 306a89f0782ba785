"""Search by error text, poison grouped by reason code, group replays, the jobs page's time range
and skip reasons, on the in-memory account and on Azurite."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import pytest

from shared import ledger, poison
from shared.core.envelope import isoformat
from shared.indexes import entries as entry_index
from shared.indexes.entry_rows import EntryState
from shared.interfaces.console import actions, queries
from shared.ledger import Facts
from shared.poison import bulk
from shared.poison.archive import index_writes, write_entry
from shared.poison.entry import ArchiveEntry
from shared.runtime.wiring import Runtime
from tests.integration.backends import Backend
from tests.integration.helpers import drain_raw
from tests.integration.ops_helpers import paced_runtime, read_op, take_steps


@pytest.fixture
def rt(storage_backend: Backend) -> Runtime:
    return paced_runtime(storage_backend)


def a_moment_later() -> None:
    """Index keys are millisecond stamps, newest first: what a test lists in order happens a
    millisecond apart at least (storage calls take longer than that; an in-memory account's not)."""
    time.sleep(0.002)


def poisoned(
    rt: Runtime, job_id: str, reason: str, code: str | None = None, expires_in_s: int | None = None
) -> str:
    """A poisoned noop job and its listed entry (archived as the poison handler writes it)."""
    a_moment_later()
    now = rt.clock()
    env = {"id": job_id, "kind": "noop", "payload": {}, "created_at": isoformat(now)}
    if expires_in_s is not None:
        env["expires_at"] = isoformat(now + timedelta(seconds=expires_in_s))
    body = json.dumps(env).encode()
    rt.ledger.create(
        job_id,
        {"id": job_id, "kind": "noop", "created_at": isoformat(now), "status": "queued", "history": []},
    )
    record = rt.ledger.get(job_id)
    rt.ledger.write(
        job_id, record, lambda prev: ledger.poisoned(prev, job_id, Facts(now), reason, code, body)
    )
    entry = ArchiveEntry.new(
        body,
        job_id,
        True,
        EntryState.POISONED,
        reason,
        now=now,
        queue_message_id=None,
        dequeue_count=5,
        record=None,
        code=code,
    )
    with index_writes(rt) as writes:
        return write_entry(rt.archive, entry, writes)


def seed_groups(rt: Runtime) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {"input_missing": [], "bad_payload": [], "max_dequeue": []}
    for i in range(5):
        groups["input_missing"].append(
            poisoned(rt, f"im-{i}", f"input_missing: blob data/day-{i}.csv does not exist", "input_missing")
        )
    for i in range(3):
        groups["bad_payload"].append(poisoned(rt, f"bp-{i}", f"bad_payload: metrics[{i}].column: required"))
    groups["max_dequeue"].append(poisoned(rt, "md-0", "the host moved it after maxDequeueCount failed runs"))
    return groups


def test_the_poison_page_groups_listed_entries_by_reason_code_with_counts(rt: Runtime) -> None:
    groups = seed_groups(rt)
    view = queries.poison_view(rt)
    assert view.groups == {"input_missing": 5, "bad_payload": 3, "max_dequeue": 1}
    actions.park(rt, groups["input_missing"][:2], "t")
    actions.delete(rt, [groups["bad_payload"][0]], "t")
    assert rt.entry_index.counts() == {"input_missing": 3, "bad_payload": 2, "max_dequeue": 1}
    actions.unpark(rt, groups["input_missing"][:1], "t")
    assert rt.entry_index.counts()["input_missing"] == 4
    group = queries.poison_view(rt, reason_code="bad_payload")
    assert {e.name for e in group.archived} == set(groups["bad_payload"][1:])
    assert rt.entry_index.recount() == rt.entry_index.counts(), "a recount from the rows agrees"
    actions.park(rt, groups["input_missing"][2:3], "t")  # its shard held none of the recount: goes below 0
    assert rt.entry_index.counts()["input_missing"] == 3, "the sum still counts it"
    from shared.interfaces import cli

    assert cli.cmd_poison(rt, cli.build_parser().parse_args(["poison", "recount"])) == 0


def test_search_by_error_text_pages_through_a_bounded_scan(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_groups(rt)
    found = queries.poison_view(rt, text="DAY-3.csv")
    assert [e.job_id for e in found.archived] == ["im-3"] and found.next_archived == ""
    assert [e.job_id for e in queries.poison_view(rt, text="column", reason_code="bad_payload").archived] == [
        "bp-2", "bp-1", "bp-0"
    ]  # fmt: skip
    assert queries.poison_view(rt, text="column", reason_code="input_missing").archived == []
    monkeypatch.setattr(entry_index, "SCAN_ROWS", 2)  # 2 rows a query, 1 query a call: pages on
    seen: list[str] = []
    after, calls = "", 0
    while True:
        rows, after = rt.entry_index.scan("poisoned", after, 50, text="data/day", queries=1)
        seen.extend(r.job_id for r in rows)
        calls += 1
        if not after:
            break
    assert sorted(seen) == [f"im-{i}" for i in range(5)] and calls >= 5, "each call read at most 2 rows"


def test_a_group_replay_is_defined_by_its_filter_not_by_rendered_rows(rt: Runtime) -> None:
    groups = seed_groups(rt)
    dry = actions.start_op(
        rt,
        {
            "kind": "replay",
            "state": "poisoned",
            "rate": 100,
            "dry_run": True,
            "where": {"reason_code": "input_missing"},
        },
        "t",
    )
    take_steps(rt)
    assert read_op(rt, dry["op"])["counts"] == {"counted": 5}
    op = actions.start_op(
        rt,
        {
            "kind": "replay",
            "state": "poisoned",
            "rate": 2,
            "where": {"reason_code": "input_missing", "text": "day-1"},
        },
        "t",
    )
    take_steps(rt)
    assert read_op(rt, op["op"])["counts"] == {"replayed": 1}
    whole = actions.start_op(
        rt, {"kind": "replay", "state": "poisoned", "rate": 2, "where": {"reason_code": "input_missing"}}, "t"
    )
    take_steps(rt)
    done = read_op(rt, whole["op"])
    assert done["status"] == "done" and done["counts"] == {"replayed": 4}, "2 a step, over 2 steps and an end"
    assert sorted(json.loads(b)["id"] for b in drain_raw(rt, rt.settings.jobs_queue)) == [
        f"im-{i}" for i in range(5)
    ]
    assert "input_missing" not in rt.entry_index.counts()
    assert {e.name for e in queries.poison_view(rt).archived} == {
        *groups["bad_payload"],
        *groups["max_dequeue"],
    }


def test_a_search_operation_goes_on_past_steps_that_found_nothing(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(6):
        poisoned(rt, f"far-{i}", "bad_payload: " + ("needle" if i == 0 else "hay"))  # the oldest matches
    monkeypatch.setattr(entry_index, "SCAN_ROWS", 2)
    monkeypatch.setattr(entry_index, "SCAN_QUERIES", 1)
    op = bulk.start(rt, "replay", "t", states=["poisoned"], rate_per_s=10, where={"text": "needle"})
    steps = take_steps(rt)
    done = read_op(rt, op["id"])
    assert done["status"] == "done" and done["counts"] == {"replayed": 1} and steps >= 3


def test_the_jobs_page_filters_by_creation_time_and_pages_within_it(rt: Runtime) -> None:
    base = rt.clock().replace(hour=12, minute=0, second=0, microsecond=0) - timedelta(days=2)
    for i in range(6):  # two a day over three days, at 06:00 and 18:00
        created = base + timedelta(hours=-6 + 12 * i)
        rt.job_index.put(
            {"id": f"t-{i}", "status": "completed", "kind": "noop", "created_at": isoformat(created)}
        )
    since = isoformat(base)  # from day 1's 12:00 to day 2's 23:59
    until = queries.parse_when((base + timedelta(days=1)).date().isoformat(), end=True)
    page = queries.jobs_page(rt, since=since, until=until)
    assert [r.id for r in page.rows] == ["t-3", "t-2", "t-1"]
    rt.job_index.days(fresh=True)  # the day list read again (as after DAYS_TTL_S), now with day 2
    first = rt.job_index.page(since=since, until=until, size=2)
    rest = rt.job_index.page(token=first.next_token, since=since, until=until, size=2)
    assert [r.id for r in first.rows + rest.rows] == ["t-3", "t-2", "t-1"] and rest.next_token is None
    assert [r.id for r in queries.jobs_page(rt, since=isoformat(base + timedelta(days=2))).rows] == ["t-5"]


def test_a_replay_says_why_it_skipped_each_job(rt: Runtime) -> None:
    poisoned(rt, "ok-1", "bad_payload: x")
    poisoned(rt, "old-1", "expired: x", expires_in_s=-60)
    done = "done-1"
    poisoned(rt, done, "bad_payload: y")
    record = rt.ledger.get(done)
    assert record is not None
    rt.ledger.write(done, record, lambda prev: {**(prev or {}), "status": ledger.COMPLETED})
    report = poison.replay_jobs(rt, ["ok-1", "old-1", done, "nobody"], rate_per_s=1000).as_dict()
    assert report["replayed"] == ["ok-1"]
    assert report["skipped_invalid"] == ["old-1"] and "extend expires_at" in report["reasons"]["old-1"]
    assert report["reasons"][done] == "the job completed meanwhile"
    assert report["reasons"]["nobody"] == "no listed poison archive entry for this job"
    answer = actions.replay_batch(rt, ["old-1"], 10, "t")
    assert answer["skipped"][0]["id"] == "old-1" and "expired at" in answer["skipped"][0]["reason"]


def test_the_admin_api_pages_poison_through_the_index(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    import azure.functions as func

    from shared.interfaces import api

    seed_groups(rt)
    monkeypatch.setattr(api, "get_runtime", lambda: rt)

    def get(**params: str) -> dict[str, Any]:
        req = func.HttpRequest("GET", "http://h/api/poison", params=params, body=b"")
        answer = api.list_poison(req)
        assert answer.status_code == 200
        return dict(json.loads(answer.get_body()))

    first = get(limit="4")
    assert len(first["archived"]) == 4 and first["next"] and first["counts"]["input_missing"] == 5
    rest = get(limit="100", after=first["next"])
    assert rest["next"] == "" and len(first["archived"]) + len(rest["archived"]) == 9
    assert [e["job_id"] for e in get(code="bad_payload", q="metrics[1]")["archived"]] == ["bp-1"]
    req = func.HttpRequest(
        "POST", "http://h/api/poison/replay", body=json.dumps({"all": True, "dry_run": True}).encode()
    )
    started = api.replay_poison(req)
    body = json.loads(started.get_body())
    assert started.status_code == 202 and body["listed"] == 9 and body["dry_run"] is True
    take_steps(rt)
    assert read_op(rt, body["op"])["counts"] == {"counted": 9}


def test_cli_replay_all_starts_an_operation_and_counts_first(
    rt: Runtime, capsys: pytest.CaptureFixture[str]
) -> None:
    from shared.interfaces import cli

    seed_groups(rt)
    args = cli.build_parser().parse_args(
        ["poison", "replay", "--all", "--dry-run", "--reason-code", "bad_payload"]
    )
    assert cli.cmd_poison(rt, args) == 0
    out = capsys.readouterr().out
    assert "listed now: 3" in out and "started operation" in out
    take_steps(rt)
    assert queries.poison_view(rt).groups["bad_payload"] == 3, "a dry run changes nothing"
    args = cli.build_parser().parse_args(
        ["poison", "replay", "--all", "--rate", "100", "--reason-code", "bad_payload"]
    )
    assert cli.cmd_poison(rt, args) == 0
    assert drain_raw(rt, rt.settings.jobs_queue) == [], "the CLI only started it: the app does the work"
    take_steps(rt)
    assert sorted(json.loads(b)["id"] for b in drain_raw(rt, rt.settings.jobs_queue)) == [
        "bp-0",
        "bp-1",
        "bp-2",
    ]
    args = cli.build_parser().parse_args(["poison", "list", "--limit", "2"])
    assert cli.cmd_poison(rt, args) == 0
    out = capsys.readouterr().out
    assert "2 shown; 6 listed" in out and "next page: --after" in out


def test_the_audit_page_lists_every_operator_action_newest_first_with_edits_old_and_new_values(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shared.interfaces import cli
    from shared.interfaces.console import routes

    groups = seed_groups(rt)
    actions.park(rt, groups["bad_payload"][:1], "alice")
    a_moment_later()
    actions.unpark(rt, groups["bad_payload"][:1], "bob")
    a_moment_later()
    actions.delete(rt, groups["max_dequeue"], "carol")
    a_moment_later()
    text = json.dumps(
        {"id": "im-0", "kind": "noop", "payload": {"note": "fixed <b>"}, "created_at": isoformat(rt.clock())}
    )
    actions.replay_edited(rt, "im-0", text, "dave")
    a_moment_later()
    actions.start_op(
        rt,
        {"kind": "replay", "state": "poisoned", "rate": 5, "where": {"reason_code": "bad_payload"}},
        "erin",
    )
    a_moment_later()
    assert (
        cli.cmd_ops(
            rt,
            cli.build_parser().parse_args(["ops", "start", "--kind", "purge", "--dry-run", "--by", "frank"]),
        )
        == 0
    )
    rt.archive.upsert(
        "edits/old-job/abc.json",
        {"job_id": "old-job", "by": "gus", "at": "2026-01-01T00:00:00Z", "changes": ["payload.n"]},
    )
    assert rt.audit.backfill(rt.archive) == 1, "the edit from before the audit table; the others are recorded"
    assert rt.audit.backfill(rt.archive) == 1, "again: the same row rewritten"
    rows, after = rt.audit.page(size=50)
    seen = [(r.by, r.action) for r in rows]
    assert seen[:6] == [
        ("frank", "op_start"), ("erin", "op_start"), ("dave", "replay_edited"), ("carol", "delete"),
        ("bob", "unpark"), ("alice", "park"),
    ]  # fmt: skip
    assert ("gus", "replay_edited") in seen and after == ""
    edit = next(r for r in rows if r.by == "dave")
    assert (
        edit.target == "im-0"
        and {"field": "payload.note", "old": "null", "new": '"fixed <b>"'} in edit.details["changes"]
    )
    assert next(r for r in rows if r.by == "erin").details["where"] == {"reason_code": "bad_payload"}
    first, key = rt.audit.page(size=2)
    second, _ = rt.audit.page(key, size=2)
    assert [r.key for r in first + second] == [r.key for r in rows[:4]], "paged newest first"
    monkeypatch.setattr(routes, "get_runtime", lambda: rt)
    import azure.functions as func

    req = func.HttpRequest(
        "GET", "http://127.0.0.1:7071/api/console/audit", headers={"host": "127.0.0.1:7071"}, params={},
        route_params={"path": "audit"}, body=b"",
    )  # fmt: skip
    html = routes.handle(req, {}).get_body().decode()
    assert "fixed &lt;b&gt;" in html and '<b>"' not in html and "data-field='payload.note'" in html
    assert html.count("<tr data-action=") == len(rows)


def test_replay_selected_reads_each_entry_by_the_name_the_page_sent_and_only_the_jobs_own(
    rt: Runtime,
) -> None:
    a = poisoned(rt, "sel-a", "bad_payload: x")
    b = poisoned(rt, "sel-b", "bad_payload: y")
    answer = actions.replay_batch(rt, ["sel-a", "sel-b"], 10, "t", [a, a])  # sel-b's name is not its own
    assert answer["replayed"] == ["sel-a", "sel-b"], "a name not the job's own is looked up instead"
    assert {r.name for r in [*(rt.entry_index.page("replayed") if rt.entry_index else [])]} >= {a, b}
