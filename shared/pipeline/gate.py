"""The permits a job needs before it runs (issue 46): its queue's MAX_CONCURRENT and the limits
its kind declares (`Handler.limits(payload)`, docs/handlers.md).

A job whose limits grant it permits runs holding them (renewed while it runs, checked by
`fence()` before the kind acts, released when the delivery ends). A job refused by one waits:
its message is parked on the jobs queue (its attempt untouched, its expiry still counting) and
this delivery is acknowledged, so it holds no worker and no message lease; the release that frees
a permit wakes the oldest waiter. A job with no limit costs nothing here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from shared.core.envelope import Envelope, encode_json
from shared.ledger import COMPLETED, POISONED, Record
from shared.observability.decisions import log_decision
from shared.permits.decide import Ticket
from shared.permits.limit import Limit
from shared.permits.service import Hold, PermitLost, Waiting
from shared.pipeline.job_payload import load_payload
from shared.runtime.wiring import Runtime

log = logging.getLogger("jobs.permits")


@dataclass
class Admission:
    """A job let through: the permits it holds (none when it has no limit) and its payload when
    the limits needed it (the run reuses it instead of reading it again)."""

    hold: Hold | None = None
    payload: Mapping[str, Any] | None = None

    def start(self) -> None:
        if self.hold is not None:
            self.hold.start()

    def fence(self) -> None:
        """Returns only while every permit is provably held (PermitLost otherwise)."""
        if self.hold is not None:
            self.hold.fence()

    def release(self) -> None:
        if self.hold is not None:
            self.hold.release()


def needed(rt: Runtime, env: Envelope) -> tuple[list[Limit], Mapping[str, Any] | None]:
    """The job's limits (pure but for a claim-checked payload's read, which the run reuses). A
    payload the kind's `limits` cannot read is let through: its run poisons it with the reason."""
    limits: list[Limit] = []
    queue_limit = rt.permit_settings.queue_limit(rt.settings.jobs_queue)
    if queue_limit is not None:
        limits.append(queue_limit)
    declared = getattr(rt.handlers.get(env.kind), "limits", None)
    if not callable(declared):
        return limits, None
    try:
        payload = load_payload(rt, env)
        limits.extend(declared(payload))
    except Exception as exc:  # bad input: the run meets it again under its claim
        log.info("job %s: limits not read (%s); the run will say why", env.id, exc)
        return limits, None
    return limits, payload


def admit(rt: Runtime, env: Envelope, owner: str, fields: Mapping[str, Any]) -> Admission | None:
    """Take the job's permits, or park it as a waiter and return None (acknowledge the delivery).
    An expired job is let through without permits: its run poisons it as expired."""
    limits, payload = needed(rt, env)
    expiry = env.expires_at or env.created_at + timedelta(seconds=rt.settings.job_ttl_s)
    if not limits or rt.clock() > expiry:
        return Admission(None, payload)
    ticket = Ticket(rt.job_key(env.id), env.created_at, owner)  # `<queue>/<id>`: ids repeat across queues
    got = rt.permits.acquire(limits, ticket)
    if isinstance(got, Waiting):
        rt.permits.wait(got, ticket, encode_json(env))
        log_decision(
            "waiting", env.id, key=got.limit.key, reason=got.reason(), recheck_in_s=got.delay_s, **fields
        )
        return None
    return Admission(got, payload)


def lost(rt: Runtime, env: Envelope, exc: PermitLost, fields: Mapping[str, Any]) -> None:
    """Log a permit lost while the job ran (its process stopped past the lease)."""
    log_decision("permit_lost", env.id, error=str(exc), level=logging.WARNING, **fields)


def waiting_reason(rt: Runtime, job_id: str, record: Record) -> dict[str, Any] | None:
    """Why a job that has not finished waits for a permit (2 reads; none for a finished job)."""
    if record.status in (COMPLETED, POISONED) or not may_wait(rt, str(record.data.get("kind", ""))):
        return None
    return rt.permits.waiting_reason(rt.job_key(job_id))


def may_wait(rt: Runtime, kind: str) -> bool:
    """Whether a job of `kind` on this queue can be limited at all (pure): its queue has a
    MAX_CONCURRENT, or its kind declares `limits` and has some configured (`limited`, if it says)."""
    if rt.permit_settings.queue_limit(rt.settings.jobs_queue) is not None:
        return True
    handler = rt.handlers.get(kind)
    return callable(getattr(handler, "limits", None)) and bool(getattr(handler, "limited", True))
