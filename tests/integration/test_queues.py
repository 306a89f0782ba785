"""Several job queues in one app (issue 46): the API's `queue`, one job id on two queues, a
queue's KINDS, expiry, retry policy and `http` allowance, on the in-memory account and Azurite."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import azure.functions as func
import pytest

from shared import poison
from shared.interfaces import api, cli
from shared.observability import queue_metrics
from shared.pipeline.processing import process_message
from shared.runtime.wiring import Runtime
from tests.integration.backends import Backend
from tests.integration.helpers import drain_raw, message, unique
from tests.otel_support import memory_telemetry, metric_points


@pytest.fixture
def rt(storage_backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    first, second = unique("jobs"), unique("gold")
    settings: dict[str, str] = {
        "JOBS_QUEUES": f"{first},{second}",
        **{
            f"QUEUE_{second.upper()}_KINDS": "noop, fault, http",
            f"QUEUE_{second.upper()}_MAX_ATTEMPTS": "1",
            f"QUEUE_{second.upper()}_JOB_TTL_SECONDS": "60",
            f"QUEUE_{second.upper()}_HTTP_ALLOWED_HOSTS": "127.0.0.1:9",
        },
    }
    runtime = storage_backend.runtime(None, **settings)
    monkeypatch.setattr(api, "get_runtime", lambda: runtime)
    yield runtime


def second(rt: Runtime) -> str:
    return rt.settings.queue_set.names[1]


def post(body: Any) -> tuple[int, dict[str, Any]]:
    req = func.HttpRequest(
        method="POST", url="http://localhost/api/jobs", body=json.dumps(body).encode(), headers={}, params={}
    )
    resp = api.submit_job(req)
    return resp.status_code, json.loads(resp.get_body())


def get(path: str, job_id: str, queue: str | None = None) -> tuple[int, dict[str, Any]]:
    req = func.HttpRequest(
        method="GET",
        url=f"http://localhost/api/{path}",
        body=b"",
        route_params={"id": job_id},
        params={"queue": queue} if queue else {},
    )
    resp = api.get_result(req) if path.endswith("/result") else api.get_job(req)
    return resp.status_code, json.loads(resp.get_body())


def run_queue(rt: Runtime, queue: str | None) -> int:
    """Deliver every message on `queue` (None: the default) once, as its trigger would."""
    name = queue or rt.settings.queue_set.default.name
    bodies = drain_raw(rt.for_queue(queue), name)
    for body in bodies:
        process_message(message(body), rt, queue=queue)
    return len(bodies)


def test_two_queues_one_job_id_two_jobs_two_results(rt: Runtime) -> None:
    gold = second(rt)
    assert post({"id": "same-1", "kind": "noop", "payload": {"note": "default"}})[0] == 202
    status, body = post({"id": "same-1", "kind": "noop", "payload": {"note": "gold"}, "queue": gold})
    assert status == 202 and body["status_url"].endswith(f"/api/jobs/same-1?queue={gold}")
    assert run_queue(rt, None) == 1 and run_queue(rt, gold) == 1
    assert get("jobs/same-1/result", "same-1") == (200, {"id": "same-1", "summary": {"note": "default"}})
    assert get("jobs/same-1/result", "same-1", gold) == (200, {"id": "same-1", "summary": {"note": "gold"}})
    status, record = get("jobs/same-1", "same-1", gold)
    assert status == 200 and record["status"] == "completed" and record["queue"] == gold
    assert "queue" not in get("jobs/same-1", "same-1")[1]  # the default queue's records as before
    assert rt.ledger.store.read(f"{gold}/same-1.json") is not None and rt.ledger.get("same-1") is not None


def test_a_queue_that_is_not_declared_is_refused(rt: Runtime) -> None:
    status, body = post({"kind": "noop", "payload": {}, "queue": "nowhere"})
    assert status == 400 and "no queue 'nowhere' is declared" in body["problems"][0]
    assert get("jobs/x", "x", "nowhere")[0] == 400


def test_kinds_refused_at_post_and_poisoned_with_the_reason_when_put_directly(rt: Runtime) -> None:
    gold = second(rt)
    aggregate = {"id": "agg-1", "kind": "aggregate", "payload": {"input": {"container": "c", "blob": "b"}}}
    status, body = post({**aggregate, "queue": gold})
    assert status == 400 and any(f"queue {gold} does not run kind 'aggregate'" in p for p in body["problems"])
    assert get("jobs/agg-1", "agg-1", gold)[0] == 404  # nothing recorded, nothing sent
    rt.for_queue(gold).account.queue(gold).send_message(json.dumps(aggregate))  # the producer's own send
    assert run_queue(rt, gold) == 1
    status, record = get("jobs/agg-1", "agg-1", gold)
    assert status == 200 and record["status"] == "poisoned" and record["reason_code"] == "kind_not_allowed"
    assert "does not run kind 'aggregate'" in record["reason"]
    poisoned = drain_raw(rt.for_queue(gold), f"{gold}-poison")
    assert [json.loads(body)["id"] for body in poisoned] == ["agg-1"]


def test_each_queue_its_own_retry_policy(rt: Runtime) -> None:
    gold = second(rt)
    job = {"kind": "fault", "payload": {"transient_failures": 1}}
    assert post({**job, "id": "tr-d"})[0] == 202 and post({**job, "id": "tr-g", "queue": gold})[0] == 202
    run_queue(rt, None)
    run_queue(rt, gold)
    assert get("jobs/tr-d", "tr-d")[1]["status"] == "retry_scheduled"  # the app's MAX_ATTEMPTS (5)
    record = get("jobs/tr-g", "tr-g", gold)[1]
    assert record["status"] == "poisoned" and "gave up after 1 attempts" in record["reason"]


def test_a_job_past_its_queues_expiry_is_poisoned_not_run(rt: Runtime) -> None:
    gold = second(rt)
    old = (datetime.now(UTC) - timedelta(seconds=120)).isoformat()
    for name in (gold, rt.settings.queue_set.default.name):
        env = {"id": "old-1", "kind": "noop", "payload": {}, "created_at": old}
        rt.account.queue(name).send_message(json.dumps(env))
    run_queue(rt, gold)
    run_queue(rt, None)
    record = get("jobs/old-1", "old-1", gold)[1]
    assert record["status"] == "poisoned" and record["reason_code"] == "expired"
    assert get("jobs/old-1", "old-1")[1]["status"] == "completed"  # the app's 7 days


def test_each_queue_its_own_http_allowance(rt: Runtime) -> None:
    call = {"kind": "http", "payload": {"url": "http://127.0.0.1:9/"}}
    status, body = post(call)
    assert status == 400 and "HTTP_ALLOWED_HOSTS" in json.dumps(body["problems"])
    assert post({**call, "queue": second(rt)})[0] == 202


def test_the_cli_enqueues_to_and_shows_from_a_queue(rt: Runtime, capsys: pytest.CaptureFixture[str]) -> None:
    gold = second(rt)
    args = cli.build_parser().parse_args(
        ["--queue", gold, "enqueue", "--kind", "noop", "--payload", "{}", "--id", "c-1"]
    )
    assert args.queue == gold and cli.cmd_enqueue(rt, args) == 0
    assert "c-1\tenqueued" in capsys.readouterr().out
    assert run_queue(rt, gold) == 1 and run_queue(rt, None) == 0
    assert cli.cmd_show(rt.for_queue(gold), args) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "completed"
    assert cli.cmd_show(rt, args) == 1  # not on the default queue


# -- operators by queue: the poison archive --------------------------------------------------


def poison_on(rt: Runtime, queue: str | None, job_id: str) -> None:
    """A job that fails once, poisoned on `queue` at its first failure (MAX_ATTEMPTS 1 there),
    and archived by that queue's poison handler."""
    lane = rt.for_queue(queue)
    body = {"id": job_id, "kind": "fault", "payload": {"permanent": True}}
    lane.account.queue(lane.queue.name).send_message(json.dumps(body))
    run_queue(rt, queue)
    for raw in drain_raw(lane, lane.queue.poison):
        poison.handle_poison_message(message(raw), rt, queue=queue)


