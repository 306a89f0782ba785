"""The job ledger: one JSON document per job id, and every change of it.

- `decide` is the pure state machine that says what a delivery of a job may do.
- The transitions are pure functions returning the new record; nothing else in the app sets a
  record's fields. Here, those of a job's runs (`claimed`, `renewed`, `progressed`, `completed`,
  `continued`, `retry_scheduled`, `released`, `poisoned`, `run_cancelled`); the producer's
  (`queued`, `send_resumed`, `sent`, `send_failed`, `resent`) are in `shared/ledger/send.py`, the
  operators' (`cancel_requested`, `edited`, `replayed`) in `shared/ledger/operator.py`.
- `Ledger.write` applies one transition with a conditional write and survives "applied, but the
  answer was lost": every write carries a `write_id`, and after an error or a conflict the
  record is read back; finding our own `write_id` means the write happened.
- What is read of a record without changing it (`RecordView`, index tags, listing metadata) is in
  `shared/ledger/view.py`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Literal

from shared.core.documents import Conflict, Document, DocumentChanged, DocumentExists, DocumentStore
from shared.core.envelope import Envelope, body_digest, isoformat

QUEUED = "queued"
IN_PROGRESS = "in_progress"
COMPLETED = "completed"
FAILED = "failed"
RETRY_SCHEDULED = "retry_scheduled"
OFFLOADED = "offloaded"
POISONED = "poisoned"
STATUSES = (QUEUED, IN_PROGRESS, COMPLETED, FAILED, RETRY_SCHEDULED, OFFLOADED, POISONED)
Status = Literal["queued", "in_progress", "completed", "failed", "retry_scheduled", "offloaded", "poisoned"]
HISTORY_LIMIT = 50
BODY_KEEP_CHARS = 16_000

Record = Document
"""A ledger record as read or written, with the etag that guards the next change."""
LedgerStore = DocumentStore
"""Where records live: `BlobDocuments` over the ledger container, or `MemoryDocuments`."""
RecordExists = DocumentExists
RecordChanged = DocumentChanged
Data = dict[str, Any]
Change = Callable[[Data | None], Data]
"""A transition with its arguments bound: the previous record's data (None: no record) -> new data."""


class Decision(Enum):
    """What a delivery of a job may do, given the ledger record."""

    RUN = "run"  # no record, or queued / failed / retry due / expired claim: take it
    RESUME = "resume"  # continue offloaded work with the saved state
    DUPLICATE = "duplicate"  # completed: acknowledge without running
    ALREADY_POISONED = "already_poisoned"  # poisoned: acknowledge (replay resets the ledger)
    STALE = "stale"  # an older message of a job that has moved on: acknowledge
    BUSY = "busy"  # a live claim by another invocation: re-check when its lease ends


def decide(data: Mapping[str, Any] | None, msg_attempt: int, msg_seq: int | None, now: datetime) -> Decision:
    """The ledger's state machine for one delivery (pure)."""
    if data is None:
        return Decision.RUN
    status = data.get("status")
    if status == COMPLETED:
        return Decision.DUPLICATE
    if status == POISONED:
        return Decision.ALREADY_POISONED
    live_claim = claim_is_live(data, now)
    continuation = data.get("continuation")
    if isinstance(continuation, dict):
        if msg_seq != continuation.get("seq"):
            return Decision.STALE
        return Decision.BUSY if live_claim else Decision.RESUME
    if msg_attempt < int(data.get("attempt", 0)):
        return Decision.STALE
    return Decision.BUSY if live_claim else Decision.RUN


def lease_end(data: Mapping[str, Any]) -> datetime | None:
    """When the record's claim ends (None: no claim)."""
    raw = data.get("lease_until")
    if data.get("status") != IN_PROGRESS or not isinstance(raw, str):
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None


def claim_is_live(data: Mapping[str, Any], now: datetime) -> bool:
    """True when the record is in progress under a lease that has not expired."""
    end = lease_end(data)
    return end is not None and end > now


