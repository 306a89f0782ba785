"""The `http` kind (the Async Caller) on the test kit: a real loopback receiver, the in-memory
account, the app's registry and retry path."""

from __future__ import annotations

import json
import logging

import pytest

from shared.core.errors import EnvelopeError
from shared.jobs.base import idempotency_key
from shared.jobs.http import HttpHandler
from shared.jobs.http_payload import client_wait_s
from shared.net.guard import Guard
from tests.handlerkit import (
    JobRun,
    Receiver,
    Reply,
    allowing,
    assert_hidden,
    assert_sent,
    drain,
    kit_runtime,
    submit_job,
)

ALLOW = {"RETRY_BASE_SECONDS": "1"}


def run_http(payload: dict[str, object], **settings: str) -> JobRun:
    secrets = [name for name in settings if name.startswith("HTTP_SECRET_")]
    kit = kit_runtime(**{**ALLOW, **allowing(str(payload["url"]), *secrets), **settings})
    job = submit_job(kit, "http", payload)
    return JobRun(kit, job, drain(kit))


def test_503_503_200_completes_after_three_calls_carrying_one_key(receiver: Receiver) -> None:
    receiver.reply(Reply(503, "busy"), Reply(503, "busy"), Reply(200, {"done": True}, {"X-Request-Id": "r1"}))
    run = run_http({"url": receiver.url(), "body": {"order": 7}})
    assert run.status == "completed"
    assert len(receiver.requests) == 3
    assert {r.headers["Idempotency-Key"] for r in receiver.requests} == {idempotency_key(run.job_id, 0)}
    assert all(r.method == "POST" and json.loads(r.body) == {"order": 7} for r in receiver.requests)
    result = run.result()
    assert result["status"] == 200 and result["body"] == {"done": True} and result["attempts"] == 3
    assert result["headers"]["x-request-id"] == "r1" and result["duration_s"] >= 0
    assert len(run.retry_delays) == 2  # each attempt's downstream status is in the history's errors
    errors = [h.get("error", "") for h in run.record["history"] if h["event"] == "retry_scheduled"]
    assert all("HTTP 503" in e for e in errors)


def test_a_4xx_is_poisoned_at_once_naming_the_status_and_the_answer(receiver: Receiver) -> None:
    receiver.reply(Reply(400, "field 'amount' is missing"))
    run = run_http({"url": receiver.url(), "method": "PUT", "body": "plain text"})
    assert run.status == "poisoned" and len(receiver.requests) == 1
    assert "HTTP 400" in run.reason and "field 'amount' is missing" in run.reason
    assert run.record["reason_code"] == "downstream_rejected"
    assert receiver.requests[0].body == b"plain text"


def test_429_retry_after_delays_the_next_call(receiver: Receiver) -> None:
    receiver.reply(Reply(429, headers={"Retry-After": "15"}))
    run = run_http({"url": receiver.url()})
    assert run.status == "completed" and len(receiver.requests) == 2
    assert run.retry_delays[0] >= 15


def test_a_call_past_its_wait_is_retried_with_the_same_key(receiver: Receiver) -> None:
    """timeout_seconds 0.5: the client waits 3 s (at least 2 s more), the first answer takes 4."""
    receiver.reply(Reply(200, "late", delay_s=4.0))
    run = run_http({"url": receiver.url(), "timeout_seconds": 0.5})
    assert run.status == "completed" and len(receiver.requests) == 2
    assert len({r.headers["Idempotency-Key"] for r in receiver.requests}) == 1
    assert "no answer within 3s" in run.record["history"][-4].get("error", "") or any(
        "no answer within" in h.get("error", "") for h in run.record["history"]
    )


@pytest.mark.parametrize(
    "url",
    [
        "https://169.254.169.254/metadata",
        "https://10.0.0.8/x",
        "https://192.168.1.1/x",
        "http://example.com/x",
    ],
)
def test_a_literal_bad_destination_is_refused_at_post(url: str) -> None:
    kit = kit_runtime()
    with pytest.raises(EnvelopeError, match=r"payload\.url"):
        submit_job(kit, "http", {"url": url})


def test_unlisted_loopback_is_refused_and_never_called(receiver: Receiver) -> None:
    kit = kit_runtime()  # no HTTP_ALLOWED_HOSTS
    with pytest.raises(EnvelopeError, match="http:// is allowed only"):
        submit_job(kit, "http", {"url": receiver.url()})
    with pytest.raises(EnvelopeError, match="loopback"):
        submit_job(kit, "http", {"url": f"https://127.0.0.1:{receiver.port}/hook"})
    assert receiver.requests == []


