"""Read-only views of a ledger record (shared/ledger/__init__.py): nothing here changes one.

- `RecordView`: what the app reads of a record, typed; the record itself stays a JSON document.
- What the store keeps beside a record, set by the same write: blob index tags (issue 21), so one
  query finds the claims that ended unfinished (`claim_to_recover` confirms one) or the finished
  records retention removes, and listing metadata (issue 12) for the console's jobs page.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from shared.core.documents import Document
from shared.ledger import (
    CLAIM_ENVELOPE,
    COMPLETED,
    IN_PROGRESS,
    POISONED,
    QUEUED,
    STATUSES,
    Record,
    Status,
    dead_runs,
    lease_end,
)

# -- issue 21: what an index of in-flight and finished jobs keeps (blob index tags) -----------

TAG_LEASE = "lease_until"
"""Index tag of an in-progress record: when its claim ends (ISO-8601 UTC, ordered as text)."""
TAG_STATE = "state"
"""Index tag of a finished record: `done` (completed) or `poisoned`; retention reads it."""
TAG_RESEND = "resend_at"
"""Index tag of a `queued` record whose message the Functions host sent (7-day time to live):
when recovery sends it again if no delivery has claimed the job (ISO-8601 UTC, ordered as text;
shared/ledger/send.py). The claim's write clears it, as every write sets the tags anew."""
STATE_DONE = "done"
STATE_POISONED = "poisoned"
TAG_DONE_AT = "done_at"
"""Index tag of a completed record: when it completed (its `finished_at`, ISO-8601 UTC, ordered as
text), so local retention finds the records past their days with one query (`done_at < cutoff`)
instead of reading every finished record's properties (shared/pipeline/retention_sweep.py)."""


def index_tags(data: Mapping[str, Any]) -> dict[str, str]:
    """Blob index tags for a record, set by the same write (pure): a host-sent job's `resend_at`
    while unclaimed, the claim's end while in progress, the finished state once finished, none
    otherwise (the write clears old ones)."""
    status = data.get("status")
    if status == QUEUED and data.get("send_pending") is True and isinstance(data.get("resend_at"), str):
        return {TAG_RESEND: str(data["resend_at"])}
    if status == IN_PROGRESS and isinstance(data.get("lease_until"), str):
        return {TAG_LEASE: str(data["lease_until"])}
    if status == COMPLETED:
        done_at = data.get("finished_at") or data.get("updated_at")
        return {TAG_STATE: STATE_DONE, **({TAG_DONE_AT: done_at} if isinstance(done_at, str) else {})}
    if status == POISONED:
        return {TAG_STATE: STATE_POISONED}
    return {}


def claim_to_recover(data: Mapping[str, Any] | None, now: datetime, grace_s: float) -> dict[str, Any] | None:
    """The envelope to re-send for a record whose claim ended at least `grace_s` ago without an
    outcome (pure); None when the record is finished, live, or moved on, or keeps no envelope."""
    if data is None:
        return None
    end = lease_end(data)
    envelope = data.get(CLAIM_ENVELOPE)
    if end is None or end + timedelta(seconds=grace_s) > now or not isinstance(envelope, dict):
        return None
    if envelope.get("id") != data.get("id") or envelope.get("attempt") != data.get("attempt"):
        return None
    return dict(envelope)


# -- console (issue 12): listing metadata -----------------------------------------------------

LISTED_FIELDS = ("status", "kind", "created_at", "updated_at")
"""Record fields copied into blob metadata by the write that sets them: one listing request then
returns them for up to 5,000 jobs (the console's jobs page)."""


def listing_metadata(data: Mapping[str, Any]) -> dict[str, str]:
    """Blob metadata for a record: ASCII values only (statuses, kinds and stamps are)."""
    return {key: str(data[key]) for key in LISTED_FIELDS if isinstance(data.get(key), str)}


# -- a typed, read-only view of a record ------------------------------------------------------