# -- issue 21: what a claim keeps for recovery (its index tags: shared/ledger/view.py) ---------

CLAIM_ENVELOPE = "envelope"
"""The claiming message's envelope, kept while the claim lasts: recovery re-sends it when the
claim ends without an outcome (the dead owner's own message is leased by a dead host). Also kept
by a `queued` record whose message the Functions host sends (the API's): recovery sends it again,
never expiring, if no delivery has claimed the job by `resend_at` (shared/ledger/send.py)."""


# -- transitions (pure) ----------------------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """Who is writing, when, and for which delivery: stamped on records and their history."""

    now: datetime
    queue_message_id: str | None = None
    dequeue_count: int | None = None
    owner: str | None = None

    def msg(self) -> dict[str, Any]:
        return {"queue_message_id": self.queue_message_id, "dequeue_count": self.dequeue_count}


def stamped(
    prev: Data | None,
    job_id: str,
    facts: Facts,
    event: str,
    *,
    details: Mapping[str, Any] | None = None,
    drop: tuple[str, ...] = (),
    **fields: Any,
) -> Data:
    """The shared part of every transition: copy, drop, set, stamp, and one history entry."""
    data: Data = dict(prev) if prev else {"id": job_id, "created_at": isoformat(facts.now)}
    for key in drop:
        data.pop(key, None)
    data.update({k: v for k, v in fields.items() if v is not None})
    data["updated_at"] = isoformat(facts.now)
    entry = {"at": isoformat(facts.now), "event": event, **(details or {}), **facts.msg()}
    history = [*(data.get("history") or []), {k: v for k, v in entry.items() if v is not None}]
    data["history"] = history[-HISTORY_LIMIT:]
    return data


SEND_MARKERS = ("send_pending", "send_lease_until", "resend_at")
"""Fields of a `queued` record whose message may not be on the queue yet (see `shared.ledger.send.queued`)."""


def dead_runs(data: Mapping[str, Any] | None) -> int:
    """How many runs of the job died in a row without finishing, as the last claim counted."""
    raw = (data or {}).get("takeovers", 0)
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else 0


def takeovers_after(prev: Mapping[str, Any] | None, owner: str | None) -> int:
    """The dead-run count a claim by `owner` over `prev` carries (pure).

    Claiming over another owner's claim that is still `in_progress` (its lease ended: the owner
    crashed, was killed or timed out) is a takeover: one more run died. Our own claim, found
    again after a lost answer, keeps the count. Any other record means the last run ended (or
    none ran: queued, replayed): the count starts again at 0. `progressed` also resets it.
    """
    if prev is None or prev.get("status") != IN_PROGRESS:
        return 0
    count = dead_runs(prev)
    return count if prev.get("owner") == owner else count + 1


def runs_died(data: Mapping[str, Any] | None, max_takeovers: int) -> str | None:
    """Why a claimed job must be poisoned instead of run (None: run it): its runs died
    `max_takeovers` times in a row without finishing (pure)."""
    count = dead_runs(data)
    if count < max_takeovers:
        return None
    return (
        f"its runs died {count} times in a row without finishing (worker crash, host kill or "
        f"function timeout); not run again (MAX_TAKEOVERS={max_takeovers})"
    )


def claimed(prev: Data | None, env: Envelope, facts: Facts, lease_s: float) -> Data:
    """A delivery takes the job: in progress under a lease owned by `facts.owner`, with the
    count of runs that died in a row before it (`takeovers_after`)."""
    takeovers = takeovers_after(prev, facts.owner)
    data = stamped(
        prev,
        env.id,
        facts,
        "claimed",
        drop=(*SEND_MARKERS, "takeovers"),  # a delivery is here: the producer's message was sent
        kind=env.kind,
        status=IN_PROGRESS,
        attempt=env.attempt,
        owner=facts.owner,
        lease_until=isoformat(facts.now + timedelta(seconds=lease_s)),
        queue_message_id=facts.queue_message_id,
        dequeue_count=facts.dequeue_count,
        takeovers=takeovers or None,
        envelope=env.to_dict(),  # recovery re-sends it when this claim ends unfinished (issue 21)
        details={"attempt": env.attempt, "owner": facts.owner, "takeover_of": _dead_owner(prev, takeovers)},
    )
    if not (prev or {}).get("created_at"):
        data["created_at"] = isoformat(env.created_at)
    data.setdefault("started_at", isoformat(facts.now))
    return data


