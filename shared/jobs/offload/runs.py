"""Hand a job's work to Spark and follow it to completion, for any job kind that offloads.

The kind says what to run and how to read its outcome (`OffloadWork`: the request for a
submission, the finished result, a failed run's report); this module does the rest:
- `offload(ctx, work)`: take a concurrency slot, submit (once), `Continue(state, delay_s)`;
- `resume(ctx, work)`: with `ctx.resume_state`, poll the run and decide (see tracking.decide):
  wait longer, verify the result and complete, resubmit, or raise PermanentError;
- `abandon(...)`: the job is poisoned: cancel its run, free its slot.
No function ever waits for Spark: each call makes a few HTTP requests and returns.

A Spark API that cannot be reached never costs the job an attempt: a failed status check is
counted in the saved state and checked again later (until SPARK_RUN_TIMEOUT_SECONDS, when the
run is cancelled); a submit or look-up that cannot tell whether the run exists leaves it
unconfirmed, to be looked up again, never submitted twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol

from shared.config.settings import Settings
from shared.core.errors import (
    DownstreamUnavailable,
    InputDataError,
    PermanentError,
    RunAbandoned,
)
from shared.jobs.base import Completed, Continue, JobContext, Outcome
from shared.spark.backends import backend_for
from shared.spark.model import RunError, RunStatus, SparkBackend, SparkJobRequest, Submission
from shared.spark.slots import Slots, run_slots
from shared.spark.tracking import (
    Decision,
    GiveUp,
    Limits,
    OffloadState,
    Resubmit,
    Verify,
    Wait,
    after_missing_result,
    after_poll_failure,
    cancel_failed,
    decide,
    next_delay,
    polled,
    resubmitted,
    with_cancelled,
)
from shared.spark.transport import step_budget
from shared.storage.ports import Account

PROGRESS_KEY = "spark_submitting"


def limits_for(settings: Settings) -> Limits:
    spark = settings.spark
    return Limits(
        max_submissions=spark.max_submissions,
        poll_initial_s=spark.poll_initial_s,
        poll_max_s=spark.poll_max_s,
        confirm_window_s=spark.confirm_window_s,
        run_timeout_s=spark.run_timeout_s,
    )


class OffloadWork(Protocol):
    """What a job kind offloads and how its outcome is read (`shared.jobs.offload.aggregate_spark`)."""

    def request(self, ctx: JobContext, submission: int) -> SparkJobRequest:
        """Submission number `submission` of this job (name unique per job and submission)."""
        ...

    def finished(self, ctx: JobContext) -> Completed | None:
        """The job's verified result, if a run has written it."""
        ...

    def run_error(self, ctx: JobContext, submission: int) -> RunError | None:
        """What a failed run of `submission` reported, if it could."""
        ...


def offload(
    ctx: JobContext, work: OffloadWork, *, backend: SparkBackend | None = None, reason: str = ""
) -> Outcome:
    """Submit the job to Spark within SPARK_STEP_BUDGET_SECONDS (see `_offload`); a slot taken
    for a submit that was refused is freed."""
    with step_budget(ctx.settings.spark.step_budget_s):
        try:
            return _offload(ctx, work, backend=backend, reason=reason)
        except PermanentError:
            _release_slot(ctx.settings, ctx.storage, ctx.job_id, None)
            raise


def resume(
    ctx: JobContext, work: OffloadWork, *, backend: SparkBackend | None = None, now: float | None = None
) -> Outcome:
    """Check the saved run within SPARK_STEP_BUDGET_SECONDS (see `_resume`); the job's
    concurrency slot is freed when its run ends (completed or given up)."""
    with step_budget(ctx.settings.spark.step_budget_s):
        try:
            outcome = _resume(ctx, work, backend=backend, now=now)
        except PermanentError:
            _release_slot(ctx.settings, ctx.storage, ctx.job_id, ctx.resume_state)
            raise
        if isinstance(outcome, Completed):
            _release_slot(ctx.settings, ctx.storage, ctx.job_id, ctx.resume_state)
        return outcome


