"""One queue message's life: parse -> claim -> handler -> complete / retry / continue / poison.

Storage requests on the happy path of a new job: claim (1 conditional create) and complete
(1 conditional replace); the host adds the delete and a share of the batch receive.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from azure.core.exceptions import AzureError, ResourceNotFoundError

from shared.backoff import retry_delay
from shared.envelope import Envelope, best_effort_id, body_digest, encode_json, isoformat, parse_body, utcnow
from shared.errors import (
    ClaimLost,
    EnvelopeError,
    Expired,
    InputMissing,
    JobBusy,
    PermanentError,
    StorageThrottled,
    TransientError,
)
from shared.jobs.base import Completed, Continue, JobContext, Outcome
from shared.ledger import (
    COMPLETED,
    FAILED,
    IN_PROGRESS,
    POISONED,
    RETRY_SCHEDULED,
    Decision,
    Record,
    RecordChanged,
    RecordExists,
    add_history,
    claim_is_live,
    decide,
)
from shared.observability import log_decision
from shared.runtime import Runtime, get_runtime
from shared.storage import is_throttled

log = logging.getLogger("jobs.processing")
BODY_KEEP_CHARS = 16_000
NEVER_EXPIRE = -1


class QueueMessageLike(Protocol):
    """What the host hands over (azure.functions.QueueMessage satisfies it)."""

    @property
    def id(self) -> str | None: ...
    @property
    def dequeue_count(self) -> int | None: ...
    def get_body(self) -> bytes: ...


@dataclass(frozen=True)
class Delivery:
    """Facts about this delivery, for records and logs."""

    message_id: str | None
    dequeue_count: int | None
    body: bytes

    def fields(self, attempt: int | None = None) -> dict[str, Any]:
        return {"queue_message_id": self.message_id, "dequeue_count": self.dequeue_count, "attempt": attempt}


def process_message(msg: QueueMessageLike, rt: Runtime | None = None) -> None:
    """The queue trigger's body. Returns to acknowledge; raises to have the host retry."""
    rt = rt or get_runtime()
    delivery = Delivery(msg.id, msg.dequeue_count, msg.get_body())
    try:
        env = parse_body(delivery.body, rt.handlers.keys())
    except EnvelopeError as exc:
        poison_unparsed(rt, delivery, exc)
        return
    Processor(rt, env, delivery).run()


