"""The paths the simulation runs, and what must hold at the end of every schedule."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from shared import ledger, poison
from shared.config.settings import DEFAULT_MAX_TAKEOVERS
from shared.pipeline.processing import process_message
from tests.sim.world import HOST_LEASE_S, Faults, Interleaver, World

DYING_LIMIT_S = HOST_LEASE_S + DEFAULT_MAX_TAKEOVERS * 45.0 + 120.0
"""A job whose runs all kill their worker is poisoned at its MAX_TAKEOVERS-th takeover: each
death costs about a claim lease (the failed message is back after visibilityTimeout, meets the
dead run's claim and re-checks at its end); an injected host crash adds the host's lease."""


def job(job_id: str, **payload: object) -> dict[str, object]:
    return {"id": job_id, "kind": "sim", "payload": payload}


@dataclass(frozen=True)
class Scenario:
    """Messages to start with, an optional operator step once things settle, and the end states."""

    name: str
    setup: Callable[[World], None]
    expect: dict[str, str]
    """job id -> completed | poisoned | invalid (a malformed body of another job's id: listed
    under unparsed/, refused by replay, the record unchanged) | rejected (a malformed body whose id
    had no record: a poisoned record with its reason, listed under the job, refused by replay)."""
    operator: Callable[[World], None] | None = None
    expect_before_operator: dict[str, str] = field(default_factory=dict)
    unparsed: tuple[bytes, ...] = ()
    """Bodies with no job of their own: each must be archived under unparsed/, byte for byte."""
    recovery_limit_s: float | None = None
    """When set, the longest a job may take to settle after a fault (instead of RECOVERY_LIMIT_S)."""
    dying: bool = False
    """Its runs die on purpose: the takeover limit must poison them (others must never reach it)."""


def _fix_and_replay(world: World) -> None:
    world.fixed = True
    world.guarded(lambda: poison.replay_jobs(world.rt, ["j1"], rate_per_s=0))


def _malformed(world: World) -> None:
    world.submit(job("b1"))  # its malformed twin comes well after any recovery: b1 has a record then
    world.submit(json.dumps({"id": "b1", "kind": "sim", "payload": [1]}).encode(), delay_s=3600)
    world.submit(json.dumps({"id": "ghost", "kind": "sim", "payload": "x"}).encode(), delay_s=1)
    world.put_text(json.dumps({"id": "stray", "kind": "nope", "payload": {}}), delay_s=2)


GARBAGE = (
    b"not base64, not JSON",  # a producer's plain text
    b"\xff\xfe\x00 binary \x80",  # not UTF-8 (sent base64-encoded: a queue holds text)
    b"{truncated",  # JSON cut short, sent base64-encoded
)


def _bodies_of_every_form(world: World) -> None:
    world.put_text(json.dumps(job("raw1")))  # raw JSON, as `az storage message put` sends it
    world.submit(job("b64"))  # base64, as the app and the base64 era send it
    world.put_text(base64.encodebytes(json.dumps(job("wrapped")).encode()).decode())  # line-wrapped
    world.put_text(GARBAGE[0].decode(), delay_s=1)
    world.submit(GARBAGE[1], delay_s=1)
    world.submit(GARBAGE[2], delay_s=2)


def _long_work_with_duplicate(world: World) -> None:
    world.submit(job("j1", work_s=45))
    world.submit(job("j1", work_s=45), delay_s=20)


def submit_twice(world: World, job_id: str) -> None:
    world.submit(job(job_id))
    world.submit(job(job_id))


SCENARIOS = [
    Scenario("new job", lambda w: w.submit(job("j1")), {"j1": "completed"}),
    Scenario("duplicate delivery", lambda w: submit_twice(w, "j1"), {"j1": "completed"}),
    Scenario("transient retry", lambda w: w.submit(job("j1", transient=1)), {"j1": "completed"}),
    Scenario(
        "unexpected error once", lambda w: w.submit(job("j1", unexpected_once=True)), {"j1": "completed"}
    ),
    Scenario("permanent error", lambda w: w.submit(job("j1", permanent_until_fix=True)), {"j1": "poisoned"}),
    Scenario(
        "host poison after maxDequeueCount",
        lambda w: w.submit(job("j1", unexpected_always=True)),
        {"j1": "poisoned"},
    ),
    Scenario("offload and continuation", lambda w: w.submit(job("j1", polls=2)), {"j1": "completed"}),
    Scenario(
        "poison, fix, replay",
        lambda w: w.submit(job("j1", permanent_until_fix=True)),
        {"j1": "completed"},
        operator=_fix_and_replay,
        expect_before_operator={"j1": "poisoned"},
    ),
    Scenario("long work outlives the claim lease", _long_work_with_duplicate, {"j1": "completed"}),
    Scenario(
        "runs keep dying",
        lambda w: w.submit(job("j1", dies=True)),
        {"j1": "poisoned"},
        recovery_limit_s=DYING_LIMIT_S,
        dying=True,
    ),
    Scenario(
        "malformed messages carrying job ids",
        _malformed,
        {"b1": "completed", "ghost": "rejected", "stray": "rejected"},
        unparsed=(json.dumps({"id": "b1", "kind": "sim", "payload": [1]}).encode(),),
    ),
    Scenario(
        "raw JSON, base64 and undecodable bodies",
        _bodies_of_every_form,
        {"raw1": "completed", "b64": "completed", "wrapped": "completed"},
        unparsed=GARBAGE,
    ),
]


def run_scenario(scenario: Scenario, faults: Faults) -> World:
    world = World(faults)
    world.expect_unparsed = scenario.unparsed
    scenario.setup(world)
    world.run()
    if scenario.operator is not None:
        problems = check(world, scenario.expect_before_operator, replay=False)
        if problems and faults.injected is None:
            raise AssertionError(f"{scenario.name}: before the operator step: {problems}")
        scenario.operator(world)
        world.run()
    return world


def check(world: World, expect: dict[str, str], replay: bool = True) -> list[str]:
    """Every promise, checked on the world's state (storage read directly, without faults)."""
    world.faults.at = None
    problems: list[str] = []
    records = {name.removesuffix(".json"): data for name, (data, _, _) in world.ledger_docs.docs.items()}
    if world.jobs.messages:
        problems.append(f"{len(world.jobs.messages)} message(s) left on the jobs queue")
    if world.poison.messages:
        problems.append(f"{len(world.poison.messages)} message(s) left on the poison queue")
    if world.clock.pending():
        problems.append(f"{world.clock.pending()} timer(s) still pending (a heartbeat not stopped)")
    for job_id, data in records.items():
        if data.get("status") == ledger.IN_PROGRESS:
            problems.append(f"{job_id}: left in progress")
        for entry in data.get("history") or []:
            owner = world.message_jobs.get(str(entry.get("queue_message_id")))
            if entry.get("queue_message_id") and owner != job_id:
                problems.append(f"{job_id}: changed by a message of {owner!r} ({entry.get('event')})")
    listed = {e.job_id: e for e in poison.list_poisoned(world.rt) if e.name.startswith("jobs/")}
    unparsed = {e.job_id: e for e in poison.list_poisoned(world.rt) if e.name.startswith("unparsed/")}
    for job_id, want in expect.items():
        data = records.get(job_id) or {}
        status = data.get("status")
        if want == "completed":
            if status != ledger.COMPLETED:
                problems.append(f"{job_id}: {status}, expected completed ({data.get('reason')})")
            elif not world.effect_applied(job_id):
                problems.append(f"{job_id}: completed without its effect")
            if job_id in listed:
                problems.append(f"{job_id}: completed but still listed as poisoned")
            continue
        if world.effect_applied(job_id):
            problems.append(f"{job_id}: effect applied to a job that did not complete")
        if want == "rejected":
            problems.extend(_rejected(world, job_id, data, listed, replay))
            continue
        if want == "invalid":
            if job_id in records:
                problems.append(f"{job_id}: a malformed body changed the ledger ({status})")
            if job_id not in unparsed or not unparsed[job_id].reason:
                problems.append(f"{job_id}: malformed body not listed with a reason")
            elif replay:
                report = poison.replay_jobs(world.rt, [job_id], rate_per_s=0)
                if report.skipped_invalid != [job_id]:
                    problems.append(f"{job_id}: replay of a malformed body said {report.as_dict()}")
            continue
        if status != ledger.POISONED or not data.get("reason"):
            problems.append(f"{job_id}: {status}, expected poisoned with a reason")
        if job_id not in listed or not listed[job_id].reason:
            problems.append(f"{job_id}: not listed in the poison archive with a reason")
        elif replay:
            problems.extend(_replayable(world, job_id, want))
    problems.extend(_unparsed_kept(world, world.expect_unparsed))
    return problems


def _unparsed_kept(world: World, bodies: tuple[bytes, ...]) -> list[str]:
    """Every body with no job of its own is archived under unparsed/, byte for byte, with a reason."""
    kept = {}
    for name, (data, _, _) in world.archive_docs.docs.items():
        if name.startswith("unparsed/") and data.get("state") == "poisoned" and data.get("reason"):
            kept[base64.b64decode(data["body_b64"])] = name
    return [
        f"body {body!r} not archived under unparsed/ with a reason" for body in bodies if body not in kept
    ]


def _rejected(
    world: World, job_id: str, data: Mapping[str, Any], listed: Mapping[str, Any], replay: bool
) -> list[str]:
    problems = []
    if data.get("status") != ledger.POISONED or not data.get("reason"):
        problems.append(f"{job_id}: {data.get('status')}, expected poisoned with its reason")
    if job_id not in listed:
        problems.append(f"{job_id}: its malformed body is not listed under the job")
    elif replay:
        report = poison.replay_jobs(world.rt, [job_id], rate_per_s=0)
        if report.skipped_invalid != [job_id]:
            problems.append(f"{job_id}: replay of its malformed body said {report.as_dict()}")
    return problems


def most_takeovers(world: World) -> int:
    """The most takeovers (dead runs replaced) any job's history holds."""
    return max(
        (
            sum(1 for entry in data.get("history") or [] if entry.get("takeover_of"))
            for data, _, _ in world.ledger_docs.docs.values()
        ),
        default=0,
    )


RECOVERY_LIMIT_S = {"error": 120.0, "lost": 120.0, "crash": 600.0 + 120.0}
"""The recovery objective: with the host alive, a job settles within 2 minutes of a storage
fault; after a worker crash, within 2 minutes of the end of the claim it held (issue 21:
recovery re-sends it), or, when it held none (a crash before its claim was written), within
the host's 10-minute message lease plus those 2 minutes."""
AFTER_CLAIM_END_S = 120.0


def claim_end_after_crash(world: World, job_id: str) -> float | None:
    """Seconds from the injected crash to the end of the claim the job held then (None: none)."""
    end = world.claims_at_crash.get(job_id)
    if end is None or world.faults.injected_at is None:
        return None
    return (end - world.faults.injected_at).total_seconds()


def recovery_limit(world: World, job_id: str, kind: str) -> float:
    """The longest a job may take to settle after the injected fault (see RECOVERY_LIMIT_S)."""
    claim_end = claim_end_after_crash(world, job_id) if kind == "crash" else None
    return RECOVERY_LIMIT_S[kind] if claim_end is None else claim_end + AFTER_CLAIM_END_S


def settled_after_fault(world: World, job_id: str) -> float | None:
    """Simulated seconds from the injected fault to the job's final state (None: no fault, or
    the job had settled before it)."""
    data = world.ledger_docs.docs.get(f"{job_id}.json", ({}, 0, None))[0]
    stamp = data.get("finished_at") or data.get("poisoned_at")
    if world.faults.injected_at is None or not isinstance(stamp, str):
        return None
    seconds = (
        datetime.fromisoformat(stamp.replace("Z", "+00:00")) - world.faults.injected_at
    ).total_seconds()
    return seconds if seconds >= 0 else None


def _replayable(world: World, job_id: str, want: str) -> list[str]:
    report = poison.replay_jobs(world.rt, [job_id], rate_per_s=0)
    if report.replayed != [job_id]:
        return [f"{job_id}: replay said {report.as_dict()}"]
    world.run()
    data = world.ledger_docs.docs[f"{job_id}.json"][0]
    if data.get("status") != ledger.POISONED or not any(
        e.job_id == job_id for e in poison.list_poisoned(world.rt)
    ):
        return [f"{job_id}: after replay {data.get('status')}, expected poisoned again and listed"]
    return []


CONCURRENT = [
    ("new job", job("j1"), "completed"),
    ("transient retry", job("j1", transient=1), "completed"),
    ("unexpected error once", job("j1", unexpected_once=True), "completed"),
    ("permanent error", job("j1", permanent_until_fix=True), "poisoned"),
    ("offload and continuation", job("j1", polls=1), "completed"),
]
"""Paths run as two deliveries of one job at once (a duplicate send), in every interleaving."""


def run_concurrent(
    body: dict[str, object], prefix: list[int]
) -> tuple[World, list[tuple[tuple[int, ...], int]]]:
    """Two copies of `body` received together and run on two threads as `prefix` interleaves
    them; then the world runs on, one delivery at a time, until nothing is left to happen."""
    world = World(Faults())
    world.submit(body)
    world.submit(body)
    interleaver = Interleaver(prefix)
    world.faults.gate = interleaver.gate
    taken = [world.jobs.take(m, world.rules.lease_s) for m in world.jobs.visible()]
    interleaver.run([partial(world.deliver, world.jobs, m, process_message) for m in taken])
    world.faults.gate = None
    world.run()
    return world, interleaver.trace