def test_a_name_resolving_to_a_private_address_is_poisoned_without_connecting(receiver: Receiver) -> None:
    guard = Guard(resolver=lambda host, port: ["127.0.0.1"])
    kit = kit_runtime({"http": HttpHandler(resolver=guard.resolver)})
    job = submit_job(kit, "http", {"url": f"https://partner.example:{receiver.port}/hook"})
    run = JobRun(kit, job, drain(kit))
    assert run.status == "poisoned" and run.record["reason_code"] == "destination_refused"
    assert "resolves to loopback address 127.0.0.1" in run.reason
    assert receiver.requests == []


def test_a_secret_header_is_sent_and_never_shown(
    receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "s3cr3t-Value-0123456789"
    caplog.set_level(logging.DEBUG)
    receiver.reply(Reply(503, "busy"), Reply(200, {"echo": "ok"}))
    run = run_http(
        {"url": receiver.url(), "headers": {"Authorization": {"secret": "HTTP_SECRET_PARTNER"}, "X-A": "b"}},
        HTTP_SECRET_PARTNER=secret,
    )
    assert run.status == "completed"
    assert len(receiver.requests) == 2
    assert_sent(secret, [r.headers["Authorization"] for r in receiver.requests])
    assert receiver.requests[0].headers["X-A"] == "b"
    stored = json.dumps(run.record) + json.dumps(run.result())
    assert_hidden(secret, stored, caplog.text)
    for blobs in run.kit.account.containers.values():
        assert all(secret.encode() not in blob.data for blob in blobs.blobs.values())


def test_a_secret_naming_any_other_setting_is_refused() -> None:
    kit = kit_runtime(**ALLOW)
    with pytest.raises(EnvelopeError, match="HTTP_SECRET_"):
        submit_job(
            kit, "http", {"url": "https://example.com/", "headers": {"A": {"secret": "AzureWebJobsStorage"}}}
        )


def test_an_unset_secret_poisons_naming_the_setting(receiver: Receiver) -> None:
    run = run_http(
        {"url": receiver.url(), "headers": {"A": {"secret": "HTTP_SECRET_MISSING"}}},
        HTTP_SECRET_MISSING_HOSTS=receiver.allow,  # its destinations are set, its value is not
    )
    assert run.status == "poisoned" and "HTTP_SECRET_MISSING is not set" in run.reason
    assert receiver.requests == []


def test_a_timeout_that_cannot_fit_in_function_timeout_is_refused_at_post() -> None:
    kit = kit_runtime(**ALLOW)
    assert kit.rt.settings.function_timeout_s == 600.0  # shipped host.json
    with pytest.raises(EnvelopeError, match="cannot fit"):
        submit_job(kit, "http", {"url": "https://example.com/", "timeout_seconds": 500})
    submit_job(kit, "http", {"url": "https://example.com/", "timeout_seconds": 400})
    assert client_wait_s(100) == 120 and client_wait_s(1) == 3


def test_a_large_body_is_kept_in_a_blob_beside_the_result(receiver: Receiver) -> None:
    receiver.reply(Reply(200, "x" * 5000))
    run = run_http({"url": receiver.url(), "method": "GET"}, HTTP_INLINE_BODY_BYTES="1000")
    result = run.result()
    assert "body" not in result and result["body_bytes"] == 5000
    assert run.blob(result["body_ref"]) == b"x" * 5000


def test_the_happy_path_takes_four_storage_requests_a_job(receiver: Receiver) -> None:
    """claim, result, complete and the jobs index's entry; the queue's receive and delete are
    the host's. The envelope goes straight onto the queue, as a producer that sends its own does."""
    from shared.core.envelope import parse_dict
    from shared.runtime.sending import send_job

    kit = kit_runtime(**ALLOW)
    for job in ("warm-up", "happy-1"):  # the first job of a day also creates the index's table
        body = {"id": job, "kind": "http", "payload": {"url": receiver.url()}}
        send_job(kit.rt, parse_dict(body, kit.rt.handlers.keys()))
        before = len(kit.account.requests)
        drain(kit)
    storage = [r for r in kit.account.requests[before:] if "/messages" not in r]
    assert len(storage) == 4, storage


def test_every_payload_problem_is_listed_at_once() -> None:
    from shared.core.errors import PayloadError
    from shared.jobs.http_payload import HttpKindSettings, parse_call

    payload = {
        "url": "ftp://x",
        "method": "TRACE",
        "headers": {"Idempotency-Key": "mine", "Bad Name": "v", "X": {"secret": "lower"}, "Y": 5},
        "timeout_seconds": 0,
        "extra": 1,
    }
    with pytest.raises(PayloadError) as failed:
        parse_call(payload, HttpKindSettings())
    text = "; ".join(failed.value.problems)
    for expected in (
        "payload.extra: unknown field",
        "payload.url: only http(s)",
        "payload.method",
        "Idempotency-Key: set by the app",
        "not a header name",
        "secret must name an app setting HTTP_SECRET_",
        'payload.headers.Y: a string, or {"secret"',
        "payload.timeout_seconds: a number",
    ):
        assert expected in text, (expected, text)
