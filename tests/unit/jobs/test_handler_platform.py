"""The handler platform: idempotency keys, effects, the deadline, retry policy per kind, kind
settings; run as the app runs them, on the test kit (tests/handlerkit.py)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from shared.config.settings import Settings
from shared.core.backoff import RetryPolicy
from shared.core.envelope import parse_dict
from shared.core.errors import DownstreamUnavailable, PayloadError, SettingsError
from shared.core.setting_reader import SettingReader
from shared.interfaces.console import actions
from shared.jobs import registry
from shared.jobs.base import Completed, JobContext, Outcome, deadline_margin, idempotency_key
from shared.jobs.kinds import configure_kinds
from shared.ledger import Facts
from shared.ledger.operator import replayed
from shared.runtime.sending import send_job
from tests.handlerkit import Kit, drain, kit_runtime, run_handler, submit_job


class Recorder:
    """A kind that records what its context said, failing on purpose as its payload asks."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.effect_runs = 0

    def validate(self, payload: Mapping[str, Any]) -> None:
        if set(payload) - {"fail", "retry_after", "n"}:
            raise PayloadError(["payload: unknown field"])

    def run(self, ctx: JobContext) -> Outcome:
        def send() -> dict[str, Any]:
            self.effect_runs += 1
            return {"sent": self.effect_runs, "key": ctx.idempotency_key("send")}

        sent = ctx.effect("send", send)
        self.calls.append(
            {"key": ctx.idempotency_key(), "left": ctx.time_left(), "sent": sent, "attempt": ctx.attempt}
        )
        if ctx.attempt < int(ctx.payload.get("fail", 0)):
            raise DownstreamUnavailable("later", retry_after_s=ctx.payload.get("retry_after"))
        return Completed(result_ref="", summary={"sent": sent["sent"]})


def test_keys_are_deterministic_per_job_version_and_scope() -> None:
    key = idempotency_key("job-1", 0)
    assert key == idempotency_key("job-1", 0)
    assert (
        len({key, idempotency_key("job-1", 1), idempotency_key("job-2", 0), idempotency_key("job-1", 0, "b")})
        == 4
    )
    assert all(c in "0123456789abcdef-" for c in key) and len(key) == 36


def test_an_effect_runs_once_across_retries_and_its_key_stays() -> None:
    kind = Recorder()
    run = run_handler(kind, {"fail": 2}, RETRY_BASE_SECONDS="1")
    assert run.status == "completed" and run.attempts == 3
    assert kind.effect_runs == 1
    assert {c["key"] for c in kind.calls} == {idempotency_key(run.job_id, 0)}
    assert [c["sent"]["sent"] for c in kind.calls] == [1, 1, 1]
    effects = run.record["effects"]
    assert effects["send"]["version"] == 0 and effects["send"]["result"]["sent"] == 1
    assert "progress" not in run.record


def replay(kit: Kit, job_id: str) -> None:
    """A plain replay, as the poison operations do it."""
    record = kit.rt.ledger.get(job_id)
    assert record is not None
    body = json.loads(record.data["body"])
    env = parse_dict(body, kit.rt.handlers.keys()).with_attempt(0)
    kit.rt.ledger.write(job_id, record, lambda prev: replayed(prev, env, Facts(kit.rt.clock())))
    send_job(kit.rt, env)


def test_a_plain_replay_keeps_key_and_effects_an_edited_one_gets_new_ones() -> None:
    kind = Recorder()
    kit = kit_runtime({"rec": kind}, MAX_ATTEMPTS="1")
    job = submit_job(kit, "rec", {"fail": 1})
    drain(kit)
    assert kit.rt.ledger.get(job).status == "poisoned"  # type: ignore[union-attr]
    replay(kit, job)
    drain(kit)
    assert kit.rt.ledger.get(job).status == "poisoned"  # type: ignore[union-attr]
    assert kind.effect_runs == 1 and len({c["key"] for c in kind.calls}) == 1
    edited = json.dumps({"id": job, "kind": "rec", "payload": {"fail": 0, "n": 2}})
    actions.replay_edited(kit.rt, job, edited, "tester")
    drain(kit)
    record = kit.rt.ledger.get(job)
    assert record is not None and record.status == "completed"
    assert kind.effect_runs == 2
    assert kind.calls[-1]["key"] == idempotency_key(job, 1) != kind.calls[0]["key"]
    assert record.data["effects"]["send"]["version"] == 1


