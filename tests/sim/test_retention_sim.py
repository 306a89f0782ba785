"""Issue 21: a job's ledger record deleted by retention cannot let its old message run it again.

The shipped JOB_TTL_SECONDS and LEDGER_RETENTION_DAYS, on the simulation's fake clock: a job
completes; its message comes back within the TTL (acknowledged as a duplicate); time passes
beyond the ledger's retention and the retention rule deletes the record (the same code as the
CLI, on the simulation's store); the old message comes back once more and is refused as expired
(poisoned with that reason, listed): the job ran once, its effect applied once.
"""

from __future__ import annotations

import base64
import json
from datetime import timedelta

import pytest

from shared import ledger
from shared.config.retention import Rule
from shared.core import envelope
from shared.core.envelope import isoformat
from shared.pipeline.retention_sweep import DocumentTarget, apply
from tests.sim.scenarios import job
from tests.sim.world import START, Faults, World


def _finished_rule(world: World) -> list[Rule]:
    return [r for r in world.settings.retention_rules() if r.name == "ledger-finished"]


def test_a_message_whose_record_retention_deleted_is_refused_as_expired_never_run_twice() -> None:
    world = World(Faults())
    settings = world.settings
    assert settings.job_ttl_s == 7 * 86400 and settings.retention.ledger == 30  # what ships
    body = json.dumps({**job("j1"), "created_at": isoformat(START)}).encode()  # as the API sends it
    world.submit(body)
    world.run()
    assert world.executions == {"j1": 1} and world.effect_applied("j1")

    def retention() -> int:
        target = DocumentTarget(world.ledger_docs)
        return apply(lambda _: target, _finished_rule(world), world.clock(), dry_run=False).deleted

    world.clock.advance_to(START + timedelta(days=6))
    world.submit(body)  # within the TTL, the record there: a duplicate
    world.run()
    assert retention() == 0 and world.executions == {"j1": 1}

    world.clock.advance_to(START + timedelta(days=29))
    assert retention() == 0, "kept for LEDGER_RETENTION_DAYS after its last write"
    world.clock.advance_to(START + timedelta(days=6 + 30, seconds=1))
    assert retention() == 1 and "j1.json" not in world.ledger_docs.docs

    world.submit(body)  # the old message, back (a producer's retry, a parked copy, a replay)
    world.run()
    assert world.executions == {"j1": 1}, "ran again after its record was deleted"
    assert world.effect_applied("j1")
    record = world.ledger_docs.docs["j1.json"][0]
    assert record["status"] == ledger.POISONED and "expired" in str(
        record.get("reason_code") or record["reason"]
    )
    assert not world.jobs.messages and not world.poison.messages


def test_a_message_without_created_at_is_dated_by_its_insertion_and_never_run_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A producer writing to the queue directly may omit created_at: the app dates the body by its
    queue message's insertion time, the same on every delivery of that message. So a message put
    on day 0 and delivered again after the record's deletion (day 36) is expired, never run again."""
    world = World(Faults())
    monkeypatch.setattr(envelope, "utcnow", world.clock)
    text = base64.b64encode(json.dumps(job("j1")).encode()).decode("ascii")
    world.jobs.put(text)
    late = world.jobs.put(text)  # a second message of the same job, put on day 0 too
    del world.jobs.messages[late.id]  # held back (by a host that leased it) while the first runs
    world.run()
    assert world.executions == {"j1": 1}

    world.clock.advance_to(START + timedelta(days=31))
    target = DocumentTarget(world.ledger_docs)
    assert apply(lambda _: target, _finished_rule(world), world.clock(), dry_run=False).deleted == 1
    late.visible_at = world.clock()  # back now, its record gone: the same message, inserted on day 0
    world.jobs.messages[late.id] = late
    world.run()
    assert world.executions == {"j1": 1}, "ran again after its record was deleted"
    record = world.ledger_docs.docs["j1.json"][0]
    assert record["status"] == ledger.POISONED and "expired" in str(
        record.get("reason_code") or record["reason"]
    )
