"""One queue message's life: parse -> claim -> handler -> complete / retry / continue / poison.

Storage requests on the happy path of a new job: claim (1 conditional create) and complete
(1 conditional replace); the host adds the delete and a share of the batch receive. A message
the app sent after making the job's record (`recorded`: the API's, retries, continuations) claims
with a GET and a conditional replace instead (a create would fail first: 3 requests). A claim is
short (`CLAIM_LEASE_SECONDS`) and renewed by a heartbeat while the handler runs, so a dead
owner's claim ends within one lease. A delivery that meets a live claim, or storage too busy to
claim, leaves a re-check message and is acknowledged: it never spends the host's dequeue count.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from shared import ledger
from shared.core.documents import Conflict
from shared.core.envelope import Envelope, decode_message, isoformat, parse_body
from shared.core.errors import (
    CancelledByOperator,
    ClaimLost,
    EnvelopeError,
    Expired,
    KindNotAllowed,
    PermanentError,
    RunsDied,
    StorageThrottled,
    TransientError,
)
from shared.core.messages import QueueMessageLike, inserted_at
from shared.jobs.base import Completed, Continue, JobContext, Outcome, deadline_margin, masked_outcome
from shared.jobs.kinds import prefix_of
from shared.jobs.offload.abandon import abandon_work
from shared.ledger import Decision, Facts, Record
from shared.ledger.calls import calls_noted
from shared.ledger.view import RecordView
from shared.net.client import CallNote, calls_recorded, deadline_at
from shared.net.secrets import secrets_in_play
from shared.observability import job_metrics, overview_counters, tracing
from shared.observability.decisions import log_decision
from shared.permits.service import PermitLost
from shared.pipeline import gate, recovery
from shared.pipeline.claims import ClaimKeeper
from shared.pipeline.delivery import Delivery, poison_unparsed, send_poison_copy
from shared.pipeline.job_payload import load_payload
from shared.runtime.sending import send_job
from shared.runtime.wiring import Runtime, get_runtime

log = logging.getLogger("jobs.processing")
RECHECK_MARGIN_S = 1
"""Seconds added to a live claim's remaining lease before its re-check message becomes visible."""
STORAGE_BUSY_RECHECK_S = 15
"""Delay of the re-check message left when storage is too busy to claim."""
OVER_SHARE_RECHECK_S = 1
"""Delay of the copy left by a job that waited its longest for a fair-share slot."""


@overview_counters.counted_in_flight  # console: jobs in flight, in memory only
def process_message(
    msg: QueueMessageLike,
    rt: Runtime | None = None,
    queue: str | None = None,
    began: float | None = None,
    waited_out_s: float | None = None,
) -> None:
    """The trigger's body for the declared queue `queue` (None: the default). Returns to
    acknowledge; raises to have the host retry. The host hands every body over as sent
    (`messageEncoding: none`): `decode_message` takes base64 and raw JSON alike, and whatever
    does not parse is poisoned at once, never retried. `began`: when the invocation began (its
    deadline counts from there; default now). `waited_out_s`: the fair share gave up waiting for
    a slot (shared/pipeline/fair_trigger.py): leave a copy for later and acknowledge this one."""
    if rt is None:
        rt = get_runtime()
        recovery.watch(rt)  # issue 21: this worker also looks for claims that ended unfinished
    rt = rt.for_queue(queue)
    several = len(rt.settings.queue_set) > 1  # decisions and metrics then name the queue
    delivery = Delivery(
        msg.id, msg.dequeue_count, decode_message(msg.get_body()), rt.queue.name if several else ""
    )
    try:
        env = parse_body(delivery.body, rt.handlers.keys(), received_at=inserted_at(msg))
    except EnvelopeError as exc:
        poison_unparsed(rt, delivery, exc)
        return
    if waited_out_s is not None:  # its attempts untouched, its expiry still counting
        Processor(rt, env, delivery, began).defer(
            OVER_SHARE_RECHECK_S, "over_share", waited_s=round(waited_out_s, 1)
        )
        return
    with tracing.delivery_span(env, delivery.message_id, delivery.dequeue_count):
        Processor(rt, env, delivery, began).run()


