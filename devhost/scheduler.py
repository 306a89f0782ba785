"""Delayed calls on one thread: the per-message lease-renewal and timeout timers.

`threading.Timer` starts a thread per timer; with two timers per message (both almost always
cancelled) that was a visible share of the host's CPU per message. Here one daemon thread waits
for the earliest due call; a call that comes due runs on a thread of its own (it may do storage
I/O), so a slow renewal never delays another.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

COMPACT_EVERY = 4096
"""Cancelled calls are dropped from the heap at most this many calls apart (not only when due)."""


class Scheduled:
    """A pending call; `cancel()` before it is due and it never runs."""

    __slots__ = ("cancelled", "due")

    def __init__(self, due: float) -> None:
        self.due = due
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Scheduler:
    """`call_later(delay, fn, *args)`; the thread starts with the first call."""

    def __init__(self, name: str = "devhost-timers") -> None:
        self._name = name
        self._heap: list[tuple[float, int, Scheduled, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> Scheduled:
        handle = Scheduled(time.monotonic() + max(0.0, delay))
        with self._cond:
            seq = next(self._seq)
            if seq % COMPACT_EVERY == 0 and len(self._heap) > COMPACT_EVERY:
                self._heap = [entry for entry in self._heap if not entry[2].cancelled]
                heapq.heapify(self._heap)
            heapq.heappush(self._heap, (handle.due, seq, handle, fn, args))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            elif self._heap[0][2] is handle:
                self._cond.notify()
        return handle

    def pending(self) -> int:
        """Calls not yet due and not cancelled."""
        with self._cond:
            return sum(1 for entry in self._heap if not entry[2].cancelled)

    def held(self) -> int:
        """Entries the heap holds, cancelled ones included: compaction keeps this near `pending()`."""
        with self._cond:
            return len(self._heap)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                due, _, handle, fn, args = self._heap[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
            if not handle.cancelled:
                threading.Thread(target=fn, args=args, name=f"{self._name}-call", daemon=True).start()