def _dead_owner(prev: Mapping[str, Any] | None, takeovers: int) -> str | None:
    """The owner whose dead run a takeover replaces (for the history)."""
    return str((prev or {}).get("owner")) if takeovers > dead_runs(prev) else None


def renewed(prev: Data | None, facts: Facts, lease_s: float) -> Data:
    """The owner's heartbeat: the lease moves on. Not kept in the history (it would crowd it out)."""
    if prev is None or prev.get("owner") != facts.owner or prev.get("status") != IN_PROGRESS:
        raise Conflict("the claim is no longer ours")
    data = dict(prev)
    data["lease_until"] = isoformat(facts.now + timedelta(seconds=lease_s))
    data["renewals"] = int(data.get("renewals", 0)) + 1
    return data


def progressed(prev: Data | None, facts: Facts, progress: Mapping[str, Any], lease_s: float) -> Data:
    """A handler's checkpoint: progress saved, lease extended. A run that makes progress is not
    dying in a loop: the dead-run count starts again (a heartbeat alone does not reset it)."""
    data = renewed(prev, facts, lease_s)
    data.pop("takeovers", None)
    data["progress"] = dict(progress)
    data["updated_at"] = isoformat(facts.now)
    return data


EFFECTS = "effects"
"""A record's external effects (`ctx.effect`): name -> {"version", "result", "at"}."""


def effect_recorded(
    prev: Data | None, facts: Facts, name: str, version: int, result: Any, lease_s: float
) -> Data:
    """A handler's effect is done: its result kept under `effects` (merged with the others,
    progress untouched), the lease extended. Only the owner of the claim records one."""
    data = renewed(prev, facts, lease_s)
    effects = dict(data.get(EFFECTS) or {})
    effects[name] = {"version": version, "result": result, "at": isoformat(facts.now)}
    data[EFFECTS] = effects
    data["updated_at"] = isoformat(facts.now)
    return data


def effects_of(data: Mapping[str, Any] | None, version: int) -> dict[str, Any]:
    """The recorded effects of payload `version`: name -> result (pure)."""
    raw = (data or {}).get(EFFECTS)
    if not isinstance(raw, Mapping):
        return {}
    return {
        str(name): entry.get("result")
        for name, entry in raw.items()
        if isinstance(entry, Mapping) and entry.get("version") == version
    }


def payload_version(data: Mapping[str, Any] | None) -> int:
    """The payload's version: how many times an operator edited the job's envelope (pure)."""
    raw = (data or {}).get("edit_count", 0)
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else 0


def completed(
    prev: Data | None,
    job_id: str,
    facts: Facts,
    attempt: int,
    result_ref: str,
    summary: Mapping[str, Any],
    duration_s: float,
) -> Data:
    return stamped(
        prev,
        job_id,
        facts,
        "completed",
        drop=("lease_until", "continuation", "error", CLAIM_ENVELOPE),
        status=COMPLETED,
        finished_at=isoformat(facts.now),
        result_ref=result_ref,
        summary=dict(summary),
        duration_s=round(duration_s, 3),
        details={"attempt": attempt},
    )


