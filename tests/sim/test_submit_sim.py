"""The producer's side in the deterministic simulation: POST /api/jobs (the real handler, on the
World's storage) with a fault at every storage call of the submit path, the producer's retries,
then the world runs; and two POSTs of one id at once, in every interleaving.

One schedule = one producer flow with one kind of fault (the API process crashing; a storage
error; a write applied whose answer is lost) at call number k of the submit path, and at the
0-2 calls right after it (`BURSTS`). After each schedule:
- the producer's POSTs got at most one 202; retried at once until answered, the producer ends
  with a 202 (also when the write that clears `send_pending` after the send failed: the marker
  stays for the first delivery to drop), or with a 409 naming its own request (`same_request`);
- the same request posted again after its 202: 409, nothing sent; or, when that 202 left
  `send_pending`, a second 202 and a second message (the send lease had ended);
- once the producer has an answer (202 or 409), a `queued` record has a message on the queue, and
  at every answer a `queued` record without `send_pending` has one (what GET shows is true);
- the world then runs to quiescence: the job completed, its effect applied, its handler run once
  (a second message from a retried send meets the ledger, never the handler), nothing left over.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import azure.functions as func
import pytest

from shared import ledger
from shared.interfaces import api
from shared.pipeline.submit import SEND_LEASE_S, request_digest, validate_request
from tests.sim.scenarios import check, job
from tests.sim.world import FAULT_KINDS, Faults, Interleaver, SimCrash, World, schedules

JOB = "s1"
BODY = job(JOB)
OTHER_BODY = job(JOB, work_s=1)
MAX_POSTS = 5
"""A producer retries a POST that got no answer or a 5xx, up to this many POSTs in all."""
Answer = int | str
"""An HTTP status; "409 other" (the id exists from another request); or "crash" (the API
process died: the producer saw no answer)."""


class _Api:
    """Routes the API handlers' runtime to the world of the schedule being run."""

    world: World | None = None
    markers_left = 0
    """202 answers given with `send_pending` left on the record (the clear failed after the send)."""


@pytest.fixture(autouse=True)
def _world_runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    def runtime() -> Any:
        assert _Api.world is not None
        return _Api.world.rt

    monkeypatch.setattr(api, "get_runtime", runtime)
    logging.disable(logging.CRITICAL)
    yield
    logging.disable(logging.NOTSET)
    _Api.world = None


def post(world: World, body: dict[str, object]) -> Answer:
    """One POST /api/jobs through the real handler."""
    req = func.HttpRequest(
        method="POST", url="http://sim/api/jobs", body=json.dumps(body).encode(), headers={}, params={}
    )
    try:
        resp = api.submit_job(req)
    except SimCrash:
        world.crash(None)
        return "crash"
    if resp.status_code == 409 and not json.loads(resp.get_body())["same_request"]:
        return "409 other"
    if resp.status_code == 202 and (record_of(world) or {}).get("send_pending"):
        _Api.markers_left += 1
    status: int = resp.status_code
    return status


def answered(answer: Answer) -> bool:
    return answer in (202, 409, "409 other")


# -- what must hold ---------------------------------------------------------------------------


def record_of(world: World) -> dict[str, Any] | None:
    found = world.ledger_docs.docs.get(f"{JOB}.json")
    return None if found is None else found[0]


def messages_on_queue(world: World) -> int:
    return sum(1 for msg_id in world.jobs.messages if world.message_jobs.get(msg_id) == JOB)


def messages_sent(world: World) -> int:
    return sum(1 for owner in world.message_jobs.values() if owner == JOB)


def truthful(world: World, when: str) -> list[str]:
    """A `queued` record without `send_pending` promises a message on the queue."""
    data = record_of(world)
    pending = bool(data and data.get("send_pending"))
    if data and data.get("status") == ledger.QUEUED and not pending and not messages_on_queue(world):
        return [f"{when}: queued without send_pending, but no message on the queue"]
    return []


def settled(world: World, answers: list[Answer], one_202: bool) -> list[str]:
    """After the producer is done (its last answer 202 or 409), then after the world ran."""
    problems: list[str] = []
    accepted = answers.count(202)
    if not answered(answers[-1]):
        problems.append(f"no answer after {len(answers)} POSTs: {answers}")
    if accepted > 1 or (one_202 and accepted != 1 and answers[-1] != 409):
        problems.append(f"{accepted} POSTs accepted: {answers}")
    data = record_of(world)
    if data is None:
        problems.append("no record once the producer is done")
    elif data.get("status") == ledger.QUEUED and not messages_on_queue(world):
        problems.append(f"queued with no message once the producer is done ({data.get('send_pending')=})")
    world.faults.at = None  # the world runs without faults: the submit path is under test
    world.run()
    problems += check(world, {JOB: "completed"})
    if world.executions.get(JOB) != 1:
        problems.append(f"handler ran {world.executions.get(JOB)} times")
    final = record_of(world) or {}
    if any(key in final for key in ledger.SEND_MARKERS):
        problems.append("the completed record still carries the send markers")
    return problems


# -- producer flows ---------------------------------------------------------------------------