class Processor:
    """Processes one parsed envelope. Keeps the latest ledger record (and its etag)."""

    def __init__(self, rt: Runtime, env: Envelope, delivery: Delivery) -> None:
        self.rt = rt
        self.env = env
        self.delivery = delivery
        self.owner = rt.new_owner()
        self.record: Record | None = None

    # -- claim -----------------------------------------------------------------------------

    def run(self) -> None:
        decision = self.claim()
        if decision is None:
            return
        started = time.monotonic()
        try:
            outcome = self.execute(resume=decision is Decision.RESUME)
        except PermanentError as exc:
            self.poison(exc)
            return
        except TransientError as exc:
            self.retry_or_poison(exc)
            return
        except (JobBusy, ClaimLost):
            raise
        except Exception as exc:
            self.record_failure(exc)
            raise
        if isinstance(outcome, Completed):
            self.complete(outcome, time.monotonic() - started)
        else:
            self.continue_later(outcome)

    def claim(self) -> Decision | None:
        """Take the job (RUN / RESUME) or return None after acknowledging; raises JobBusy."""
        env, now = self.env, utcnow()
        for _ in range(3):
            try:
                self.record = self.rt.ledger.create(env.id, self.claimed_data({}, now))
                return self.run_or_expire(Decision.RUN, now)
            except RecordExists:
                pass
            current = self.rt.ledger.get(env.id)
            if current is None:
                continue  # deleted between our create and read: try creating again
            decision = decide(current.data, env.attempt, env.continuation_seq, now)
            if decision in (Decision.RUN, Decision.RESUME):
                try:
                    self.record = self.rt.ledger.replace(
                        env.id, current, self.claimed_data(current.data, now)
                    )
                except RecordChanged:
                    continue  # another delivery moved first: read again
                return self.run_or_expire(decision, now)
            self.acknowledge(decision, current)
            return None
        raise JobBusy(f"job {env.id}: the ledger record kept changing while claiming; will retry")

    def run_or_expire(self, decision: Decision, now: datetime) -> Decision | None:
        expires = self.env.expires_at or self.env.created_at + timedelta(seconds=self.rt.settings.job_ttl_s)
        if now > expires:
            self.poison(Expired(f"job expired at {isoformat(expires)} before it could run"))
            return None
        return decision

    def acknowledge(self, decision: Decision, current: Record) -> None:
        fields = self.delivery.fields(self.env.attempt)
        if decision is Decision.BUSY:
            log_decision("busy", self.env.id, owner=current.data.get("owner"), **fields)
            raise JobBusy(
                f"job {self.env.id} is in progress by {current.data.get('owner')} until "
                f"{current.data.get('lease_until')}; the message will come back"
            )
        name = {
            Decision.DUPLICATE: "duplicate",
            Decision.STALE: "stale",
            Decision.ALREADY_POISONED: "already_poisoned",
        }[decision]
        log_decision(name, self.env.id, status=current.status, **fields)

    def claimed_data(self, previous: Mapping[str, Any], now: datetime) -> dict[str, Any]:
        data = dict(previous)
        data.update(
            id=self.env.id,
            kind=self.env.kind,
            status=IN_PROGRESS,
            attempt=self.env.attempt,
            owner=self.owner,
            lease_until=isoformat(now + timedelta(seconds=self.rt.settings.claim_lease_s)),
            updated_at=isoformat(now),
            created_at=data.get("created_at") or isoformat(self.env.created_at),
            queue_message_id=self.delivery.message_id,
            dequeue_count=self.delivery.dequeue_count,
        )
        data.setdefault("started_at", isoformat(now))
        add_history(data, "claimed", now, attempt=self.env.attempt, owner=self.owner, **self._msg_fields())
        return data

    # -- run -------------------------------------------------------------------------------

    def execute(self, resume: bool) -> Outcome:
        handler = self.rt.handlers[self.env.kind]
        payload = load_payload(self.rt, self.env)
        handler.validate(payload)
        assert self.record is not None
        continuation = self.record.data.get("continuation") if resume else None
        ctx = JobContext(
            job_id=self.env.id,
            kind=self.env.kind,
            attempt=self.env.attempt,
            payload=payload,
            settings=self.rt.settings,
            storage=self.rt.storage,
            log=logging.LoggerAdapter(logging.getLogger(f"jobs.{self.env.kind}"), {"job_id": self.env.id}),
            checkpoint=self.checkpoint,
            resume_state=continuation.get("state") if isinstance(continuation, dict) else None,
            progress=self.record.data.get("progress"),
        )
        if resume:
            log_decision("resumed", self.env.id, **self.delivery.fields(self.env.attempt))
        return handler.run(ctx)

    def checkpoint(self, progress: Mapping[str, Any]) -> None:
        """Save progress in the ledger and extend our claim; ClaimLost if someone took over."""
        now = utcnow()
        self.update(
            progress=dict(progress),
            lease_until=isoformat(now + timedelta(seconds=self.rt.settings.claim_lease_s)),
            updated_at=isoformat(now),
        )

    # -- outcomes --------------------------------------------------------------------------

    def complete(self, outcome: Completed, duration_s: float) -> None:
        now = utcnow()
        self.update(
            status=COMPLETED,
            finished_at=isoformat(now),
            updated_at=isoformat(now),
            result_ref=outcome.result_ref,
            summary=dict(outcome.summary),
            duration_s=round(duration_s, 3),
            lease_until=None,
            continuation=None,
            error=None,
            _event=("completed", {"attempt": self.env.attempt}),
        )
        latency = (now - self.env.created_at).total_seconds()
        log_decision(
            "completed",
            self.env.id,
            duration_s=round(duration_s, 3),
            latency_s=round(latency, 3),
            **self.delivery.fields(self.env.attempt),
        )

    def continue_later(self, outcome: Continue) -> None:
        """Enqueue the continuation first, then record it: a crash in between loses nothing."""
        assert self.record is not None
        previous = self.record.data.get("continuation")
        seq = int(previous.get("seq", 0)) + 1 if isinstance(previous, dict) else 1
        self.send_followup(self.env.with_attempt(self.env.attempt, seq), outcome.delay_s)
        now = utcnow()
        self.update(
            status=outcome.status,
            continuation={"seq": seq, "state": dict(outcome.state)},
            next_check_at=isoformat(now + timedelta(seconds=outcome.delay_s)),
            updated_at=isoformat(now),
            lease_until=None,
            _event=(outcome.status, {"seq": seq, "delay_s": outcome.delay_s}),
        )
        log_decision(
            outcome.status,
            self.env.id,
            delay_s=outcome.delay_s,
            seq=seq,
            **self.delivery.fields(self.env.attempt),
        )

    def retry_or_poison(self, exc: TransientError) -> None:
        settings = self.rt.settings
        next_attempt = self.env.attempt + 1
        if next_attempt >= settings.max_attempts:
            self.poison(exc, reason=f"gave up after {next_attempt} attempts; last error: {exc}")
            return
        delay = retry_delay(next_attempt, settings.retry_base_s, settings.retry_max_s)
        assert self.record is not None
        continuation = self.record.data.get("continuation")
        seq = None
        if isinstance(continuation, dict):
            seq = int(continuation.get("seq", 0)) + 1
            continuation = {**continuation, "seq": seq}
        self.send_followup(self.env.with_attempt(next_attempt, seq), delay)
        now = utcnow()
        self.update(
            status=RETRY_SCHEDULED,
            attempt=next_attempt,
            error=_describe(exc),
            next_run_at=isoformat(now + timedelta(seconds=delay)),
            updated_at=isoformat(now),
            lease_until=None,
            continuation=continuation,
            _event=(
                "retry_scheduled",
                {"attempt": self.env.attempt, "delay_s": delay, "error": _describe(exc)},
            ),
        )
        log_decision(
            "retry_scheduled",
            self.env.id,
            delay_s=delay,
            error=_describe(exc),
            next_attempt=next_attempt,
            level=logging.WARNING,
            **self.delivery.fields(self.env.attempt),
        )

    def poison(self, exc: PermanentError | TransientError, reason: str | None = None) -> None:
        """Copy the body to <queue>-poison (first: nothing is lost), then record the reason."""
        text = reason or f"{exc.reason_code}: {exc}"
        send_poison_copy(self.rt, self.delivery.body, text, self.env.id)
        now = utcnow()
        try:
            self.update(
                status=POISONED,
                reason=text,
                reason_code=exc.reason_code,
                poisoned_at=isoformat(now),
                updated_at=isoformat(now),
                lease_until=None,
                body=_body_text(self.delivery.body),
                _event=("poisoned", {"attempt": self.env.attempt, "reason": text}),
            )
        except ClaimLost:
            log.warning("job %s: poisoned, but the ledger moved on meanwhile", self.env.id)
        log_decision(
            "poisoned",
            self.env.id,
            reason=text,
            reason_code=exc.reason_code,
            level=logging.WARNING,
            **self.delivery.fields(self.env.attempt),
        )

    def record_failure(self, exc: BaseException) -> None:
        """Unexpected error: record it, then the caller re-raises for the host's retry/poison path."""
        now = utcnow()
        try:
            self.update(
                status=FAILED,
                error=_describe(exc),
                updated_at=isoformat(now),
                lease_until=None,
                _event=("failed", {"attempt": self.env.attempt, "error": _describe(exc)}),
            )
        except Exception:  # keep the original error for the host
            log.exception("job %s: could not record the failure on the ledger", self.env.id)
        log_decision(
            "failed",
            self.env.id,
            error=_describe(exc),
            level=logging.ERROR,
            **self.delivery.fields(self.env.attempt),
        )

    # -- helpers ---------------------------------------------------------------------------

    def update(self, _event: tuple[str, dict[str, Any]] | None = None, **changes: Any) -> None:
        """Conditional replace of our record; ClaimLost when someone else changed it."""
        current = self.record
        data = dict(current.data) if current else {"id": self.env.id, "kind": self.env.kind}
        for key, value in changes.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        if _event:
            add_history(data, _event[0], utcnow(), **_event[1], **self._msg_fields())
        try:
            self.record = self.rt.ledger.put(self.env.id, data, current)
        except (RecordChanged, RecordExists):
            raise ClaimLost(f"job {self.env.id}: another invocation took over the ledger record") from None

    def send_followup(self, env: Envelope, delay_s: int) -> None:
        try:
            self.rt.jobs_queue.send_message(
                encode_json(env), visibility_timeout=delay_s, time_to_live=NEVER_EXPIRE
            )
        except AzureError as exc:
            if is_throttled(exc):
                raise StorageThrottled(
                    f"could not enqueue the follow-up of job {env.id}: {exc.__class__.__name__}"
                ) from exc
            raise

    def _msg_fields(self) -> dict[str, Any]:
        return {"queue_message_id": self.delivery.message_id, "dequeue_count": self.delivery.dequeue_count}


