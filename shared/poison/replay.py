"""Replay, in one place: every caller (the CLI, the admin API, the console's replay, edit-and-replay
and bulk operations) sends a poisoned job back through here, under one rule.

The rule (`replay_entry`): an archive entry is replayed while it is listed (`poisoned`), under its
job (`jobs/<id>/...`: an `unparsed/` body is fixed and submitted as a new job instead), a valid
envelope not yet expired, and its job's record is `poisoned` (or missing). The ledger write that
takes the job out of `poisoned` names who replayed it (`replayed_by`), then the message is sent,
then the entry is marked `replayed`. Interrupted anywhere, the same caller again finishes the work;
the ledger keeps a job from being applied twice.

Cost: per job, the entry's read, the record's read, its conditional write, the message and the
entry's conditional write (5); the index rows (the entries' moves, the jobs' new records) are left
in a `StepWrites` and sent together at the end (entity group transactions, the reason-code counters
in one transaction).
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared import ledger
from shared.core.documents import Conflict, Document
from shared.core.envelope import Envelope, parse_body
from shared.core.errors import EnvelopeError
from shared.indexes.entry_rows import EntryState
from shared.indexes.jobs import IndexedStore
from shared.ledger import Facts, Record
from shared.ledger import operator as ledger_operator
from shared.ledger.view import RecordView
from shared.observability import tracing
from shared.observability.decisions import log_decision
from shared.poison.archive import JOBS_PREFIX, LISTED_STATE, UNPARSED_PREFIX, set_state
from shared.poison.bulk_pacing import StepWrites
from shared.runtime.sending import send_job
from shared.runtime.wiring import Runtime

log = logging.getLogger("jobs.poison")
COMPLETED_MEANWHILE = "the job completed meanwhile"
EXPIRED_HINT = "it would be poisoned again: extend expires_at in the job's editor and replay the edit"
SKIP_REASONS = {
    "skipped_completed": COMPLETED_MEANWHILE,
    "not_found": "no listed poison archive entry for this job",
}


class ReplayRefused(Exception):
    """A replay that cannot be done as asked (the job is not poisoned, or changed meanwhile)."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ReplayReport:
    """What a replay of jobs did (or would do, in a dry run)."""

    replayed: list[str] = field(default_factory=list)
    skipped_completed: list[str] = field(default_factory=list)
    skipped_invalid: list[str] = field(default_factory=list)
    """Not replayed for another reason (`reasons` says which)."""
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

    def add_entry_outcome(self, job_id: str, outcome: str, reason: str) -> None:
        """An outcome of `replay_entry` (replayed / skipped / not_found), in the report's fields."""
        if outcome == "skipped":
            outcome = "skipped_completed" if reason == COMPLETED_MEANWHILE else "skipped_invalid"
        self.add(job_id, outcome, reason)


def expiry_refusal(expires_at: datetime | None, now: datetime) -> str:
    """Why an envelope may not be replayed as it is because it expired ("" when it may) (pure)."""
    if expires_at is None or expires_at > now:
        return ""
    return f"expired at {expires_at.isoformat()}: {EXPIRED_HINT}"


def entry_refusal(name: str, state: str) -> str:
    """Why an entry in `state` may not be replayed ("" when it may) (pure)."""
    if state != LISTED_STATE:
        return f"entry is {state}"
    if name.startswith(UNPARSED_PREFIX):
        return "not a valid envelope: fix and replay it from the entry page"
    return ""


def record_refusal(record: Record | None) -> str:
    """Why a job with this record may not be replayed ("" when it may: poisoned, or no record) (pure)."""
    if record is None or record.status == ledger.POISONED:
        return ""
    if record.status == ledger.COMPLETED:
        return COMPLETED_MEANWHILE
    return f"the job is {record.status}, not poisoned"


# -- one entry --------------------------------------------------------------------------------


