"""Replay, in one place: every caller (the CLI, the admin API, the console's replay, edit-and-replay
and bulk operations) sends a poisoned job back through here, under one rule.

The rule (`replay_entry`): an archive entry is replayed while it is listed (`poisoned`), under its
job (`jobs/<id>/...`: an `unparsed/` body is fixed and submitted as a new job instead), a valid
envelope not yet expired, and its job's record is `poisoned` (or missing). The ledger write that
takes the job out of `poisoned` names who replayed it (`replayed_by`), then the message is sent,
then the entry is marked `replayed`. The message goes back to the queue the entry came from
(`entry_lane`: its `-poison` queue's jobs queue, with that queue's ledger keys and settings).
Interrupted anywhere, the same caller again finishes the work;
the ledger keeps a job from being applied twice.

Cost: per job, the entry's read, the record's read, its conditional write, the message and the
entry's conditional write (5); the index rows (the entries' moves, the jobs' new records) are left
in an `IndexWrites` and sent together at the end (entity group transactions, the reason-code counters
in one transaction).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from shared import ledger
from shared.core.archive_layout import JOBS_PREFIX, UNPARSED_PREFIX, is_job_entry_of
from shared.core.documents import Conflict
from shared.core.envelope import Envelope, parse_body
from shared.core.errors import EnvelopeError
from shared.indexes.entry_rows import EntryState
from shared.ledger import Facts, Record
from shared.ledger import operator as ledger_operator
from shared.ledger.view import RecordView
from shared.observability import tracing
from shared.observability.decisions import log_decision
from shared.poison.archive import LISTED_STATE, IndexWrites, StoredEntry, index_writes, read_entry, set_state
from shared.poison.entry import ArchiveEntry
from shared.poison.pacing import Pacer
from shared.queues import UnknownQueue
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
    stored: StoredEntry,
    by: str,
    writes: IndexWrites,
    mine: bool = False,
    dry_run: bool = False,
) -> tuple[str, str]:
    """Replay one archive entry: (outcome: replayed / skipped, reason). `mine`: the entry's events
    name `by` (a repeated step of the same operation). A caller that finds its own replay on a job
    still `queued` (`replayed_by`) and the entry still listed sends the message again, since it
    cannot tell whether the message went out before the stop: at least once, and the ledger
    applies the job once. The index rows are left in `writes` (the caller sends them)."""
    name, entry = stored.name, stored.entry
    if entry.state == EntryState.REPLAYED and mine:
        writes.move(replace(entry, state=LISTED_STATE).row(name), stored.row)
        return "replayed", ""
    refused = entry_refusal(name, entry.state)
    if refused:
        return "skipped", refused
    try:
        rt = entry_lane(rt, entry)  # the queue it came from: its ledger keys, its jobs queue
    except UnknownQueue as exc:
        return "skipped", f"{exc}: declare it again to replay its jobs"
    try:
        env = parse_body(entry.body(), rt.handlers.keys())
    except EnvelopeError as exc:
        return "skipped", f"not a valid envelope ({exc}): fix it in the job's editor and replay the edit"
    now = rt.clock()
    expired = expiry_refusal(env.expires_at, now)
    if expired:
        return "skipped", expired
    jobs = ledger.Ledger(rt.ledger_docs)  # its index rows go with `writes`
    record = jobs.get(env.id)
    refused = record_refusal(record)
    if dry_run:
        return ("skipped", refused) if refused else ("replayed", "")
    if record is not None and record.status == ledger.COMPLETED:
        set_state(rt.archive, name, EntryState.SKIPPED_COMPLETED, rt.clock(), writes, by, current=stored)
        return "skipped", refused
    if refused:
        assert record is not None
        if mine or RecordView.of(record).replayed_by == by:
            # this caller took it out of `poisoned`, and stopped before marking the entry
            if record.status == ledger.QUEUED:
                # it may have stopped before the message too: send it (again). A second copy is a
                # duplicate the ledger runs once; a job queued with no message would be lost.
                send_job(rt, tracing.replayed(env.with_attempt(0)))  # a new trace linked to the first
            set_state(rt.archive, name, EntryState.REPLAYED, rt.clock(), writes, by, current=stored)
            return "replayed", ""
        return "skipped", refused
    facts = Facts(now)
    try:
        written = jobs.write(env.id, record, lambda prev: ledger_operator.replayed(prev, env, facts, by=by))
    except Conflict:
        return "skipped", "the job changed meanwhile"
    writes.record(written.data)
    send_job(rt, tracing.replayed(env.with_attempt(0)))  # a new trace linked to the first
    set_state(rt.archive, name, EntryState.REPLAYED, rt.clock(), writes, by, current=stored)
    log_decision("replayed", env.id, attempt=0, by=by)
    return "replayed", ""


def entry_lane(rt: Runtime, entry: ArchiveEntry) -> Runtime:
    """The runtime of the queue an entry came from (`queue`; None: the default); UnknownQueue
    when that queue is no longer declared."""
    return rt.for_queue(entry.queue)


def job_key(rt: Runtime, job_id: str) -> str:
    """How the archive names a job given by an operator: as given when it holds a queue
    (`<queue>/<id>`, as listings show it), else on `rt`'s queue (pure)."""
    return job_id if "/" in job_id else rt.job_key(job_id)


# -- jobs by id -------------------------------------------------------------------------------


