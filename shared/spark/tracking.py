"""Pure decisions for an offloaded job's lifecycle: wait, verify, resubmit or give up.

The saved state travels as `Continue.state` on the ledger; `decide` looks at it and the run's
current status and says what to do next. No I/O here.

A run is tracked by deadline, not by attempts: a status check that fails (API down, 5xx, 429,
timeouts) is counted in `poll_failures` and checked again later (`after_poll_failure`); only
failed submissions count, against `max_submissions`. A run live past `run_timeout_s` is
cancelled on the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from shared.core.errors import PermanentError
from shared.spark.model import RunStatus


@dataclass(frozen=True)
class OffloadState:
    """What the ledger keeps while a job runs on Spark."""

    backend: str
    submission_id: str | None
    """None while a submit that timed out has not been found on the backend yet."""
    name: str
    submitted_at: float
    submissions: int = 1
    polls: int = 0
    reason: str = ""
    """Why the job went to Spark: engine (the payload asked), size (over
    SPARK_OFFLOAD_THRESHOLD_BYTES) or max_groups (an inline run passed MAX_GROUPS)."""
    poll_failures: int = 0
    """Status checks of this submission that failed in a row (API down, 5xx, 429, timeouts)."""
    last_error: str = ""
    """The last poll failure's message (cleared by a good poll)."""
    cancelled: tuple[str, ...] = ()
    """Submission ids cancelled on the cluster (past the deadline), oldest first."""
    slot: int | None = None
    """The concurrency slot the job holds (SPARK_MAX_CONCURRENT_RUNS), None without one."""

    @property
    def waiting(self) -> bool:
        """Not submitted yet: waiting for a free slot (`submissions` is 0)."""
        return self.submissions == 0

    @property
    def confirmed(self) -> bool:
        return self.submission_id is not None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cancelled"] = list(self.cancelled)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OffloadState:
        """Parse a saved state; PermanentError when it is not one of ours."""
        try:
            sid = data.get("submission_id")
            return cls(
                backend=str(data["backend"]),
                submission_id=None if sid in (None, "") else str(sid),
                name=str(data["name"]),
                submitted_at=float(data["submitted_at"]),
                submissions=int(data.get("submissions", 1)),
                polls=int(data.get("polls", 0)),
                reason=str(data.get("reason") or ""),
                poll_failures=int(data.get("poll_failures", 0)),
                last_error=str(data.get("last_error") or ""),
                cancelled=tuple(str(x) for x in data.get("cancelled") or ()),
                slot=None if data.get("slot") is None else int(data["slot"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PermanentError(
                f"spark: saved offload state is unreadable ({exc.__class__.__name__}: {exc})"
            ) from None


@dataclass(frozen=True)
class Limits:
    """Tracking limits from SparkSettings (and SPARK_* extras)."""

    max_submissions: int = 3
    poll_initial_s: int = 10
    poll_max_s: int = 300
    confirm_window_s: float = 120.0
    """How long an unconfirmed submit (create timed out, run not found) is looked for."""
    run_timeout_s: float = 6 * 3600.0
    """`SPARK_RUN_TIMEOUT_SECONDS`: a submission live (or unreachable) for longer than this is
    cancelled on the cluster and counted as a failed submission."""


@dataclass(frozen=True)
class Wait:
    """Check again after `delay_s`; `state` has the poll counted."""

    state: OffloadState
    delay_s: int


@dataclass(frozen=True)
class Verify:
    """The run succeeded: verify its result document, then complete."""

    state: OffloadState


@dataclass(frozen=True)
class Resubmit:
    """The run failed or was forgotten and submissions remain: submit again."""

    state: OffloadState
    reason: str
    cancel: bool = False
    """Cancel the old run first (it may still be alive, e.g. past run_timeout_s)."""


@dataclass(frozen=True)
class GiveUp:
    """No submissions remain: fail the job permanently with `reason` (the driver's error)."""

    state: OffloadState
    reason: str
    cancel: bool = False
    input_error: bool = False
    """The job reported bad input data (a new run cannot help)."""


Decision = Wait | Verify | Resubmit | GiveUp


def next_delay(polls: int, limits: Limits) -> int:
    """poll_initial_s * 2^polls, capped at poll_max_s."""
    if polls >= 32:
        return limits.poll_max_s
    return int(min(limits.poll_initial_s * (2**polls), limits.poll_max_s))


def decide(
    state: OffloadState,
    status: RunStatus | None,
    *,
    now: float,
    limits: Limits,
    permanent_error: str | None = None,
) -> Decision:
    """What to do with `state` given the run's `status` (None: unconfirmed and still not found).

    `permanent_error`: the job reported a failure that a new run cannot fix (bad input data):
    a failed run then gives up at once instead of being resubmitted.
    """
    age = now - state.submitted_at
    if status is None:
        if age < limits.confirm_window_s:
            return _wait(state, limits)
        return _failed(
            state, f"submission {state.name} was not found {age:.0f}s after a timed-out create", limits
        )
    if status.state in ("pending", "running"):
        if age > limits.run_timeout_s:
            reason = f"run {state.submission_id} still {status.raw_state or status.state} after {age:.0f}s"
            return _failed(state, reason, limits, cancel=True)
        return _wait(state, limits)
    if status.state == "succeeded":
        return Verify(state)
    if status.state == "unknown":
        return _failed(state, f"the backend forgot run {state.submission_id}: {status.message}", limits)
    if permanent_error:
        return GiveUp(state, permanent_error, input_error=True)
    return _failed(state, status.message or f"run {state.submission_id} failed", limits)


def after_poll_failure(state: OffloadState, error: str, *, now: float, limits: Limits) -> Decision:
    """A status check (or look-up) failed: check again later; it never costs an attempt.

    Past the run's deadline the run is cancelled (the cancel itself may fail and be retried at
    the next check, see `cancel_failed`).
    """
    age = now - state.submitted_at
    if state.confirmed and age > limits.run_timeout_s:
        reason = f"run {state.submission_id} unreachable past the deadline ({age:.0f}s): {error}"
        return _failed(state, reason, limits, cancel=True)
    return _unreachable(state, error, limits)


def cancel_failed(state: OffloadState, error: str, limits: Limits) -> Wait:
    """The cancel of a run past its deadline failed: try again at the next check."""
    return _unreachable(state, f"cancel of {state.submission_id} failed: {error}", limits)


def _unreachable(state: OffloadState, error: str, limits: Limits) -> Wait:
    failures = state.poll_failures + 1
    failed = replace(state, polls=state.polls + 1, poll_failures=failures, last_error=error[:500])
    return Wait(failed, next_delay(failures, limits))


def polled(state: OffloadState) -> OffloadState:
    """The state after a status check that answered: the failure streak ends."""
    if not state.poll_failures and not state.last_error:
        return state
    return replace(state, poll_failures=0, last_error="")


def with_cancelled(state: OffloadState) -> OffloadState:
    """The state after its current run was cancelled on the cluster."""
    if state.submission_id is None or state.submission_id in state.cancelled:
        return state
    return replace(state, cancelled=(*state.cancelled, state.submission_id))


def after_missing_result(state: OffloadState, limits: Limits) -> Decision:
    """The run reported success but its result document is missing or not ours."""
    return _failed(state, f"run {state.submission_id} succeeded but wrote no result document", limits)


def resubmitted(state: OffloadState, submission_id: str | None, name: str, now: float) -> OffloadState:
    """The state after submission number `state.submissions + 1` was made."""
    return replace(
        state,
        submission_id=submission_id,
        name=name,
        submitted_at=now,
        submissions=state.submissions + 1,
        polls=0,
        poll_failures=0,
        last_error="",
    )


def _wait(state: OffloadState, limits: Limits) -> Wait:
    return Wait(replace(state, polls=state.polls + 1), next_delay(state.polls + 1, limits))


def _failed(state: OffloadState, reason: str, limits: Limits, cancel: bool = False) -> Decision:
    if state.submissions < limits.max_submissions:
        return Resubmit(state, reason, cancel)
    return GiveUp(state, reason, cancel)