def continued(
    prev: Data | None,
    job_id: str,
    facts: Facts,
    status: str,
    seq: int,
    state: Mapping[str, Any],
    delay_s: int,
) -> Data:
    """The work goes on elsewhere; continuation message `seq` checks it after `delay_s`."""
    return stamped(
        prev,
        job_id,
        facts,
        status,
        drop=("lease_until", CLAIM_ENVELOPE),
        status=status,
        continuation={"seq": seq, "state": dict(state)},
        next_check_at=isoformat(facts.now + timedelta(seconds=delay_s)),
        details={"seq": seq, "delay_s": delay_s},
    )


def retry_scheduled(
    prev: Data | None, job_id: str, facts: Facts, attempt: int, error: str, delay_s: int, seq: int | None
) -> Data:
    """A transient failure: attempt + 1 runs after `delay_s` (a continuation keeps its state)."""
    continuation = (prev or {}).get("continuation")
    data = stamped(
        prev,
        job_id,
        facts,
        "retry_scheduled",
        drop=("lease_until", CLAIM_ENVELOPE),
        status=RETRY_SCHEDULED,
        attempt=attempt + 1,
        error=error,
        next_run_at=isoformat(facts.now + timedelta(seconds=delay_s)),
        details={"attempt": attempt, "delay_s": delay_s, "error": error},
    )
    if isinstance(continuation, dict) and seq is not None:
        data["continuation"] = {**continuation, "seq": seq}
    return data


def released(prev: Data | None, job_id: str, facts: Facts, attempt: int, error: str) -> Data:
    """An unexpected failure: the claim is given up so the next delivery can run at once."""
    return stamped(
        prev,
        job_id,
        facts,
        "failed",
        drop=("lease_until", CLAIM_ENVELOPE),
        status=FAILED,
        error=error,
        details={"attempt": attempt, "error": error},
    )


POISON_DIGESTS = "poison_digests"
"""The digests of the bodies that poisoned the job, newest first: each names the job's archive entry
(`jobs/<id>/<digest>.json`), so the console's job page reads them without listing the archive."""
POISON_DIGESTS_PARTIAL = "poison_digests_partial"
"""True when `poison_digests` may miss a body that poisoned the job (one older than the field, or
past `POISON_DIGESTS_KEEP`): the console lists the job's archive entries then."""
POISON_DIGESTS_KEEP = 8


def poison_digests_of(data: Mapping[str, Any] | None) -> list[str] | None:
    """The record's `poison_digests`; None when it has none or they are not a non-empty list of
    digests (a record written before the field, or a damaged one) (pure)."""
    value = (data or {}).get(POISON_DIGESTS)
    if not isinstance(value, list) or not value or not all(isinstance(d, str) and d for d in value):
        return None
    return value


def history_events(data: Mapping[str, Any]) -> set[str]:
    """The events the record's history holds (pure)."""
    history = data.get("history")
    if not isinstance(history, list):
        return set()
    return {str(h.get("event")) for h in history if isinstance(h, Mapping)}


def ever_archived(data: Mapping[str, Any]) -> bool:
    """True when the job may have poison archive entries: poisoned or replayed, now or before (pure)."""
    return bool(
        data.get("poisoned_at") or data.get("replay_count") or history_events(data) & {POISONED, "replayed"}
    )


def poison_digests_after(prev: Mapping[str, Any] | None, digest: str) -> tuple[list[str], bool]:
    """(`poison_digests`, partial) once `digest` poisons the job (pure). A record archived before
    without the field (or with a damaged one) starts a partial list."""
    prev = prev or {}
    known = poison_digests_of(prev)
    partial = bool(prev.get(POISON_DIGESTS_PARTIAL)) or (known is None and ever_archived(prev))
    digests = [digest, *(d for d in known or () if d != digest)]
    return digests[:POISON_DIGESTS_KEEP], partial or len(digests) > POISON_DIGESTS_KEEP