def listed_entry(rt: Runtime, job_id: str, name: str = "") -> StoredEntry | None:
    """The job's listed entry: `name` when it is one of the job's (the page's row), else the newest
    the entry index lists for the job (one query); None when there is none. `job_id`: the job as
    operators name it (`job_key`: an id on `rt`'s queue, or `<queue>/<id>`)."""
    job_id = job_key(rt, job_id)
    if not is_job_entry_of(name, job_id):  # only the job's own entries
        rows = rt.entry_index.page(LISTED_STATE, "", 5, job_id=job_id)
        name = next((r.name for r in rows if is_job_entry_of(r.name, job_id)), "")
    stored = read_entry(rt.archive, name) if name else None
    if stored is None or stored.entry.job_id != job_id:
        return None
    return stored


def listed_jobs(rt: Runtime, queue: str = "") -> list[tuple[str, str]]:
    """(job key, entry name) of every listed entry under a job (of `queue`, when given), newest
    first: the entry index's listed partition, a query per 1,000 entries."""
    found: list[tuple[str, str]] = []
    after = ""
    while True:
        rows = rt.entry_index.page(LISTED_STATE, after, 1000, queue=queue)
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
    queue: str = "",
) -> ReplayReport:
    """Replay jobs by id (None: every listed job), at most `rate_per_s` a second (0: no pause:
    `Pacer`), each from its listed entry (`names`, aligned with `job_ids`: the entries the caller
    already knows; else found in the entry index). The index writes go out together, every
    `FLUSH_EVERY` jobs and at the end. `queue`: with None, only that queue's listed jobs. Each
    job goes back to the queue its entry came from."""
    if job_ids is None:
        listed = listed_jobs(rt, queue)
        job_ids, names = [j for j, _ in listed], [n for _, n in listed]
    ids = list(job_ids)
    given = dict(zip(ids, names or (), strict=False))
    wanted = list(dict.fromkeys(ids))
    report = ReplayReport(dry_run=dry_run)
    pacer = Pacer(rate_per_s, rt.monotonic)
    started = 0
    with index_writes(rt) as writes:
        for index, job_id in enumerate(wanted, start=1):
            found = listed_entry(rt, job_id, given.get(job_id, ""))
            if found is None:
                report.add(job_id, "not_found")
            else:
                pacer.wait(started, rt.sleep)
                started += 1
                outcome = replay_entry(rt, found, by, writes, dry_run=dry_run)
                report.add_entry_outcome(job_id, *outcome)
            if progress:
                progress(index, len(wanted), job_id)
            if index % FLUSH_EVERY == 0:
                writes.flush(rt)
    return report


# -- an edited envelope, a fixed body ----------------------------------------------------------


def poisoned_record(rt: Runtime, job_id: str) -> Record:  # rt: the job's queue's
    """The job's record when it may be replayed with an edit (`record_refusal`), else ReplayRefused."""
    record = rt.ledger.get(job_id)
    if record is None or record_refusal(record):
        status = record.status if record is not None else "unknown"
        raise ReplayRefused(f"job {job_id} is {status}, not poisoned: nothing was enqueued")
    return record


def replay_edit(
    rt: Runtime,
    env: Envelope,
    record: Record,
    entry_names: Iterable[str],
    by: str,
    edited: Callable[[dict[str, Any] | None, Facts], dict[str, Any]],
) -> None:
    """Replay a job with an operator's edited envelope (`env`, the same id; `record`: its record,
    from `poisoned_record`). The ledger records the edit (`edited`) and the replay in one
    conditional write; then the message; then its entries are marked replayed. ReplayRefused
    when the record changed meanwhile."""
    env = env.with_attempt(0)  # rt: the job's queue's (its ledger keys, its jobs queue)
    facts = Facts(rt.clock())
    try:
        rt.ledger.write(
            env.id, record, lambda prev: ledger_operator.replayed(edited(prev, facts), env, facts, by=by)
        )
    except Conflict:
        raise ReplayRefused(f"job {env.id} changed meanwhile; reload and try again") from None
    send_job(rt, tracing.replayed(env))  # a new trace linked to the first
    with index_writes(rt) as writes:
        for name in entry_names:
            set_state(rt.archive, name, EntryState.REPLAYED, rt.clock(), writes, by)
    log_decision("replayed", env.id, attempt=0, by=by)


def fixed_refusal(stored: StoredEntry | None) -> str:
    """Why an entry may not be fixed and submitted ("" when it may: a listed unparsed/ body) (pure)."""
    if stored is None or not stored.name.startswith(UNPARSED_PREFIX) or not stored.entry.listed:
        return "not a listed unparsed entry"
    return ""


def replay_fixed(rt: Runtime, name: str, by: str, submit: Callable[[Runtime], str]) -> str:
    """Replay a body that is not a valid envelope (`unparsed/`) as the operator fixed it: `submit`
    sends the fixed envelope as a new job on the runtime it is given (the queue the entry came
    from; as the API would; it raises to refuse) and returns its id; then the entry is marked
    replayed (it stays archived). ReplayRefused (409) when the entry is not a listed unparsed one
    or its queue is no longer declared."""
    stored = read_entry(rt.archive, name)
    refused = fixed_refusal(stored)
    if refused or stored is None:
        raise ReplayRefused(f"{name} is {refused}")
    try:
        lane = entry_lane(rt, stored.entry)
    except UnknownQueue as exc:
        raise ReplayRefused(f"{name}: {exc}") from None
    job_id = submit(lane)
    with index_writes(rt) as writes:
        set_state(rt.archive, name, EntryState.REPLAYED, rt.clock(), writes, by, current=stored)
    return job_id