def retry_at_once(world: World, body: dict[str, object] = BODY) -> tuple[list[Answer], list[str]]:
    """POST; on no answer or an error, POST again at once, until answered."""
    answers: list[Answer] = []
    problems: list[str] = []
    while len(answers) < MAX_POSTS and not (answers and answered(answers[-1])):
        answers.append(post(world, body))
        problems += truthful(world, f"after POST {len(answers)} ({answers[-1]})")
    return answers, problems


def run_then_retry(world: World) -> tuple[list[Answer], list[str]]:
    """POST; on no answer or an error the world runs first (a sent message is processed), then
    the producer retries: a retry that finds the job taken answers 409 and sends nothing."""
    answers: list[Answer] = [post(world, BODY)]
    problems = truthful(world, f"after POST 1 ({answers[0]})")
    while len(answers) < MAX_POSTS and not answered(answers[-1]):
        world.faults.at = None
        sent_before = messages_sent(world)
        world.run()
        answers.append(post(world, BODY))
        problems += truthful(world, f"after POST {len(answers)} ({answers[-1]})")
        data = record_of(world) or {}
        if data.get("status") == ledger.COMPLETED and messages_sent(world) != sent_before:
            problems.append("a retry of a completed job sent a message")
    if answers[-1] == 409 and (record_of(world) or {}).get("status") != ledger.COMPLETED:
        problems.append(f"a retry answered 409 for a job that has not run: {record_of(world)}")
    return answers, problems


def answer_lost_then_again(world: World) -> tuple[list[Answer], list[str]]:
    """Retried until answered; then the same POST once more (its 202 never reached the client)
    and a different request with the same id. The different one: 409, sends nothing. The same
    one: 409 sending nothing; or, when the 202 left `send_pending` (the clear failed after the
    send), 202 after sending once more (the job still runs once: `settled`)."""
    answers, problems = retry_at_once(world)
    sent = messages_sent(world)
    marker_left = answers[-1] == 202 and bool((record_of(world) or {}).get("send_pending"))
    again_answers, again_problems = retry_at_once(world)
    again_sent = messages_sent(world) - sent
    other_answers, other_problems = retry_at_once(world, OTHER_BODY)
    again, other = again_answers[-1], other_answers[-1]
    problems += again_problems + other_problems
    expected = (202, 1) if marker_left else (409, 0)
    if (again, again_sent) != expected or other != "409 other" or messages_sent(world) != sent + again_sent:
        problems.append(
            f"POST again: {again} ({again_sent} sent, {marker_left=}), a different body: {other}, "
            f"messages {sent} -> {messages_sent(world)}"
        )
    return answers, problems


@dataclass(frozen=True)
class Flow:
    name: str
    run: Callable[[World], tuple[list[Answer], list[str]]]
    one_202: bool


FLOWS = [
    Flow("POST, retried at once until answered", retry_at_once, one_202=True),
    Flow("POST, the world runs, then the retry", run_then_retry, one_202=False),
    Flow("POST answered, posted again, and another body", answer_lost_then_again, one_202=True),
]


@dataclass
class Explored:
    schedules: int = 0
    failures: list[str] = field(default_factory=list)
    markers_left: int = 0
    """Schedules where a POST answered 202 with `send_pending` left (the clear failed after the send)."""
    double_sends: int = 0
    """Schedules where the job's message was sent twice (a retry took over a send that had
    happened after all); the ledger ran the job once."""
    retry_409s: int = 0


BURSTS = (1, 2, 3)
"""A fault at call k, and at the calls right after it: a failed send and the failed write
that would have ended its lease; a crashed POST whose retry crashes too; ..."""


def explore(flow: Flow, max_calls: int = 60) -> Explored:
    found = Explored()
    runs = [(None, 1)] + [(kind, burst) for kind in FAULT_KINDS for burst in BURSTS]
    for kind, burst in runs:
        for at in [None] if kind is None else range(1, max_calls):
            world = World(Faults(at=at, kind=kind or "error", burst=burst))
            _Api.world = world
            left_before = _Api.markers_left
            answers, problems = flow.run(world)
            if at is not None and world.faults.injected is None:
                break  # k is past the submit path's last call
            found.schedules += 1
            problems += settled(world, answers, flow.one_202)
            found.double_sends += messages_sent(world) > 1
            found.markers_left += _Api.markers_left > left_before
            found.retry_409s += answers[-1] == 409 and len(answers) > 1
            if problems:
                found.failures.append(
                    f"{flow.name} | {world.faults.injected or 'no fault'}: {answers} {problems}"
                )
    return found


def test_the_submit_path_with_a_fault_at_every_storage_call() -> None:
    total = markers_left = 0
    failures: list[str] = []
    print()
    for flow in FLOWS:
        found = explore(flow)
        total += found.schedules
        failures += found.failures
        print(
            f"submit simulation: {flow.name}: {found.schedules} schedules, {found.double_sends} with the "
            f"message sent twice, {found.markers_left} with a 202 that left send_pending, "
            f"{found.retry_409s} ending in a retry's 409, {len(found.failures)} failed"
        )
        markers_left += found.markers_left
    print(f"submit simulation: {total} schedules in all")
    assert failures == []
    assert total >= 3 * 3 * 5
    assert markers_left >= 3  # the failed clear was among the schedules, in each flow


