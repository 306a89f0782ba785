"""The handler kit's clock, deadline and continuations (issue 45): the kit runs on the runtime's
clock, handlers read it (`ctx.now()`, `ctx.created_at`), and `Continue(attempts=...)` says whether
transient failures count per stage or per job."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from shared.core.errors import DownstreamUnavailable
from shared.jobs.base import Completed, Continue, JobContext, Outcome
from tests.handlerkit import JobRun, drain, kit_runtime, run_handler, set_function_timeout, submit_job


class Poller:
    """Polls every 30 s until `polls` polls are done; a poll listed in `blips` fails once."""

    def __init__(self, polls: int, blips: tuple[int, ...] = (), attempts: str = "job") -> None:
        self.polls, self.blips, self.attempts = polls, blips, attempts
        self.failed: set[int] = set()
        self.seen: list[dict[str, Any]] = []

    def validate(self, payload: Mapping[str, Any]) -> None:
        return None

    def run(self, ctx: JobContext) -> Outcome:
        poll = int((ctx.resume_state or {}).get("poll", 0)) + 1
        self.seen.append({"now": ctx.now(), "created_at": ctx.created_at, "left": ctx.time_left()})
        if poll in self.blips and poll not in self.failed:
            self.failed.add(poll)
            raise DownstreamUnavailable(f"blip at poll {poll}")
        if poll >= self.polls:
            return Completed("", {"polls": poll})
        return Continue({"poll": poll}, delay_s=30, status="polling", attempts=self.attempts)


def test_the_kits_clock_is_the_runtimes_a_job_expires_in_skipped_time() -> None:
    poller = Poller(polls=20)
    job = run_handler(poller, {}, kind="poll", JOB_TTL_SECONDS="100")
    assert job.status == "poisoned" and job.record["reason_code"] == "expired"
    assert "before it could finish" in job.reason
    assert len(poller.seen) <= 5  # 100 s of 30-s polls, not 20


def test_handlers_read_the_runtimes_clock_and_the_jobs_created_at() -> None:
    poller = Poller(polls=3)
    job = run_handler(poller, {}, kind="poll")
    assert job.status == "completed"
    first, _, last = poller.seen
    assert first["created_at"] is not None and first["created_at"] <= first["now"]
    assert last["now"] - first["now"] >= timedelta(seconds=60)  # two 30-s waits, skipped
    assert last["created_at"] == first["created_at"]


def test_transient_failures_count_per_job_by_default_and_per_stage_when_asked() -> None:
    settings = {"POLL_MAX_ATTEMPTS": "2", "POLL_RETRY_BASE_SECONDS": "1"}
    per_job = run_handler(Poller(polls=6, blips=(2, 5)), {}, kind="poll", **settings)
    assert per_job.status == "poisoned" and "gave up after 2 attempts" in per_job.reason
    per_stage = run_handler(Poller(polls=6, blips=(2, 5), attempts="stage"), {}, kind="poll", **settings)
    assert per_stage.status == "completed" and per_stage.record["summary"] == {"polls": 6}


def test_the_deadline_knob_sets_ctx_deadline() -> None:
    poller = Poller(polls=1)
    kit = set_function_timeout(kit_runtime({"poll": poller}), 60)
    job = JobRun(kit, submit_job(kit, "poll", {}))
    job.waits = drain(kit)
    assert job.status == "completed"
    assert 50 < poller.seen[0]["left"] <= 54  # 60 s less the 6-s margin
