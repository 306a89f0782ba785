"""Operator tools on the poison archive: list, peek, replay, purge."""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from shared import ledger
from shared.app.runtime import Runtime
from shared.app.sending import send_job
from shared.config import tracing
from shared.config.observability import log_decision
from shared.core.documents import Conflict
from shared.core.envelope import best_effort_id, parse_body
from shared.core.errors import EnvelopeError
from shared.indexes.entries import best_effort
from shared.ledger import Facts
from shared.ledger import operator as ledger_operator
from shared.poison.archive import JOBS_PREFIX, LISTED_STATE, UNPARSED_PREFIX, reason_name, set_state

log = logging.getLogger("jobs.poison")


@dataclass
class PoisonEntry:
    """One archived poison message, as operators see it."""

    name: str
    job_id: str | None
    state: str
    reason: str
    archived_at: str
    attempts: int
    body_bytes: int
    age_s: float = 0.0


@dataclass
class ReplayReport:
    """What a replay did (or would do, in a dry run)."""

    replayed: list[str] = field(default_factory=list)
    skipped_completed: list[str] = field(default_factory=list)
    skipped_invalid: list[str] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)
    dry_run: bool = False
    reasons: dict[str, str] = field(default_factory=dict)
    """Why each job not replayed was skipped or not found (job id -> reason)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "replayed": self.replayed,
            "skipped_completed": self.skipped_completed,
            "skipped_invalid": self.skipped_invalid,
            "not_found": self.not_found,
            "reasons": self.reasons,
        }

    def add(self, job_id: str, outcome: str, reason: str = "") -> None:
        getattr(self, outcome).append(job_id)
        if outcome != "replayed":
            self.reasons[job_id] = reason or SKIP_REASONS.get(outcome, outcome)


SKIP_REASONS = {
    "skipped_completed": "the job completed meanwhile",
    "not_found": "no listed poison archive entry for this job",
}
EXPIRED_HINT = "it would be poisoned again: extend expires_at in the job's editor and replay the edit"


def expiry_refusal(expires_at: datetime | None, now: datetime) -> str:
    """Why an envelope may not be replayed as it is because it expired ("" when it may) (pure)."""
    if expires_at is None or expires_at > now:
        return ""
    return f"expired at {expires_at.isoformat()}: {EXPIRED_HINT}"


def list_poisoned(rt: Runtime, include_done: bool = False) -> list[PoisonEntry]:
    """Archived poison entries (oldest first). Reads blobs only: no message is taken."""
    now = rt.clock()
    entries = []
    for name in _entry_names(rt):
        found = rt.archive.read(name)
        data = found.data if found else None
        if data is None or (not include_done and data.get("state") != LISTED_STATE):
            continue
        archived = str(data.get("archived_at", ""))
        entries.append(
            PoisonEntry(
                name=name,
                job_id=data.get("job_id"),
                state=str(data.get("state")),
                reason=str(data.get("reason", "")),
                archived_at=archived,
                attempts=sum(1 for e in data.get("history") or [] if e.get("event") == "claimed"),
                body_bytes=int(data.get("body_bytes", 0)),
                age_s=_age_s(archived, now),
            )
        )
    return sorted(entries, key=lambda e: e.archived_at)


def peek_poison_queue(rt: Runtime, limit: int = 32) -> list[dict[str, Any]]:
    """Messages still on <queue>-poison (not yet archived), without taking them."""
    out = []
    for msg in rt.poison_queue.peek_messages(max_messages=min(32, limit)):
        text = str(msg.content or "")
        try:
            job_id = best_effort_id(base64.b64decode(text, validate=True))
        except ValueError:
            job_id = None
        out.append(
            {
                "queue_message_id": msg.id,
                "job_id": job_id,
                "inserted_on": str(msg.inserted_on),
                "dequeue_count": msg.dequeue_count,
                "chars": len(text),
            }
        )
    return out


def replay(
    rt: Runtime,
    job_ids: Iterable[str] | None,
    *,
    rate_per_s: float = 10.0,
    dry_run: bool = False,
    progress: Callable[[int, int, str], None] | None = None,
) -> ReplayReport:
    """Send poisoned jobs back to the main queue, at most `rate_per_s` a second.

    Per job: skip if completed; reset the ledger to queued (attempt 0); enqueue; mark the
    archive entry replayed. Interrupted anywhere, a second run finishes the work: entries not
    yet marked are replayed again, and the ledger keeps a job from being applied twice.
    """
    by_job: dict[str, list[PoisonEntry]] = {}
    for entry in list_poisoned(rt):
        if entry.job_id:
            by_job.setdefault(entry.job_id, []).append(entry)
    wanted = list(by_job) if job_ids is None else list(dict.fromkeys(job_ids))
    report = ReplayReport(dry_run=dry_run)
    interval = 1.0 / rate_per_s if rate_per_s > 0 else 0.0
    next_at = time.monotonic()
    for index, job_id in enumerate(wanted, start=1):
        entries = by_job.get(job_id)
        if not entries:
            report.add(job_id, "not_found")
        else:
            pause = next_at - time.monotonic()
            if pause > 0:
                rt.sleep(pause)
            next_at = max(next_at, time.monotonic()) + interval
            report.add(job_id, *replay_one_why(rt, job_id, [e.name for e in entries], dry_run))
        if progress:
            progress(index, len(wanted), job_id)
    return report


def replay_one(rt: Runtime, job_id: str, names: list[str], dry_run: bool = False) -> str:
    """Replay one job from its newest archive entry. Returns the report field it belongs in."""
    return replay_one_why(rt, job_id, names, dry_run)[0]


def replay_one_why(rt: Runtime, job_id: str, names: list[str], dry_run: bool = False) -> tuple[str, str]:
    """Replay one job from its newest archive entry: (the report field it belongs in, why it was
    not replayed; "" when it was)."""
    docs = [d.data for d in (rt.archive.read(n) for n in names) if d is not None]
    if not docs:
        return "not_found", "its archive entries are gone"
    latest = max(docs, key=lambda d: str(d.get("archived_at", "")))
    body = base64.b64decode(latest.get("body_b64", ""))
    record = rt.ledger.get(job_id)
    if record is not None and record.status == ledger.COMPLETED:
        if not dry_run:
            _mark(rt, names, "skipped_completed")
        return "skipped_completed", SKIP_REASONS["skipped_completed"]
    try:
        env = parse_body(body, rt.handlers.keys())
    except EnvelopeError as exc:
        return (
            "skipped_invalid",
            f"not a valid envelope ({exc}): fix it in the job's editor and replay the edit",
        )
    expired = expiry_refusal(env.expires_at, rt.clock())
    if expired:
        return "skipped_invalid", expired
    if dry_run:
        return "replayed", ""
    facts = Facts(rt.clock())
    try:
        rt.ledger.write(job_id, record, lambda prev: ledger_operator.replayed(prev, env, facts))
    except Conflict:
        latest_record = rt.ledger.get(job_id)
        if latest_record and latest_record.status == ledger.COMPLETED:
            return "skipped_completed", SKIP_REASONS["skipped_completed"]
        return "not_found", "the job's record changed meanwhile"
    send_job(rt, tracing.replayed(env.with_attempt(0)))  # issue 36: a new trace linked to the first
    _mark(rt, names, "replayed")
    log_decision("replayed", job_id, attempt=0)
    return "replayed", ""


def _mark(rt: Runtime, names: list[str], state: str) -> None:
    for name in names:
        set_state(rt.archive, name, state, rt.clock(), rt.entry_index)


def purge(rt: Runtime, older_than_days: float, dry_run: bool = False) -> list[str]:
    """Delete poison entries (jobs/ and unparsed/, with their recorded reasons and index rows)
    older than N days, parked ones excepted. Edits, operations, counters and the reasons of entries
    kept are never touched. Lists the entries (the CLI's and API's purge; the console runs it as a
    bulk operation over the entry index). Returns the names deleted."""
    cutoff = rt.clock() - timedelta(days=older_than_days)
    doomed = []
    for prefix in (JOBS_PREFIX, UNPARSED_PREFIX):
        for name, modified in rt.archive.names(prefix):
            if not modified or modified >= cutoff:
                continue
            doc = rt.archive.read(name)
            if doc is None or doc.data.get("state") == "parked":
                continue
            doomed.append(name)
            if not dry_run:
                rt.archive.delete(name)
                rt.archive.delete(reason_name(str(doc.data.get("digest"))))
                if rt.entry_index is not None:
                    best_effort(name, rt.entry_index.remove, doc.data)
    return doomed


def _entry_names(rt: Runtime) -> Iterator[str]:
    for prefix in (JOBS_PREFIX, UNPARSED_PREFIX):
        for name, _ in rt.archive.names(prefix):
            yield name


def _age_s(stamp: str, now: datetime) -> float:
    try:
        return (now - datetime.fromisoformat(stamp.replace("Z", "+00:00"))).total_seconds()
    except ValueError:
        return 0.0
