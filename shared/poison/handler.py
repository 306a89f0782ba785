"""The poison-queue trigger and the sweeper: every poisoned message ends archived and listable.

With `messageEncoding: none` the host hands every body to `handle_poison` as it was sent; the
app decodes it (`decode_message`) exactly as the jobs trigger does. A `-poison` queue has no
poison queue of its own: a handler that keeps failing is never called again for that message
(the host leaves it leased, 10 minutes at a time). So the handler retries storage failures
itself before raising, and the `sweep_poison` timer archives messages dequeued
maxDequeueCount times or more, which the host will not hand over any more.
"""

from __future__ import annotations

import base64
import logging
import math
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from shared import ledger
from shared.core.archive_layout import reason_name
from shared.core.documents import Conflict
from shared.core.envelope import (
    Envelope,
    best_effort_id,
    body_digest,
    decode_message,
    encode_json,
    parse_body,
)
from shared.core.errors import EnvelopeError, JobError
from shared.core.messages import NEVER_EXPIRE, QueueMessageLike
from shared.indexes.entry_rows import EntryState
from shared.jobs.offload.abandon import abandon_work
from shared.ledger import Decision, Facts, Record
from shared.ledger.view import RecordView
from shared.observability.decisions import log_decision
from shared.poison.archive import AppReason, index_writes, read_reason, write_entry
from shared.poison.entry import ArchiveEntry
from shared.runtime.wiring import Runtime, get_runtime
from shared.storage.failures import StorageError

log = logging.getLogger("jobs.poison")
HOST_REASON = "the host moved it after maxDequeueCount failed runs"
HANDLER_TRIES = 8
"""Archiving attempts per invocation of handle_poison, about 1.5 minutes of waiting between them
(1, 2, 4, 8, 16, 30, 30 s). The host gives a failed `-poison` message back only after its
10-minute lease, so retrying here is what makes a storage outage of a minute or two harmless."""
HANDLER_BACKOFF_MAX_S = 30.0
GIVE_BACK_DELAY_S = 600
"""A poison message put back after its last allowed dequeue is visible again after this long
(the cadence the host itself keeps for a failing `-poison` message)."""


@dataclass(frozen=True)
class Verdict:
    state: EntryState
    """The archive entry's state; only `poisoned` entries are listed and replayable."""
    reason: str
    mark: bool = False
    """The body was the job's current message: its record becomes poisoned."""
    recheck_at: datetime | None = None
    """A live claim holds the job: send the message back to the jobs queue for this moment."""
    create: bool = False
    """Not an envelope, but its id is well formed and has no record: create one, poisoned."""


def judge(
    record: dict[str, Any] | None, env: Envelope | None, app: AppReason | None, now: datetime
) -> Verdict:
    """What a poisoned body means for its job (pure). Only the job's own current message may
    poison it: a stale copy, a malformed body carrying its id, or a copy of a completed job may not."""
    if env is None:  # not an envelope: its id may be another job's, so no existing record changes
        return Verdict(EntryState.POISONED, app.reason if app else HOST_REASON, create=record is None)
    view = RecordView.of(record)
    if view.status == ledger.COMPLETED:
        return Verdict(EntryState.DUPLICATE_OF_COMPLETED, "a copy of a job that had already completed")
    if app is not None and app.under_claim:
        return Verdict(EntryState.POISONED, app.reason, mark=view.status != ledger.POISONED)
    if record is None:
        return Verdict(EntryState.POISONED, HOST_REASON, mark=True)
    decision = ledger.decide(record, env.attempt, env.continuation_seq, now)
    if decision is Decision.ALREADY_POISONED:
        return Verdict(EntryState.POISONED, view.reason or HOST_REASON)
    if decision is Decision.STALE:
        return Verdict(EntryState.STALE, "an older message of a job that has moved on")
    if decision is Decision.BUSY:
        return Verdict(
            EntryState.RECHECKED,
            "another invocation held the job's claim; sent back to be re-checked when the claim ends",
            recheck_at=view.lease_end,
        )
    error = view.error
    return Verdict(
        EntryState.POISONED, f"{HOST_REASON}; last error: {error}" if error else HOST_REASON, mark=True
    )


# -- the poison-queue trigger ---------------------------------------------------------------


def handle_poison_message(msg: QueueMessageLike, rt: Runtime | None = None, queue: str | None = None) -> None:
    """Archive one poisoned message of the declared queue `queue` (None: the default) and settle
    its job. Never raises because of a body; raises only when storage failed `HANDLER_TRIES` times
    in a row, so the message comes back."""
    try:
        body = decode_message(msg.get_body() or b"")
    except Exception:  # a body the worker could not even hand over
        body = b""
    rt = (rt or get_runtime()).for_queue(queue)
    for attempt in range(1, HANDLER_TRIES + 1):
        try:
            archive_message(rt, body, msg.id, msg.dequeue_count)
            return
        except (StorageError, JobError, Conflict) as exc:
            if attempt == HANDLER_TRIES:
                give_back(rt, msg, body, exc)
                return
            log.warning("poison message %s: archiving failed (%s); trying again", msg.id, exc)
            rt.sleep(min(HANDLER_BACKOFF_MAX_S, 2.0 ** (attempt - 1)))


