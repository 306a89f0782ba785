"""The deterministic simulation: every path, a fault at every storage call, shipped timing.

One schedule = one scenario run with one fault (a worker crash; a storage error; a write applied
whose answer is lost) injected at storage call number k. Each scenario is first run without a
fault to count its calls, then once per call and fault kind, until k passes the calls the run
makes. The world uses the shipped host.json and the default settings (claim lease, heartbeat,
MAX_ATTEMPTS), on a fake clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import cast

import pytest

from shared import ledger, poison
from shared.indexes.entry_rows import EntryState
from shared.pipeline import processing
from shared.poison import handler
from tests.sim.scenarios import (
    CONCURRENT,
    SCENARIOS,
    Scenario,
    check,
    claim_end_after_crash,
    most_takeovers,
    recovery_limit,
    run_concurrent,
    run_scenario,
    settled_after_fault,
)
from tests.sim.scenarios import job as sim_job
from tests.sim.world import FAULT_KINDS, START, Faults, SimCrash, World, schedules


@dataclass
class Exploration:
    schedules: int = 0
    failures: list[str] = field(default_factory=list)
    slowest: dict[str, tuple[float, str]] = field(default_factory=dict)
    """Per fault kind: the longest simulated time from the fault to a job's final state."""
    dying: dict[str, tuple[float, str]] = field(default_factory=dict)
    """The same for paths whose runs die on purpose (poisoned at the takeover limit)."""
    after_claim_end: tuple[float, str] = (0.0, "")
    """After a crash that left a claim: the longest time from the claim's end to the job's final state."""
    most_takeovers: tuple[int, str] = (0, "")
    """The most takeovers one job of a path whose runs do not die on purpose went through."""


def explore(scenarios: list[Scenario], max_calls: int = 200) -> Exploration:
    found = Exploration()
    for scenario in scenarios:
        for kind in (None, *FAULT_KINDS):
            for at in [None] if kind is None else range(1, max_calls):
                faults = Faults(at=at, kind=kind or "error")
                try:
                    world = run_scenario(scenario, faults)
                except AssertionError as exc:
                    found.failures.append(f"{scenario.name} | {faults.injected}: {exc}")
                    continue
                if at is not None and faults.injected is None:
                    break  # k is past the last call this run made
                found.schedules += 1
                problems = []
                if not scenario.dying and most_takeovers(world) > found.most_takeovers[0]:
                    found.most_takeovers = (
                        most_takeovers(world),
                        f"{scenario.name} | {faults.injected or 'no fault'}",
                    )
                limit = scenario.recovery_limit_s
                for job_id in scenario.expect if kind and not scenario.operator else ():
                    assert kind is not None  # the loop runs for a fault kind only
                    took = settled_after_fault(world, job_id)  # before check() replays anything
                    if took is None:
                        continue
                    if took > (limit or recovery_limit(world, job_id, kind)):
                        problems.append(f"{job_id}: settled {took:.0f} s after the fault")
                    claim_end = claim_end_after_crash(world, job_id) if kind == "crash" else None
                    if (
                        claim_end is not None
                        and not scenario.dying
                        and took - claim_end > found.after_claim_end[0]
                    ):
                        found.after_claim_end = (took - claim_end, f"{scenario.name} | {faults.injected}")
                    slowest = found.dying if scenario.dying else found.slowest
                    if took > slowest.get(kind, (0.0, ""))[0]:
                        slowest[kind] = (took, f"{scenario.name} | {faults.injected}")
                problems += check(world, scenario.expect)
                if problems:
                    found.failures.append(f"{scenario.name} | {faults.injected or 'no fault'}: {problems}")
    return found


@pytest.fixture(autouse=True)
def _quiet() -> Iterator[None]:
    logging.disable(logging.CRITICAL)  # tens of thousands of decision records
    yield
    logging.disable(logging.NOTSET)


def test_the_simulation_uses_what_ships() -> None:
    world = World(Faults())
    assert world.rules.visibility_timeout_s == 10 and world.rules.max_dequeue_count == 5
    assert world.settings.claim_lease_s == 30 and world.settings.heartbeat_s == 10


