"""The worked example of docs/handlers.md: the `webhook` kind, tested on the handler test kit."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from shared.config.settings import Settings
from shared.core.errors import EnvelopeError, SettingsError
from shared.jobs.kinds import configure_kinds
from tests.handlerkit import Receiver, Reply, kit_runtime, run_handler, submit_job

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "webhook.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("webhook_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


webhook = load_example()
ALLOW = {"RETRY_BASE_SECONDS": "1"}


def run(receiver: Receiver, body: Any = None) -> Any:
    payload = {"url": receiver.url(), "body": body or {"event": "paid"}}
    allow = {"WEBHOOK_ALLOWED_HOSTS": receiver.allow}
    return run_handler(webhook.WebhookHandler(), payload, kind="webhook", **ALLOW, **allow)


def test_a_5xx_is_retried_with_the_same_key_then_the_answer_is_the_result(receiver: Receiver) -> None:
    receiver.reply(Reply(503, "busy"), Reply(200, "thanks"))
    job = run(receiver)
    assert job.status == "completed" and job.attempts == 2
    assert len({r.headers["Idempotency-Key"] for r in receiver.requests}) == 1
    assert job.result() == {"status": 200, "answer": "thanks"}
    assert job.record["effects"]["post"]["result"]["status"] == 200


def test_a_4xx_is_poisoned_at_once_with_the_status_in_the_reason(receiver: Receiver) -> None:
    receiver.reply(Reply(422, "amount missing"))
    job = run(receiver)
    assert job.status == "poisoned" and len(receiver.requests) == 1
    assert "HTTP 422" in job.reason and "amount missing" in job.reason


def test_retry_after_is_honoured(receiver: Receiver) -> None:
    receiver.reply(Reply(429, headers={"Retry-After": "20"}))
    job = run(receiver)
    assert job.status == "completed" and job.retry_delays == [20]


def test_an_address_it_may_not_call_is_refused_at_post(receiver: Receiver) -> None:
    kit = kit_runtime({"webhook": webhook.WebhookHandler()})  # no WEBHOOK_ALLOWED_HOSTS
    with pytest.raises(EnvelopeError, match="http:// is allowed only"):
        submit_job(kit, "webhook", {"url": receiver.url()})
    with pytest.raises(EnvelopeError, match="link-local"):
        submit_job(kit, "webhook", {"url": "https://169.254.169.254/latest/meta-data"})
    assert receiver.requests == []


def test_a_wrong_setting_refuses_to_start_naming_it() -> None:
    settings = Settings.from_env(
        {"AzureWebJobsStorage": "UseDevelopmentStorage=true", "WEBHOOK_TIMEOUT_SECONDS": "0"}
    )
    with pytest.raises(SettingsError, match="WEBHOOK_TIMEOUT_SECONDS"):
        configure_kinds(settings, {"webhook": webhook.WebhookHandler()})