def abandon(
    settings: Settings,
    storage: Account,
    job_id: str,
    saved: Mapping[str, Any],
    *,
    backend: SparkBackend | None = None,
) -> dict[str, Any] | None:
    """Cancel a saved run within SPARK_STEP_BUDGET_SECONDS (see `_abandon`) and free its slot."""
    with step_budget(settings.spark.step_budget_s):
        try:
            return _abandon(settings, saved, backend=backend)
        finally:
            _release_slot(settings, storage, job_id, saved)


def slots_for(settings: Settings, storage: Account) -> Slots:
    """The SPARK_MAX_CONCURRENT_RUNS slots, kept in the ledger container."""
    return run_slots(storage.documents(settings.ledger_container), settings.spark)


def _release_slot(settings: Settings, storage: Account, job_id: str, saved: Mapping[str, Any] | None) -> None:
    slot = saved.get("slot") if isinstance(saved, Mapping) else None
    if settings.spark.max_concurrent_runs <= 0:
        return
    try:
        slots_for(settings, storage).release(job_id, slot if isinstance(slot, int) else None)
    except Exception as exc:  # the slot is free again when its lease ends
        logging.getLogger("jobs.spark").warning("job %s: slot %s not released (%s)", job_id, slot, exc)


def _offload(
    ctx: JobContext, work: OffloadWork, *, backend: SparkBackend | None = None, reason: str = ""
) -> Outcome:
    """Submit the job to Spark; `Continue` to poll it later (or `Completed` if a run already finished).

    `reason` (why the job went to Spark) is kept in the offload state, so the ledger says why.
    """
    request = work.request(ctx, 1)  # may refuse the job before any request
    done = work.finished(ctx)
    if done is not None:  # an earlier run finished but the ledger never heard of it
        return done
    backend = backend or backend_for(ctx.settings.spark)
    limits = limits_for(ctx.settings)
    slot = slots_for(ctx.settings, ctx.storage).acquire(ctx.job_id)
    if slot is None:
        waiting = OffloadState(backend.name, None, request.name, time.time(), submissions=0, reason=reason)
        ctx.log.info(
            "spark: %d run(s) in flight (SPARK_MAX_CONCURRENT_RUNS): waiting for a slot",
            ctx.settings.spark.max_concurrent_runs,
        )
        return Continue(state=waiting.to_dict(), delay_s=limits.poll_initial_s)
    return _first_submission(ctx, backend, request, reason, slot, limits)


def _first_submission(
    ctx: JobContext, backend: SparkBackend, request: SparkJobRequest, reason: str, slot: int, limits: Limits
) -> Continue:
    sub = _submit_once(ctx, backend, request)
    state = OffloadState(
        backend.name,
        sub.submission_id,
        sub.name,
        sub.submitted_at,
        submissions=1,
        polls=0,
        reason=reason,
        slot=slot if slot >= 0 else None,
    )
    ctx.log.info(
        "spark: offloaded as %s (%s; reason: %s)", sub.submission_id or "unconfirmed", sub.name, reason or "-"
    )
    return Continue(state=state.to_dict(), delay_s=limits.poll_initial_s)


def _wait_for_slot(
    ctx: JobContext, work: OffloadWork, backend: SparkBackend, state: OffloadState, limits: Limits
) -> Continue:
    """A job over the cap: take a slot that has come free and submit, or wait longer."""
    slot = slots_for(ctx.settings, ctx.storage).acquire(ctx.job_id)
    if slot is None:
        waited = replace(state, polls=state.polls + 1)
        return Continue(state=waited.to_dict(), delay_s=next_delay(waited.polls, limits))
    ctx.log.info("spark: slot %d is free after %d check(s): submitting", slot, state.polls)
    return _first_submission(ctx, backend, work.request(ctx, 1), state.reason, slot, limits)


