"""Each attempt's downstream status: noted by the app's HTTP client, kept in the ledger write that
ends the attempt (no storage request more), shown on the job's console page."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime

import pytest

from shared.core.errors import DestinationRefused, DownstreamUnavailable
from shared.interfaces.console.pages import job_page
from shared.interfaces.console.queries import JobView
from shared.ledger.calls import DOWNSTREAM_KEEP, calls_noted, downstream_of
from shared.net.client import MAX_CALL_NOTES, HttpClient, calls_recorded
from shared.net.guard import Guard
from tests.handlerkit import JobRun, Receiver, Reply, drain, kit_runtime, submit_job

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
ALLOW = {"RETRY_BASE_SECONDS": "1"}


def statuses(record: dict[str, object]) -> list[tuple[object, object]]:
    return [(n["attempt"], n.get("status", n.get("error"))) for n in downstream_of(record)]


def test_calls_noted_appends_one_attempts_notes_and_keeps_the_newest() -> None:
    record: dict[str, object] | None = {"id": "j"}
    for attempt in range(DOWNSTREAM_KEEP + 3):
        record = calls_noted(record, attempt, [{"status": 503, "ms": 4, "secret": "dropped"}], NOW)
    assert record is not None
    notes = downstream_of(record)
    assert len(notes) == DOWNSTREAM_KEEP and notes[0]["attempt"] == 3 and notes[-1]["attempt"] == 22
    assert notes[-1] == {"attempt": 22, "at": "2026-11-28T12:00:00.000000Z", "status": 503, "ms": 4}
    assert calls_noted(record, 23, [], NOW) is record  # no call: the record as it was
    assert calls_noted(None, 0, [{"status": 200}], NOW) is None


def test_a_write_applied_again_on_its_own_unanswered_write_adds_nothing() -> None:
    once = calls_noted({"id": "j"}, 0, [{"status": 200, "ms": 1}], NOW)
    assert calls_noted(once, 0, [{"status": 200, "ms": 1}], NOW) is once


def test_a_replayed_jobs_notes_say_which_replay() -> None:
    record = calls_noted({"id": "j", "replay_count": 2}, 0, [{"error": "timeout", "ms": 7003}], NOW)
    assert downstream_of(record) == [
        {"attempt": 0, "at": "2026-11-28T12:00:00.000000Z", "replay": 2, "error": "timeout", "ms": 7003}
    ]


def test_a_damaged_field_reads_as_no_calls() -> None:
    assert downstream_of({"downstream": "x"}) == []
    assert downstream_of({"downstream": [1, {"attempt": 0, "status": 200}]}) == [
        {"attempt": 0, "status": 200}
    ]


def test_the_client_notes_a_call_only_when_asked_and_inside_a_recording(receiver: Receiver) -> None:
    guard = Guard.of([receiver.allow])
    receiver.reply(Reply(503, "busy"), Reply(200, "ok"), Reply(200, "ok"))
    recording = HttpClient("t", 2, 5, guard=guard, record=True)
    silent = HttpClient("t", 2, 5, guard=guard)
    with calls_recorded() as notes:
        with pytest.raises(DownstreamUnavailable, match="HTTP 503"):
            recording.request("GET", receiver.url())
        silent.request("GET", receiver.url())
        recording.request("GET", receiver.url())
    assert [n["status"] for n in notes] == [503, 200]
    assert all(isinstance(n["ms"], int) and set(n) == {"status", "ms"} for n in notes)
    recording.request("GET", receiver.url())  # outside a recording: nowhere to note, no error
    assert MAX_CALL_NOTES >= DOWNSTREAM_KEEP


def test_a_refused_destination_and_no_answer_are_noted_by_why(receiver: Receiver) -> None:
    refusing = HttpClient("t", 1, 1, guard=Guard.of([]), record=True)
    receiver.reply(Reply(200, "late", delay_s=3))
    waiting = HttpClient("t", 1, 1, guard=Guard.of([receiver.allow]), record=True)
    with calls_recorded() as notes:
        for client, url in ((refusing, "https://10.0.0.1/x"), (waiting, receiver.url())):
            with contextlib.suppress(DownstreamUnavailable, DestinationRefused):
                client.request("POST", url)
    assert [n.get("error") for n in notes] == ["refused by the outbound guard", "timeout"]


def test_an_http_jobs_record_holds_each_attempts_status_503_503_200(receiver: Receiver) -> None:
    receiver.reply(Reply(503, "busy"), Reply(503, "busy"), Reply(200, {"done": True}))
    kit = kit_runtime(**ALLOW, HTTP_ALLOWED_HOSTS=receiver.allow)
    job = submit_job(kit, "http", {"url": receiver.url()})
    run = JobRun(kit, job, drain(kit))
    assert run.status == "completed"
    assert statuses(run.record) == [(0, 503), (1, 503), (2, 200)]


def test_a_hung_call_is_noted_as_a_timeout_then_the_answer(receiver: Receiver) -> None:
    receiver.reply(Reply(200, "late", delay_s=4.0))
    kit = kit_runtime(**ALLOW, HTTP_ALLOWED_HOSTS=receiver.allow)
    job = submit_job(kit, "http", {"url": receiver.url(), "timeout_seconds": 0.5})
    run = JobRun(kit, job, drain(kit))
    assert statuses(run.record) == [(0, "timeout"), (1, 200)]


def test_the_happy_path_notes_cost_no_storage_request(receiver: Receiver) -> None:
    """The same count as without notes: claim, result, complete, the jobs index's entry."""
    from shared.core.envelope import parse_dict
    from shared.runtime.sending import send_job

    kit = kit_runtime(**ALLOW, HTTP_ALLOWED_HOSTS=receiver.allow)
    for job in ("warm-up", "happy-1"):
        send_job(
            kit.rt, parse_dict({"id": job, "kind": "http", "payload": {"url": receiver.url()}}, ["http"])
        )
        before = len(kit.account.requests)
        drain(kit)
    assert len([r for r in kit.account.requests[before:] if "/messages" not in r]) == 4
    record = kit.rt.ledger.get("happy-1")
    assert record is not None and statuses(record.data) == [(0, 200)]


def test_the_job_page_shows_each_attempts_status() -> None:
    record = {
        "status": "completed",
        "downstream": [
            {"attempt": 0, "at": "t0", "status": 503, "ms": 5},
            {"attempt": 1, "at": "t1", "error": "connection error", "ms": 2},
            {"attempt": 2, "at": "t2", "status": 200, "ms": 9, "replay": 1},
            {"attempt": 3, "at": "t3", "status": "<b>x</b>"},
        ],
    }
    html = job_page(JobView(record, [], None, None, {}, "", []), "/b", "j")
    table = html[html.index("<table id=downstream>") : html.index("</table>", html.index("id=downstream"))]
    assert "data-status='503'" in table and "data-status='connection error'" in table
    assert "data-status='200'" in table and "2 (replay 1)" in table
    assert "<b>x</b>" not in html  # a damaged note is not markup
    assert "id=downstream" not in job_page(
        JobView({"status": "completed"}, [], None, None, {}, "", []), "/b", "j"
    )
