"""The takeover limit (issue 19): runs that keep dying are counted on the claim and poisoned (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared import ledger
from shared.core.envelope import Envelope
from shared.ledger import Decision, Facts
from shared.ledger import operator as ledger_operator

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = 30.0
ENV = Envelope(id="j1", kind="noop", created_at=NOW - timedelta(minutes=1), payload={})


def facts(owner: str, at_s: float = 0.0) -> Facts:
    return Facts(NOW + timedelta(seconds=at_s), "m1", 1, owner)


def dies(times: int, start: ledger.Data | None = None) -> ledger.Data:
    """`times` runs in a row that claim the job and die (each one's lease then ends)."""
    data = start
    for i in range(times):
        data = ledger.claimed(data, ENV, facts(f"host/{i}", i * 40.0), LEASE)
    assert data is not None
    return data


def test_a_new_job_and_a_claim_after_an_ended_run_count_nothing() -> None:
    first = ledger.claimed(None, ENV, facts("host/a"), LEASE)
    assert ledger.dead_runs(first) == 0 and "takeovers" not in first
    assert ledger.runs_died(first, 1) is None


def test_each_takeover_of_an_expired_claim_counts_one_dead_run() -> None:
    data = dies(1)
    later = NOW + timedelta(seconds=LEASE + 1)
    assert ledger.decide(data, 0, None, later) is Decision.RUN  # the dead run's claim has ended
    data = dies(3)
    assert ledger.dead_runs(data) == 2  # three runs: the first claimed fresh, two took over
    assert [h.get("takeover_of") for h in data["history"]] == [None, "host/0", "host/1"]


def test_our_own_claim_found_again_after_a_lost_answer_is_not_a_takeover() -> None:
    data = dies(2)
    again = ledger.claimed(data, ENV, facts("host/1", 41.0), LEASE)  # same owner: Ledger.write's re-apply
    assert ledger.dead_runs(again) == 1
    assert again["history"][-1].get("takeover_of") is None


@pytest.mark.parametrize(
    "ended",
    [
        lambda d, f: ledger.completed(d, "j1", f, 0, "r", {}, 1.0),
        lambda d, f: ledger.released(d, "j1", f, 0, "RuntimeError: boom"),
        lambda d, f: ledger.retry_scheduled(d, "j1", f, 0, "503", 4, None),
        lambda d, f: ledger.continued(d, "j1", f, ledger.OFFLOADED, 1, {"run": "r"}, 10),
    ],
    ids=["completed", "released", "retry_scheduled", "continued"],
)
def test_a_run_that_ends_starts_the_count_again(ended) -> None:  # type: ignore[no-untyped-def]
    data = dies(3)
    f = facts("host/2", 81.0)
    after = ended(data, f)
    if after["status"] == ledger.COMPLETED:
        assert ledger.decide(after, 0, None, f.now) is Decision.DUPLICATE
        return
    nxt = ledger.claimed(after, ENV, facts("host/9", 200.0), LEASE)
    assert ledger.dead_runs(nxt) == 0 and "takeovers" not in nxt


def test_progress_starts_the_count_again_but_a_heartbeat_does_not() -> None:
    data = dies(3)
    beat = ledger.renewed(data, facts("host/2", 90.0), LEASE)
    assert ledger.dead_runs(beat) == 2  # a hung run heartbeats until functionTimeout kills it
    saved = ledger.progressed(beat, facts("host/2", 95.0), {"rows": 10}, LEASE)
    assert ledger.dead_runs(saved) == 0
    assert ledger.dead_runs(ledger.claimed(saved, ENV, facts("host/3", 200.0), LEASE)) == 1


def test_the_limit_poisons_at_the_takeover_that_finds_the_last_dead_run() -> None:
    data = dies(3)  # two dead runs, the third is running
    assert ledger.runs_died(data, 3) is None
    data = dies(1, data)  # the third died: this claim is the third takeover
    reason = ledger.runs_died(data, 3)
    assert reason is not None
    assert "died 3 times in a row without finishing" in reason
    assert "worker crash, host kill or function timeout" in reason and "MAX_TAKEOVERS=3" in reason


def test_poisoned_keeps_the_count_and_replay_starts_afresh() -> None:
    data = dies(4)
    poisoned = ledger.poisoned(data, "j1", facts("host/3"), "runs_died: ...", "runs_died", b"{}")
    assert poisoned["status"] == ledger.POISONED and ledger.dead_runs(poisoned) == 3
    replayed = ledger_operator.replayed(poisoned, ENV, facts("operator"))
    assert "takeovers" not in replayed and ledger.runs_died(replayed, 1) is None
    assert ledger.dead_runs(ledger.claimed(replayed, ENV, facts("host/x"), LEASE)) == 0


@pytest.mark.parametrize("raw", [None, 0, -2, True, "3", 2.5])
def test_an_unreadable_count_reads_as_none(raw: object) -> None:
    assert ledger.dead_runs({"takeovers": raw}) == 0