def load_payload(rt: Runtime, env: Envelope) -> Mapping[str, Any]:
    """The inline payload, or the claim-checked one from the payloads container."""
    if env.payload_ref is None:
        return env.payload or {}
    blob = rt.storage.container(rt.settings.payloads_container).get_blob_client(env.payload_ref)
    try:
        raw = blob.download_blob().readall()
    except ResourceNotFoundError:
        raise InputMissing(
            f"payload_ref: blob {rt.settings.payloads_container}/{env.payload_ref} does not exist (dangling claim check)"
        ) from None
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise EnvelopeError([f"payload_ref: blob {env.payload_ref} is not JSON"], job_id=env.id) from None
    if not isinstance(payload, dict):
        raise EnvelopeError([f"payload_ref: blob {env.payload_ref} must hold a JSON object"], job_id=env.id)
    return payload


def send_poison_copy(rt: Runtime, body: bytes, reason: str, job_id: str | None) -> None:
    """Record the reason by the body's digest, then put a copy of the body on <queue>-poison."""
    digest = body_digest(body)
    reason_doc = json.dumps({"reason": reason, "job_id": job_id, "at": isoformat(utcnow())})
    archive = rt.storage.container(rt.settings.poison_archive_container)
    archive.upload_blob(f"reasons/{digest}.json", reason_doc, overwrite=True)
    rt.poison_queue.send_message(base64.b64encode(body).decode("ascii"), time_to_live=NEVER_EXPIRE)