def poisoned(
    prev: Data | None, job_id: str, facts: Facts, reason: str, code: str | None, body: bytes
) -> Data:
    """The one writer of `poisoned`: the reason and the body are kept for operators, the body's
    digest also in `poison_digests` (in the same write: no request more)."""
    text = body.decode("utf-8", errors="replace")
    if len(text) > BODY_KEEP_CHARS:
        text = text[:BODY_KEEP_CHARS] + f"... ({len(text)} chars)"
    digest = body_digest(body)
    digests, partial = poison_digests_after(prev, digest)
    return stamped(
        prev,
        job_id,
        facts,
        "poisoned",
        drop=("lease_until", "reason_code", CLAIM_ENVELOPE),
        status=POISONED,
        reason=reason,
        reason_code=code,
        poisoned_at=isoformat(facts.now),
        body=text,
        body_digest=digest,
        poison_digests=digests,
        poison_digests_partial=partial or None,
        details={"attempt": (prev or {}).get("attempt"), "reason": reason},
    )


def poisoned_by(data: Mapping[str, Any], body: bytes) -> bool:
    """True when the record is poisoned and this body is the one that poisoned it."""
    return data.get("status") == POISONED and data.get("body_digest") == body_digest(body)


def run_cancelled(prev: Data | None, job_id: str, facts: Facts, run: Mapping[str, Any]) -> Data:
    """Offloaded work was cancelled on its cluster (or the cancel failed: `run["cancelled"]` False)."""
    details = {
        k: run.get(k) for k in ("backend", "submission_id", "cancelled", "error") if run.get(k) is not None
    }
    return stamped(prev, job_id, facts, "run_cancelled", cancelled_run=dict(run), details=details)


# -- the store -------------------------------------------------------------------------------


class Ledger:
    """Reads records and applies transitions to them with conditional writes."""

    def __init__(self, store: DocumentStore) -> None:
        self.store = store

    @staticmethod
    def name(job_id: str) -> str:
        return f"{job_id}.json"

    def get(self, job_id: str) -> Record | None:
        """One GET; None when the job has no record."""
        return self.store.read(self.name(job_id))

    def write(
        self, job_id: str, current: Record | None, change: Change, mine: set[str] | None = None
    ) -> Record:
        """Apply `change` to `current` (None: create). Conflict when another writer moved first.

        `mine` collects this caller's write ids: when a read-back finds an earlier write of ours
        that was applied while its answer was lost, the change is applied again on top of it.
        """
        mine = set() if mine is None else mine
        for _ in range(3):
            data = change(current.data if current is not None else None)
            token = uuid.uuid4().hex
            data["write_id"] = token
            mine.add(token)
            name = self.name(job_id)
            try:
                if current is None:
                    return self.store.create(name, data)
                return self.store.replace(name, current, data)
            except Exception as exc:
                try:
                    back = self.store.read(name)
                except Exception:
                    raise exc from None
                if back is not None and back.data.get("write_id") == token:
                    return back  # applied; only the answer was lost
                if back is not None and back.data.get("write_id") in mine:
                    current = back  # an earlier write of ours landed unanswered: build on it
                    continue
                if isinstance(exc, Conflict):  # the caller decides on what we read: no second GET
                    exc.read_back, exc.current = True, back
                raise
        raise DocumentChanged(f"{job_id}: the record kept changing under our writes")

    def create_rejected(self, job_id: str, facts: Facts, reason: str, code: str | None, body: bytes) -> bool:
        """Create `job_id`'s record as poisoned by `body` (not an envelope) only if it has none
        (If-None-Match: it never changes another job's record). True when the record is this
        body's: created now, or by an earlier try with this body."""
        try:
            self.write(job_id, None, lambda prev: poisoned(prev, job_id, facts, reason, code, body))
            return True
        except Conflict as conflict:
            current = conflict.current if conflict.read_back else self.get(job_id)
            return current is not None and poisoned_by(current.data, body)

    def create(self, job_id: str, data: Data) -> Record:
        """Write a record as given when none exists (tests and tools); RecordExists otherwise."""
        return self.store.create(self.name(job_id), data)
