"""Pure functions: backend states -> RunStatus, the offload lifecycle decision, HTTP helpers."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shared.core.errors import PermanentError
from shared.spark.model import RunState, RunStatus
from shared.spark.states import databricks_status, livy_status, standalone_status
from shared.spark.tracking import (
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
from shared.spark.transport import retry_after_seconds, scrub

LIMITS = Limits(
    max_submissions=3, poll_initial_s=10, poll_max_s=300, confirm_window_s=120, run_timeout_s=3600
)
STATE = OffloadState("standalone", "driver-1", "aggregate-j-s1", submitted_at=1000.0, submissions=1, polls=0)


# --- state mapping -----------------------------------------------------------------------------


def test_standalone_success_flag_decides_unknown() -> None:
    assert standalone_status({"success": False, "submissionId": "x"}).state == "unknown"
    assert standalone_status({"success": True, "driverState": "RUNNING"}).state == "running"
    error = standalone_status({"success": True, "driverState": "ERROR", "message": "java.io.IOException: x"})
    assert (error.state, error.message) == ("failed", "java.io.IOException: x")
    assert standalone_status({"success": True, "driverState": "SOMETHING_NEW"}).state == "pending"


def test_livy_synapse_result_field_wins_over_a_lagging_state() -> None:
    assert livy_status({"state": "success", "result": "Failed"}).state == "failed"
    assert livy_status({"state": "success", "result": "Succeeded"}).state == "succeeded"
    assert livy_status({"state": "Running"}).state == "running"
    assert livy_status({"state": "dead"}).message == "Livy batch ended in state dead"


def test_databricks_status_block_of_api_2_2() -> None:
    body = {"status": {"state": "TERMINATED", "termination_details": {"code": "SUCCESS", "message": ""}}}
    assert databricks_status(body).state == "succeeded"
    failed = {
        "status": {
            "state": "TERMINATED",
            "termination_details": {"code": "RUN_EXECUTION_ERROR", "message": "boom"},
        }
    }
    status = databricks_status(failed)
    assert status.state == "failed" and "boom" in status.message
    assert databricks_status({"state": {"life_cycle_state": "BLOCKED"}}).state == "pending"


# --- tracking ----------------------------------------------------------------------------------


def test_delay_grows_and_is_capped() -> None:
    assert [next_delay(n, LIMITS) for n in range(7)] == [10, 20, 40, 80, 160, 300, 300]
    assert next_delay(1000, LIMITS) == 300


def test_live_run_waits_longer_each_poll() -> None:
    first = decide(STATE, RunStatus("pending"), now=1010, limits=LIMITS)
    assert isinstance(first, Wait) and first.delay_s == 20 and first.state.polls == 1
    second = decide(first.state, RunStatus("running"), now=1030, limits=LIMITS)
    assert isinstance(second, Wait) and second.delay_s == 40 and second.state.polls == 2
    assert second.state.submission_id == STATE.submission_id


def test_success_is_verified() -> None:
    assert isinstance(decide(STATE, RunStatus("succeeded"), now=1100, limits=LIMITS), Verify)


@pytest.mark.parametrize("state", ["failed", "unknown"])
def test_failed_or_forgotten_is_resubmitted_while_submissions_remain(state: RunState) -> None:
    decision = decide(STATE, RunStatus(state, "driver said no"), now=1100, limits=LIMITS)
    assert isinstance(decision, Resubmit)
    assert not decision.cancel


def test_after_max_submissions_it_gives_up_with_the_drivers_message() -> None:
    last = OffloadState("standalone", "driver-3", "n", 1000.0, submissions=3)
    decision = decide(
        last, RunStatus("failed", "ValueError: the driver's own words"), now=1100, limits=LIMITS
    )
    assert isinstance(decision, GiveUp)
    assert decision.reason == "ValueError: the driver's own words"


def test_a_reported_input_error_gives_up_at_once() -> None:
    decision = decide(STATE, RunStatus("failed"), now=1100, limits=LIMITS, permanent_error="column 'v' bad")
    assert isinstance(decision, GiveUp) and decision.input_error and decision.reason == "column 'v' bad"


def test_forgotten_is_resubmitted_even_with_an_input_error_document() -> None:
    decision = decide(STATE, RunStatus("unknown"), now=1100, limits=LIMITS, permanent_error="stale")
    assert isinstance(decision, Resubmit)


def test_unconfirmed_submit_waits_inside_the_window_then_counts_as_failed() -> None:
    unconfirmed = OffloadState("livy", None, "n", 1000.0)
    assert isinstance(decide(unconfirmed, None, now=1100, limits=LIMITS), Wait)
    late = decide(unconfirmed, None, now=1121, limits=LIMITS)
    assert isinstance(late, Resubmit) and "not found" in late.reason


def test_a_run_past_max_run_is_cancelled() -> None:
    decision = decide(STATE, RunStatus("running", raw_state="RUNNING"), now=1000 + 3601, limits=LIMITS)
    assert isinstance(decision, Resubmit) and decision.cancel


def test_missing_result_after_success_counts_as_a_failure() -> None:
    assert isinstance(after_missing_result(STATE, LIMITS), Resubmit)
    last = OffloadState("standalone", "d", "n", 1000.0, submissions=3)
    assert isinstance(after_missing_result(last, LIMITS), GiveUp)


def test_resubmitted_state_resets_polls_and_counts_the_submission() -> None:
    polled = OffloadState("standalone", "d1", "n-s1", 1000.0, submissions=1, polls=4)
    new = resubmitted(polled, "d2", "n-s2", 2000.0)
    assert (new.submission_id, new.name, new.submitted_at, new.submissions, new.polls) == (
        "d2",
        "n-s2",
        2000.0,
        2,
        0,
    )


def test_state_round_trips_and_rejects_garbage() -> None:
    assert OffloadState.from_dict(STATE.to_dict()) == STATE
    assert OffloadState.from_dict({**STATE.to_dict(), "submission_id": None}).submission_id is None
    with pytest.raises(PermanentError, match="unreadable"):
        OffloadState.from_dict({"backend": "standalone"})


# --- HTTP helpers ------------------------------------------------------------------------------


def test_scrub_masks_tokens_keys_and_passwords() -> None:
    text = (
        "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.sig AccountKey=abc/def==;x "
        "password=hunter2 token: dapi0123456789abcdef0123"
    )
    out = scrub(text)
    for secret in ("eyJhbGciOiJIUzI1NiJ9", "abc/def==", "hunter2", "dapi0123456789abcdef0123"):
        assert secret not in out
    assert len(scrub("x" * 1000)) < 420


def test_retry_after_parses_seconds_and_dates() -> None:
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    when = retry_after_seconds("Wed, 21 Oct 2015 07:28:30 GMT", now=1445412500.0)
    assert when == pytest.approx(10.0)


# --- tracking by deadline ----------------------------------------------------------------------


def test_a_failed_poll_waits_longer_and_counts_nothing_but_the_failure() -> None:
    wait = after_poll_failure(STATE, "livy: cannot reach x", now=1100, limits=LIMITS)
    assert isinstance(wait, Wait) and wait.delay_s == 20
    assert (wait.state.submissions, wait.state.poll_failures, wait.state.last_error) == (
        1,
        1,
        "livy: cannot reach x",
    )
    many = replace(STATE, poll_failures=40)
    assert after_poll_failure(many, "e", now=1100, limits=LIMITS).delay_s == LIMITS.poll_max_s  # type: ignore[union-attr]
    assert polled(wait.state).poll_failures == 0 and polled(wait.state).last_error == ""


def test_a_failed_poll_past_the_deadline_cancels_the_run() -> None:
    decision = after_poll_failure(STATE, "down", now=1000 + 3601, limits=LIMITS)
    assert (
        isinstance(decision, Resubmit)
        and decision.cancel
        and "unreachable past the deadline" in decision.reason
    )
    unconfirmed = OffloadState("livy", None, "n", 1000.0)
    assert isinstance(after_poll_failure(unconfirmed, "down", now=1000 + 3601, limits=LIMITS), Wait)


def test_a_failed_cancel_waits_and_a_done_cancel_is_kept_once() -> None:
    wait = cancel_failed(STATE, "503", LIMITS)
    assert isinstance(wait, Wait) and "cancel of driver-1 failed" in wait.state.last_error
    once = with_cancelled(with_cancelled(STATE))
    assert once.cancelled == ("driver-1",)
    assert OffloadState.from_dict(once.to_dict()) == once
