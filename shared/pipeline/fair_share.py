"""A fair share of one worker process's job slots among the declared queues (issue 46).

The Functions host gives every queue its own listener, each fetching up to batchSize +
newBatchThreshold messages, and runs them all in the worker's one thread pool, first come first
served (functions-queue-host.md). A flooded queue then keeps as many jobs running as the pool
holds, and every other queue's job runs beside them, slowed by the flood's share of the CPU,
the storage account and the downstream.

The rule, per worker process: a queue is *active* while it has a job running or waiting here, or
had one start within `ACTIVE_WINDOW_S`. Each active queue may run `slots // active` jobs at once
(at least one); a job over its queue's share waits (before its claim: no lease, no attempt
spent) and starts when a running job of its queue ends or another queue goes idle, the longest
waiting first. A queue alone is active alone: it gets every slot (work-conserving), so with one
queue nothing changes. `slots` is the worker's thread count (`PYTHON_THREADPOOL_THREAD_COUNT`,
else the Python worker's default, min(32, cpus + 4)).

`FAIR_SHARE=false` turns it off. Measured (docs/performance.md): beside a flood of 600 jobs it
kept the other queues within target, beside 2,000 it did not: the flood's waiting invocations
still hold the worker's threads, and the shared CPU and storage account are the bottleneck.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

ACTIVE_WINDOW_S = 2.0
"""How long a queue counts as active after its last job started: small queues whose jobs come
one at a time keep their share between arrivals."""
RECHECK_S = 0.25
"""A waiting job looks again at least this often (a queue going idle wakes no one)."""


def worker_slots(env: Mapping[str, str]) -> int:
    """The worker's thread count: `PYTHON_THREADPOOL_THREAD_COUNT`, else min(32, cpus + 4)."""
    raw = env.get("PYTHON_THREADPOOL_THREAD_COUNT", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return min(32, (os.cpu_count() or 1) + 4)


class FairShare:
    """The job slots of one worker process, shared among the queues with work."""

    def __init__(
        self, slots: int, window_s: float = ACTIVE_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.slots = max(1, slots)
        self.window_s = window_s
        self.clock = clock
        self.running: Counter[str] = Counter()
        self.waiting: Counter[str] = Counter()
        self.started: dict[str, float] = {}
        self._cond = threading.Condition()

    def share(self) -> int:
        """Each active queue's share of the slots now (call holding the lock)."""
        now = self.clock()
        active = {q for q, n in self.running.items() if n} | {q for q, n in self.waiting.items() if n}
        active |= {q for q, at in self.started.items() if now - at < self.window_s}
        return max(1, self.slots // max(1, len(active)))

    def may_start(self, queue: str) -> bool:
        """Whether a job of `queue` may start now (call holding the lock; pure on the counts)."""
        return self.running[queue] < self.share()

    @contextmanager
    def slot(self, queue: str) -> Iterator[None]:
        """Hold one of `queue`'s share of the slots while the block runs (waiting for it first)."""
        with self._cond:
            self.waiting[queue] += 1  # waiting, its queue is active at once
            try:
                while not self.may_start(queue):
                    self._cond.wait(RECHECK_S)
            finally:
                self.waiting[queue] -= 1
            self.running[queue] += 1
            self.started[queue] = self.clock()
        try:
            yield
        finally:
            with self._cond:
                self.running[queue] -= 1
                self._cond.notify_all()


_shared: FairShare | None = None
_lock = threading.Lock()


def process_share() -> FairShare:
    """This worker process's fair share (built on first use)."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = FairShare(worker_slots(os.environ))
        return _shared