def _keep_slot(ctx: JobContext, state: OffloadState) -> OffloadState:
    """Renew the job's slot; take one again if it was lost (the run goes on either way)."""
    if ctx.settings.spark.max_concurrent_runs <= 0:
        return state
    slots = slots_for(ctx.settings, ctx.storage)
    if state.slot is not None and slots.renew(ctx.job_id, state.slot):
        return state
    slot = slots.acquire(ctx.job_id)
    if slot is None:
        ctx.log.warning("spark: run %s goes on without a slot (its hold lapsed)", state.submission_id)
    return replace(state, slot=slot)


def _resume(
    ctx: JobContext, work: OffloadWork, *, backend: SparkBackend | None = None, now: float | None = None
) -> Outcome:
    """Check the run saved in `ctx.resume_state` and act on it (never submits while it is live)."""
    if ctx.resume_state is None:
        raise PermanentError("spark: resume called without a saved offload state")
    state = OffloadState.from_dict(ctx.resume_state)
    backend = backend or backend_for(ctx.settings.spark)
    if state.backend != backend.name:
        raise PermanentError(
            f"spark: the job was offloaded to {state.backend} but SPARK_BACKEND is now {backend.name}"
        )
    limits = limits_for(ctx.settings)
    if state.waiting:
        return _wait_for_slot(ctx, work, backend, state, limits)
    state = _keep_slot(ctx, state)
    clock = time.time() if now is None else now
    try:
        state, status = _look(ctx, work, backend, state)
    except DownstreamUnavailable as exc:
        failure = after_poll_failure(state, str(exc), now=clock, limits=limits)
        ctx.log.warning(
            "spark: status of %s unavailable (%s in a row): %s",
            state.submission_id or state.name,
            state.poll_failures + 1,
            exc,
        )
        if isinstance(failure, Wait):
            return Continue(state=failure.state.to_dict(), delay_s=failure.delay_s)
        return _act_on_failure(ctx, work, backend, failure, limits)
    permanent = None
    if status is not None and status.state == "failed":
        error = work.run_error(ctx, state.submissions)
        if error is not None:
            status = replace(status, message=error.message)
            permanent = error.message if error.permanent else None
    decision: Decision = decide(state, status, now=clock, limits=limits, permanent_error=permanent)
    ctx.log.info(
        "spark: run %s is %s -> %s",
        state.submission_id,
        status.state if status else "unconfirmed",
        type(decision).__name__,
    )
    if isinstance(decision, Wait):
        return Continue(state=decision.state.to_dict(), delay_s=decision.delay_s)
    done = work.finished(ctx)  # a killed run may have finished writing
    if done is not None:
        return _with_run(done, state)
    if isinstance(decision, Verify):
        decision = after_missing_result(state, limits)
    return _act_on_failure(ctx, work, backend, decision, limits)


def _look(
    ctx: JobContext, work: OffloadWork, backend: SparkBackend, state: OffloadState
) -> tuple[OffloadState, RunStatus | None]:
    """Find an unconfirmed run, then ask for its status (None: still not found).

    DownstreamUnavailable when the backend cannot be asked or cannot tell.
    """
    if not state.confirmed:
        found = backend.find(work.request(ctx, state.submissions))
        if found is not None and found.submission_id:
            state = replace(state, submission_id=found.submission_id)
            ctx.log.info(
                "spark: found run %s for %s after a timed-out create", found.submission_id, state.name
            )
    status = backend.status(state.submission_id) if state.submission_id else None
    return polled(state), status


