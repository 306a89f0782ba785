"""Unit tests for the pure parts of devhost (no Azurite, no subprocess)."""

from __future__ import annotations

import base64
import json
import logging
import types
from datetime import UTC, datetime
from pathlib import Path

import azure.functions as func
import pytest
from azure.core.exceptions import HttpResponseError

from devhost import decisions
from devhost.config import (
    ConfigError,
    apply_settings,
    load_host_options,
    parse_duration,
    parse_timespan,
    queue_options_from,
    resolve_setting_refs,
)
from devhost.decisions import Action, Backoff, RenewOutcome, next_poll_delay
from devhost.http_server import compile_route, to_reply
from devhost.invoker import message_bodies
from devhost.loader import find_app, index_functions
from devhost.queue_ops import delete_message, release_message
from devhost.storage import (
    DEV_KEY,
    RequestCounter,
    expand_connection_string,
    resolve_queue_connection,
)
from devhost.timers import IntervalSchedule, parse_cron, parse_field, parse_schedule

# --- polling backoff --------------------------------------------------------------------------


def run_backoff(polls: list[bool], maximum: float, factor: float) -> list[float]:
    state, delays = Backoff(), []
    for found in polls:
        delay, state = next_poll_delay(state, found, maximum, lambda _a, _b: factor)
        delays.append(delay)
    return delays


def test_backoff_grows_exponentially_from_100ms_and_caps() -> None:
    delays = run_backoff([False] * 8, maximum=2.0, factor=1.0)
    # first delay ever is the minimum; then 100 ms + 2^(k-1) * 100 ms
    assert delays[:5] == pytest.approx([0.1, 0.2, 0.3, 0.5, 0.9])
    assert delays[5:] == pytest.approx([1.7, 2.0, 2.0])


@pytest.mark.parametrize("factor", [0.8, 1.0, 1.1999])
def test_backoff_randomization_range(factor: float) -> None:
    delays = run_backoff([False, False, False], maximum=60.0, factor=factor)
    assert delays[1] == pytest.approx(0.1 + factor * 0.1)
    assert delays[2] == pytest.approx(0.1 + factor * 0.2)


def test_backoff_uses_uniform_between_0_8_and_1_2() -> None:
    seen: list[tuple[float, float]] = []

    def uniform(a: float, b: float) -> float:
        seen.append((a, b))
        return a

    state = Backoff(0.1, 1)
    next_poll_delay(state, False, 2.0, uniform)
    assert seen == [(0.8, 1.2)]


def test_backoff_resets_after_messages_found() -> None:
    delays = run_backoff([False, False, False, False, True, False, False], maximum=2.0, factor=1.0)
    assert delays[4] == pytest.approx(0.1)  # found since last delay: back to the minimum
    assert delays[5:] == pytest.approx([0.2, 0.3])


def test_backoff_stays_at_cap() -> None:
    delays = run_backoff([False] * 30, maximum=1.0, factor=1.2)
    assert max(delays) == 1.0
    assert delays[-10:] == [1.0] * 10


# --- failure / poison decisions ---------------------------------------------------------------


def test_poison_queue_name() -> None:
    assert decisions.poison_queue_name("jobs") == "jobs-poison"
    assert decisions.poison_queue_name("jobs-poison") is None
    assert decisions.poison_queue_name("a" * 56) == "a" * 56 + "-poison"
    assert decisions.poison_queue_name("a" * 57) is None


@pytest.mark.parametrize(
    ("dequeue_count", "expected"),
    [(1, Action.RELEASE), (2, Action.RELEASE), (3, Action.POISON), (4, Action.POISON)],
)
def test_after_failure_with_poison_queue(dequeue_count: int, expected: Action) -> None:
    assert decisions.after_call(False, dequeue_count, 3, True) is expected