def replay_req(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    req = func.HttpRequest(
        method="POST", url="http://localhost/api/poison/replay", body=json.dumps(body).encode(), params={}
    )
    resp = api.replay_poison(req)
    return resp.status_code, json.loads(resp.get_body())


def poison_page(queue: str = "") -> dict[str, Any]:
    req = func.HttpRequest(
        method="GET", url="http://localhost/api/poison", body=b"", params={"queue": queue} if queue else {}
    )
    resp = api.list_poison(req)
    assert resp.status_code == 200
    return dict(json.loads(resp.get_body()))


def test_a_poisoned_job_is_replayed_to_the_queue_it_came_from(rt: Runtime) -> None:
    gold, default = second(rt), rt.settings.queue_set.default.name
    poison_on(rt, gold, "p-1")
    poison_on(rt, None, "p-1")  # the same id on the default queue: another job, another entry
    listed = poison_page(gold)
    assert [(r["job_id"], r["queue"]) for r in listed["archived"]] == [(f"{gold}/p-1", gold)]
    assert listed["counts"] == {"bad_input_data": 1}
    assert {r["job_id"] for r in poison_page()["archived"]} == {"p-1", f"{gold}/p-1"}
    assert rt.entry_index.queue_counts(default) == {default: 1, gold: 1}

    status, report = replay_req({"ids": ["p-1"], "queue": gold})
    assert status == 200 and report["replayed"] == ["p-1"]
    sent = drain_raw(rt.for_queue(gold), gold)
    assert [json.loads(b)["id"] for b in sent] == ["p-1"] and drain_raw(rt, default) == []
    assert get("jobs/p-1", "p-1", gold)[1]["status"] == "queued"
    assert get("jobs/p-1", "p-1")[1]["status"] == "poisoned"  # the default queue's p-1 untouched
    assert poison_page(gold)["archived"] == [] and len(poison_page()["archived"]) == 1

    status, report = replay_req({"ids": [f"{gold}/p-1"]})  # as listed: already replayed
    assert status == 200 and report["not_found"] == [f"{gold}/p-1"]
    status, report = replay_req({"ids": ["p-1"]})  # the default queue's, to the default queue
    assert status == 200 and report["replayed"] == ["p-1"]
    assert [json.loads(b)["id"] for b in drain_raw(rt, default)] == ["p-1"]
    assert drain_raw(rt.for_queue(gold), gold) == []
    assert replay_req({"ids": ["p-1"], "queue": "nowhere"})[0] == 400


def test_the_cli_lists_and_replays_one_queues_poisoned_jobs(
    rt: Runtime, capsys: pytest.CaptureFixture[str]
) -> None:
    gold = second(rt)
    poison_on(rt, gold, "c-2")
    poison_on(rt, None, "d-2")
    args = cli.build_parser().parse_args(["--queue", gold, "poison", "list"])
    assert cli.cmd_poison(rt.for_queue(gold), args) == 0
    out = capsys.readouterr().out
    assert f"{gold}/c-2" in out and "d-2" not in out and "1 listed" in out
    args = cli.build_parser().parse_args(["--queue", gold, "poison", "replay", "--all", "--here"])
    assert cli.cmd_poison(rt.for_queue(gold), args) == 0
    assert json.loads(capsys.readouterr().out.strip())["replayed"] == [f"{gold}/c-2"]
    assert [json.loads(b)["id"] for b in drain_raw(rt.for_queue(gold), gold)] == ["c-2"]
    assert drain_raw(rt, rt.settings.queue_set.default.name) == []
    assert [r["job_id"] for r in poison_page()["archived"]] == ["d-2"]


def test_a_queues_deliveries_and_samples_carry_its_name(rt: Runtime) -> None:
    _, reader = memory_telemetry()
    gold, first = second(rt), rt.settings.queue_set.default.name
    assert post({"id": "m-1", "kind": "noop", "payload": {}, "queue": gold})[0] == 202
    assert post({"id": "m-2", "kind": "noop", "payload": {}})[0] == 202
    assert run_queue(rt, gold) == 1 and run_queue(rt, None) == 1
    done = {(a.get("queue_name"), a.get("job.outcome")) for a, _ in metric_points(reader, "jobs.deliveries")}
    assert {(gold, "completed"), (first, "completed")} <= done
    queue_metrics.sample(rt)
    depth = {(a.get("queue_name"), a["queue"]) for a, _ in metric_points(reader, "jobs.queue.depth")}
    assert {(gold, "jobs"), (gold, "poison"), (first, "jobs")} <= depth


def test_one_job_id_on_two_queues_is_two_holders_of_a_shared_limit_each_parked_on_its_queue(
    storage_backend: Backend,
) -> None:
    """A per-host limit spans queues: the same id on two queues is two jobs in its line (not one
    holder twice), and a waiter from one queue is parked, and woken by a release on the other
    queue's lane, on its own queue."""
    from shared.core.envelope import Envelope, utcnow
    from shared.pipeline import gate

    first, gold = unique("jobs"), unique("gold")
    rt = storage_backend.runtime(
        None,
        JOBS_QUEUES=f"{first},{gold}",
        HTTP_MAX_CONCURRENT_PER_HOST="1",
        HTTP_ALLOWED_HOSTS="127.0.0.1:9",
        **{f"QUEUE_{gold.upper()}_HTTP_ALLOWED_HOSTS": "127.0.0.1:9"},
    )
    default, lane = rt.for_queue(None), rt.for_queue(gold)
    job = Envelope("same-2", "http", utcnow(), payload={"url": "http://127.0.0.1:9/x"})
    held = gate.admit(default, job, "owner-a", {})
    assert held is not None and held.hold is not None, "the default queue's job takes the one permit"
    assert gate.admit(lane, job, "owner-b", {}) is None, "the gold queue's job of the same id waits"
    assert drain_raw(default, first) == [], "nothing parked on the default queue"
    assert lane.permits.waiting_reason(lane.job_key("same-2")) is not None
    held.release()  # on the default queue's lane: wakes the gold job's parked message
    woken = drain_raw(lane, gold)
    assert [json.loads(body)["id"] for body in woken] == ["same-2"], "parked and woken on its own queue"
