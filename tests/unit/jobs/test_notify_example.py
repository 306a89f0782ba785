"""The second worked example of docs/handlers.md: the `notify` fan-out kind, tested on the handler
kit alone (no module of the app is imported here: the kit is the whole test surface)."""

from __future__ import annotations

import hashlib
import hmac
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.handlerkit import (
    EnvelopeError,
    JobRun,
    Receiver,
    Reply,
    assert_hidden,
    kit_runtime,
    run_handler,
    submit_job,
)

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "notify.py"
KEY = "notify-signing-key-5c2e"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("notify_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


notify = load_example()


def settings(receiver: Receiver) -> dict[str, str]:
    return {
        "NOTIFY_ALLOWED_HOSTS": receiver.allow,
        "NOTIFY_SECRET_SIGNING": KEY,
        "NOTIFY_SECRET_SIGNING_HOSTS": receiver.allow,
        "RETRY_BASE_SECONDS": "1",
    }


def run(receiver: Receiver, event: dict[str, Any], paths: list[str]) -> JobRun:
    payload = {"event": event, "subscribers": [receiver.url(p) for p in paths]}
    return run_handler(notify.NotifyHandler(), payload, kind="notify", **settings(receiver))


def signed(body: bytes) -> str:
    return "sha256=" + hmac.new(KEY.encode(), body, hashlib.sha256).hexdigest()


def test_a_partial_failure_calls_only_the_subscribers_not_yet_delivered(receiver: Receiver) -> None:
    receiver.route("/b", Reply(503, "busy"))
    job = run(receiver, {"order": 7}, ["/a", "/b", "/c"])
    assert job.status == "completed" and job.attempts == 2
    assert [len(receiver.to(p)) for p in ("/a", "/b", "/c")] == [1, 2, 1]
    first, second = receiver.to("/b")
    assert first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"]
    assert len({r.headers["Idempotency-Key"] for r in receiver.requests}) == 3  # one per subscriber
    assert all(r.headers["X-Signature"] == signed(r.body) for r in receiver.requests)


def test_an_edited_replay_calls_every_subscriber_again_with_new_keys(receiver: Receiver) -> None:
    receiver.route("/b", Reply(400, "unknown order"))
    job = run(receiver, {"order": 7}, ["/a", "/b", "/c"])
    assert job.status == "poisoned" and "HTTP 400" in job.reason and receiver.to("/c") == []
    assert job.archived() is not None
    before = {r.path: r.headers["Idempotency-Key"] for r in receiver.requests}

    job.edited_replay({"event": {"order": 8}, "subscribers": [receiver.url(p) for p in ("/a", "/b", "/c")]})
    assert job.status == "completed"
    assert [len(receiver.to(p)) for p in ("/a", "/b", "/c")] == [2, 2, 1]
    after = {p: receiver.to(p)[-1].headers["Idempotency-Key"] for p in ("/a", "/b")}
    assert after["/a"] != before["/a"] and after["/b"] != before["/b"]
    assert json.loads(receiver.to("/c")[0].body) == {"order": 8}


def test_a_plain_replay_keeps_the_keys_and_skips_the_delivered(receiver: Receiver) -> None:
    receiver.route("/b", Reply(400, "unknown order"))
    job = run(receiver, {"order": 7}, ["/a", "/b"])
    assert job.status == "poisoned"
    job.replay()
    assert job.status == "completed" and len(receiver.to("/a")) == 1
    first, second = receiver.to("/b")
    assert first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"]


def test_subscribers_are_checked_at_post(receiver: Receiver) -> None:
    kit = kit_runtime({"notify": notify.NotifyHandler()}, **settings(receiver))
    with pytest.raises(EnvelopeError, match="1 to 5"):
        submit_job(kit, "notify", {"event": {}, "subscribers": [receiver.url()] * 6})
    with pytest.raises(EnvelopeError, match=r"subscribers\[1\].*NOTIFY_ALLOWED_HOSTS"):
        submit_job(kit, "notify", {"event": {}, "subscribers": [receiver.url(), "https://10.0.0.7/hook"]})
    assert receiver.requests == []


def test_the_signing_key_is_never_stored(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    receiver.route("/a", Reply(503, f"bad key {KEY}"))
    job = run(receiver, {"order": 1}, ["/a"])
    assert job.status == "completed"
    assert_hidden(KEY, json.dumps(job.record), caplog.text)
