"""How a step of a bulk operation (shared/poison/bulk.py) keeps its pace and its cost: how many
entries it takes (`step_plan`), how many run at once (`step_threads`), when each starts (`Pacer`),
and the index writes it leaves for its end (`StepWrites`)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from shared.runtime.wiring import Runtime

STEP_ITEMS = 1000
STEP_SECONDS = 5.0
"""A step takes about this long at the operation's rate (at most `STEP_ITEMS` entries): few enough
steps that their overhead (the document's read and write, the next step's message, the index
transactions) is small per entry, short enough that Cancel takes effect within seconds."""
STEP_THREADS = 32
"""Entries of a step applied at once at most (each is independent: its own entry, its own job);
a step starts its entries at the rate, so fewer are in flight at a low rate."""


@dataclass(frozen=True)
class Plan:
    """What one step does (pure): how many items, and how long to wait before the next."""

    size: int
    delay_s: int


def step_plan(rate_per_s: float, done_in_s: float = 0.0, items: int = 0, max_items: int = STEP_ITEMS) -> Plan:
    """At most `max_items`, about `STEP_SECONDS` worth at `rate_per_s`; the next step waits what
    the rate still asks for after this one took `done_in_s` for `items` (a step paces its entries
    at the rate, so usually nothing)."""
    size = max(1, min(max_items, math.floor(rate_per_s * STEP_SECONDS))) if rate_per_s > 0 else max_items
    wait = (items / rate_per_s - done_in_s) if rate_per_s > 0 else 0.0
    return Plan(size, max(0, math.ceil(wait)))


def step_threads(rate_per_s: float, items: int) -> int:
    """Entries in flight: a quarter second's worth at the rate (so a 250 ms entry keeps up), 4 to
    `STEP_THREADS`, never more than the step's entries."""
    wanted = math.ceil(rate_per_s / 4) if rate_per_s > 0 else STEP_THREADS
    return max(1, min(items, STEP_THREADS, max(4, wanted)))


class Pacer:
    """Starts a step's entries at `rate_per_s`: entry k not before k / rate after the first."""

    def __init__(self, rate_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = 1.0 / rate_per_s if rate_per_s > 0 else 0.0
        self.clock = clock
        self.started = clock()

    def wait(self, k: int, sleep: Callable[[float], None] = time.sleep) -> None:
        delay = self.started + k * self.interval - self.clock()
        if delay > 0:
            sleep(delay)


@dataclass
class StepWrites:
    """Index writes a step's entries leave for the end of the step, sent as entity group
    transactions: the entry index moves (name, before, after), its removals (name, entry) and the
    jobs' new records."""

    moves: list[tuple[str, dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    removes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def move(self, name: str, before: dict[str, Any], after: dict[str, Any]) -> None:
        with self.lock:
            self.moves.append((name, before, after))

    def remove(self, name: str, entry: dict[str, Any]) -> None:
        with self.lock:
            self.removes.append((name, entry))

    def record(self, data: dict[str, Any]) -> None:
        with self.lock:
            self.records.append(data)

    def flush(self, rt: Runtime) -> None:
        """Send them (best effort, like every index write: the blobs are the truth). A step
        redone after a crash finds its entries done and leaves their writes again."""
        if self.moves or self.removes:
            rt.entry_index.move_many(self.moves, self.removes)
        if self.records:
            rt.job_index.put_many(self.records)
