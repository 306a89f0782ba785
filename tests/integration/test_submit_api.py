"""POST /api/jobs through the API's own handler, on the in-memory account and on Azurite: the
producer's fields refused, one 202 per id under concurrency, a retried POST finishing a failed send,
and the message handed to the Functions host (its output binding), sent again if never claimed."""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import azure.functions as func
import pytest
from azure.core.exceptions import AzureError, ServiceResponseError

from shared.interfaces import api, cli
from shared.ledger import send as ledger_send
from shared.pipeline import recovery
from shared.pipeline import submit as submit_module
from shared.pipeline.processing import process_message
from shared.runtime.wiring import Runtime
from shared.storage.failures import StorageError, translate
from tests.integration.backends import Backend
from tests.integration.helpers import drain_raw, message, queue_length


@pytest.fixture
def rt(storage_backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    runtime = storage_backend.runtime()
    monkeypatch.setattr(api, "get_runtime", lambda: runtime)
    yield runtime


def post(body: Any) -> tuple[int, dict[str, Any]]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = func.HttpRequest(method="POST", url="http://localhost/api/jobs", body=raw, headers={}, params={})
    resp = api.submit_job(req)
    return resp.status_code, json.loads(resp.get_body())


def get(job_id: str) -> tuple[int, dict[str, Any]]:
    req = func.HttpRequest(
        method="GET", url=f"http://localhost/api/jobs/{job_id}", body=b"", route_params={"id": job_id}
    )
    resp = api.get_job(req)
    return resp.status_code, json.loads(resp.get_body())


def noop(job_id: str, **payload: Any) -> dict[str, Any]:
    return {"id": job_id, "kind": "noop", "payload": payload}


def through_the_port(sdk_error: AzureError) -> StorageError:
    """What a storage port raises when its SDK call fails with `sdk_error` (its Azure adapter
    translates it, the SDK error as the cause): ports never raise an SDK's errors."""
    failure = translate(sdk_error, "injected")
    failure.__cause__ = sdk_error
    return failure


class FlakySender:
    """The jobs queue, with its next `fail` sends failing: before reaching the queue, or (lost)
    after the message is on it."""

    def __init__(self, inner: Any, fail: int = 1, lost: bool = False) -> None:
        self.inner, self.fail, self.lost, self.sent = inner, fail, lost, 0

    def send_message(self, content: Any, **kwargs: Any) -> Any:
        if self.fail > 0:
            self.fail -= 1
            if self.lost:
                self.inner.send_message(content, **kwargs)
                self.sent += 1
            raise through_the_port(ServiceResponseError("injected: the queue did not answer"))
        self.sent += 1
        return self.inner.send_message(content, **kwargs)


@pytest.mark.parametrize("field", ["attempt", "continuation_seq"])
def test_a_producer_setting_the_apps_fields_gets_400_naming_them(rt: Runtime, field: str) -> None:
    status, body = post({**noop("p1"), field: 1})
    assert status == 400 and body["problems"] == [f"{field}: set by the app, not by producers"], body
    status, body = post({**noop("p1"), "attempt": 0, "continuation_seq": 1})
    assert status == 400 and len(body["problems"]) == 2
    assert queue_length(rt, rt.settings.jobs_queue) == 0 and rt.ledger.get("p1") is None


def test_the_cli_refuses_them_too(rt: Runtime, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job_file = tmp_path / "job.json"
    job_file.write_text(json.dumps([{**noop("c1"), "attempt": 3}, noop("c2")]))
    args = argparse.Namespace(file=str(job_file), kind=None, payload=None, id=None)
    assert cli.cmd_enqueue(rt, args) == 1
    out = capsys.readouterr()
    assert "rejected: attempt: set by the app, not by producers" in out.err and "c2\tenqueued" in out.out
    assert rt.ledger.get("c1") is None and queue_length(rt, rt.settings.jobs_queue) == 1


def test_two_posts_of_one_id_at_once_one_202_one_409_one_message(rt: Runtime) -> None:
    ids = [f"twin-{i}" for i in range(8)]
    for job_id in ids:
        barrier = threading.Barrier(2)
        answers: list[tuple[int, dict[str, Any]]] = []

        def go(
            job_id: str = job_id, barrier: threading.Barrier = barrier, answers: list[Any] = answers
        ) -> None:
            barrier.wait()
            answers.append(post(noop(job_id, note=job_id)))

        threads = [threading.Thread(target=go) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(a[0] for a in answers) == [202, 409], answers
        conflict = next(body for status, body in answers if status == 409)
        assert conflict["same_request"] is True and conflict["status"] in ("queued", "in_progress")
    bodies = [json.loads(b) for b in drain_raw(rt, rt.settings.jobs_queue)]
    assert sorted(b["id"] for b in bodies) == ids  # exactly one message per id
    for job_id in ids:
        record = rt.ledger.get(job_id)
        assert record is not None and "send_pending" not in record.data


def test_a_retried_post_after_a_failed_send_completes_the_job(rt: Runtime) -> None:
    rt.jobs_queue = FlakySender(rt.jobs_queue)
    status, body = post(noop("r1", note="x"))
    assert status == 503 and "storage unavailable" in body["error"]
    status, record = get("r1")  # what GET shows meanwhile: queued, its message not sent yet
    assert status == 200 and record["status"] == "queued" and record["send_pending"] is True
    assert [h["event"] for h in record["history"]] == ["queued", "send_failed"]
    assert queue_length(rt, rt.settings.jobs_queue) == 0
    status, body = post(noop("r1", note="other"))  # another request with the id: refused
    assert status == 409 and body["same_request"] is False
    started = time.monotonic()
    status, body = post(noop("r1", note="x"))  # the same request: takes the send over at once
    assert status == 202 and body["id"] == "r1" and time.monotonic() - started < 5
    status, record = get("r1")
    assert record["status"] == "queued" and "send_pending" not in record
    bodies = drain_raw(rt, rt.settings.jobs_queue)
    assert len(bodies) == 1 and json.loads(bodies[0])["attempt"] == 0
    process_message(message(bodies[0]), rt)
    status, record = get("r1")
    assert record["status"] == "completed" and record["summary"] == {"note": "x"}
    assert post(noop("r1", note="x"))[0] == 409  # once more: the job is there, nothing sent
    assert queue_length(rt, rt.settings.jobs_queue) == 0


def test_a_retry_after_the_worker_took_the_job_is_409_with_its_status(rt: Runtime) -> None:
    rt.jobs_queue = FlakySender(rt.jobs_queue, lost=True)  # sent, but the answer is lost
    assert post(noop("w1"))[0] == 503
    (sent,) = drain_raw(rt, rt.settings.jobs_queue)
    process_message(message(sent), rt)  # the worker runs it before the producer retries
    status, body = post(noop("w1"))
    assert status == 409 and body["status"] == "completed" and body["same_request"] is True
    assert queue_length(rt, rt.settings.jobs_queue) == 0 and rt.jobs_queue.sent == 1


def test_a_claim_checked_payload_survives_a_failed_send(rt: Runtime) -> None:
    rt.jobs_queue = FlakySender(rt.jobs_queue)
    big = noop("big-1", note="x" * 80_000)
    assert post(big)[0] == 503
    status, body = post(big)
    assert status == 202 and body["claim_checked"] is True
    (sent,) = drain_raw(rt, rt.settings.jobs_queue)
    envelope = json.loads(sent)
    assert "payload" not in envelope and envelope["payload_ref"].startswith("big-1/")
    process_message(message(sent), rt)
    record = rt.ledger.get("big-1")
    assert record is not None and record.status == "completed"


def test_a_request_body_nested_too_deeply_gets_400_not_a_crash(rt: Runtime) -> None:
    status, body = post(b'{"id": "deep", "kind": "noop", "payload": ' + b"[" * 5000 + b"]" * 5000 + b"}")
    assert status == 400 and "nested too deeply" in body["problems"][0], body
    assert rt.ledger.get("deep") is None


# -- the API's message handed to the Functions host (the queue output binding) ------------------


class Outbox:
    """What `func.Out[str]` is to the function: the host sends the value when it returns."""

    def __init__(self) -> None:
        self.value: str | None = None

    def set(self, val: str) -> None:
        self.value = val


def post_hosted(body: Any) -> tuple[int, dict[str, Any], Outbox]:
    out = Outbox()
    req = func.HttpRequest(
        method="POST", url="http://localhost/api/jobs", body=json.dumps(body).encode(), headers={}, params={}
    )
    resp = api.submit_job(req, out)
    return resp.status_code, json.loads(resp.get_body()), out


def due_for_resend(rt: Runtime, at: datetime) -> list[str]:
    return sorted(rt.ledger.store.find(recovery.unclaimed_query(at)))


def test_the_host_sends_the_apis_message_and_its_first_claim_drops_the_marker(rt: Runtime) -> None:
    status, body, out = post_hosted(noop("h1", note="x"))
    assert status == 202 and out.value is not None, body
    assert queue_length(rt, rt.settings.jobs_queue) == 0  # the function sent nothing itself
    sent = json.loads(out.value)
    assert sent["id"] == "h1" and sent["recorded"] is True and sent["payload"] == {"note": "x"}
    record = rt.ledger.get("h1")
    assert record is not None and record.data["send_pending"] is True
    assert [h["event"] for h in record.data["history"]] == ["queued"]  # no clear after the send
    made = datetime.fromisoformat(record.data["history"][0]["at"])
    due = made + timedelta(seconds=ledger_send.RESEND_AFTER_S)
    assert datetime.fromisoformat(record.data["resend_at"]) == due
    assert record.data["envelope"]["payload"] == {"note": "x"}
    assert due_for_resend(rt, due) == ["h1.json"] and due_for_resend(rt, due - timedelta(seconds=1)) == []
    again = post_hosted(noop("h1", note="other"))  # another request with the id: refused, nothing to send
    assert again[0] == 409 and again[2].value is None
    process_message(message(out.value.encode()), rt)  # the host's message, delivered
    record = rt.ledger.get("h1")
    assert record is not None and record.status == "completed" and record.data["summary"] == {"note": "x"}
    assert not {"send_pending", "resend_at", "envelope"} & set(record.data)
    assert due_for_resend(rt, due + timedelta(days=30)) == []  # the claim's write cleared the tag
    status, body, out = post_hosted(noop("h1", note="x"))  # the same request again: 409, nothing sent
    assert status == 409 and body["same_request"] is True and out.value is None


def test_an_unclaimed_host_sent_job_is_sent_again_never_expiring_before_its_message_could(
    rt: Runtime,
) -> None:
    status, _, out = post_hosted(noop("h2", note="y"))
    assert status == 202 and out.value is not None  # and the host's message is lost (its 7 days ran out)
    record = rt.ledger.get("h2")
    assert record is not None
    due = datetime.fromisoformat(record.data["resend_at"])
    rt.clock = lambda: due - timedelta(minutes=1)
    early = recovery.resend_unclaimed(rt)
    assert early.found == 0 and queue_length(rt, rt.settings.jobs_queue) == 0
    rt.clock = lambda: due + timedelta(minutes=1)
    report = recovery.resend_unclaimed(rt)
    assert report.found == 1 and report.resent == ["h2"]
    (peeked,) = rt.account.raw_queue(rt.settings.jobs_queue).peek_messages(max_messages=5)
    assert peeked.expires_on is not None and peeked.expires_on.year == 9999  # never expires
    record = rt.ledger.get("h2")
    assert record is not None and record.status == "queued" and "send_pending" not in record.data
    assert record.data["history"][-1]["event"] == "resent" and "envelope" not in record.data
    assert recovery.resend_unclaimed(rt).found == 0  # once
    (body,) = drain_raw(rt, rt.settings.jobs_queue)
    assert json.loads(body)["recorded"] is True and json.loads(body)["payload"] == {"note": "y"}
    process_message(message(body), rt)
    record = rt.ledger.get("h2")
    assert record is not None and record.status == "completed" and record.data["summary"] == {"note": "y"}


def test_a_host_sent_job_of_a_kind_since_undeployed_is_sent_again_and_poisoned_with_its_reason(
    rt: Runtime, caplog: pytest.LogCaptureFixture
) -> None:
    status, _, out = post_hosted(noop("h3"))
    assert status == 202 and out.value is not None
    record = rt.ledger.get("h3")
    assert record is not None
    rt.clock = lambda: datetime.fromisoformat(record.data["resend_at"]) + timedelta(minutes=1)
    rt.handlers = {k: v for k, v in rt.handlers.items() if k != "noop"}  # a deployment without it
    assert recovery.resend_unclaimed(rt).resent == ["h3"]  # not left queued for good
    (body,) = drain_raw(rt, rt.settings.jobs_queue)
    with caplog.at_level(logging.WARNING, logger="jobs"):
        process_message(message(body), rt)  # the delivery poisons it, with its reason
    (copy,) = drain_raw(rt, rt.settings.poison_queue)
    assert json.loads(copy)["id"] == "h3"  # on the poison queue, for handle_poison to archive
    poisoned = [r for r in caplog.records if getattr(r, "decision", None) == "poisoned"]
    assert len(poisoned) == 1 and "unknown kind 'noop'" in getattr(poisoned[0], "reason", "")


def test_a_host_sent_post_that_failed_is_not_sent_later_unbidden_and_its_retry_is(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    upload = submit_module._upload_payload
    failures = [through_the_port(ServiceResponseError("injected: the payload upload did not answer"))]

    def flaky_upload(*args: Any) -> None:
        if failures:
            raise failures.pop()
        upload(*args)

    monkeypatch.setattr(submit_module, "_upload_payload", flaky_upload)
    big = noop("h4", note="x" * 80_000)  # claim-checked: uploaded before the message is handed over
    status, _, out = post_hosted(big)
    assert status == 503 and out.value is None  # nothing for the host to send
    record = rt.ledger.get("h4")
    assert record is not None and not {"resend_at", "envelope"} & set(record.data)
    rt.clock = lambda: datetime.now(UTC) + timedelta(days=30)
    assert recovery.resend_unclaimed(rt).found == 0  # the caller was told 503: not run unbidden
    rt.clock = lambda: datetime.now(UTC)
    status, body, out = post_hosted(big)  # the same request: takes the send over, kept again
    assert status == 202 and body["claim_checked"] is True and out.value is not None
    record = rt.ledger.get("h4")
    assert record is not None and record.data["envelope"]["payload_ref"].startswith("h4/")
    assert record.data["envelope"]["created_at"] == record.data["created_at"]  # the first request's
    assert due_for_resend(rt, datetime.fromisoformat(record.data["resend_at"])) == ["h4.json"]
    process_message(message(out.value.encode()), rt)
    record = rt.ledger.get("h4")
    assert record is not None and record.status == "completed"