def test_every_fault_at_every_storage_call_of_every_path() -> None:
    found = explore(SCENARIOS)
    print(
        f"\nsimulation: {found.schedules} schedules over {len(SCENARIOS)} paths, {len(found.failures)} failed"
    )
    for kind, (took, where) in sorted(found.slowest.items()):
        print(f"  slowest recovery after a {kind}: {took:.0f} s (simulated), {where}")
    for kind, (took, where) in sorted(found.dying.items()):
        print(
            f"  slowest poisoning of runs that keep dying, after a {kind}: {took:.0f} s (simulated), {where}"
        )
    print(
        f"  slowest recovery after a crash that left a claim: {found.after_claim_end[0]:.0f} s after "
        f"the claim's end (simulated), {found.after_claim_end[1]}"
    )
    print(f"  most takeovers of one job that does not die on purpose: {found.most_takeovers}")
    assert found.failures == []
    # one fault never kills two runs of a job in a row: even MAX_TAKEOVERS=2 poisons no good job
    assert found.most_takeovers[0] == 1
    assert found.schedules > 300
    assert set(found.slowest) == set(FAULT_KINDS)


def test_runs_that_keep_dying_are_poisoned_at_the_takeover_limit_and_replay_counts_afresh() -> None:
    """Every run kills its worker: the first run and MAX_TAKEOVERS - 1 takeovers die, the
    MAX_TAKEOVERS-th takeover poisons the job with the reason, listed; a replay runs it as many
    times again (a fresh count), then poisons it again."""
    world = World(Faults())
    limit = world.settings.max_takeovers
    world.submit(sim_job("j1", dies=True))
    world.run()
    record = world.ledger_docs.docs["j1.json"][0]
    assert record["status"] == ledger.POISONED and record["reason_code"] == "runs_died"
    assert f"runs died {limit} times in a row without finishing" in record["reason"]
    assert world.executions == {"j1": limit} and world.crashes == limit
    listed = [e for e in poison.list_poisoned(world.rt) if e.job_id == "j1"]
    assert len(listed) == 1 and "runs_died" in listed[0].reason
    took = (world.clock() - START).total_seconds()
    print(
        f"\nsimulated: poisoned after {limit} dead runs, {took:.0f} s after submit (each run kills its worker)"
    )

    assert poison.replay_jobs(world.rt, ["j1"], rate_per_s=0).replayed == ["j1"]
    world.run()
    record = world.ledger_docs.docs["j1.json"][0]
    assert record["status"] == ledger.POISONED and world.executions == {"j1": 2 * limit}
    assert check(world, {"j1": "poisoned"}, replay=False) == []