def give_back(rt: Runtime, msg: QueueMessageLike, body: bytes, exc: Exception) -> None:
    """Archiving kept failing. Raise, so the host gives the message back after its lease; but at
    the last dequeue the host would never call us again for it, so put a fresh copy on the poison
    queue first (visible after `GIVE_BACK_DELAY_S`) and let this one go."""
    if int(msg.dequeue_count or 0) < rt.settings.max_dequeue_count:
        log.error(
            "poison message %s: archiving failed %d times (%s); it will come back", msg.id, HANDLER_TRIES, exc
        )
        raise exc
    rt.poison_queue.send_message(
        base64.b64encode(body).decode("ascii"),
        visibility_timeout=GIVE_BACK_DELAY_S,
        time_to_live=NEVER_EXPIRE,
    )
    log.error(
        "poison message %s: archiving failed %d times at dequeue %s (%s); put back as a new message",
        msg.id,
        HANDLER_TRIES,
        msg.dequeue_count,
        exc,
    )


def archive_message(rt: Runtime, body: bytes, queue_message_id: str | None, dequeue_count: int | None) -> str:
    """Archive one poison-queue body (as `decode_message` gives it), mark or re-check its job as
    `judge` says. Returns the entry name.

    A body that is not an envelope is filed under its job only when the job's record is its own
    (created poisoned by it, If-None-Match); otherwise under unparsed/."""
    job_id = best_effort_id(body)
    error: EnvelopeError | None = None
    try:
        env: Envelope | None = parse_body(body, rt.handlers.keys())
    except EnvelopeError as exc:
        env, error = None, exc
    app = read_reason(rt.archive, body_digest(body))
    record = rt.ledger.get(job_id) if job_id else None
    now = rt.clock()
    verdict = judge(record.data if record else None, env, app, now)
    if verdict.reason == HOST_REASON and error is not None:
        verdict = replace(verdict, reason=f"{error.reason_code}: {error}")
    owned = env is not None
    if env is None and job_id is not None:
        owned = (
            rt.ledger.create_rejected(
                job_id, Facts(now), verdict.reason, error.reason_code if error else None, body
            )
            if verdict.create
            else record is not None and ledger.poisoned_by(record.data, body)
        )
    entry = ArchiveEntry.new(
        body,
        rt.job_key(job_id) if job_id else None,  # `<queue>/<id>` on a queue other than the default
        env is not None,
        verdict.state,
        verdict.reason,
        now=now,
        queue_message_id=queue_message_id,
        dequeue_count=dequeue_count,
        record=record.data if record else None,
        owned=owned,
        code=app.code if app is not None and app.reason == verdict.reason else None,
        queue=rt.queue.name,  # a replay goes back to it
    )
    with index_writes(rt) as writes:
        name = write_entry(rt.archive, entry, writes)
    if verdict.recheck_at is not None and env is not None:
        delay = max(1, math.ceil((verdict.recheck_at - now).total_seconds()) + 1)
        rt.jobs_queue.send_message(encode_json(env), visibility_timeout=delay, time_to_live=NEVER_EXPIRE)
    if job_id is not None and verdict.mark:
        mark_poisoned(rt, job_id, record, verdict, body)
    if app is not None:  # used up: a later copy of this body is judged by the ledger alone
        rt.archive.delete(reason_name(body_digest(body)))
    log_decision(
        "archived",
        job_id,
        queue_message_id=queue_message_id,
        dequeue_count=dequeue_count,
        reason=verdict.reason,
        state=verdict.state,
        archive=name,
        level=logging.WARNING,
    )
    return name


def mark_poisoned(rt: Runtime, job_id: str, record: Record | None, verdict: Verdict, body: bytes) -> None:
    """The job's record becomes poisoned; offloaded work it still holds is cancelled first."""
    run = abandon_work(
        rt.handlers.get(RecordView.of(record).kind),
        rt.settings,
        rt.account,
        record.data if record else None,
        None,
    )
    facts = Facts(rt.clock())

    def change(prev: ledger.Data | None) -> ledger.Data:
        base = ledger.run_cancelled(prev, job_id, facts, run) if run else prev
        return ledger.poisoned(base, job_id, facts, verdict.reason, None, body)

    try:
        rt.ledger.write(job_id, record, change)
    except Conflict:  # someone moved the job meanwhile (completed, replayed, claimed): theirs stands
        log.warning("job %s: the ledger changed while marking it poisoned; left as it is", job_id)


# -- the sweeper ------------------------------------------------------------------------------


def sweep(rt: Runtime | None = None, limit: int = 32) -> int:
    """Archive and remove poison-queue messages the host will not hand to `handle_poison` any
    more: those dequeued maxDequeueCount times or more (their handler kept failing, and a
    `-poison` queue has no poison queue). Every other body reaches `handle_poison` as sent.

    Peeks first: nothing is received unless such a message is visible. Every message received is
    archived here (none is released, which would raise its dequeue count). Each declared queue's
    `-poison` queue (JOBS_QUEUES: one peek each). Returns how many."""
    rt = rt or get_runtime()
    return sum(_sweep_queue(rt.for_queue(queue.name), limit) for queue in rt.settings.queue_set)


def _sweep_queue(rt: Runtime, limit: int) -> int:
    queue = rt.poison_queue
    limit = min(32, limit)
    max_count = rt.settings.max_dequeue_count
    if all(int(m.dequeue_count or 0) < max_count for m in queue.peek_messages(max_messages=limit)):
        return 0
    swept = 0
    for msg in queue.receive_messages(max_messages=limit, visibility_timeout=60):
        try:
            body = decode_message(str(msg.content or "").encode("utf-8"))
            archive_message(rt, body, msg.id, msg.dequeue_count)
            queue.delete_message(msg)
            swept += 1
        except (StorageError, JobError, Conflict) as exc:  # visible again in 60 s; the next sweep retries
            log.warning("sweep: poison message %s could not be archived (%s)", msg.id, exc)
    return swept