def poison_unparsed(rt: Runtime, delivery: Delivery, exc: EnvelopeError) -> None:
    """A message that is not a valid envelope: poison it at once, with the problems as its reason."""
    job_id = exc.job_id or best_effort_id(delivery.body)
    reason = f"{exc.reason_code}: {exc}"
    send_poison_copy(rt, delivery.body, reason, job_id)
    if job_id is not None:
        _mark_poisoned(rt, job_id, reason, exc.reason_code, delivery)
    log_decision(
        "poisoned",
        job_id,
        reason=reason,
        reason_code=exc.reason_code,
        level=logging.WARNING,
        **delivery.fields(),
    )


def _mark_poisoned(rt: Runtime, job_id: str, reason: str, code: str, delivery: Delivery) -> None:
    """Set a job's record to poisoned unless it completed or is running (best effort)."""
    now = utcnow()
    for _ in range(3):
        current = rt.ledger.get(job_id)
        if current is not None and (current.status == COMPLETED or claim_is_live(current.data, now)):
            return
        data = dict(current.data) if current else {"id": job_id, "created_at": isoformat(now)}
        data.update(
            status=POISONED,
            reason=reason,
            reason_code=code,
            poisoned_at=isoformat(now),
            updated_at=isoformat(now),
            body=_body_text(delivery.body),
        )
        data.pop("lease_until", None)
        add_history(
            data,
            "poisoned",
            now,
            reason=reason,
            queue_message_id=delivery.message_id,
            dequeue_count=delivery.dequeue_count,
        )
        try:
            rt.ledger.put(job_id, data, current)
            return
        except (RecordChanged, RecordExists):
            continue


def _describe(exc: BaseException) -> str:
    return f"{exc.__class__.__name__}: {exc}"[:2000]


def _body_text(body: bytes) -> str:
    text = body.decode("utf-8", errors="replace")
    return text if len(text) <= BODY_KEEP_CHARS else text[:BODY_KEEP_CHARS] + f"... ({len(text)} chars)"