def test_after_call_success_deletes_and_no_poison_queue_leaves() -> None:
    assert decisions.after_call(True, 99, 3, True) is Action.DELETE
    assert decisions.after_call(True, 1, 3, False) is Action.DELETE
    assert decisions.after_call(False, 1, 3, False) is Action.LEAVE
    assert decisions.after_call(False, 3, 3, False) is Action.LEAVE


def test_before_call() -> None:
    assert decisions.before_call(3, 3, True) is Action.CALL
    assert decisions.before_call(4, 3, True) is Action.POISON
    assert decisions.before_call(4, 3, False) is Action.LEAVE


def test_decode_body() -> None:
    assert decisions.decode_body(base64.b64encode(b"hi there").decode(), "base64") == b"hi there"
    assert decisions.decode_body("aGkg\ndGhlcmU=", "base64") == b"hi there"  # whitespace ignored like .NET
    assert decisions.decode_body("not base64!", "base64") is None
    assert decisions.decode_body('{"a": 1}', "base64") is None
    assert decisions.decode_body("not base64!", "none") == b"not base64!"
    assert decisions.after_undecodable(True) is Action.POISON
    assert decisions.after_undecodable(False) is Action.LEAVE
    assert decisions.encode_body(b"x", "base64") == "eA=="


def test_error_classification() -> None:
    ignorable = decisions.is_ignorable_completion_error
    assert ignorable(400, "PopReceiptMismatch")
    assert ignorable(404, "MessageNotFound")
    assert ignorable(404, "QueueNotFound")
    assert ignorable(409, "QueueBeingDeleted")
    assert not ignorable(404, "ResourceNotFound")  # 404 alone is not enough: look at the code
    assert not ignorable(400, "InvalidQueryParameterValue")
    assert not ignorable(500, "InternalError")
    empty = decisions.is_empty_poll_error
    assert empty(404, "QueueNotFound") and empty(503, "ServerBusy") and empty(None, None)
    assert not empty(403, "AuthorizationFailure")


def test_renewal_interval() -> None:
    lease = 600.0
    nxt = decisions.next_renewal_interval
    assert nxt(300.0, RenewOutcome.OK, lease) == 300.0
    assert nxt(300.0, RenewOutcome.SERVER_ERROR, lease) == 150.0
    assert nxt(75.0, RenewOutcome.SERVER_ERROR, lease) == 60.0  # floor: lease / 10
    assert nxt(60.0, RenewOutcome.SERVER_ERROR, lease) == 60.0
    assert nxt(60.0, RenewOutcome.OK, lease) == 300.0
    assert nxt(300.0, RenewOutcome.LOST, lease) is None
    for status in (400, 404, 409):
        assert decisions.classify_renew_error(status) is RenewOutcome.LOST
    assert decisions.classify_renew_error(503) is RenewOutcome.SERVER_ERROR
    assert decisions.classify_renew_error(None) is RenewOutcome.SERVER_ERROR


# --- completion helpers against a fake client ----------------------------------------------------


def storage_error(status: int, code: str) -> HttpResponseError:
    exc = HttpResponseError(message=f"{status} {code}")
    exc.status_code = status
    # the storage SDK sets `error_code`; azure-core does not declare it
    exc.error_code = code  # type: ignore[attr-defined]
    return exc


class FakeQueue:
    queue_name = "fake"

    def __init__(self, exc: Exception | None) -> None:
        self.exc = exc

    def delete_message(self, _id: str, _receipt: str) -> None:
        if self.exc:
            raise self.exc

    def update_message(self, _id: str, _receipt: str, visibility_timeout: int) -> None:
        if self.exc:
            raise self.exc


