"""A clock and call-later timers: one daemon thread in production, a fake clock in simulations."""

from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

log = logging.getLogger("jobs.timers")

Clock = Callable[[], datetime]
"""Returns the current time, UTC-aware."""


def system_clock() -> datetime:
    return datetime.now(UTC)


class Timer(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    """Runs `fn` once after `delay_s` seconds, on some other thread of control."""

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Timer: ...


class _Entry:
    __slots__ = ("cancelled", "fn")

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ThreadTimers:
    """All timers of the process on one daemon thread; callbacks run on a small pool, so one slow
    callback (a storage write retrying) does not hold back the others."""

    def __init__(self, name: str = "jobs-timers", workers: int = 16) -> None:
        self._name = name
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix=name)
        self._heap: list[tuple[float, int, _Entry]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Timer:
        entry = _Entry(fn)
        with self._cond:
            heapq.heappush(self._heap, (time.monotonic() + max(0.0, delay_s), next(self._seq), entry))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        return entry

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
                _, _, entry = heapq.heappop(self._heap)
            if not entry.cancelled:
                self._pool.submit(_call, entry)


def _call(entry: _Entry) -> None:
    if entry.cancelled:
        return
    try:
        entry.fn()
    except Exception:  # logged: a timer callback has nobody to raise to
        log.exception("timer callback failed")
