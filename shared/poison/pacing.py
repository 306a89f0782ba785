"""Pacing, in one place: every replay and bulk operation keeps its rate with a `Pacer` (item k
starts not before k / rate after the first), and sizes its windows with `per_window` (how many
items the rate allows in so many seconds): a bulk step (`step_plan`, `STEP_SECONDS`), a console
replay request (`TICK_S`: the page sends one tick's worth a request, shared/interfaces/console/assets.py
keeps the same figures). How many entries of a step run at once: `step_threads`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

STEP_ITEMS = 1000
STEP_SECONDS = 5.0
"""A step takes about this long at the operation's rate (at most `STEP_ITEMS` entries): few enough
steps that their overhead (the document's read and write, the next step's message, the index
transactions) is small per entry, short enough that Cancel takes effect within seconds."""
STEP_THREADS = 32
"""Entries of a step applied at once at most (each is independent: its own entry, its own job);
a step starts its entries at the rate, so fewer are in flight at a low rate."""
TICK_S = 0.5
TICK_ITEMS = 50
"""The console's replay sends a tick's worth of job ids a request (at most `TICK_ITEMS`)."""


def per_window(rate_per_s: float, window_s: float, most: int) -> int:
    """Items the rate allows in a window of `window_s` seconds: at least 1, at most `most`; no
    rate (0): `most` (pure)."""
    return max(1, min(most, math.floor(rate_per_s * window_s))) if rate_per_s > 0 else most


@dataclass(frozen=True)
class Plan:
    """What one step does (pure): how many items, and how long to wait before the next."""

    size: int
    delay_s: int


def step_plan(rate_per_s: float, done_in_s: float = 0.0, items: int = 0, max_items: int = STEP_ITEMS) -> Plan:
    """At most `max_items`, about `STEP_SECONDS` worth at `rate_per_s`; the next step waits what
    the rate still asks for after this one took `done_in_s` for `items` (a step paces its entries
    at the rate, so usually nothing)."""
    wait = (items / rate_per_s - done_in_s) if rate_per_s > 0 else 0.0
    return Plan(per_window(rate_per_s, STEP_SECONDS, max_items), max(0, math.ceil(wait)))


def step_threads(rate_per_s: float, items: int) -> int:
    """Entries in flight: a quarter second's worth at the rate (so a 250 ms entry keeps up), 4 to
    `STEP_THREADS`, never more than the step's entries."""
    wanted = math.ceil(rate_per_s / 4) if rate_per_s > 0 else STEP_THREADS
    return max(1, min(items, STEP_THREADS, max(4, wanted)))


class Pacer:
    """Starts items at `rate_per_s` (0: no pause): item k not before k / rate after the first."""

    def __init__(self, rate_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = 1.0 / rate_per_s if rate_per_s > 0 else 0.0
        self.clock = clock
        self.started = clock()

    def wait(self, k: int, sleep: Callable[[float], None] = time.sleep) -> None:
        delay = self.started + k * self.interval - self.clock()
        if delay > 0:
            sleep(delay)