def test_delete_ignores_by_error_code_and_raises_others() -> None:
    assert delete_message(FakeQueue(None), "m", "r") is True  # type: ignore[arg-type]
    for status, code in [(400, "PopReceiptMismatch"), (404, "MessageNotFound"), (409, "QueueBeingDeleted")]:
        assert delete_message(FakeQueue(storage_error(status, code)), "m", "r") is False  # type: ignore[arg-type]
    with pytest.raises(HttpResponseError):
        delete_message(FakeQueue(storage_error(403, "AuthorizationFailure")), "m", "r")  # type: ignore[arg-type]
    with pytest.raises(HttpResponseError):
        delete_message(FakeQueue(storage_error(404, "ContainerNotFound")), "m", "r")  # type: ignore[arg-type]
    assert release_message(FakeQueue(storage_error(404, "MessageNotFound")), "m", "r", 2) is False  # type: ignore[arg-type]


# --- config -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("00:00:02", 2.0),
        ("00:10:00", 600.0),
        ("01:02:03", 3723.0),
        ("1.00:00:00", 86400.0),
        ("2.03:04:05.5", 2 * 86400 + 3 * 3600 + 4 * 60 + 5.5),
        ("00:00:00.250", 0.25),
        ("00:05", 300.0),
        ("3", 3 * 86400.0),
        ("-00:00:01", -1.0),
    ],
)
def test_parse_timespan(text: str, seconds: float) -> None:
    assert parse_timespan(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["abc", "1:2:3:4", "00:61:00", "", "10s"])
def test_parse_timespan_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_timespan(text)


def test_parse_duration_numbers_are_milliseconds() -> None:
    assert parse_duration(2000) == 2.0
    assert parse_duration("1500") == 1.5
    assert parse_duration("00:00:01") == 1.0


def test_queue_option_defaults() -> None:
    dev = queue_options_from(None, development=True, cpu_count=4)
    assert (dev.batch_size, dev.new_batch_threshold, dev.max_dequeue_count) == (16, 32, 5)
    assert dev.max_polling_interval == 2.0
    assert dev.visibility_timeout == 0.0
    assert dev.message_encoding == "base64"
    assert dev.max_in_flight == 48
    prod = queue_options_from({"BatchSize": 5}, development=False, cpu_count=1)
    assert (prod.batch_size, prod.new_batch_threshold, prod.max_polling_interval) == (5, 2, 60.0)
    with pytest.raises(ConfigError):
        queue_options_from({"batchSize": 33}, development=True, cpu_count=1)
    with pytest.raises(ConfigError):
        queue_options_from({"maxPollingInterval": 50}, development=True, cpu_count=1)
    with pytest.raises(ConfigError):
        queue_options_from({"messageEncoding": "utf8"}, development=True, cpu_count=1)


def test_load_host_options(tmp_path: Path) -> None:
    (tmp_path / "host.json").write_text(
        json.dumps(
            {
                "functionTimeout": "00:05:00",
                "logging": {"logLevel": {"default": "Warning"}},
                "extensions": {"queues": {"visibilityTimeout": "00:00:30", "newBatchThreshold": 0}},
            }
        )
    )
    opts = load_host_options(tmp_path, {"DEVHOST_MESSAGE_LEASE_SECONDS": "4"}, cpu_count=2)
    assert opts.function_timeout == 300.0
    assert opts.log_level == logging.WARNING
    assert opts.queues.visibility_timeout == 30.0
    assert opts.queues.new_batch_threshold == 0
    assert opts.lease_seconds == 4.0
    assert opts.route_prefix == "api"
    defaults = load_host_options(tmp_path / "missing", {}, cpu_count=1)
    assert defaults.lease_seconds == 600.0
    assert defaults.function_timeout == 1800.0


def test_apply_settings_existing_env_wins() -> None:
    env = {"A": "from-env"}
    applied = apply_settings({"A": "from-file", "B": "b"}, env)
    assert env == {"A": "from-env", "B": "b", "AZURE_FUNCTIONS_ENVIRONMENT": "Development"}
    assert applied == ["B"]


