"""A poison archive entry, typed: `ArchiveEntry` is the entry blob (`jobs/<id>/<digest>.json`,
`unparsed/<digest>.json`), parsed (`parse`) and written (`to_data`) here and nowhere else; its
index row (`EntryRow`) is derived from it (`row`). Pure.

The blob's format is unchanged: a JSON object with the fields below. Entries written by earlier
versions lack some (`owned`, `reason_code`, `index_key`, `events`): they read with the values those
versions meant (`owned` = `parsed`, the code read from the reason, the key from the first archival).
Fields this version does not know are kept as they were (`extra`).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from shared.core.archive_layout import entry_name
from shared.core.envelope import body_digest, isoformat
from shared.indexes.entry_rows import EntryRow, EntryState, reason_code_of
from shared.indexes.keys import clip, newest_first

KNOWN = frozenset(
    {
        "job_id", "parsed", "owned", "digest", "state", "reason", "reason_code", "queue_message_id",
        "dequeue_count", "archived_at", "body_b64", "body_bytes", "history", "attempt", "events",
        "index_key", "parked_message_id", "parked_pop_receipt", "queue",
    }
)  # fmt: skip


@dataclass(frozen=True)
class EntryEvent:
    """A change of the entry: when, what (a state, or `unparked`), who (operator actions)."""

    at: str
    event: str
    by: str = ""

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> EntryEvent:
        return cls(str(data.get("at") or ""), str(data.get("event") or ""), str(data.get("by") or ""))

    def to_data(self) -> dict[str, Any]:
        return {"at": self.at, "event": self.event, **({"by": self.by} if self.by else {})}


@dataclass(frozen=True)
class ArchiveEntry:
    """One archived poisoned body and what became of it. `body_b64` keeps the body byte for byte."""

    job_id: str | None
    digest: str
    state: str
    """An `EntryState` (earlier versions wrote states no longer written: read as they were)."""
    reason: str
    reason_code: str
    archived_at: str
    body_b64: str
    body_bytes: int
    parsed: bool = True
    """The body was a valid envelope."""
    owned: bool = True
    """Filed under its job (`jobs/<id>/`): a valid envelope, or an invalid one whose record it created."""
    queue_message_id: str | None = None
    dequeue_count: int | None = None
    attempt: int | None = None
    history: tuple[Mapping[str, Any], ...] = ()
    """The job record's history when the body was archived (the ledger's entries, as they were)."""
    events: tuple[EntryEvent, ...] = ()
    index_key: str = ""
    """Its index row's RowKey, fixed at its first write ("" before it)."""
    parked_message_id: str | None = None
    parked_pop_receipt: str | None = None
    """Where its parked copy is (`<queue>-parked`), while parked."""
    queue: str | None = None
    """The declared queue whose `-poison` queue it came from (JOBS_QUEUES): a replay goes back
    there. None (entries of earlier versions): the default queue. On a queue other than the
    default, `job_id` is the job's key `<queue>/<id>` (as the ledger and the jobs index name it)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Fields written by another version, kept as they were."""

    # -- made, read, written ----------------------------------------------------------------

    @classmethod
    def new(
        cls,
        body: bytes,
        job_id: str | None,
        parsed: bool,
        state: EntryState,
        reason: str,
        *,
        now: datetime,
        queue_message_id: str | None,
        dequeue_count: int | None,
        record: Mapping[str, Any] | None,
        owned: bool | None = None,
        code: str | None = None,
        queue: str | None = None,
    ) -> ArchiveEntry:
        """A new entry; `reason_code` is `code`, else read from the reason (`reason_code_of`)."""
        history = (record or {}).get("history") or []
        attempt = (record or {}).get("attempt")
        return cls(
            job_id=job_id,
            digest=body_digest(body),
            state=str(state),
            reason=reason,
            reason_code=reason_code_of(reason, code),
            archived_at=isoformat(now),
            body_b64=base64.b64encode(body).decode("ascii"),
            body_bytes=len(body),
            parsed=parsed,
            owned=parsed if owned is None else owned,
            queue_message_id=queue_message_id,
            dequeue_count=dequeue_count,
            attempt=int(attempt) if isinstance(attempt, int) else None,
            history=tuple(h for h in history if isinstance(h, Mapping)),
            events=(EntryEvent(isoformat(now), str(state)),),
            queue=queue,
        )

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> ArchiveEntry:
        """The entry from its blob's JSON, today's format or an earlier one."""
        parsed = bool(data.get("parsed", True))
        reason = str(data.get("reason") or "")
        history = data.get("history")
        events = data.get("events")
        return cls(
            job_id=_text_or_none(data.get("job_id")),
            digest=str(data.get("digest") or ""),
            state=str(data.get("state") or EntryState.POISONED),
            reason=reason,
            reason_code=str(data.get("reason_code") or reason_code_of(reason)),
            archived_at=str(data.get("archived_at") or ""),
            body_b64=str(data.get("body_b64") or ""),
            body_bytes=_int(data.get("body_bytes")) or 0,
            parsed=parsed,
            owned=bool(data.get("owned", parsed)),
            queue_message_id=_text_or_none(data.get("queue_message_id")),
            dequeue_count=_int(data.get("dequeue_count")),
            attempt=_int(data.get("attempt")),
            history=tuple(h for h in history if isinstance(h, Mapping)) if isinstance(history, list) else (),
            events=tuple(EntryEvent.parse(e) for e in events if isinstance(e, Mapping))
            if isinstance(events, list)
            else (),
            index_key=str(data.get("index_key") or ""),
            parked_message_id=_text_or_none(data.get("parked_message_id")),
            parked_pop_receipt=_text_or_none(data.get("parked_pop_receipt")),
            queue=_text_or_none(data.get("queue")),
            extra={k: v for k, v in data.items() if k not in KNOWN},
        )

    def to_data(self) -> dict[str, Any]:
        """The blob's JSON (today's format)."""
        data: dict[str, Any] = {
            "job_id": self.job_id,
            "parsed": self.parsed,
            "owned": self.owned,
            "digest": self.digest,
            "state": self.state,
            "reason": self.reason,
            "reason_code": self.reason_code,
            "queue_message_id": self.queue_message_id,
            "dequeue_count": self.dequeue_count,
            "archived_at": self.archived_at,
            "body_b64": self.body_b64,
            "body_bytes": self.body_bytes,
            "history": [dict(h) for h in self.history],
            "attempt": self.attempt,
            "events": [e.to_data() for e in self.events],
        }
        if self.index_key:
            data["index_key"] = self.index_key
        if self.queue is not None:
            data["queue"] = self.queue
        if self.parked_message_id is not None or self.parked_pop_receipt is not None:
            data.update(parked_message_id=self.parked_message_id, parked_pop_receipt=self.parked_pop_receipt)
        return {**data, **self.extra}

    # -- what it says -----------------------------------------------------------------------

    @property
    def name(self) -> str:
        """Where it is written (shared/core/archive_layout.py `entry_name`)."""
        return entry_name(self.job_id, self.digest, self.owned)

    @property
    def listed(self) -> bool:
        """Listed and replayable (the other states are kept for the record)."""
        return self.state == EntryState.POISONED

    def body(self) -> bytes:
        return base64.b64decode(self.body_b64)

    def key(self, name: str) -> str:
        """Its index row's RowKey: its own when it has one, else from its first archival."""
        return self.index_key or newest_first(self.archived_at, name)

    def attempts(self) -> int:
        """The attempts its job made: the claims in the history it keeps, else its `attempt`."""
        claims = sum(1 for e in self.history if e.get("event") == "claimed")
        return claims or int(self.attempt or 0)

    def acted_by(self, by: str) -> bool:
        """True when one of its events names `by` (a repeated step of the same operation)."""
        return any(e.by == by for e in self.events)

    def row(self, name: str) -> EntryRow:
        """Its index row (what pages list without reading the blob)."""
        return EntryRow(
            name=name,
            state=self.state,
            job_id=clip(self.job_id or "", 128),
            reason=clip(self.reason),
            archived_at=clip(self.archived_at, 40),
            attempts=self.attempts(),
            body_bytes=self.body_bytes,
            key=self.key(name),
            reason_code=self.reason_code,
            queue=self.queue or "",
        )

    # -- changes (new values; the blob changes with a conditional write) -------------------

    def moved(self, name: str, state: EntryState, at: datetime, by: str = "") -> ArchiveEntry:
        """In `state` from now, its row's key kept."""
        event = EntryEvent(isoformat(at), str(state), by)
        return replace(self, state=str(state), index_key=self.key(name), events=(*self.events, event))

    def parked(
        self, name: str, message_id: str | None, pop_receipt: str | None, at: datetime, by: str
    ) -> ArchiveEntry:
        """Parked, with where its parked copy is."""
        moved = self.moved(name, EntryState.PARKED, at, by)
        return replace(moved, parked_message_id=message_id, parked_pop_receipt=pop_receipt)

    def unparked(self, name: str, at: datetime, by: str) -> ArchiveEntry:
        """Listed again; its parked copy's receipt dropped."""
        event = EntryEvent(isoformat(at), "unparked", by)
        return replace(
            self,
            state=str(EntryState.POISONED),
            index_key=self.key(name),
            events=(*self.events, event),
            parked_message_id=None,
            parked_pop_receipt=None,
        )

    def merged_into(self, name: str, old: ArchiveEntry) -> ArchiveEntry:
        """This new archival of the same body written over `old`: its row's key and events kept."""
        return replace(self, index_key=old.key(name), events=(*old.events, *self.events))


def _text_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def _int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        return int(value)
    except ValueError:
        return None
