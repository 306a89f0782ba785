"""A fair share of one worker process's job slots among the declared queues (issue 46).

The Functions host gives every queue its own listener, each holding up to batchSize +
newBatchThreshold messages, and runs every sync invocation (HTTP ones too) in the worker's one
thread pool, first come first served (functions-queue-host.md). A flooded queue then fills that
pool, and every other queue's job and every POST waits for a thread behind it.

The rule, per worker process: a queue is *active* while it has a job running or waiting here, or
had one start within `ACTIVE_WINDOW_S`. Each active queue may run `slots // active` jobs at once
(at least one); a job over its queue's share waits, the oldest of its queue first, and starts
when a running job of its queue ends or another queue goes idle. A queue alone is active alone:
it gets every slot (work-conserving), so with one queue nothing changes. `slots` is the worker's
thread count (`PYTHON_THREADPOOL_THREAD_COUNT`, else the Python worker's default,
min(32, cpus + 4)).

How a job waits without holding a worker: with several queues and `FAIR_SHARE` on, the job
triggers are `async def` (function_app.py, shared/pipeline/fair_trigger.py): an invocation over
its queue's share waits on the worker's event loop (no thread), then its job runs on this
module's own pool of threads. The
worker's thread pool is left to the HTTP functions and the timers, so a POST never waits behind
a flood, and a flood's waiting messages make no storage request at all: the flood's storage
requests are paced by its share (its running jobs), while each queue's listener still fetches
only its own messages. Nothing is written while a job waits: its attempts are untouched and its
expiry keeps counting (the claim checks it when it starts). The waiting message stays leased by
the host (renewed as for any running invocation); if the process dies while it waits, the host
sees it again when its lease ends (10 minutes), as for any invocation in flight: nothing is lost.
The trigger's body (shared/pipeline/fair_trigger.py) bounds the wait to half of functionTimeout.

Why not put an over-share message back on its queue with a delay instead: each deferral costs a
send and the host's delete, and the flood's listener fetches the next messages of its backlog at
once, so a backlog of 2,000 would be deferred message after message as fast as the storage
account answers: the very request budget the other queues need.

`FAIR_SHARE=false` turns it off (sync triggers, first come first served).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import TypeVar

T = TypeVar("T")

ACTIVE_WINDOW_S = 2.0
"""How long a queue counts as active after its last job started: small queues whose jobs come
one at a time keep their share between arrivals."""
RECHECK_S = 0.25
"""A waiting job looks again at least this often (a queue going idle wakes no one)."""
POOL_FACTOR = 2
"""The job pool holds `POOL_FACTOR * slots` threads: a queue that was alone keeps its running
jobs when another becomes active, so shares may add up to more than `slots` for a while; the
total is capped at the pool's size, so a started job never waits for a thread."""


