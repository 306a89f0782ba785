"""The console by queue (issue 46): every page and data route filters by `?queue=`, the overview
shows each queue's backlog, oldest message, running against its limit and poisoned count, a job
page shows its queue, and its actions go to that queue; on the in-memory account and Azurite."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import azure.functions as func
import pytest

from shared.interfaces import api
from shared.interfaces.console import routes
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


def test_the_overview_shows_each_queue_and_costs_a_few_requests_a_queue(rt: Runtime) -> None:
    first, gold = names(rt)
    poison_on(rt, gold, "o-1")
    for n in range(2):
        rt.storage.queue(first).send_message(json.dumps({"id": f"w-{n}", "kind": "noop", "payload": {}}))
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
