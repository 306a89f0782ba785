"""What operators do to a ledger record: ask to cancel a job, edit a poisoned job's envelope,
replay it (pure transitions, as those of a job's runs in shared/ledger/__init__.py)."""

from __future__ import annotations

from shared.core.documents import Conflict
from shared.core.envelope import Envelope, isoformat
from shared.ledger import (
    CLAIM_ENVELOPE,
    COMPLETED,
    POISONED,
    QUEUED,
    SEND_MARKERS,
    Data,
    Facts,
    claim_is_live,
    stamped,
)


def cancel_requested(prev: Data | None, job_id: str, facts: Facts, by: str, reason: str) -> Data:
    """An operator asks to cancel the job; its next delivery poisons it (and stops offloaded work).
    Conflict when there is nothing to cancel or a live claim holds the job (ask again after it)."""
    if prev is None or prev.get("status") in (COMPLETED, POISONED):
        raise Conflict(f"job {job_id} is {(prev or {}).get('status', 'unknown')}: nothing to cancel")
    if claim_is_live(prev, facts.now):
        raise Conflict(
            f"job {job_id} is running now (claimed until {prev.get('lease_until')}): ask again then"
        )
    request = {"at": isoformat(facts.now), "by": by, "reason": reason}
    return stamped(prev, job_id, facts, "cancel_requested", cancel_requested=request, details={"by": by})


def replayed(prev: Data | None, env: Envelope, facts: Facts, by: str | None = None) -> Data:
    """An operator sends the job back: queued at attempt 0, the last reason kept. `by`: who
    replayed it (`replayed_by`; a bulk operation's `op:<id>` tells a repeated step that this job
    was already sent by it)."""
    last_reason = (prev or {}).get("reason")
    data = stamped(
        prev,
        env.id,
        facts,
        "replayed",
        drop=(
            "reason",
            "reason_code",
            "lease_until",
            "continuation",
            "owner",
            "error",
            "next_run_at",
            "body",
            "body_digest",
            "cancel_requested",
            "takeovers",
            "replayed_by",
            CLAIM_ENVELOPE,
            *SEND_MARKERS,
        ),
        kind=env.kind,
        status=QUEUED,
        attempt=0,
        replayed_at=isoformat(facts.now),
        replay_count=int((prev or {}).get("replay_count", 0)) + 1,
        last_reason=last_reason,
        replayed_by=by,
    )
    data["attempt"] = 0
    if prev is None:
        data["created_at"] = isoformat(env.created_at)
    return data


# -- console (issue 12): operator edits --------------------------------------------------------


def edited(prev: Data | None, job_id: str, facts: Facts, by: str, changes: list[str], digest: str) -> Data:
    """An operator changed a poisoned job's envelope before replaying it (the original stays in
    the poison archive; `digest` names the edited body, kept as `last_edit_digest`: the console
    reads that edit by name). Applied just before `replayed`."""
    if prev is None or prev.get("status") != POISONED:
        raise Conflict(f"job {job_id} is not poisoned: only a poisoned job's envelope may be edited")
    return stamped(
        prev,
        job_id,
        facts,
        "edited",
        edit_count=int(prev.get("edit_count", 0)) + 1,
        last_edit_digest=digest,
        details={"by": by, "changes": list(changes)[:20], "digest": digest},
    )
