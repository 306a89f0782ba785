"""The console by queue (issue 46): which queue a request means, how a job of another queue is
named and linked, and the overview's table of queues.

A job off the default queue is `<queue>/<id>` wherever the console lists it (the jobs index,
the poison archive); its page is `jobs/<id>?queue=<queue>`. The table of queues costs, per
declared queue: the jobs queue's properties and, when it is not empty, a peek at its first
message (in the queue's own account: `QUEUE_<NAME>_CONNECTION`), the poison queue's properties,
and with a `MAX_CONCURRENT` its permit document (one read); for all of them, one query of the
poison archive index's counters. Nothing reads the history.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, urlencode

from shared.observability.queue_metrics import sample_queue
from shared.permits.limit import queue_key
from shared.runtime.wiring import Runtime


@dataclass(frozen=True)
class QueueRow:
    """One declared queue as the overview shows it."""

    name: str
    default: bool
    depth: int | None
    """Messages on the jobs queue (approximate; None: the queue does not exist)."""
    oldest_age_s: float
    """Age of its first visible message (0 when empty)."""
    poison_depth: int | None
    """Messages on its `-poison` queue, not yet archived."""
    poisoned: int
    """Its listed (replayable) poison archive entries."""
    max_concurrent: int | None
    """Its `MAX_CONCURRENT` (None: no limit)."""
    running: int | None
    """Jobs holding one of its permits now (None without a limit: then nothing counts them)."""
    waiting: int | None
    """Jobs waiting for one of its permits."""
    account: str
    """`app` (AzureWebJobsStorage), or the connection setting naming the queue's account."""


def split_key(key: str) -> tuple[str, str]:
    """(queue, id) of a job as listed: `<queue>/<id>`, or an id of the default queue ("") (pure)."""
    queue, _, job_id = key.rpartition("/")
    return queue, job_id


def job_href(base: str, key: str) -> str:
    """The page of a job as listed (`<queue>/<id>` or an id of the default queue) (pure)."""
    queue, job_id = split_key(key)
    return f"{base}/jobs/{quote(job_id)}" + (f"?{urlencode({'queue': queue})}" if queue else "")


def queue_rows(rt: Runtime, names: tuple[str, ...] | None = None) -> list[QueueRow]:
    """The declared queues (`names`: those only), each with a few requests (module docstring)."""
    queue_set = rt.settings.queue_set
    listed = rt.entry_index.queue_counts(queue_set.default.name)
    now = rt.clock()
    rows = []
    for queue in queue_set:
        if names is not None and queue.name not in names:
            continue
        held = rt.account_of(queue.name)
        jobs = sample_queue(rt, "jobs", queue.name, queue.name, held)
        poison = sample_queue(rt, "poison", queue.poison, queue.name, held)
        limit = rt.permit_settings.queue_limit(queue.name)
        running = waiting = None
        if limit is not None:
            state = rt.permits.state(queue_key(queue.name))
            running = sum(1 for h in state.holders if h.until > now)
            waiting = len(state.waiters)
        rows.append(
            QueueRow(
                name=queue.name,
                default=queue.default,
                depth=jobs.depth,
                oldest_age_s=jobs.oldest_age_s,
                poison_depth=poison.depth,
                poisoned=listed.get(queue.name, 0),
                max_concurrent=limit.max_concurrent if limit is not None else None,
                running=running,
                waiting=waiting,
                account=queue.connection or "app",
            )
        )
    return rows
