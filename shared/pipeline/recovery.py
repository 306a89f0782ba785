"""Claims that ended without an outcome, found and handed to a live instance (issue 21).

A host killed mid-job leaves its records `in_progress` under a claim that ends within
`CLAIM_LEASE_SECONDS`, while its messages stay leased by the dead host for 10 minutes. Every
claim and heartbeat write sets the record's `lease_until` index tag in the same PUT (no extra
request); every write that ends a claim clears it. So one Find Blobs by Tags request
(`lease_until < now - grace`) lists exactly the claims that ended unfinished, without listing
the ledger. For each, the record is read, `ledger_view.claim_to_recover` confirms it (pure),
and the claim's envelope (kept in the record while the claim lasts) is sent again: a live
instance takes the job over at once (one takeover). The dead host's message, back after its lease, is
then acknowledged as a duplicate (or stale, or meets a live claim and re-checks): the ledger
runs the job's effect once.

Who runs it: every worker that processes jobs, every `RECOVERY_INTERVAL_SECONDS` while it lives
(`watch`), and the `recover_claims` timer, which also runs when a host starts. An idle app has
no worker awake and nothing to recover, so it costs nothing there.

The timer also sends again the API's jobs that no delivery has claimed `RESEND_AFTER_S` (6 days)
after their record was made (`resend_unclaimed`): the Functions host sent their message with the
queue's default time to live (7 days; shared/ledger/send.py). One more tag query a timer run
(`resend_at <= now`), which finds nothing unless a backlog is days old.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from shared.core.documents import Conflict, TagQuery
from shared.core.envelope import isoformat, parse_dict
from shared.core.errors import EnvelopeError
from shared.ledger import Facts
from shared.ledger import send as ledger_send
from shared.ledger import view as ledger_view
from shared.observability.decisions import log_decision
from shared.runtime.sending import send_job
from shared.runtime.wiring import Runtime, get_runtime

log = logging.getLogger("jobs.recovery")
GRACE_S = 10.0
"""Seconds after a claim's end before recovery acts: a delivery that met the live claim re-checks
at its end + 1 s (the host alive, only the worker died), so recovery leaves that path its turn."""


@dataclass
class Recovered:
    """What one pass found and did."""

    found: int = 0
    """Records the pass's tag query returned (as indexed)."""
    resent: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """Moved on since the index was written, or not recoverable here (see the log)."""


def ended_claims_query(now: datetime, grace_s: float = GRACE_S) -> TagQuery:
    """The index query for claims that ended at least `grace_s` before `now` (pure)."""
    return TagQuery(ledger_view.TAG_LEASE, "<", isoformat(now - timedelta(seconds=grace_s)))


def recover_claims(rt: Runtime, grace_s: float = GRACE_S) -> Recovered:
    """One pass: find claims that ended at least `grace_s` ago, confirm each from its record,
    re-send its envelope."""
    query = ended_claims_query(rt.clock(), grace_s)
    return _each_found(rt, query, lambda job_id: _recover_one(rt, job_id, grace_s), "recovery")


def _each_found(rt: Runtime, query: TagQuery, send_one: Callable[[str], bool], what: str) -> Recovered:
    """Run `send_one` on each record the index query finds. A failing query raises (the next pass
    retries); a failing job is logged and skipped (its tag stays: the next pass tries it again)."""
    report = Recovered()
    for name in list(rt.ledger.store.find(query)):
        report.found += 1
        job_id = name.removesuffix(".json")
        try:
            done = send_one(job_id)
        except Exception as exc:
            log.warning("job %s: %s failed (%s); the next pass retries", job_id, what, exc)
            done = False
        (report.resent if done else report.skipped).append(job_id)
    return report


def _recover_one(rt: Runtime, job_id: str, grace_s: float) -> bool:
    record = rt.ledger.get(job_id)
    data = record.data if record is not None else None
    raw = ledger_view.claim_to_recover(data, rt.clock(), grace_s)
    if raw is None or data is None:
        return False
    try:
        env = parse_dict(raw, rt.handlers.keys())
    except EnvelopeError as exc:  # e.g. a kind no longer deployed: its own message settles it
        log.warning("job %s: claim not recovered, its envelope is refused (%s)", job_id, exc)
        return False
    send_job(rt, replace(env, recorded=True))  # the record it was read from exists
    log_decision(
        "recovered",
        job_id,
        attempt=env.attempt,
        owner=data.get("owner"),
        lease_until=data.get("lease_until"),
        level=logging.WARNING,
    )
    return True


# -- host-sent jobs that no delivery claimed before their message could expire ---------------


def unclaimed_query(now: datetime) -> TagQuery:
    """The index query for host-sent jobs due to be sent again (pure)."""
    return TagQuery(ledger_view.TAG_RESEND, "<=", isoformat(now))


def resend_unclaimed(rt: Runtime) -> Recovered:
    """One pass: send each due job's kept envelope again (never expiring), then drop its marker."""
    return _each_found(rt, unclaimed_query(rt.clock()), lambda job_id: _resend_one(rt, job_id), "re-send")


def _resend_one(rt: Runtime, job_id: str) -> bool:
    record = rt.ledger.get(job_id)
    raw = ledger_send.unclaimed_to_resend(record.data if record is not None else None, rt.clock())
    if raw is None or record is None:
        return False
    try:  # any kind: one no longer deployed is then poisoned, with its reason, by the delivery
        env = parse_dict(raw)
    except EnvelopeError as exc:  # a record edited by hand: the tag stays, each pass says so
        log.warning("job %s: not sent again, its kept envelope is refused (%s)", job_id, exc)
        return False
    send_job(rt, replace(env, recorded=True))
    log_decision("resent_unclaimed", job_id, resend_at=record.data.get("resend_at"), level=logging.WARNING)
    with contextlib.suppress(Conflict):  # a claim may have come first: its write cleared the marker
        rt.ledger.write(job_id, record, lambda prev: ledger_send.resent(prev, job_id, Facts(rt.clock())))
    return True


# -- the watch: every worker that processes jobs, while it lives -----------------------------

_watched: set[int] = set()
_lock = threading.Lock()


def watch(rt: Runtime) -> None:
    """Run `recover_claims` every `RECOVERY_INTERVAL_SECONDS` on this runtime's timers, from now
    until the process ends (idempotent: one watch per runtime)."""
    with _lock:
        if id(rt) in _watched:
            return
        _watched.add(id(rt))
    rt.timers.call_later(rt.settings.recovery_interval_s, lambda: _tick(rt))


def _tick(rt: Runtime) -> None:
    try:
        recover_claims(rt)
    except Exception as exc:
        log.warning("recovery pass failed (%s); retrying at the next one", exc)
    finally:
        rt.timers.call_later(rt.settings.recovery_interval_s, lambda: _tick(rt))


def on_timer(rt: Runtime | None = None) -> Recovered:
    """The `recover_claims` timer (also run when a host starts): one pass, and the watch."""
    rt = rt or get_runtime()
    watch(rt)
    report = recover_claims(rt)
    if report.found:
        log.info("recovery: %d ended claim(s), %d re-sent", report.found, len(report.resent))
    unclaimed = resend_unclaimed(rt)
    if unclaimed.found:
        log.info("recovery: %d unclaimed job(s) due, %d sent again", unclaimed.found, len(unclaimed.resent))
    return report