def replay_entry(
    rt: Runtime,
    name: str,
    doc: Document,
    by: str,
    mine: bool = False,
    writes: StepWrites | None = None,
    dry_run: bool = False,
) -> tuple[str, str]:
    """Replay one archive entry: (outcome: replayed / skipped, reason). `mine`: the entry's events
    name `by` (a repeated step of the same operation). A caller that finds its own replay on a job
    still `queued` (`replayed_by`) and the entry still listed sends the message again, since it
    cannot tell whether the message went out before the stop: at least once, and the ledger
    applies the job once. With `writes` the
    index rows are left there (the caller flushes them), else written here."""
    state = str(doc.data.get("state", ""))
    if state == EntryState.REPLAYED and mine:
        _moved(name, {**doc.data, "state": LISTED_STATE}, doc.data, writes)
        return "replayed", ""
    refused = entry_refusal(name, state)
    if refused:
        return "skipped", refused
    body = base64.b64decode(str(doc.data.get("body_b64", "")))
    try:
        env = parse_body(body, rt.handlers.keys())
    except EnvelopeError as exc:
        return "skipped", f"not a valid envelope ({exc}): fix it in the job's editor and replay the edit"
    now = rt.clock()
    expired = expiry_refusal(env.expires_at, now)
    if expired:
        return "skipped", expired
    jobs = _ledger_for(rt, writes)
    record = jobs.get(env.id)
    refused = record_refusal(record)
    if dry_run:
        return ("skipped", refused) if refused else ("replayed", "")
    if record is not None and record.status == ledger.COMPLETED:
        _mark(rt, name, doc, EntryState.SKIPPED_COMPLETED, by, writes)
        return "skipped", refused
    if refused:
        assert record is not None
        if mine or RecordView.of(record).replayed_by == by:
            # this caller took it out of `poisoned`, and stopped before marking the entry
            if record.status == ledger.QUEUED:
                # it may have stopped before the message too: send it (again). A second copy is a
                # duplicate the ledger runs once; a job queued with no message would be lost.
                send_job(rt, tracing.replayed(env.with_attempt(0)))  # a new trace linked to the first
            _mark(rt, name, doc, EntryState.REPLAYED, by, writes)
            return "replayed", ""
        return "skipped", refused
    facts = Facts(now)
    try:
        written = jobs.write(env.id, record, lambda prev: ledger_operator.replayed(prev, env, facts, by=by))
    except Conflict:
        return "skipped", "the job changed meanwhile"
    if writes is not None:
        writes.record(written.data)
    send_job(rt, tracing.replayed(env.with_attempt(0)))  # a new trace linked to the first
    _mark(rt, name, doc, EntryState.REPLAYED, by, writes)
    log_decision("replayed", env.id, attempt=0, by=by)
    return "replayed", ""


def _ledger_for(rt: Runtime, writes: StepWrites | None) -> ledger.Ledger:
    """The ledger, without its per-write index upsert when the caller batches the index writes."""
    store = rt.ledger.store
    if writes is not None and isinstance(store, IndexedStore):
        return ledger.Ledger(store.inner)
    return rt.ledger


def _mark(
    rt: Runtime, name: str, doc: Document, state: EntryState, by: str, writes: StepWrites | None
) -> None:
    """The entry's new state (a conditional write on the entry as read); its index row moves now,
    or with the caller's `writes`."""
    if writes is None:
        set_state(rt.archive, name, state, rt.clock(), rt.entry_index, by, current=doc)
        return
    after = set_state(rt.archive, name, state, rt.clock(), None, by, current=doc)
    if after is not None:
        writes.move(name, doc.data, after)


def _moved(name: str, before: dict[str, Any], after: dict[str, Any], writes: StepWrites | None) -> None:
    if writes is not None:
        writes.move(name, before, after)


# -- jobs by id -------------------------------------------------------------------------------


def listed_entry(rt: Runtime, job_id: str, name: str = "") -> tuple[str, Document] | None:
    """The job's listed entry: `name` when it is one of the job's (the page's row), else the newest
    the entry index lists for the job (one query); None when there is none."""
    if not name.startswith(f"{JOBS_PREFIX}{job_id}/"):  # only the job's own entries
        rows = rt.entry_index.page(LISTED_STATE, "", 5, job_id=job_id)
        name = next((r.name for r in rows if r.name.startswith(f"{JOBS_PREFIX}{job_id}/")), "")
    doc = rt.archive.read(name) if name else None
    if doc is None or doc.data.get("job_id") != job_id:
        return None
    return name, doc


