"""The producer's send protocol on a ledger record (pure transitions, as in shared/ledger/__init__.py).

The producer creates the job's `queued` record before it sends the job's message; the record
says the send is pending (`send_pending`, `send_lease_until`) until the message is on the queue.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from shared.core.documents import Conflict
from shared.core.envelope import Envelope, isoformat
from shared.ledger import QUEUED, SEND_MARKERS, Data, Facts, stamped


def queued(env: Envelope, facts: Facts, *, request: str, submitter: str, send_lease_s: float) -> Data:
    """Written by the producer (conditional create) BEFORE it sends the job's message: the create
    decides which request owns the job. Until `sent`, `send_pending` says the message may not be
    on the queue; `submitter` (the request) has until `send_lease_until` to send it, after which
    the same request (`request`: its digest) retried may take the send over (`send_resumed`)."""
    return stamped(
        None,
        env.id,
        facts,
        "queued",
        kind=env.kind,
        status=QUEUED,
        attempt=env.attempt,
        created_at=isoformat(env.created_at),
        payload_ref=env.payload_ref,
        request_digest=request,
        submitter=submitter,
        send_pending=True,
        send_lease_until=isoformat(facts.now + timedelta(seconds=send_lease_s)),
    )


def send_is_pending(data: Mapping[str, Any] | None) -> bool:
    """True for a `queued` record whose producer has not yet confirmed its message is on the queue."""
    return data is not None and data.get("status") == QUEUED and data.get("send_pending") is True


def send_lease_end(data: Mapping[str, Any]) -> datetime | None:
    """When the pending send's owner loses it (None: no pending send, or no readable lease)."""
    raw = data.get("send_lease_until")
    if not send_is_pending(data) or not isinstance(raw, str):
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None


def _pending_of(prev: Data | None, submitter: str | None) -> Data:
    if prev is None or not send_is_pending(prev):
        raise Conflict("no send is pending on this record")
    if submitter is not None and prev.get("submitter") != submitter:
        raise Conflict("the pending send belongs to another request")
    return prev


def send_resumed(prev: Data | None, job_id: str, facts: Facts, submitter: str, send_lease_s: float) -> Data:
    """The same request, retried, takes over a pending send whose lease has ended."""
    _pending_of(prev, None)
    return stamped(
        prev,
        job_id,
        facts,
        "send_resumed",
        submitter=submitter,
        send_lease_until=isoformat(facts.now + timedelta(seconds=send_lease_s)),
        details={"submitter": submitter},
    )


def sent(prev: Data | None, job_id: str, facts: Facts, submitter: str) -> Data:
    """The submitter's message is on the queue: the marker goes."""
    return stamped(_pending_of(prev, submitter), job_id, facts, "sent", drop=SEND_MARKERS)


def send_failed(prev: Data | None, job_id: str, facts: Facts, submitter: str, error: str) -> Data:
    """The submitter could not send: its lease ends now, so a retry takes the send over at once."""
    return stamped(
        _pending_of(prev, submitter),
        job_id,
        facts,
        "send_failed",
        send_lease_until=isoformat(facts.now),
        details={"error": error},
    )
