"""The worker's fair share of job slots among queues with work (shared/pipeline/fair_share.py).

The rule is pure (`active_queues`, `share_of`, `may_start`) and tested on a fake clock; the
waiting is tested on a real event loop with jobs that block real threads, the clock still fake
(a queue goes idle when the test says so).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from shared.pipeline.fair_share import (
    POOL_FACTOR,
    FairShare,
    active_queues,
    may_start,
    share_of,
    worker_slots,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- the rule (pure) ----------------------------------------------------------------------------


def test_a_queue_is_active_with_work_or_a_start_within_the_window() -> None:
    now = 1000.0
    running, waiting = {"flood": 3, "idle": 0}, {"b": 1}
    started = {"a": now - 1.9, "old": now - 2.0}
    assert active_queues(running, waiting, started, now, 2.0) == {"flood", "b", "a"}


def test_each_active_queue_gets_an_equal_share_of_at_least_one() -> None:
    assert share_of(24, 1) == 24
    assert share_of(24, 3) == 8
    assert share_of(2, 5) == 1
    assert share_of(24, 0) == 24


def test_a_queue_alone_may_use_every_slot() -> None:
    assert may_start("flood", 4, {"flood": 3}, {}, {"flood": 999.0}, 1000.0)
    assert not may_start("flood", 4, {"flood": 4}, {}, {"flood": 999.0}, 1000.0)


def test_a_queue_over_its_share_waits_while_another_is_active() -> None:
    running, started = {"flood": 2}, {"flood": 999.9, "small": 999.0}
    assert not may_start("flood", 4, running, {}, started, 1000.0)  # two active: 2 each
    assert may_start("small", 4, running, {}, started, 1000.0)
    assert may_start("flood", 4, running, {}, started, 1002.0)  # small idle past the window


def test_the_asking_queue_counts_as_active() -> None:
    assert may_start("small", 4, {"flood": 4}, {}, {}, 1000.0)  # two active: 2 each, small has none
    assert may_start("flood", 4, {"flood": 2}, {}, {}, 1000.0)  # flood alone: 4
    assert not may_start("flood", 4, {"flood": 2, "small": 1}, {}, {}, 1000.0)


def test_the_total_never_exceeds_the_pool() -> None:
    slots = 4
    running = {"a": POOL_FACTOR * slots - 1, "b": 1}  # `a` was alone when it started them
    assert not may_start("c", slots, running, {}, {}, 1000.0)
    assert may_start("c", slots, {"a": POOL_FACTOR * slots - 2, "b": 1}, {}, {}, 1000.0)


def test_slots_are_the_workers_thread_count() -> None:
    assert worker_slots({"PYTHON_THREADPOOL_THREAD_COUNT": "24"}) == 24
    assert 5 <= worker_slots({}) <= 32
    assert worker_slots({"PYTHON_THREADPOOL_THREAD_COUNT": "x"}) == worker_slots({})


# -- waiting on the event loop ------------------------------------------------------------------


class Jobs:
    """Jobs that block their thread until released; records the order they started in."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = threading.Event()
        self._lock = threading.Lock()

    def job(self, name: str) -> Callable[[], str]:
        def run() -> str:
            with self._lock:
                self.started.append(name)
            assert self.release.wait(10), "never released"
            return name

        return run


async def until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def fair_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("fair-share"))


