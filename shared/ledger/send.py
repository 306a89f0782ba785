"""The producer's send protocol on a ledger record (pure transitions, as in shared/ledger/__init__.py).

The producer creates the job's `queued` record before it sends the job's message; the record
says the send is pending (`send_pending`, `send_lease_until`) until the message is on the queue.

The API's message is sent by the Functions host (the function's queue output binding) after the
function returns, so no write can follow the send: the marker stays until the first delivery's
claim drops it. The host's message has the queue's default time to live (7 days) where the app's
own sends never expire, so such a record also keeps the envelope and `resend_at` (indexed): a job
no delivery has claimed by then is sent again, never expiring (`unclaimed_to_resend`, `resent`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from shared.core.documents import Conflict
from shared.core.envelope import Envelope, isoformat
from shared.ledger import CLAIM_ENVELOPE, QUEUED, SEND_MARKERS, Data, Facts, stamped

RESEND_AFTER_S = 6 * 24 * 3600.0
"""Seconds after a host-sent job's record is created before recovery sends its message again,
if no delivery has claimed it: a day before the host's message expires (the queue's default time
to live, 7 days), with the `recover_claims` timer (every 15 minutes) well inside that day."""


def queued(
    env: Envelope,
    facts: Facts,
    *,
    request: str,
    submitter: str,
    send_lease_s: float,
    host_sends: bool = False,
) -> Data:
    """Written by the producer (conditional create) BEFORE it sends the job's message: the create
    decides which request owns the job. Until `sent`, `send_pending` says the message may not be
    on the queue; `submitter` (the request) has until `send_lease_until` to send it, after which
    the same request (`request`: its digest) retried may take the send over (`send_resumed`).
    `host_sends`: the Functions host sends it (7-day time to live): keep the envelope to send
    again at `resend_at` if no delivery has claimed the job by then."""
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
        **_kept_for_resend(env if host_sends else None, facts),
    )


def _kept_for_resend(env: Envelope | None, facts: Facts) -> dict[str, Any]:
    """What a host-sent job's record keeps until its first claim: the envelope, and when to send
    it again (`resend_at`, its index tag); nothing when this request sends it itself (`env` None)."""
    if env is None:
        return {}
    return {
        "resend_at": isoformat(facts.now + timedelta(seconds=RESEND_AFTER_S)),
        CLAIM_ENVELOPE: env.to_dict(),
    }


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


def send_resumed(
    prev: Data | None,
    job_id: str,
    facts: Facts,
    submitter: str,
    send_lease_s: float,
    host_sends: Envelope | None = None,
) -> Data:
    """The same request, retried, takes over a pending send whose lease has ended. `host_sends`:
    the envelope the Functions host is to send, kept again to send it after `RESEND_AFTER_S`."""
    _pending_of(prev, None)
    return stamped(
        prev,
        job_id,
        facts,
        "send_resumed",
        submitter=submitter,
        send_lease_until=isoformat(facts.now + timedelta(seconds=send_lease_s)),
        details={"submitter": submitter},
        **_kept_for_resend(host_sends, facts),
    )


def sent(prev: Data | None, job_id: str, facts: Facts, submitter: str) -> Data:
    """The submitter's message is on the queue: the marker goes."""
    return stamped(_pending_of(prev, submitter), job_id, facts, "sent", drop=(*SEND_MARKERS, CLAIM_ENVELOPE))


def unclaimed_to_resend(data: Mapping[str, Any] | None, now: datetime) -> dict[str, Any] | None:
    """The envelope to send again for a host-sent job that no delivery has claimed by its
    `resend_at` (pure); None when the record moved on, is not due, or keeps no envelope."""
    if data is None or not send_is_pending(data):
        return None
    raw, envelope = data.get("resend_at"), data.get(CLAIM_ENVELOPE)
    if not isinstance(raw, str) or not isinstance(envelope, dict) or envelope.get("id") != data.get("id"):
        return None
    try:
        due = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return dict(envelope) if due <= now else None


def resent(prev: Data | None, job_id: str, facts: Facts) -> Data:
    """Recovery sent an unclaimed job's message again, never expiring: the marker goes, as after `sent`."""
    return stamped(_pending_of(prev, None), job_id, facts, "resent", drop=(*SEND_MARKERS, CLAIM_ENVELOPE))


def send_failed(prev: Data | None, job_id: str, facts: Facts, submitter: str, error: str) -> Data:
    """The submitter could not send: its lease ends now, so a retry takes the send over at once.
    Nothing was sent and the caller was told so (503): nothing is kept to send again later."""
    return stamped(
        _pending_of(prev, submitter),
        job_id,
        facts,
        "send_failed",
        drop=("resend_at", CLAIM_ENVELOPE),
        send_lease_until=isoformat(facts.now),
        details={"error": error},
    )
