"""The console by queue, its pure parts: how a job of another queue is named and linked, which
archive entries are a job's own, the counters per reason code and per queue, and what an operator
limited to some queues is told (issue 46)."""

from __future__ import annotations

import pytest

from shared.core.archive_layout import entry_name, is_job_entry_of
from shared.indexes.entry_rows import EntryRow, count_changes, counted_code, counts_of, queue_counts_of
from shared.interfaces.console.by_queue import job_href, split_key
from shared.interfaces.console.queue_access import check, refusal
from shared.interfaces.console.queue_html import queue_links, queues_table
from shared.interfaces.console.security import Denied, Principal, authorize, decode_principal

AZURE = {"WEBSITE_INSTANCE_ID": "abc", "WEBSITE_AUTH_ENABLED": "true", "JOBS_QUEUES": "jobs,gold"}


def test_a_job_of_another_queue_is_named_and_linked_with_its_queue() -> None:
    assert split_key("gold/a-1") == ("gold", "a-1") and split_key("a-1") == ("", "a-1")
    assert job_href("/api/console", "gold/a-1") == "/api/console/jobs/a-1?queue=gold"
    assert job_href("/api/console", "a-1") == "/api/console/jobs/a-1"


def test_a_default_queue_job_named_like_a_queue_owns_only_its_own_entries() -> None:
    own = entry_name("gold", "d1")  # the default queue's job "gold"
    other = entry_name("gold/x", "d2")  # job "x" of queue gold
    assert is_job_entry_of(own, "gold") and not is_job_entry_of(other, "gold")
    assert is_job_entry_of(other, "gold/x") and not is_job_entry_of(own, "gold/x")


def row(code: str, queue: str, state: str = "poisoned") -> EntryRow:
    return EntryRow("jobs/a/1.json", state, "a", f"{code}: x", "t", 1, 1, "k", code, queue)


def test_listed_counts_are_kept_per_reason_code_and_queue() -> None:
    assert counted_code("bad", "gold") == "bad@gold" and counted_code("bad", "") == "bad"
    assert count_changes(None, row("bad", "gold")) == [("bad@gold", 1)]
    assert count_changes(row("bad", "gold"), row("bad", "gold", "parked")) == [("bad@gold", -1)]
    counters = [
        {"RowKey": "bad@gold|01", "n": 2},
        {"RowKey": "bad@jobs|03", "n": 1},
        {"RowKey": "bad|00", "n": 4},  # written before queues were counted: the default's
        {"RowKey": "expired@gold|02", "n": 1},
    ]
    assert counts_of(counters) == {"bad": 7, "expired": 1}
    assert counts_of(counters, "gold", "jobs") == {"bad": 2, "expired": 1}
    assert counts_of(counters, "jobs", "jobs") == {"bad": 5}
    assert queue_counts_of(counters, "jobs") == {"jobs": 5, "gold": 3}


def principal(role: str, group: str = "") -> str:
    import base64
    import json

    claims = [{"typ": "roles", "val": role}, *([{"typ": "groups", "val": group}] if group else [])]
    doc = {"auth_typ": "aad", "role_typ": "roles", "claims": claims}
    return base64.b64encode(json.dumps(doc).encode()).decode()


def test_a_queues_own_roles_grant_that_queue_only_and_say_why_elsewhere() -> None:
    env = {**AZURE, "CONSOLE_ALLOWED_ROLES": "Ops", "QUEUE_GOLD_CONSOLE_ROLES": "Gold"}
    headers = {"host": "app.example", "x-ms-client-principal": principal("Gold")}
    gold = authorize(headers, env)
    assert gold.queues == frozenset({"gold"})
    assert authorize({**headers, "x-ms-client-principal": principal("Ops")}, env).queues is None
    check(gold, "gold")
    with pytest.raises(Denied) as denied:
        check(gold, "jobs")
    assert denied.value.status == 403
    assert "may operate the jobs of queue gold only, not of jobs" in str(denied.value)
    assert "QUEUE_JOBS_CONSOLE_ROLES" in str(denied.value)
    assert "not of every queue" in refusal(gold, "")
    only_queue = {**AZURE, "QUEUE_GOLD_CONSOLE_GROUPS": "g-1"}  # no app-wide role at all
    grouped = authorize({**headers, "x-ms-client-principal": principal("x", group="g-1")}, only_queue)
    assert grouped.queues == frozenset({"gold"}) and decode_principal(principal("x")).queues is None
    with pytest.raises(Denied):
        authorize({**headers, "x-ms-client-principal": principal("Other")}, only_queue)
    check(Principal("local", "local"), "jobs")  # the local host and the admin key: every queue


def test_the_queue_picker_and_table_show_what_the_operator_may_see() -> None:
    assert queue_links("/c", "jobs", ["jobs"], "") == ""
    links = queue_links("/c", "jobs", ["jobs", "gold"], "gold")
    assert "all queues" in links and "data-queue-shown='gold'" in links and "/c/jobs?queue=jobs" in links
    assert "all queues" not in queue_links("/c", "jobs", ["gold"], "gold", allow_all=False)
    table = queues_table(
        "/c",
        [{"name": "gold", "depth": 3, "oldest_age_s": 90.0, "max_concurrent": 4, "running": 4, "waiting": 2,
          "poisoned": 1, "poison_depth": 0, "account": "PARTNER"}],
    )  # fmt: skip
    assert "4 / 4 (2 waiting)" in table and "90 s" in table and "PARTNER" in table
    assert queues_table("/c", []) == ""