def listed_jobs(rt: Runtime) -> list[tuple[str, str]]:
    """(job id, entry name) of every listed entry under a job, newest first: the entry index's
    listed partition, a query per 1,000 entries."""
    found: list[tuple[str, str]] = []
    after = ""
    while True:
        rows = rt.entry_index.page(LISTED_STATE, after, 1000)
        found.extend((r.job_id, r.name) for r in rows if r.job_id and r.name.startswith(JOBS_PREFIX))
        if len(rows) < 1000:
            return found
        after = rows[-1].key


FLUSH_EVERY = 100
"""A long replay sends its index writes every this many jobs (a transaction's worth)."""


def replay_jobs(
    rt: Runtime,
    job_ids: Iterable[str] | None,
    by: str = "cli",
    *,
    names: Iterable[str] | None = None,
    rate_per_s: float = 0.0,
    dry_run: bool = False,
    progress: Callable[[int, int, str], None] | None = None,
) -> ReplayReport:
    """Replay jobs by id (None: every listed job), at most `rate_per_s` a second (0: no pause),
    each from its listed entry (`names`, aligned with `job_ids`: the entries the caller already
    knows; else found in the entry index). The index writes go out together, every
    `FLUSH_EVERY` jobs and at the end."""
    if job_ids is None:
        listed = listed_jobs(rt)
        job_ids, names = [j for j, _ in listed], [n for _, n in listed]
    ids = list(job_ids)
    given = dict(zip(ids, names, strict=False)) if names is not None else {}
    wanted = list(dict.fromkeys(ids))
    report = ReplayReport(dry_run=dry_run)
    writes = StepWrites()
    interval = 1.0 / rate_per_s if rate_per_s > 0 else 0.0
    next_at = time.monotonic()
    try:
        for index, job_id in enumerate(wanted, start=1):
            found = listed_entry(rt, job_id, given.get(job_id, ""))
            if found is None:
                report.add(job_id, "not_found")
            else:
                pause = next_at - time.monotonic()
                if pause > 0:
                    rt.sleep(pause)
                next_at = max(next_at, time.monotonic()) + interval
                outcome = replay_entry(rt, *found, by, writes=writes, dry_run=dry_run)
                report.add_entry_outcome(job_id, *outcome)
            if progress:
                progress(index, len(wanted), job_id)
            if index % FLUSH_EVERY == 0:
                writes.flush(rt)
                writes = StepWrites()
    finally:
        writes.flush(rt)
    return report


# -- an edited envelope -----------------------------------------------------------------------


def replay_edit(
    rt: Runtime,
    env: Envelope,
    record: Record | None,
    entry_names: Iterable[str],
    by: str,
    edited: Callable[[dict[str, Any] | None, Facts], dict[str, Any]],
) -> None:
    """Replay a job with an operator's edited envelope (`env`, the same id), under the same rule:
    its record must be poisoned. The ledger records the edit (`edited`) and the replay in one
    write; then the message; then its entries are marked replayed. ReplayRefused otherwise."""
    refused = "no record" if record is None else record_refusal(record)
    if refused:
        status = record.status if record is not None else "unknown"
        raise ReplayRefused(f"job {env.id} is {status}, not poisoned: nothing was enqueued")
    env = env.with_attempt(0)
    facts = Facts(rt.clock())
    try:
        rt.ledger.write(
            env.id, record, lambda prev: ledger_operator.replayed(edited(prev, facts), env, facts, by=by)
        )
    except Conflict:
        raise ReplayRefused(f"job {env.id} changed meanwhile; reload and try again") from None
    send_job(rt, tracing.replayed(env))  # a new trace linked to the first
    for name in entry_names:
        set_state(rt.archive, name, EntryState.REPLAYED, rt.clock(), rt.entry_index, by)
    log_decision("replayed", env.id, attempt=0, by=by)
