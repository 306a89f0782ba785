"""The devhost's one-thread scheduler for per-message timers (short real delays)."""

from __future__ import annotations

import threading
import time

from devhost import scheduler as scheduler_module
from devhost.scheduler import Scheduler


def test_calls_run_in_due_order_each_on_its_own_thread() -> None:
    sched = Scheduler("t")
    ran: list[tuple[str, str]] = []
    done = threading.Event()

    def record(label: str) -> None:
        ran.append((label, threading.current_thread().name))
        if len(ran) == 3:
            done.set()

    sched.call_later(0.15, record, "late")
    sched.call_later(0.05, record, "early")
    sched.call_later(0.0, record, "now")
    assert done.wait(5)
    assert [label for label, _ in ran] == ["now", "early", "late"]
    assert all(name == "t-call" for _, name in ran)


def test_a_cancelled_call_never_runs() -> None:
    sched = Scheduler()
    ran = threading.Event()
    handle = sched.call_later(0.05, ran.set)
    handle.cancel()
    after = threading.Event()
    sched.call_later(0.1, after.set)
    assert after.wait(5)
    assert not ran.is_set()
    assert sched.pending() == 0


def test_a_slow_call_does_not_delay_the_next() -> None:
    sched = Scheduler()
    release = threading.Event()
    quick = threading.Event()
    sched.call_later(0.0, release.wait, 5)
    started = time.monotonic()
    sched.call_later(0.05, quick.set)
    assert quick.wait(2)
    assert time.monotonic() - started < 2
    release.set()


def test_cancelled_calls_are_dropped_before_they_are_due() -> None:
    sched = Scheduler()
    every = scheduler_module.COMPACT_EVERY
    handles = [sched.call_later(3600, print) for _ in range(every * 2)]
    for handle in handles:
        handle.cancel()
    sched.call_later(3600, print)
    assert sched.held() <= every + 1
    assert sched.pending() == 1
