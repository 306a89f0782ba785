"""The queue-depth sample (issue 36): depth and oldest-message age of the jobs, poison and parked
queues, and the Spark runs in flight, set on the `jobs.queue.*` / `jobs.spark.*` gauges. With
several queues (JOBS_QUEUES) each declared queue's three, the gauges also saying `queue_name`
(3 to 6 requests a queue); a queue in another account (QUEUE_<NAME>_CONNECTION) and its `-poison`
queue are sampled there, its `-parked` queue in the app's.

Run by the `sample_queues` timer (function_app.py). Cost per sample: one Get Queue Properties per
queue (3) and one Peek Messages per queue that is not empty (0 to 3), plus one read per Spark slot
when SPARK_MAX_CONCURRENT_RUNS caps the runs (none without a cap: nothing tracks runs then). With
the default schedule (the sweep's, every 15 minutes in Azure) that is 3 to 6 requests per 15
minutes, 0.2 to 0.4 a minute; sampled every minute, 3 to 6 a minute. No message is received or
changed. The age is the first visible message's (a delayed retry is invisible until it is due).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from shared.config.settings import Settings
from shared.core.timers import Clock
from shared.observability import job_metrics
from shared.spark.slots import run_slots
from shared.storage.failures import NotFound
from shared.storage.ports import Account

log = logging.getLogger("jobs.metrics")


class Sampled(Protocol):
    """What a sample reads: the process's runtime (shared.runtime.wiring.Runtime) has it."""

    @property
    def settings(self) -> Settings: ...
    @property
    def account(self) -> Account: ...
    @property
    def clock(self) -> Clock: ...
    def account_of(self, queue: str | None = None) -> Account: ...


@dataclass(frozen=True)
class QueueSample:
    queue: str
    """jobs | poison | parked"""
    depth: int | None
    """None: the queue does not exist."""
    oldest_age_s: float
    name: str = ""
    """The declared jobs queue (JOBS_QUEUES) the sampled queue belongs to."""


def oldest_age(inserted: Iterable[datetime | None], now: datetime) -> float:
    """Age in seconds of the oldest of the peeked messages (0 when none; pure)."""
    ages = [(now - moment).total_seconds() for moment in inserted if moment is not None]
    return max(0.0, max(ages)) if ages else 0.0


def sample_queue(
    rt: Sampled, role: str, name: str, owner: str = "", account: Account | None = None
) -> QueueSample:
    """One queue (in `account`, default the app's): its properties, and a peek at its first
    message when it is not empty."""
    queue = (account or rt.account).raw_queue(name)
    try:
        depth = queue.depth()
        peeked = queue.peek_messages(max_messages=1) if depth else []
    except NotFound:
        return QueueSample(role, None, 0.0, owner)
    return QueueSample(role, depth, oldest_age((_inserted(m) for m in peeked), rt.clock()), owner)


def _inserted(msg: object) -> datetime | None:
    value = getattr(msg, "inserted_on", None)
    return value if isinstance(value, datetime) and value.tzinfo is not None else None


def sample(rt: Sampled, clock: Callable[[], float] = time.time) -> list[QueueSample]:
    """Sample the three queues and the Spark slots; set the gauges. Returns the queue samples."""
    settings = rt.settings
    samples = []
    for queue in settings.queue_set:
        held = rt.account_of(queue.name)  # QUEUE_<NAME>_CONNECTION: the queue's own account
        samples += [
            sample_queue(rt, "jobs", queue.name, queue.name, held),
            sample_queue(rt, "poison", queue.poison, queue.name, held),
            sample_queue(rt, "parked", queue.parked, queue.name),
        ]
    for s in samples:
        if s.depth is not None:
            job_metrics.queue_sample(
                s.queue, s.depth, s.oldest_age_s, s.name if len(settings.queue_set) > 1 else ""
            )
    if settings.spark.max_concurrent_runs > 0:
        store = rt.account.documents(settings.ledger_container)  # where the offload keeps them
        since = run_slots(store, settings.spark).held_since()
        now = clock()
        job_metrics.spark_sample(len(since), max((now - t for t in since), default=0.0))
    return samples


def on_timer(runtime: Callable[[], Sampled]) -> None:
    """The `sample_queues` timer's body (`runtime`: the process's, built on first use): a failed
    sample is logged, the next one tries again."""
    try:
        samples = sample(runtime())
    except Exception as exc:
        log.warning("queue metrics: sample failed (%s); the next run tries again", exc.__class__.__name__)
        return
    log.info("queue metrics: %s", ", ".join(f"{s.queue}={s.depth}/{s.oldest_age_s:.0f}s" for s in samples))
