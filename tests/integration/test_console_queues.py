"""The console by queue (issue 46): every page and data route filters by `?queue=`, the overview
shows each queue's backlog, oldest message, running against its limit and poisoned count, a job
page shows its queue, and its actions go to that queue; on the in-memory account and Azurite."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import azure.functions as func
import pytest

from shared.interfaces import api
from shared.interfaces.console import by_queue, routes
from shared.interfaces.console.security import issue_token
from shared.runtime.wiring import Runtime
from tests.integration.backends import Backend
from tests.integration.helpers import drain_raw, unique
from tests.integration.test_queues import poison_on

SECRET = "s" * 40
ENV = {"CONSOLE_CSRF_SECRET": SECRET}
HOST = {"host": "127.0.0.1:7071"}


@pytest.fixture
def rt(storage_backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    first, second = unique("jobs"), unique("gold")
    runtime = storage_backend.runtime(
        None,
        JOBS_QUEUES=f"{first},{second}",
        **{f"QUEUE_{second.upper()}_MAX_ATTEMPTS": "1", f"QUEUE_{second.upper()}_MAX_CONCURRENT": "3"},
        MAX_ATTEMPTS="1",
    )
    monkeypatch.setattr(api, "get_runtime", lambda: runtime)
    monkeypatch.setattr(routes, "get_runtime", lambda: runtime)
    yield runtime


def get(path: str, **params: str) -> tuple[int, str]:
    req = func.HttpRequest(
        "GET", f"http://127.0.0.1:7071/api/console/{path}", headers=HOST, params=params,
        route_params={"path": path}, body=b"",
    )  # fmt: skip
    resp = routes.handle(req, ENV)
    return resp.status_code, resp.get_body().decode()


def data(path: str, **params: str) -> Any:
    status, body = get(f"data/{path}", **params)
    assert status == 200, body
    return json.loads(body)


def post(action: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    token = issue_token("local:local", SECRET.encode(), time.time())
    headers = {**HOST, "cookie": f"console_csrf={token}", "x-console-csrf": token}
    req = func.HttpRequest(
        "POST", f"http://127.0.0.1:7071/api/console/action/{action}", headers=headers, params={},
        route_params={"path": f"action/{action}"}, body=json.dumps(body).encode(),
    )  # fmt: skip
    resp = routes.handle(req, ENV)
    return resp.status_code, json.loads(resp.get_body())


def names(rt: Runtime) -> tuple[str, str]:
    first, gold = rt.settings.queue_set.names
    return first, gold


def test_the_overview_shows_each_queues_backlog_age_running_and_poisoned(rt: Runtime) -> None:
    first, gold = names(rt)
    poison_on(rt, gold, "o-1")
    for n in range(2):
        rt.account.queue(first).send_message(json.dumps({"id": f"w-{n}", "kind": "noop", "payload": {}}))
    rows = {r["name"]: r for r in data("overview")["queues"]}
    assert (rows[first]["depth"], rows[first]["poisoned"], rows[first]["max_concurrent"]) == (2, 0, None)
    assert rows[first]["oldest_age_s"] >= 0 and rows[first]["running"] is None
    assert (rows[gold]["depth"], rows[gold]["poisoned"]) == (0, 1)
    assert (rows[gold]["max_concurrent"], rows[gold]["running"], rows[gold]["waiting"]) == (3, 0, 0)
    assert [r["name"] for r in data("overview", queue=gold)["queues"]] == [gold]
    status, html = get("", queue=gold)
    assert status == 200 and "<table id=queues>" in html and f"data-queue-shown='{gold}'" in html
    assert "0 / 3" in html
    assert get("", queue="nowhere")[0] == 404 and get("data/poison", queue="nowhere")[0] == 404


def test_pages_and_data_filter_by_queue_and_link_to_the_jobs_own_queue(rt: Runtime) -> None:
    first, gold = names(rt)
    poison_on(rt, gold, "f-1")
    poison_on(rt, None, "f-2")
    assert [e["job_id"] for e in data("poison", queue=gold)["archived"]] == [f"{gold}/f-1"]
    assert [e["job_id"] for e in data("poison", queue=first)["archived"]] == ["f-2"]
    assert {e["job_id"] for e in data("poison")["archived"]} == {"f-2", f"{gold}/f-1"}
    assert data("poison", queue=gold)["groups"] == {"bad_input_data": 1}
    _, html = get("poison", queue=gold)
    assert f"/api/console/jobs/f-1?queue={gold}" in html and "f-2" not in html
    assert f"data-queue='{gold}'" in html  # its bulk operations keep to the queue
    assert [(r["id"], r["queue"]) for r in data("jobs", queue=gold)["rows"]] == [("f-1", gold)]
    assert [(r["id"], r["queue"]) for r in data("jobs", queue=first)["rows"]] == [("f-2", "")]
    assert {r["id"] for r in data("jobs")["rows"]} == {"f-1", "f-2"}
    _, html = get("jobs")
    assert f"/api/console/jobs/f-1?queue={gold}" in html and "/api/console/jobs/f-2'" in html
    status, html = get("jobs/f-1", queue=gold)
    assert status == 200 and f"<b id=job-queue>{gold}</b>" in html and f"data-job='{gold}/f-1'" in html
    assert get("jobs/f-1")[0] == 404  # not on the default queue
    assert data("jobs/f-1", queue=gold)["queue"] == gold
    status, _ = get("jobs", id="f-1", queue=gold)
    assert status == 303
    req = func.HttpRequest(
        "GET", "http://127.0.0.1:7071/api/console/jobs", headers=HOST, params={"id": "f-1"},
        route_params={"path": "jobs"}, body=b"",
    )  # fmt: skip
    found = routes.handle(req, ENV)  # no queue given: each queue's ledger, one read each
    assert found.status_code == 303 and found.headers["Location"] == f"/api/console/jobs/f-1?queue={gold}"


def test_a_job_page_edit_replays_to_the_jobs_own_queue(rt: Runtime) -> None:
    first, gold = names(rt)
    poison_on(rt, gold, "e-1")
    view = data("jobs/e-1", queue=gold)
    env = {**json.loads(view["envelope_text"]), "payload": {"note": "fixed"}}
    status, body = post("validate", {"job_id": f"{gold}/e-1", "envelope": json.dumps(env)})
    assert status == 200 and body["valid"], body
    status, body = post("replay-edited", {"job_id": f"{gold}/e-1", "envelope": json.dumps(env)})
    assert status == 200 and body["changes"] == ["payload.note", "payload.permanent"], body
    [sent] = drain_raw(rt.for_queue(gold), gold)
    assert json.loads(sent)["payload"] == {"note": "fixed"} and drain_raw(rt, first) == []
    assert data("jobs/e-1", queue=gold)["record"]["status"] == "queued"
    status, body = post("cancel", {"job_id": "nowhere/e-1"})
    assert status == 400 and "no queue 'nowhere'" in body["error"]


def test_parking_keeps_the_copy_on_the_entrys_own_parked_queue(rt: Runtime) -> None:
    first, gold = names(rt)
    poison_on(rt, gold, "k-1")
    [entry] = data("poison", queue=gold)["archived"]
    status, body = post("park", {"names": [entry["name"]]})
    assert status == 200 and body["parked"] == [entry["name"]]
    parked = drain_raw(rt, f"{gold}-parked")
    assert [json.loads(b)["id"] for b in parked] == ["k-1"] and drain_raw(rt, f"{first}-parked") == []
    assert [e["job_id"] for e in data("poison", queue=gold)["parked"]] == [f"{gold}/k-1"]


# -- an operator limited to one queue's jobs ---------------------------------------------------


def azure_env(rt: Runtime) -> dict[str, str]:
    """In Azure, with Easy Auth: `Console.Operator` sees every queue, `Gold.Operator` the second only."""
    first, gold = names(rt)
    return {
        "WEBSITE_INSTANCE_ID": "abc",
        "WEBSITE_AUTH_ENABLED": "true",
        "CONSOLE_CSRF_SECRET": SECRET,
        "CONSOLE_ALLOWED_ROLES": "Console.Operator",
        "JOBS_QUEUES": f"{first},{gold}",
        f"QUEUE_{gold.upper()}_CONSOLE_ROLES": "Gold.Operator",
    }


def signed_in(role: str) -> dict[str, str]:
    doc = {
        "auth_typ": "aad",
        "name_typ": "name",
        "role_typ": "roles",
        "claims": [
            {"typ": "name", "val": "gil"},
            {"typ": "oid", "val": "oid-gil"},
            {"typ": "roles", "val": role},
        ],
    }
    return {
        "host": "jobs.example",
        "x-ms-client-principal": base64.b64encode(json.dumps(doc).encode()).decode(),
    }


def as_operator(
    rt: Runtime, role: str, method: str, path: str, body: Any = None, **params: str
) -> tuple[int, str]:
    headers = signed_in(role)
    if method == "POST":
        token = issue_token("aad:oid-gil", SECRET.encode(), time.time())
        headers.update(
            {"cookie": f"console_csrf={token}", "x-console-csrf": token, "origin": "https://jobs.example"}
        )
    req = func.HttpRequest(
        method, f"https://jobs.example/api/console/{path}", headers=headers, params=params,
        route_params={"path": path}, body=json.dumps(body).encode() if body is not None else b"",
    )  # fmt: skip
    resp = routes.handle(req, azure_env(rt))
    return resp.status_code, resp.get_body().decode()


def test_an_operator_limited_to_one_queue_sees_and_acts_on_its_jobs_only(rt: Runtime) -> None:
    first, gold = names(rt)
    poison_on(rt, gold, "g-1")
    poison_on(rt, None, "d-1")
    status, page = as_operator(rt, "Gold.Operator", "GET", "data/poison")
    assert status == 200 and [e["job_id"] for e in json.loads(page)["archived"]] == [f"{gold}/g-1"]
    status, page = as_operator(rt, "Gold.Operator", "GET", "data/overview")
    assert [q["name"] for q in json.loads(page)["queues"]] == [gold]
    status, page = as_operator(rt, "Gold.Operator", "GET", "jobs")
    assert status == 200 and "g-1" in page and "d-1" not in page
    status, page = as_operator(rt, "Gold.Operator", "GET", "poison", queue=first)
    assert status == 403 and f"may operate the jobs of queue {gold} only, not of {first}" in page
    assert f"QUEUE_{first.upper()}_CONSOLE_ROLES" in page
    status, page = as_operator(rt, "Gold.Operator", "GET", "audit")
    assert status == 403 and "not of every queue" in page
    status, page = as_operator(rt, "Gold.Operator", "GET", "jobs/d-1/result")
    assert status == 403
    [default_entry] = data("poison", queue=first)["archived"]
    refused = {
        "replay": {"ids": ["d-1"], "rate": 10},
        "park": {"names": [default_entry["name"]]},
        "purge": {"older_than_days": 0},
        "op-start": {"kind": "replay", "state": "poisoned", "rate": 10},
        "cancel": {"job_id": "d-1"},
    }
    for action, body in refused.items():
        status, answer = as_operator(rt, "Gold.Operator", "POST", f"action/{action}", body)
        assert status == 403 and "may operate the jobs of queue" in json.loads(answer)["error"], action
    assert data("poison", queue=first)["archived"] == [default_entry], "nothing was changed"
    status, answer = as_operator(
        rt, "Gold.Operator", "POST", "action/replay", {"ids": [f"{gold}/g-1"], "rate": 10}
    )
    assert status == 200 and json.loads(answer)["replayed"] == [f"{gold}/g-1"]
    status, answer = as_operator(
        rt, "Gold.Operator", "POST", "action/op-start",
        {"kind": "replay", "state": "poisoned", "rate": 10, "dry_run": True, "where": {"queue": gold}},
    )  # fmt: skip
    assert status == 200, answer
    status, page = as_operator(rt, "Console.Operator", "GET", "data/poison")
    assert status == 200 and [e["job_id"] for e in json.loads(page)["archived"]] == ["d-1"]
    assert as_operator(rt, "Other.Role", "GET", "data/poison")[0] == 403


def test_the_table_of_queues_costs_a_few_requests_a_queue_whatever_the_history(
    rt: Runtime, storage_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, gold = names(rt)
    poison_on(rt, gold, "h-0")
    for n in range(5):
        rt.account.queue(first).send_message(json.dumps({"id": f"w-{n}", "kind": "noop", "payload": {}}))

    def cost() -> list[str]:
        sent = storage_backend.record_requests(monkeypatch)
        rows = by_queue.queue_rows(rt)
        assert [r.name for r in rows] == [first, gold]
        return sent()

    before = cost()
    # the counters (1); the first queue: properties, a peek (not empty), its poison queue's
    # properties (3); gold: properties (empty: no peek), its poison queue's, its permits (3)
    assert len(before) == 7, before
    for n in range(1, 4):
        poison_on(rt, gold, f"h-{n}")
    assert len(cost()) == len(before), "the same requests, whatever the history"
    assert by_queue.queue_rows(rt)[1].poisoned == 4