class Processor:
    """Processes one parsed envelope."""

    def __init__(self, rt: Runtime, env: Envelope, delivery: Delivery, began: float | None = None) -> None:
        self.rt = rt
        self.env = env
        self.delivery = delivery
        self.owner = rt.new_owner()
        self.started = time.monotonic() if began is None else began
        """When this invocation began: its deadline counts from here (functionTimeout)."""
        self.mine: set[str] = set()
        self.keeper: ClaimKeeper | None = None
        self.admission = gate.Admission()
        """The permits this job holds while it runs (shared/pipeline/gate.py)."""
        self.calls: list[CallNote] = []
        """This run's downstream calls (clients with `record=True`), kept by the attempt's last write."""

    def facts(self) -> Facts:
        return Facts(self.rt.clock(), self.delivery.message_id, self.delivery.dequeue_count, self.owner)

    # -- the life of a delivery -------------------------------------------------------------

    def run(self) -> None:
        try:
            with tracing.step("claim"):
                admission = gate.admit(self.rt, self.env, self.owner, self.delivery.fields(self.env.attempt))
                if admission is None:  # waiting for a permit: parked, this delivery acknowledged
                    return
                self.admission = admission
                decision = self.claim()
        except StorageThrottled as exc:
            self.admission.release()
            self.defer(STORAGE_BUSY_RECHECK_S, "storage_busy", error=str(exc))
            return
        try:
            self.run_admitted(decision)
        finally:
            self.admission.release()

    def run_admitted(self, decision: Decision | None) -> None:
        if decision is None:
            return
        assert self.keeper is not None
        try:
            self.run_claimed(self.keeper, decision)
        except ClaimLost:
            self.keeper.stop()
            self.after_claim_lost()
        finally:
            self.keeper.stop()

    def run_claimed(self, keeper: ClaimKeeper, decision: Decision) -> None:
        if self.expired():
            when = "finish" if decision is Decision.RESUME or self.env.attempt > 0 else "run"  # ran before?
            expired = Expired(f"job expired at {isoformat(self.expiry())} before it could {when}")
            self.finish(partial(self.poison, expired))
            return
        refusal = self.rt.queue.kind_refusal(self.env.kind)
        if refusal:  # QUEUE_<NAME>_KINDS: put on this queue directly (the API refuses it with 400)
            self.finish(partial(self.poison, KindNotAllowed(refusal)))
            return
        died = ledger.runs_died(keeper.record.data, self.rt.settings.max_takeovers)
        if died:  # its runs keep dying (a crash the host's dequeue count never sees): stop here
            self.finish(partial(self.poison, RunsDied(died)))
            return
        started = time.monotonic()
        keeper.start()
        self.admission.start()
        try:
            with tracing.step("handler"):
                outcome = self.execute(keeper, resume=decision is Decision.RESUME)
        except ClaimLost:
            raise
        except PermitLost as exc:  # not acted on: give the claim up and wait for a permit again
            keeper.stop()
            gate.lost(self.rt, self.env, exc, self.delivery.fields(self.env.attempt))
            self.finish(partial(self.release, exc))
            self.defer(RECHECK_MARGIN_S, "permit_lost")
            return
        except PermanentError as exc:
            keeper.stop()
            self.finish(partial(self.poison, exc))
            return
        except TransientError as exc:
            keeper.stop()
            self.finish(partial(self.retry_or_poison, exc))
            return
        except Exception as exc:
            keeper.stop()
            self.release(exc)
            raise
        keeper.stop()
        if isinstance(outcome, Completed):
            self.finish(partial(self.complete, outcome, time.monotonic() - started))
        else:
            self.finish(partial(self.continue_later, outcome))

    def finish(self, step: Callable[[], None]) -> None:
        """A last step; when it fails, give the claim up (best effort) and raise for the host's retry."""
        try:
            with tracing.step("outcome"):
                step()
        except ClaimLost:
            raise
        except Exception as exc:
            self.release(exc)
            raise

    # -- claim -------------------------------------------------------------------------------

    def claim(self) -> Decision | None:
        """Take the job (RUN / RESUME), or deal with the delivery and return None. A message the
        app sent after making the record (`recorded`) reads it first: a GET and a conditional
        replace, where trying to create it would cost a failed create as well."""
        env, current, decision = self.env, None, Decision.RUN
        if env.recorded:
            current = self.rt.ledger.get(env.id)
            if current is not None:
                decision = ledger.decide(current.data, env.attempt, env.continuation_seq, self.rt.clock())
                if decision not in (Decision.RUN, Decision.RESUME):
                    self.meet(decision, current)
                    return None
        for _ in range(3):
            facts = self.facts()
            try:
                record = self.rt.ledger.write(
                    env.id,
                    current,
                    partial(_claimed, env=env, facts=facts, lease_s=self.rt.settings.claim_lease_s),
                    self.mine,
                )
            except Conflict as conflict:
                current = conflict.current if conflict.read_back else self.rt.ledger.get(env.id)
                data = current.data if current is not None else None
                decision = ledger.decide(data, env.attempt, env.continuation_seq, self.rt.clock())
                if current is not None and decision not in (Decision.RUN, Decision.RESUME):
                    self.meet(decision, current)
                    return None
                continue
            self.keeper = ClaimKeeper(self.rt, env.id, self.owner, record, self.mine)
            job_metrics.claimed(record.data)
            return decision
        self.defer(RECHECK_MARGIN_S, "contended")
        return None

    def meet(self, decision: Decision, current: Record) -> None:
        """A delivery that may not run: acknowledge it, leaving a re-check when a live claim holds it."""
        fields = self.delivery.fields(self.env.attempt)
        if decision is Decision.BUSY:
            view = RecordView.of(current)
            end = view.lease_end
            wait = (end - self.rt.clock()).total_seconds() if end else 0.0
            self.defer(max(1, math.ceil(wait)) + RECHECK_MARGIN_S, "busy", owner=view.owner)
            return
        log_decision(decision.value, self.env.id, status=current.status, **fields)

    def defer(self, delay_s: int, why: str, **details: Any) -> None:
        """Leave a copy of this message for `delay_s`, then acknowledge this one."""
        self.send_followup(self.env, delay_s)
        log_decision(
            why, self.env.id, recheck_in_s=delay_s, **details, **self.delivery.fields(self.env.attempt)
        )

    def after_claim_lost(self) -> None:
        """Another writer moved the record: acknowledge, with a re-check unless the job is settled."""
        current = self.rt.ledger.get(self.env.id)
        decision = ledger.decide(
            current.data if current else None, self.env.attempt, self.env.continuation_seq, self.rt.clock()
        )
        if current is not None and decision not in (Decision.RUN, Decision.RESUME):
            self.meet(decision, current)
        else:
            self.defer(RECHECK_MARGIN_S, "claim_lost")

    def expiry(self) -> datetime:
        return self.env.expires_at or self.env.created_at + timedelta(seconds=self.rt.settings.job_ttl_s)

    def expired(self) -> bool:
        return bool(self.rt.clock() > self.expiry())

    # -- run ---------------------------------------------------------------------------------

    def execute(self, keeper: ClaimKeeper, resume: bool) -> Outcome:
        handler = self.rt.handlers[self.env.kind]
        payload = self.admission.payload
        payload = load_payload(self.rt, self.env) if payload is None else payload
        handler.validate(payload)
        record = RecordView.of(keeper.record)
        cancel = record.cancel_request
        if cancel is not None:  # an operator asked: poison now (offloaded work is stopped)
            raise CancelledByOperator(f"cancelled by {cancel.by}: {cancel.reason or 'no reason given'}")
        continuation = record.continuation if resume else None
        version = ledger.payload_version(keeper.record.data)
        timeout = self.rt.settings.function_timeout_s
        ctx = JobContext(
            job_id=self.rt.job_key(self.env.id),
            kind=self.env.kind,
            attempt=self.env.attempt,
            payload=payload,
            settings=self.rt.settings,
            storage=self.rt.account,
            log=logging.LoggerAdapter(logging.getLogger(f"jobs.{self.env.kind}"), {"job_id": self.env.id}),
            checkpoint=self.checkpoint,
            resume_state=continuation.state if continuation else None,
            progress=record.progress,
            version=version,
            effects=ledger.effects_of(keeper.record.data, version),
            record_effect=partial(self.record_effect, version),
            deadline=self.started + timeout - deadline_margin(timeout),
            fence=self.admission.fence,
            release_permits=self.admission.release,
            now=self.rt.clock,
            created_at=self.env.created_at,
            settings_prefix=prefix_of(self.env.kind, handler),
        )
        if resume:
            log_decision("resumed", self.env.id, **self.delivery.fields(self.env.attempt))
        with deadline_at(ctx.deadline), calls_recorded() as calls, secrets_in_play():  # see shared/net
            self.calls = calls
            try:
                return masked_outcome(handler.run(ctx))
            finally:  # done acting: its permits go back before the outcome's writes
                self.admission.release()

    def record_effect(self, version: int, name: str, result: Any) -> None:
        """Keep an effect's result in the ledger record (`ctx.effect`); ClaimLost if taken over."""
        assert self.keeper is not None
        facts = self.facts()
        self.keeper.write(
            lambda prev: ledger.effect_recorded(
                prev, facts, name, version, result, self.rt.settings.claim_lease_s
            )
        )

    def checkpoint(self, progress: Mapping[str, Any]) -> None:
        """Save progress in the ledger and extend our claim; ClaimLost if someone took over."""
        assert self.keeper is not None
        facts = self.facts()
        self.keeper.write(
            lambda prev: ledger.progressed(prev, facts, progress, self.rt.settings.claim_lease_s)
        )

    # -- outcomes ----------------------------------------------------------------------------

    def write(self, change: ledger.Change) -> Record:
        """The attempt's last write (an outcome): it also keeps the run's call notes."""
        assert self.keeper is not None
        attempt, calls, now = self.env.attempt, self.calls, self.rt.clock()
        return self.keeper.write(lambda prev: change(calls_noted(prev, attempt, calls, now)))

    def complete(self, outcome: Completed, duration_s: float) -> None:
        facts, env = self.facts(), self.env
        self.write(
            lambda prev: ledger.completed(
                prev, env.id, facts, env.attempt, outcome.result_ref, outcome.summary, duration_s
            )
        )
        log_decision(
            "completed",
            env.id,
            duration_s=round(duration_s, 3),
            latency_s=round((facts.now - env.created_at).total_seconds(), 3),
            **self.delivery.fields(env.attempt),
        )

    def continue_later(self, outcome: Continue) -> None:
        """Enqueue the continuation first, then record it: a crash in between loses nothing."""
        assert self.keeper is not None
        seq = RecordView.of(self.keeper.record).next_continuation_seq
        attempt = 0 if outcome.attempts == "stage" else self.env.attempt  # failures counted per stage
        self.send_followup(self.env.with_attempt(attempt, seq), outcome.delay_s)
        facts = self.facts()
        self.write(
            lambda prev: ledger.continued(
                prev, self.env.id, facts, outcome.status, seq, outcome.state, outcome.delay_s
            )
        )
        log_decision(
            outcome.status,
            self.env.id,
            delay_s=outcome.delay_s,
            seq=seq,
            **self.delivery.fields(self.env.attempt),
        )

    def retry_or_poison(self, exc: TransientError) -> None:
        env = self.env
        policy = self.rt.retry_policy(env.kind)
        next_attempt = env.attempt + 1
        if next_attempt >= policy.attempts:
            self.poison(exc, reason=f"gave up after {next_attempt} attempts; last error: {exc}")
            return
        delay = policy.delay(next_attempt, getattr(exc, "retry_after_s", None))
        assert self.keeper is not None
        seq = RecordView.of(self.keeper.record).retry_seq
        self.send_followup(env.with_attempt(next_attempt, seq), delay)
        facts, error = self.facts(), _describe(exc)
        self.write(lambda prev: ledger.retry_scheduled(prev, env.id, facts, env.attempt, error, delay, seq))
        log_decision(
            "retry_scheduled",
            env.id,
            delay_s=delay,
            error=error,
            next_attempt=next_attempt,
            level=logging.WARNING,
            **self.delivery.fields(env.attempt),
        )

    def poison(self, exc: PermanentError | TransientError, reason: str | None = None) -> None:
        """Note the reason, copy the body to <queue>-poison (nothing is lost), then record it."""
        text = reason or f"{exc.reason_code}: {exc}"
        send_poison_copy(self.rt, self.delivery.body, text, self.env.id, exc.reason_code, under_claim=True)
        assert self.keeper is not None
        handler = self.rt.handlers.get(self.env.kind)
        run = abandon_work(handler, self.rt.settings, self.rt.account, self.keeper.record.data, exc)
        facts = self.facts()
        self.write(
            lambda prev: ledger.poisoned(
                ledger.run_cancelled(prev, self.env.id, facts, run) if run else prev,
                self.env.id,
                facts,
                text,
                exc.reason_code,
                self.delivery.body,
            )
        )
        log_decision(
            "poisoned",
            self.env.id,
            reason=text,
            reason_code=exc.reason_code,
            level=logging.WARNING,
            **self.delivery.fields(self.env.attempt),
        )

    def release(self, exc: BaseException) -> None:
        """Unexpected error: give the claim up (best effort) so the host's retry can run at once."""
        error, facts = _describe(exc), self.facts()
        if self.keeper is not None and not self.keeper.lost:
            try:
                self.write(lambda prev: ledger.released(prev, self.env.id, facts, self.env.attempt, error))
            except Exception as write_error:  # the claim then ends with its lease
                log.warning(
                    "job %s: could not release the claim (%s); it ends with its lease",
                    self.env.id,
                    write_error,
                )
        log_decision(
            "failed", self.env.id, error=error, level=logging.ERROR, **self.delivery.fields(self.env.attempt)
        )

    def send_followup(self, env: Envelope, delay_s: int) -> None:
        send_job(self.rt, env, delay_s)


def _claimed(prev: ledger.Data | None, *, env: Envelope, facts: Facts, lease_s: float) -> ledger.Data:
    return ledger.claimed(prev, env, facts, lease_s)


def _describe(exc: BaseException) -> str:
    return f"{exc.__class__.__name__}: {exc}"[:2000]