def test_resolve_setting_refs() -> None:
    assert resolve_setting_refs("%Q%-x", {"Q": "jobs"}, "f") == "jobs-x"
    assert resolve_setting_refs("plain", {}, "f") == "plain"
    with pytest.raises(ConfigError, match="'MISSING'"):
        resolve_setting_refs("%MISSING%", {}, "function f")


# --- storage connections and counting ------------------------------------------------------------


def test_connection_resolution() -> None:
    dev = resolve_queue_connection(None, {"AzureWebJobsStorage": "UseDevelopmentStorage=true"})
    assert dev.connection_string is not None
    assert "QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1" in dev.connection_string
    assert DEV_KEY in dev.connection_string
    ident = resolve_queue_connection("Store", {"Store__accountName": "acct"})
    assert ident.service_uri == "https://acct.queue.core.windows.net"
    uri = resolve_queue_connection("Store", {"AzureWebJobsStore__queueServiceUri": "https://x.example/"})
    assert uri.service_uri == "https://x.example/"
    with pytest.raises(ConfigError, match="AzureWebJobsStorage"):
        resolve_queue_connection("AzureWebJobsStorage", {})
    assert expand_connection_string("AccountName=a;AccountKey=b") == "AccountName=a;AccountKey=b"


def test_request_counter_classifies_endpoints() -> None:
    conn = "AccountName=a;AccountKey=k;BlobEndpoint=http://127.0.0.1:4000/a;QueueEndpoint=http://127.0.0.1:4001/a;"
    counter = RequestCounter({"AzureWebJobsStorage": conn})
    counter.record("GET", "http://127.0.0.1:4001/a/q/messages")
    counter.record("put", "http://127.0.0.1:4000/a/c/b")
    counter.record("GET", "https://acct.queue.core.windows.net/q/messages")
    counter.record("GET", "http://elsewhere/")
    snap = counter.snapshot()
    assert snap["total"] == 4
    assert snap["queue"] == {"GET": 2, "total": 2}
    assert snap["blob"] == {"PUT": 1, "total": 1}
    assert snap["other"]["total"] == 1


# --- cron -------------------------------------------------------------------------------------


def test_parse_field() -> None:
    assert parse_field("*", 0, 5) == frozenset(range(6))
    assert parse_field("*/15", 0, 59) == frozenset({0, 15, 30, 45})
    assert parse_field("1,3,5", 0, 59) == frozenset({1, 3, 5})
    assert parse_field("10-12", 0, 59) == frozenset({10, 11, 12})
    assert parse_field("0-30/10", 0, 59) == frozenset({0, 10, 20, 30})
    assert parse_field("5/20", 0, 59) == frozenset({5, 25, 45})
    for bad in ("60", "a", "*/0", "5-1"):
        with pytest.raises(ConfigError):
            parse_field(bad, 0, 59)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_cron_next_occurrence() -> None:
    every5s = parse_cron("*/5 * * * * *")
    assert every5s.next_after(at("2024-01-01T00:00:00")) == at("2024-01-01T00:00:05")
    assert every5s.next_after(at("2024-01-01T00:00:04.9")) == at("2024-01-01T00:00:05")
    hourly = parse_cron("0 0 * * * *")
    assert hourly.next_after(at("2024-01-01T10:00:00")) == at("2024-01-01T11:00:00")
    weekdays_9_30 = parse_cron("0 30 9 * * 1-5")
    assert weekdays_9_30.next_after(at("2024-01-05T10:00:00")) == at("2024-01-08T09:30:00")  # Fri -> Mon
    sunday = parse_cron("0 0 12 * * 7")
    assert sunday.next_after(at("2024-01-01T00:00:00")) == at("2024-01-07T12:00:00")
    yearly = parse_cron("0 0 0 1 1 *")
    assert yearly.next_after(at("2024-06-15T00:00:00")) == at("2025-01-01T00:00:00")
    leap = parse_cron("0 0 0 29 2 *")
    assert leap.next_after(at("2024-03-01T00:00:00")) == at("2028-02-29T00:00:00")
    with pytest.raises(ConfigError):
        parse_cron("*/5 * * * *")  # 5 fields: NCRONTAB here needs seconds