def test_the_deadline_is_function_timeout_less_a_margin() -> None:
    kind = Recorder()
    run = run_handler(kind, {})
    timeout = run.kit.rt.settings.function_timeout_s
    assert timeout == 600.0  # the shipped host.json
    assert deadline_margin(timeout) == 30.0
    assert timeout - 30.0 - 5.0 < kind.calls[0]["left"] <= timeout - 30.0


def test_retry_after_is_honoured_up_to_the_kinds_cap() -> None:
    run = run_handler(Recorder(), {"fail": 1, "retry_after": 15}, RETRY_BASE_SECONDS="1")
    assert run.retry_delays == [15] and run.waits[0] > 14
    capped = run_handler(Recorder(), {"fail": 1, "retry_after": 900}, kind="k", K_RETRY_MAX_SECONDS="20")
    assert capped.retry_delays == [20]
    policy = RetryPolicy(5, 2.0, 300.0)
    assert policy.delay(1, 15.0, rand=lambda: 0.0) == 15
    assert policy.delay(1, 900.0, rand=lambda: 0.0) == 300
    assert RetryPolicy(5, 2.0, 300.0, jitter=False).delay(3) == 8


def test_a_kinds_attempts_come_from_its_own_settings() -> None:
    run = run_handler(Recorder(), {"fail": 9}, kind="rec", REC_MAX_ATTEMPTS="2", RETRY_BASE_SECONDS="1")
    assert run.status == "poisoned" and run.attempts == 2
    assert "gave up after 2 attempts" in run.reason


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"REC_MAX_ATTEMPTS": "0"}, "REC_MAX_ATTEMPTS"),
        ({"REC_RETRY_BASE_SECONDS": "10", "REC_RETRY_MAX_SECONDS": "5"}, "REC_RETRY_MAX_SECONDS"),
        ({"REC_RETRY_JITTER": "maybe"}, "REC_RETRY_JITTER"),
        ({"HTTP_CONNECT_TIMEOUT_SECONDS": "soon"}, "HTTP_CONNECT_TIMEOUT_SECONDS"),
        ({"HTTP_FOLLOW_REDIRECTS": "yes"}, "HTTP_FOLLOW_REDIRECTS"),
    ],
)
def test_a_wrong_kind_setting_refuses_to_start_naming_it(env: dict[str, str], named: str) -> None:
    settings = Settings.from_env({"AzureWebJobsStorage": "UseDevelopmentStorage=true", **env})
    with pytest.raises(SettingsError, match=named):
        configure_kinds(settings, {**registry(), "rec": Recorder()})


class Configured:
    """A kind with typed settings of its own."""

    settings_prefix = "WEBHOOK_"

    def __init__(self, limit: int = 0) -> None:
        self.limit = limit

    def configure(self, reader: SettingReader, settings: Settings) -> Configured:
        return Configured(reader.integer("WEBHOOK_LIMIT", 3, 1))

    def validate(self, payload: Mapping[str, Any]) -> None:
        return None

    def run(self, ctx: JobContext) -> Outcome:
        return Completed(result_ref="", summary={"limit": self.limit})


def test_kind_settings_are_read_under_the_kinds_prefix() -> None:
    settings = Settings.from_env({"AzureWebJobsStorage": "UseDevelopmentStorage=true", "WEBHOOK_LIMIT": "7"})
    kinds = configure_kinds(settings, {"webhook": Configured()})
    assert kinds.handlers["webhook"].limit == 7  # type: ignore[attr-defined]
    assert kinds.retry["webhook"] == RetryPolicy(5, 2.0, 300.0)
    run = run_handler(Configured(), {}, kind="webhook", WEBHOOK_LIMIT="9")
    assert run.record["summary"] == {"limit": 9}


def test_the_default_kit_runtime_is_the_apps_registry() -> None:
    kit = kit_runtime()
    assert set(kit.rt.handlers) == set(registry())
    with pytest.raises(Exception, match="unknown"):
        submit_job(kit, "no-such-kind", {})


def test_the_app_refuses_to_start_on_a_wrong_kind_setting() -> None:
    """The runtime reads the kinds' settings as it is built (start-up), with the app's."""
    with pytest.raises(SettingsError, match="HTTP_MAX_ATTEMPTS=0 must be >= 1"):
        kit_runtime(HTTP_MAX_ATTEMPTS="0")