def run(scenario: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(scenario())


def test_a_queue_alone_gets_every_slot_and_a_job_over_it_holds_no_thread() -> None:
    share, jobs = FairShare(4, clock=Clock()), Jobs()

    async def scenario() -> None:
        tasks = [asyncio.create_task(share.run("flood", jobs.job(f"f{i}"))) for i in range(10)]
        await until(lambda: len(jobs.started) == 4)
        await asyncio.sleep(0.3)
        assert len(jobs.started) == 4 and share.waiting["flood"] == 6
        assert fair_threads() <= 4  # the six waiting jobs hold no thread
        jobs.release.set()
        assert sorted(await asyncio.gather(*tasks)) == sorted(f"f{i}" for i in range(10))

    run(scenario)
    assert jobs.started == [f"f{i}" for i in range(10)]  # oldest first
    assert share.running["flood"] == 0 and share.waiting == {}


def test_another_queue_starts_at_once_beside_a_flood_and_the_flood_keeps_its_share() -> None:
    clock = Clock()
    share, floods, small = FairShare(4, clock=clock), Jobs(), Jobs()

    async def scenario() -> None:
        flood = [asyncio.create_task(share.run("flood", floods.job(f"f{i}"))) for i in range(8)]
        await until(lambda: len(floods.started) == 4)
        mine = asyncio.create_task(share.run("small", small.job("s0")))
        await until(lambda: small.started == ["s0"])  # within its share: starts at once
        floods.release.set()  # the flood's jobs end: now it runs two at a time at most
        await until(lambda: len(floods.started) == 8)
        small.release.set()
        await asyncio.gather(mine, *flood)

    run(scenario)
    assert share.running == {"flood": 0, "small": 0}


def test_a_flood_over_its_share_waits_until_the_other_queue_goes_idle() -> None:
    clock = Clock()
    share, floods, small = FairShare(4, clock=clock), Jobs(), Jobs()

    async def scenario() -> None:
        small_task = asyncio.create_task(share.run("small", small.job("s0")))
        await until(lambda: small.started == ["s0"])
        flood = [asyncio.create_task(share.run("flood", floods.job(f"f{i}"))) for i in range(4)]
        await until(lambda: len(floods.started) == 2)
        await asyncio.sleep(0.4)  # rechecks: still two, the small queue is active
        assert len(floods.started) == 2 and share.waiting["flood"] == 2
        small.release.set()
        await small_task
        await asyncio.sleep(0.4)
        assert len(floods.started) == 2  # the small queue started one within the window
        clock.now += 5  # idle past the window: the flood alone gets every slot (work-conserving)
        await until(lambda: len(floods.started) == 4)
        floods.release.set()
        await asyncio.gather(*flood)

    run(scenario)


def test_a_waiting_job_starts_when_one_of_its_queue_ends() -> None:
    share, small, first, second = FairShare(2, clock=Clock()), Jobs(), Jobs(), Jobs()

    async def scenario() -> None:
        mine = asyncio.create_task(share.run("small", small.job("s0")))
        a = asyncio.create_task(share.run("flood", first.job("f0")))
        await until(lambda: first.started == ["f0"] and small.started == ["s0"])
        b = asyncio.create_task(share.run("flood", second.job("f1")))
        await asyncio.sleep(0.3)
        assert second.started == []  # one each while small runs
        first.release.set()
        await until(lambda: second.started == ["f1"])
        second.release.set()
        small.release.set()
        await asyncio.gather(mine, a, b)

    run(scenario)


def test_a_cancelled_waiting_job_leaves_the_line_and_a_failing_job_gives_its_slot_back() -> None:
    share, jobs = FairShare(1, clock=Clock()), Jobs()

    def boom() -> str:
        raise ValueError("boom")

    async def scenario() -> None:
        first = asyncio.create_task(share.run("q", jobs.job("first")))
        await until(lambda: jobs.started == ["first"])
        waiting = asyncio.create_task(share.run("q", jobs.job("cancelled")))
        await until(lambda: share.waiting["q"] == 1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert share.waiting == {}
        jobs.release.set()
        await first
        with pytest.raises(ValueError, match="boom"):
            await share.run("q", boom)
        assert share.running["q"] == 0
        assert await share.run("q", jobs.job("after")) == "after"

    run(scenario)
    assert jobs.started == ["first", "after"]


def test_a_job_that_waits_longer_than_it_may_leaves_the_line() -> None:
    share, jobs = FairShare(1, clock=Clock()), Jobs()

    async def scenario() -> None:
        first = asyncio.create_task(share.run("q", jobs.job("first")))
        await until(lambda: jobs.started == ["first"])
        assert not await share.acquire("q", timeout_s=0.3)
        assert share.waiting == {} and share.running["q"] == 1
        jobs.release.set()
        await first
        assert await share.acquire("q", timeout_s=0.3)  # free: taken at once
        share.release("q")

    run(scenario)
