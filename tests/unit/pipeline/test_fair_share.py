"""The worker's fair share of job slots among queues with work (shared/pipeline/fair_share.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest

from shared.pipeline.fair_share import FairShare, worker_slots


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def hold(share: FairShare, queue: str, release: threading.Event, started: list[str]) -> threading.Thread:
    def job() -> None:
        with share.slot(queue):
            started.append(queue)
            release.wait(10)

    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    return thread


def wait_until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


@pytest.fixture
def clock() -> Iterator[Clock]:
    yield Clock()


def test_a_queue_alone_gets_every_slot(clock: Clock) -> None:
    share = FairShare(4, clock=clock)
    with ExitStack() as stack:
        for _ in range(4):
            stack.enter_context(share.slot("flood"))
        assert share.running["flood"] == 4 and share.share() == 4


def test_two_active_queues_each_get_half(clock: Clock) -> None:
    share = FairShare(4, clock=clock)
    release, started = threading.Event(), list[str]()
    floods = [hold(share, "flood", release, started) for _ in range(2)]
    wait_until(lambda: started.count("flood") == 2)
    with share.slot("small"):  # small under its share: starts at once
        third = hold(share, "flood", release, started)
        time.sleep(0.4)
        assert started.count("flood") == 2 and share.waiting["flood"] == 1  # flood at its share of 2
    clock.now += 10  # the small queue idle past the window: the flood alone again
    wait_until(lambda: started.count("flood") == 3)
    release.set()
    for thread in [*floods, third]:
        thread.join(5)
    assert share.running == {"flood": 0, "small": 0}


def test_a_waiting_job_starts_when_one_of_its_queue_ends(clock: Clock) -> None:
    share = FairShare(2, clock=clock)
    first_done, started = threading.Event(), list[str]()
    with share.slot("small"):
        first = hold(share, "flood", first_done, started)
        wait_until(lambda: started == ["flood"])
        second = hold(share, "flood", threading.Event(), started)
        time.sleep(0.3)
        assert started == ["flood"]  # share 1 each while small runs
        first_done.set()
        wait_until(lambda: started == ["flood", "flood"])
    first.join(5)
    second.join(0)


def test_a_recent_start_keeps_a_queue_active_within_the_window(clock: Clock) -> None:
    share = FairShare(4, clock=clock)
    with share.slot("small"):
        pass
    assert share.share() == 4  # alone: small counts, nothing else does
    with share.slot("flood"):
        assert share.share() == 2  # small started within the window
        clock.now += 5
        assert share.share() == 4


def test_slots_are_the_workers_thread_count() -> None:
    assert worker_slots({"PYTHON_THREADPOOL_THREAD_COUNT": "24"}) == 24
    assert 5 <= worker_slots({}) <= 32
    assert worker_slots({"PYTHON_THREADPOOL_THREAD_COUNT": "x"}) == worker_slots({})