def test_a_fault_free_post_costs_three_storage_requests() -> None:
    world = World(Faults())
    _Api.world = world
    assert post(world, BODY) == 202
    assert world.faults.calls == ["ledger.create s1.json", "queue.send jobs", "ledger.replace s1.json"]
    data = record_of(world) or {}
    assert data["status"] == ledger.QUEUED and "send_pending" not in data and messages_on_queue(world) == 1


def test_a_crashed_submitter_is_taken_over_once_its_send_lease_ends() -> None:
    world = World(Faults(at=2, kind="crash"))  # the API process dies just before it sends
    _Api.world = world
    assert post(world, BODY) == "crash"
    data = record_of(world) or {}
    assert data["status"] == ledger.QUEUED and data["send_pending"] is True and not messages_on_queue(world)
    started = world.clock()
    assert post(world, BODY) == 202  # waits out the dead request's lease, then sends
    assert (world.clock() - started).total_seconds() >= SEND_LEASE_S - 1
    assert messages_on_queue(world) == 1 and "send_pending" not in (record_of(world) or {})


def test_a_failed_clear_after_the_send_answers_202_and_the_job_runs_once() -> None:
    world = World(Faults(at=3, kind="error", burst=2))  # the clear, and its read-back
    _Api.world = world
    started = world.clock()
    assert post(world, BODY) == 202
    assert world.clock() == started  # no wait: not on the lease, not on a retry
    assert world.faults.calls[:3] == ["ledger.create s1.json", "queue.send jobs", "ledger.replace s1.json"]
    assert world.faults.calls.count("ledger.replace s1.json") == 1  # tried once
    data = record_of(world) or {}
    assert data["status"] == ledger.QUEUED and data["send_pending"] is True and messages_on_queue(world) == 1
    assert post(world, OTHER_BODY) == "409 other"  # another request with the id: refused at once
    world.faults.at = None
    assert post(world, BODY) == 202  # the same request again: waits out the lease, sends again
    assert (world.clock() - started).total_seconds() >= SEND_LEASE_S - 1
    assert messages_sent(world) == 2 and "send_pending" not in (record_of(world) or {})
    assert settled(world, [202], one_202=True) == []  # both messages delivered: the job ran once
    assert world.executions.get(JOB) == 1


def test_a_failed_clear_is_dropped_by_the_first_delivery() -> None:
    world = World(Faults(at=3, kind="error", burst=2))
    _Api.world = world
    assert post(world, BODY) == 202 and (record_of(world) or {}).get("send_pending") is True
    world.faults.at = None
    world.run()
    final = record_of(world) or {}
    assert final["status"] == ledger.COMPLETED and not any(key in final for key in ledger.SEND_MARKERS)
    assert post(world, BODY) == 409 and messages_sent(world) == 1 and world.executions.get(JOB) == 1


# -- two POSTs of one id at once -----------------------------------------------------------------


def run_two(
    bodies: tuple[dict[str, object], dict[str, object]], prefix: list[int]
) -> tuple[World, list[Answer], Any]:
    world = World(Faults())
    _Api.world = world
    answers: list[Answer] = [0, 0]

    def one(i: int) -> Callable[[], None]:
        def go() -> None:
            answers[i] = post(world, bodies[i])

        return go

    interleaver = Interleaver(prefix)
    world.faults.gate = interleaver.gate
    interleaver.run([one(0), one(1)])
    world.faults.gate = None
    return world, answers, interleaver.trace


@pytest.mark.parametrize(
    ("name", "bodies"),
    [("the same request twice", (BODY, BODY)), ("two requests, one id", (BODY, OTHER_BODY))],
)
def test_two_posts_of_one_id_at_once_in_every_interleaving(
    name: str, bodies: tuple[dict[str, object], dict[str, object]]
) -> None:
    seen: list[tuple[World, list[Answer]]] = []

    def run(prefix: list[int]) -> Any:
        world, answers, trace = run_two(bodies, prefix)
        seen.append((world, answers))
        return trace

    failures, double_sends = [], 0
    rt = World(Faults()).rt
    digests = [request_digest(validate_request(rt, body)) for body in bodies]
    for prefix in schedules(run, bound=3):
        world, answers = seen[-1]
        problems = truthful(world, "after both answers")
        if sorted(map(str, answers)) != ["202", "409" if bodies[0] == bodies[1] else "409 other"]:
            problems.append(f"answers {answers}")
        elif (record_of(world) or {}).get("request_digest") != digests[answers.index(202)]:
            problems.append("the job recorded is not the accepted request's")
        double_sends += messages_sent(world) > 1
        problems += settled(world, answers, one_202=True)
        if problems:
            failures.append(f"{name} | interleaving {prefix}: {answers} {problems}")
    print(
        f"\n{name}: {len(seen)} interleavings of two POSTs, {double_sends} with the message sent twice "
        "(the creator stalled past its send lease)"
    )
    assert failures == []
    assert len(seen) >= 10