def test_runs_that_keep_dying_loop_forever_when_the_limit_is_reverted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 19: without the takeover limit, each death's re-check message starts a new dequeue
    count, so maxDequeueCount never triggers: the simulation never settles."""
    monkeypatch.setattr(ledger, "runs_died", lambda data, limit: None)
    world = World(Faults())
    world.submit(sim_job("j1", dies=True))
    with pytest.raises(AssertionError, match="no quiescence"):
        world.run(max_steps=2_000)
    assert world.executions["j1"] > 3 * world.settings.max_takeovers
    assert max(m.dequeue_count for m in world.jobs.messages.values()) <= 2


@pytest.mark.parametrize(("name", "body", "want"), CONCURRENT, ids=[c[0] for c in CONCURRENT])
def test_two_deliveries_of_one_job_in_every_interleaving(
    name: str, body: dict[str, object], want: str
) -> None:
    worlds: list[World] = []

    def run(prefix: list[int]) -> list[tuple[tuple[int, ...], int]]:
        world, trace = run_concurrent(body, prefix)
        worlds.append(world)
        return trace

    failures = []
    for prefix in schedules(run, bound=3):
        problems = check(worlds[-1], {"j1": want})
        if problems:
            failures.append(f"{name} | interleaving {prefix}: {problems}")
    print(f"\n{name}: {len(worlds)} interleavings of two deliveries")
    assert failures == []
    assert len(worlds) >= 5


def test_long_work_keeps_its_claim_by_heartbeat() -> None:
    scenario = next(s for s in SCENARIOS if s.name == "long work outlives the claim lease")
    world = run_scenario(scenario, Faults())
    assert world.executions == {"j1": 1}  # the duplicate at 20 s met a live claim: no second run
    record = world.ledger_docs.docs["j1.json"][0]
    assert record["renewals"] >= 4 and record["status"] == ledger.COMPLETED


def test_the_stuck_job_of_issue_9_is_caught_when_its_fix_is_reverted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without read-back, with the old 600-s claim, a BUSY delivery raising, and the poison
    handler archiving a copy of a running job as done, a claim write applied without an answer
    leaves the job in progress with no message: the simulation must see it."""

    def write_without_read_back(self: ledger.Ledger, job_id: str, current, change, mine=None):  # type: ignore[no-untyped-def]
        data = change(current.data if current else None)
        name = self.name(job_id)
        return self.store.create(name, data) if current is None else self.store.replace(name, current, data)

    meet = processing.Processor.meet

    def busy_raises(self: processing.Processor, decision: ledger.Decision, current: ledger.Record) -> None:
        if decision is ledger.Decision.BUSY:
            raise RuntimeError("busy: the message comes back")
        meet(self, decision, current)

    judge = handler.judge

    def no_recheck(*args, **kwargs):  # type: ignore[no-untyped-def]
        verdict = judge(*args, **kwargs)
        return (
            handler.Verdict(cast(EntryState, "duplicate_of_running"), verdict.reason)
            if verdict.recheck_at
            else verdict
        )

    init = World.__init__

    def old_claim(self: World, faults: Faults, settings_env: object = None) -> None:
        init(self, faults, {"CLAIM_LEASE_SECONDS": "600", "CLAIM_HEARTBEAT_SECONDS": "200"})

    monkeypatch.setattr(ledger.Ledger, "write", write_without_read_back)
    monkeypatch.setattr(processing.Processor, "meet", busy_raises)
    monkeypatch.setattr(handler, "judge", no_recheck)
    monkeypatch.setattr(World, "__init__", old_claim)
    monkeypatch.setattr(World, "claims_open", lambda self: {})  # no recovery watch: it would rescue it
    found = explore([SCENARIOS[0]])
    print("\n" + "\n".join(found.failures))
    assert any(
        "lost at call 1: ledger.create j1.json" in f and "left in progress" in f for f in found.failures
    )


@pytest.mark.parametrize("failures", [6, 8, 40])
def test_poison_handler_storage_failing_many_times_in_a_row(failures: int) -> None:
    """Every poison-archive call fails `failures` times in a row from the handler's first one:
    6 and 8 are absorbed by the handler's own retries (one invocation of up to 8 tries); 40 outlast
    five invocations (the host gives a failed `-poison` message back only after its 10-minute
    lease), so at the last dequeue the handler puts a fresh copy back. It ends archived and listed."""
    scenario = next(s for s in SCENARIOS if s.name == "host poison after maxDequeueCount")
    world = run_scenario(scenario, Faults(at=1, kind="error", burst=failures, only="archive."))
    assert world.faults.injections == failures
    assert check(world, scenario.expect) == []


class CrashThenFault(Faults):
    """A worker crash at call `crash_at` (leaving a claim for recovery to find), then one fault
    of `kind` at call `at` (> crash_at): in the recovery pass or in the resumed run."""

    def __init__(self, crash_at: int, at: int, kind: str) -> None:
        super().__init__(at=at, kind=kind)
        self.crash_at = crash_at
        self.faults_at: list[datetime] = []

    def before(self, op: str, name: str) -> Callable[[], None] | None:
        if len(self.calls) + 1 == self.crash_at:
            self.calls.append(f"{op} {name}")
            self.faults_at.append(self.clock() if self.clock else START)
            raise SimCrash(f"crash at call {self.crash_at}: {op} {name}")
        answer = super().before(op, name)
        if self.injected is not None and len(self.faults_at) < 2 and self.clock is not None:
            self.faults_at.append(self.clock())
        return answer