def test_timespan_schedule() -> None:
    sched = parse_schedule("00:00:30")
    assert isinstance(sched, IntervalSchedule)
    assert sched.next_after(at("2024-01-01T00:00:00")) == at("2024-01-01T00:00:30")


# --- HTTP routing -----------------------------------------------------------------------------


def test_compile_route() -> None:
    result = compile_route("jobs/{id}/result")
    assert result.match("jobs/42/result") == {"id": "42"}
    assert result.match("JOBS/42/result/") == {"id": "42"}
    assert result.match("jobs/42") is None
    typed = compile_route("items/{n:int}")
    assert typed.match("items/7") == {"n": "7"}
    assert typed.match("items/x") is None
    optional = compile_route("files/{name?}")
    assert optional.match("files") == {}
    assert optional.match("files/a.txt") == {"name": "a.txt"}
    catch_all = compile_route("static/{*path}")
    assert catch_all.match("static/a/b/c") == {"path": "a/b/c"}
    dashed = compile_route("runs/{run-id}")
    assert dashed.match("runs/r1") == {"run-id": "r1"}
    assert compile_route("jobs/stats").precedence < compile_route("jobs/{id}").precedence


def test_to_reply() -> None:
    reply = to_reply(
        func.HttpResponse("x", status_code=201, headers={"X-A": "1"}, mimetype="application/json")
    )
    assert reply.status == 201 and reply.body == b"x"
    assert reply.headers["Content-Type"].startswith("application/json")
    assert to_reply("hi").status == 200
    assert to_reply(None).status == 204
    with pytest.raises(TypeError):
        to_reply({"a": 1})


def test_message_bodies() -> None:
    assert message_bodies("a") == [b"a"]
    assert message_bodies([b"a", "b"]) == [b"a", b"b"]
    assert message_bodies(None) == []
    with pytest.raises(TypeError):
        message_bodies(3)


# --- loader -----------------------------------------------------------------------------------


def test_find_app_requires_exactly_one() -> None:
    module = types.ModuleType("function_app")
    with pytest.raises(ConfigError, match=r"no azure.functions.FunctionApp instance"):
        find_app(module)
    module.app = func.FunctionApp()  # type: ignore[attr-defined]
    module.alias = module.app  # type: ignore[attr-defined]
    assert find_app(module) is module.app
    module.other = func.FunctionApp()  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="2 FunctionApp instances"):
        find_app(module)


def test_index_functions() -> None:
    app = func.FunctionApp()

    @app.queue_trigger(arg_name="msg", queue_name="%Q%", connection="AzureWebJobsStorage")
    def process_job(msg: func.QueueMessage) -> None:
        pass

    @app.route(route="jobs/{id}", methods=["GET"])
    async def get_job(req: func.HttpRequest) -> func.HttpResponse:
        return func.HttpResponse("x")

    specs = index_functions(app)
    assert [(s.name, s.kind, s.is_async) for s in specs] == [
        ("process_job", "queue", False),
        ("get_job", "http", True),
    ]
    assert specs[0].trigger.get("queueName") == "%Q%"
    assert specs[1].trigger.get("route") == "jobs/{id}"
    with pytest.raises(ValueError):
        app.get_functions()  # once only: indexing again raises in azure-functions itself


def test_index_functions_rejects_unsupported_bindings() -> None:
    app = func.FunctionApp()

    @app.queue_trigger(arg_name="msg", queue_name="q", connection="AzureWebJobsStorage")
    @app.blob_input(arg_name="blob", path="c/b", connection="AzureWebJobsStorage")
    def with_blob(msg: func.QueueMessage, blob: bytes) -> None:
        pass

    with pytest.raises(ConfigError, match="blob"):
        index_functions(app)