@dataclass(frozen=True)
class Continuation:
    """Work going on elsewhere: the continuation message `seq` checks it with `state`."""

    seq: int
    state: Mapping[str, Any] | None


@dataclass(frozen=True)
class CancelRequest:
    by: str
    reason: str


@dataclass(frozen=True)
class RecordView:
    """What the app reads of a ledger record, typed; the record itself stays a JSON document.

    Readers use this instead of `data.get(...)`; only the transitions write fields."""

    data: Mapping[str, Any]

    @classmethod
    def of(cls, record: Record | Mapping[str, Any] | None) -> RecordView:
        data = record.data if isinstance(record, Document) else record
        return cls(data or {})

    @property
    def status(self) -> Status | None:
        raw = self.data.get("status")
        return cast(Status, raw) if raw in STATUSES else None

    @property
    def kind(self) -> str:
        return str(self.data.get("kind") or "")

    @property
    def owner(self) -> str | None:
        raw = self.data.get("owner")
        return raw if isinstance(raw, str) else None

    @property
    def lease_end(self) -> datetime | None:
        return lease_end(self.data)

    @property
    def continuation(self) -> Continuation | None:
        raw = self.data.get("continuation")
        if not isinstance(raw, dict):
            return None
        state = raw.get("state")
        return Continuation(_int(raw.get("seq")), state if isinstance(state, dict) else None)

    @property
    def next_continuation_seq(self) -> int:
        """The seq of the next continuation message (1 for the first)."""
        current = self.continuation
        return current.seq + 1 if current else 1

    @property
    def retry_seq(self) -> int | None:
        """The seq a retry's message carries: the next one when work goes on elsewhere, else none."""
        return self.next_continuation_seq if self.continuation else None

    @property
    def cancel_request(self) -> CancelRequest | None:
        raw = self.data.get("cancel_requested")
        if not isinstance(raw, dict):
            return None
        return CancelRequest(str(raw.get("by") or ""), str(raw.get("reason") or ""))

    @property
    def progress(self) -> Mapping[str, Any] | None:
        raw = self.data.get("progress")
        return raw if isinstance(raw, dict) else None

    @property
    def result_ref(self) -> str | None:
        raw = self.data.get("result_ref")
        return raw if isinstance(raw, str) and raw else None

    @property
    def reason(self) -> str | None:
        raw = self.data.get("reason")
        return str(raw) if raw else None

    @property
    def error(self) -> str | None:
        raw = self.data.get("error")
        return str(raw) if raw else None

    @property
    def takeovers(self) -> int:
        return dead_runs(self.data)

    @property
    def summary(self) -> Mapping[str, Any]:
        """A completed job's inline result (no `result_ref`)."""
        raw = self.data.get("summary")
        return raw if isinstance(raw, dict) else {}

    @property
    def history(self) -> list[Mapping[str, Any]]:
        raw = self.data.get("history")
        return [e for e in raw if isinstance(e, dict)] if isinstance(raw, list) else []

    @property
    def created_at(self) -> datetime | None:
        """When the job was first recorded (None when missing or unreadable)."""
        raw = self.data.get("created_at")
        try:
            return datetime.fromisoformat(str(raw).replace("Z", "+00:00")) if raw else None
        except ValueError:
            return None

    @property
    def request_digest(self) -> str | None:
        """The digest of the submit request that created the record (the producer's retry check)."""
        raw = self.data.get("request_digest")
        return raw if isinstance(raw, str) else None

    @property
    def submitter(self) -> str | None:
        """Who holds (or held) the record's send lease."""
        raw = self.data.get("submitter")
        return raw if isinstance(raw, str) else None

    @property
    def replayed_by(self) -> str | None:
        """Who last replayed the job (an operator, or a bulk operation's `op:<id>`)."""
        raw = self.data.get("replayed_by")
        return raw if isinstance(raw, str) else None


def _int(raw: object) -> int:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else 0