RECOVERY_PATHS = [
    ("new job", sim_job("j1"), "effects.create"),  # dead after its claim, before its effect
    ("long work", sim_job("j1", work_s=45), "ledger.replace"),  # dead at its first heartbeat
    ("offload and continuation", sim_job("j1", polls=2), "queue.send"),  # dead sending its continuation
]


@pytest.mark.parametrize(("name", "body", "crash_on"), RECOVERY_PATHS, ids=[p[0] for p in RECOVERY_PATHS])
def test_a_crash_then_a_fault_at_every_call_of_the_recovery_and_the_resumed_run(
    name: str, body: dict[str, object], crash_on: str
) -> None:
    """Issue 21: the worker dies holding a claim; its message stays leased by the dead host for
    10 minutes, so only recovery can bring the job back within 2 minutes of the claim's end.
    Then one more fault (crash, error, lost answer) at every later storage call: the recovery
    pass (the tag query, the record read, the re-send) and the resumed run. Each schedule ends
    with the job completed, its effect applied once, nothing left, and within 2 minutes of the
    end of the last claim or fault (a second crash before a new claim: of the older claim)."""
    probe = World(Faults())
    probe.submit(body)
    probe.run()
    crash_at = 1 + next(i for i, call in enumerate(probe.faults.calls) if call.startswith(crash_on))
    failures, schedules, slowest, recovered = [], 0, (0.0, ""), 0
    for kind in FAULT_KINDS:
        for at in range(crash_at + 1, crash_at + 200):
            faults = CrashThenFault(crash_at, at, kind)
            world = World(faults)
            world.submit(body)
            try:
                world.run()
            except AssertionError as exc:
                failures.append(f"{kind} at {at}: {exc}")
                continue
            if faults.injected is None:
                break
            schedules += 1
            recovered += world.recoveries > 0
            data = world.ledger_docs.docs["j1.json"][0]
            finished = datetime.fromisoformat(str(data.get("finished_at")).replace("Z", "+00:00"))
            since = max([*world.claim_ends, *faults.faults_at])
            took = (finished - since).total_seconds()
            if took > slowest[0]:
                slowest = (took, f"{kind} at call {at}: {faults.injected}")
            problems = check(world, {"j1": "completed"})
            if took > 120:
                problems.append(f"settled {took:.0f} s after the last claim end or fault")
            if problems:
                failures.append(f"{kind} at {at} ({faults.injected}): {problems}")
    print(
        f"\n{name}: crash at call {crash_at} ({crash_on}), then {schedules} schedules; recovery "
        f"re-sent the job in {recovered}; slowest {slowest[0]:.0f} s after the last claim end or fault ({slowest[1]})"
    )
    assert failures == []
    assert schedules > 20 and recovered > 0


def test_a_host_crash_mid_job_is_recovered_within_2_minutes_of_the_claim_end() -> None:
    """Without the recovery watch, the job waits for the dead host's 10-minute message lease."""
    times = {}
    for label, recover in (("with recovery", True), ("without", False)):
        world = World(Faults(at=2, kind="crash"))  # call 2: the effect, right after the claim
        if not recover:
            world.recover = lambda: None  # type: ignore[method-assign]
        world.submit(sim_job("j1"))
        world.run()
        [claim_end] = world.claims_at_crash.values()
        data = world.ledger_docs.docs["j1.json"][0]
        finished = datetime.fromisoformat(str(data["finished_at"]).replace("Z", "+00:00"))
        times[label] = (finished - claim_end).total_seconds()
        assert check(world, {"j1": "completed"}) == []
    print(f"\nsimulated, completed after the claim's end: {times}")
    assert times["with recovery"] <= 120 < times["without"]