def _act_on_failure(
    ctx: JobContext, work: OffloadWork, backend: SparkBackend, decision: Decision, limits: Limits
) -> Outcome:
    if not isinstance(decision, Resubmit | GiveUp):
        raise AssertionError(f"unexpected decision {decision!r}")
    state = decision.state
    cancel_record: dict[str, Any] | None = None
    if decision.cancel and state.submission_id:
        try:
            backend.cancel(state.submission_id)
        except DownstreamUnavailable as exc:  # the run may still be alive: never leave it running
            ctx.log.warning("spark: cancel of %s failed (trying again later): %s", state.submission_id, exc)
            wait = cancel_failed(state, str(exc), limits)
            return Continue(state=wait.state.to_dict(), delay_s=wait.delay_s)
        except PermanentError as exc:  # refused (e.g. credentials): say so, do not loop on it
            ctx.log.warning("spark: cancel of %s refused: %s", state.submission_id, exc)
            cancel_record = {**cancelled_run(state), "cancelled": False, "error": str(exc)[:500]}
        else:
            state = with_cancelled(state)
            cancel_record = cancelled_run(state)
            ctx.log.warning(
                "spark: cancelled run %s on the cluster: %s", state.submission_id, decision.reason
            )
    if isinstance(decision, GiveUp):
        message = f"spark run failed after {state.submissions} submission(s): {decision.reason}"
        if decision.input_error:
            raise InputDataError(message)
        raise RunAbandoned(message, cancel_record)
    ctx.log.warning(
        "spark: resubmitting (%s of %s): %s", state.submissions + 1, limits.max_submissions, decision.reason
    )
    request = work.request(ctx, state.submissions + 1)
    sub = _submit_once(ctx, backend, request)
    new_state = resubmitted(state, sub.submission_id, sub.name, sub.submitted_at)
    return Continue(state=new_state.to_dict(), delay_s=limits.poll_initial_s)


def _abandon(
    settings: Settings, saved: Mapping[str, Any], *, backend: SparkBackend | None = None
) -> dict[str, Any] | None:
    """Cancel the run of a saved offload state (its job is being poisoned): facts for the ledger.

    None when there is nothing to cancel (no confirmed run, or it was cancelled already).
    """
    state = OffloadState.from_dict(saved)
    if state.submission_id is None or state.submission_id in state.cancelled:
        return None
    if backend is None and state.backend != settings.spark.backend:
        error = f"offloaded to {state.backend}, but SPARK_BACKEND is now {settings.spark.backend}: cancel it there"
        return {**cancelled_run(state), "cancelled": False, "error": error}
    backend = backend or backend_for(settings.spark)
    try:
        backend.cancel(state.submission_id)
    except (DownstreamUnavailable, PermanentError) as exc:
        return {**cancelled_run(state), "cancelled": False, "error": str(exc)[:500]}
    return cancelled_run(state)


def cancelled_run(state: OffloadState) -> dict[str, Any]:
    """What the ledger records about a run cancelled on the cluster."""
    return {
        "backend": state.backend,
        "submission_id": state.submission_id,
        "name": state.name,
        "submissions": state.submissions,
        "cancelled": True,
    }


def _submit_once(ctx: JobContext, backend: SparkBackend, request: SparkJobRequest) -> Submission:
    """Submit, unless an earlier attempt of this call may already have: then look the run up first.

    When the backend cannot be reached, or cannot tell whether an earlier submit went through,
    the submission is left unconfirmed (looked up again by `resume`), never submitted blindly.
    """
    marker = (ctx.progress or {}).get(PROGRESS_KEY)
    maybe_submitted = isinstance(marker, Mapping) and marker.get("name") == request.name
    started = time.time()
    try:
        if maybe_submitted or ctx.attempt > 0:
            found = backend.find(request)
            if found is not None and found.submission_id:
                ctx.log.info(
                    "spark: %s already submitted as %s; not submitting again",
                    request.name,
                    found.submission_id,
                )
                return found
        ctx.checkpoint(
            {PROGRESS_KEY: {"name": request.name, "submission": request.submission, "at": started}}
        )
        return backend.submit(request)
    except DownstreamUnavailable as exc:
        ctx.log.warning("spark: %s left unconfirmed (looked up later): %s", request.name, exc)
        return Submission(backend.name, None, request.name, started)


def _with_run(done: Completed, state: OffloadState) -> Completed:
    """The kind's result with the run that produced it, for the ledger's summary."""
    summary = {
        **done.summary,
        "backend": state.backend,
        "submission_id": state.submission_id,
        "submissions": state.submissions,
    }
    if state.reason:
        summary["offload_reason"] = state.reason
    return replace(done, summary=summary)
