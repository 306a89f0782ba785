"""`Permits` over the in-memory store and parking: counts of store operations, waking the oldest
waiter, fencing. A fake clock (wall and monotonic together) with the shipped lease."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from shared.permits.decide import RESERVED_SHARE, Ticket
from shared.permits.limit import Limit
from shared.permits.limit_settings import read_permit_settings
from shared.permits.parked_messages import MemoryParking
from shared.permits.service import Hold, PermitLost, Permits, Waiting
from shared.permits.store import DocumentPermitStore
from shared.storage.memory_documents import MemoryDocuments

LEASE = read_permit_settings({}, "jobs").lease_s
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.s = 0.0

    def now(self) -> datetime:
        return T0 + timedelta(seconds=self.s)

    def mono(self) -> float:
        return 1000.0 + self.s


class NoTimers:
    def call_later(self, delay_s: float, fn: Callable[[], None]) -> NoTimers:
        return self

    def cancel(self) -> None:
        return None


class Instance:
    """One process: its own Permits (cache, locks) over the shared store."""

    def __init__(self, docs: MemoryDocuments, parking: MemoryParking, clock: Clock) -> None:
        self.permits = Permits(DocumentPermitStore(docs), parking, clock.now, NoTimers(), LEASE, clock.mono)


@pytest.fixture
def world() -> tuple[Clock, MemoryDocuments, MemoryParking, Counter[str]]:
    clock = Clock()
    ops: Counter[str] = Counter()

    def count(op: str, name: str) -> None:
        ops[op] += 1

    docs = MemoryDocuments(clock.now, before=count, label="permits")
    return clock, docs, MemoryParking(clock.now), ops


def ticket(n: int) -> Ticket:
    return Ticket(f"job-{n}", T0 + timedelta(milliseconds=n), f"inst/{n}")


def test_acquire_and_release_cost_one_write_each_with_a_current_copy(world) -> None:  # type: ignore[no-untyped-def]
    clock, docs, parking, ops = world
    one = Instance(docs, parking, clock)
    limit = Limit("http:api.partner.example", 4)
    first = one.permits.acquire([limit], ticket(0))
    assert isinstance(first, Hold)
    first.release()
    assert sum(ops.values()) == 3  # the first use reads the (absent) document once
    for n in range(1, 11):
        ops.clear()
        hold = one.permits.acquire([limit], ticket(n))
        assert isinstance(hold, Hold)
        hold.release()
        assert sum(ops.values()) == 2, ops


def test_no_limit_costs_nothing(world) -> None:  # type: ignore[no-untyped-def]
    clock, docs, parking, ops = world
    hold = Instance(docs, parking, clock).permits.acquire([], ticket(0))
    assert isinstance(hold, Hold)
    hold.release()
    assert sum(ops.values()) == 0


def test_two_instances_never_exceed_the_limit_and_release_wakes_the_oldest(world) -> None:  # type: ignore[no-untyped-def]
    clock, docs, parking, _ = world
    a, b = Instance(docs, parking, clock), Instance(docs, parking, clock)
    limit = Limit("k", 2)
    holds = [a.permits.acquire([limit], ticket(0)), b.permits.acquire([limit], ticket(1))]
    assert all(isinstance(h, Hold) for h in holds)
    for n, inst in ((3, a), (2, b), (4, a)):  # job-2 is older than job-3 though it waits later
        got = inst.permits.acquire([limit], ticket(n))
        assert isinstance(got, Waiting)
        assert got.reason() == "waiting for a permit of k: 2 of 2 held by job-0, job-1"
        inst.permits.wait(got, ticket(n), f"body-{n}")
    assert a.permits.state("k").holders and len(a.permits.state("k").holders) == 2
    assert [w.job for w in a.permits.state("k").waiters] == ["job-2", "job-3", "job-4"]
    assert parking.due() == []
    holds[0].release()  # type: ignore[union-attr]
    woken = parking.due()
    assert [m.body for m in woken] == ["body-2"]
    # the woken job takes its reservation; a newcomer cannot
    assert isinstance(a.permits.acquire([limit], ticket(9)), Waiting)
    got = b.permits.acquire([limit], ticket(2))
    assert isinstance(got, Hold)
    assert sorted(h.job for h in a.permits.state("k").holders) == ["job-1", "job-2"]


def test_a_killed_holders_permit_is_back_within_one_lease(world) -> None:  # type: ignore[no-untyped-def]
    clock, docs, parking, _ = world
    dead, live = Instance(docs, parking, clock), Instance(docs, parking, clock)
    limit = Limit("k", 1)
    assert isinstance(dead.permits.acquire([limit], ticket(0)), Hold)  # then killed: never released
    waiting = live.permits.acquire([limit], ticket(1))
    assert isinstance(waiting, Waiting)
    assert waiting.delay_s == int(LEASE) + 1  # parked until the lease ends, no polling before
    live.permits.wait(waiting, ticket(1), "body-1")
    clock.s = LEASE - 1
    assert parking.due() == []
    clock.s = waiting.delay_s
    (msg,) = parking.due()
    assert msg.body == "body-1"
    assert isinstance(live.permits.acquire([limit], ticket(1)), Hold)
    assert waiting.delay_s <= 60


def test_a_frozen_holder_cannot_act_after_its_permit_went_to_another(world) -> None:  # type: ignore[no-untyped-def]
    clock, docs, parking, _ = world
    frozen, other = Instance(docs, parking, clock), Instance(docs, parking, clock)
    limit = Limit("k", 1)
    hold = frozen.permits.acquire([limit], ticket(0))
    assert isinstance(hold, Hold)
    hold.fence()  # held: returns
    clock.s = LEASE * (1 - 1 / 6) - 0.5
    hold.fence()  # still inside the margin: no renewal needed
    clock.s = 90  # SIGSTOP for 90 s: the lease ended, another job took the permit
    taken = other.permits.acquire([limit], ticket(1))
    assert isinstance(taken, Hold)
    with pytest.raises(PermitLost):
        hold.fence()
    with pytest.raises(PermitLost):  # and stays lost
        hold.fence()
    assert [h.job for h in other.permits.state("k").holders] == ["job-1"]
    hold.release()  # releasing a lost permit does not free the other's
    assert [h.job for h in other.permits.state("k").holders] == ["job-1"]


def test_fence_renews_near_the_lease_end(world) -> None:  # type: ignore[no-untyped-def]
    clock, docs, parking, ops = world
    inst = Instance(docs, parking, clock)
    hold = inst.permits.acquire([Limit("k", 1)], ticket(0))
    assert isinstance(hold, Hold)
    clock.s = LEASE * (1 - 1 / 6)
    ops.clear()
    hold.fence()
    assert ops["permits.replace"] == 1
    until = inst.permits.state("k").holders[0].until
    assert until == clock.now() + timedelta(seconds=LEASE)


def test_a_refusal_from_a_stale_copy_is_checked_against_the_store(world) -> None:  # type: ignore[no-untyped-def]
    clock, docs, parking, _ = world
    a, b = Instance(docs, parking, clock), Instance(docs, parking, clock)
    limit = Limit("k", 1)
    held = b.permits.acquire([limit], ticket(0))
    assert isinstance(a.permits.acquire([limit], ticket(1)), Waiting)  # a caches the held state
    held.release()  # type: ignore[union-attr]
    assert isinstance(a.permits.acquire([limit], ticket(1)), Hold)


def test_several_limits_all_or_none(world) -> None:  # type: ignore[no-untyped-def]
    clock, docs, parking, _ = world
    inst = Instance(docs, parking, clock)
    queue, host = Limit("queue:jobs", 5), Limit("http:a.example", 1)
    assert isinstance(inst.permits.acquire([queue, host], ticket(0)), Hold)
    got = inst.permits.acquire([host, queue], ticket(1))
    assert isinstance(got, Waiting) and got.limit == host
    assert [h.job for h in inst.permits.state("queue:jobs").holders] == ["job-0"]  # given back


def test_changes_asked_while_a_write_is_under_way_go_together_in_the_next_write() -> None:
    clock = Clock()
    writes: list[str] = []
    writing, go_on = threading.Event(), threading.Event()

    def before(op: str, name: str) -> None:
        if op.endswith((".create", ".replace")) and name.startswith("keys/"):
            writes.append(op)
            if len(writes) == 1:  # the first write is slow: the other threads' changes queue
                writing.set()
                go_on.wait(5)

    one = Instance(
        MemoryDocuments(clock.now, before=before, label="permits"), MemoryParking(clock.now), clock
    )
    limit = Limit("k", 4)
    got: dict[int, Hold | Waiting] = {}

    def take(n: int) -> None:
        got[n] = one.permits.acquire([limit], ticket(n))

    first = threading.Thread(target=take, args=(0,))
    first.start()
    assert writing.wait(5)
    others = [threading.Thread(target=take, args=(n,)) for n in range(1, 8)]
    for thread in others:
        thread.start()
    deadline = time.monotonic() + 5
    while len(one.permits._asks.get("k", [])) < 7 and time.monotonic() < deadline:
        time.sleep(0.01)
    go_on.set()
    for thread in (first, *others):
        thread.join(5)
    assert len(writes) == 2  # the first job's, then the seven others' in one
    assert sum(isinstance(h, Hold) for h in got.values()) == 4
    assert len(one.permits.state("k").holders) == 4


def test_a_reservation_left_unused_sends_the_jobs_message_again(world) -> None:  # type: ignore[no-untyped-def]
    clock, docs, parking, _ = world
    a, b = Instance(docs, parking, clock), Instance(docs, parking, clock)
    limit = Limit("k", 1)
    hold = a.permits.acquire([limit], ticket(0))
    assert isinstance(hold, Hold)
    waiting = b.permits.acquire([limit], ticket(1))
    assert isinstance(waiting, Waiting)
    b.permits.wait(waiting, ticket(1), "body-1")
    assert "body" not in str(b.permits.waiting_reason("job-1"))  # the console shows no message
    hold.release()
    (woken,) = parking.due()  # then its host dies before it starts job-1: the message is gone with it
    assert woken.body == "body-1"
    reserved_s = LEASE * RESERVED_SHARE  # shipped: 10 s
    clock.s = reserved_s - 1
    assert isinstance(a.permits.acquire([limit], ticket(2)), Waiting)
    assert parking.due() == []
    clock.s = reserved_s + 1  # the next write drops the reservation and sends job-1's message again
    assert isinstance(a.permits.acquire([limit], ticket(2)), Hold)
    (again,) = parking.due()
    assert again.body == "body-1"
    assert isinstance(a.permits.acquire([limit], ticket(3)), Waiting)
    assert parking.due() == []  # once