def worker_slots(env: Mapping[str, str]) -> int:
    """The worker's thread count: `PYTHON_THREADPOOL_THREAD_COUNT`, else min(32, cpus + 4)."""
    raw = env.get("PYTHON_THREADPOOL_THREAD_COUNT", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return min(32, (os.cpu_count() or 1) + 4)


def active_queues(
    running: Mapping[str, int],
    waiting: Mapping[str, int],
    started: Mapping[str, float],
    now: float,
    window_s: float = ACTIVE_WINDOW_S,
) -> frozenset[str]:
    """The queues with a job running or waiting, or one started within `window_s` of `now`."""
    busy = {q for q, n in running.items() if n} | {q for q, n in waiting.items() if n}
    return frozenset(busy | {q for q, at in started.items() if now - at < window_s})


def share_of(slots: int, active: int) -> int:
    """Each active queue's share of `slots` (at least one)."""
    return max(1, slots // max(1, active))


def may_start(
    queue: str,
    slots: int,
    running: Mapping[str, int],
    waiting: Mapping[str, int],
    started: Mapping[str, float],
    now: float,
    window_s: float = ACTIVE_WINDOW_S,
) -> bool:
    """Whether one more job of `queue` may start now: under its share and under the pool's size.
    `queue` counts as active (it has a job asking)."""
    active = active_queues(running, waiting, started, now, window_s) | {queue}
    total = sum(running.values())
    return running.get(queue, 0) < share_of(slots, len(active)) and total < POOL_FACTOR * slots


class _Ticket:
    """One waiting job: woken (from any thread) when a slot may have come free."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.event = asyncio.Event()

    def wake(self) -> None:
        self.loop.call_soon_threadsafe(self.event.set)


class FairShare:
    """The job slots of one worker process, shared among the queues with work."""

    def __init__(
        self, slots: int, window_s: float = ACTIVE_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.slots = max(1, slots)
        self.window_s = window_s
        self.clock = clock
        self.running: Counter[str] = Counter()
        self.started: dict[str, float] = {}
        self.lines: dict[str, deque[_Ticket]] = {}
        """Each queue's waiting jobs, oldest first."""
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def waiting(self) -> Counter[str]:
        with self._lock:
            return Counter({q: len(line) for q, line in self.lines.items() if line})

    def share(self) -> int:
        """Each active queue's share of the slots now."""
        with self._lock:
            return share_of(self.slots, len(self._active()))

    def _active(self) -> frozenset[str]:
        waiting = {q: len(line) for q, line in self.lines.items()}
        return active_queues(self.running, waiting, self.started, self.clock(), self.window_s)

    def try_start(self, queue: str, ticket: _Ticket | None = None) -> bool:
        """Take a slot of `queue` if the rule allows it and no older job of `queue` waits first."""
        with self._lock:
            line = self.lines.setdefault(queue, deque())
            if line and line[0] is not ticket:
                return False
            waiting = {q: len(x) for q, x in self.lines.items()}
            if not may_start(
                queue, self.slots, self.running, waiting, self.started, self.clock(), self.window_s
            ):
                return False
            if line:
                line.popleft()
            self.running[queue] += 1
            self.started[queue] = self.clock()
        return True

    def release(self, queue: str) -> None:
        """A job of `queue` ended: wake every waiting job (each looks again, oldest first)."""
        with self._lock:
            self.running[queue] -= 1
            tickets = [t for line in self.lines.values() for t in line]
        for ticket in tickets:
            ticket.wake()

    async def acquire(self, queue: str, timeout_s: float | None = None) -> bool:
        """Wait (on the event loop, holding no thread) until a job of `queue` may start, and take
        its slot: True. False after `timeout_s` seconds without one (it leaves the line)."""
        loop = asyncio.get_running_loop()
        ticket, give_up = _Ticket(loop), None if timeout_s is None else loop.time() + timeout_s
        with self._lock:
            self.lines.setdefault(queue, deque()).append(ticket)
        try:
            while True:
                ticket.event.clear()  # before looking: a release after the look wakes us
                if self.try_start(queue, ticket):
                    return True
                wait = RECHECK_S if give_up is None else min(RECHECK_S, give_up - loop.time())
                if wait <= 0:
                    self._leave(queue, ticket)
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ticket.event.wait(), wait)
        except BaseException:
            self._leave(queue, ticket)
            raise

    def _leave(self, queue: str, ticket: _Ticket) -> None:
        with self._lock:
            line = self.lines.get(queue)
            if line is not None and ticket in line:
                line.remove(ticket)
            tickets = [t for line in self.lines.values() for t in line]
        for other in tickets:  # the next in line may be first now
            other.wake()

    async def run(self, queue: str, job: Callable[[], T]) -> T:
        """Run `job` (sync) as one of `queue`'s jobs: wait for its slot, then run it on the pool."""
        await self.acquire(queue)
        return await self.run_acquired(queue, job)

    async def run_acquired(self, queue: str, job: Callable[[], T]) -> T:
        """Run `job` on the pool in the slot of `queue` taken by `acquire`, giving it back after."""

        def held() -> T:
            try:
                return job()
            finally:
                self.release(queue)

        future = self.pool().submit(contextvars.copy_context().run, held)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if future.cancelled():  # never started: its slot goes back here
                self.release(queue)
            raise

    async def run_unslotted(self, job: Callable[[], T]) -> T:
        """Run `job` on the pool outside any share (a short step: a wait given up)."""
        return await asyncio.wrap_future(self.pool().submit(contextvars.copy_context().run, job))

    def pool(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=POOL_FACTOR * self.slots, thread_name_prefix="fair-share"
                )
            return self._pool


_shared: FairShare | None = None
_lock = threading.Lock()


def process_share() -> FairShare:
    """This worker process's fair share (built on first use)."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = FairShare(worker_slots(os.environ))
        return _shared
