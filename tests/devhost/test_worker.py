"""The worker process and its supervisor: pure parts, and a real worker on a tiny app (no Azurite)."""

from __future__ import annotations

import io
import os
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import azure.functions as func
import pytest
from azure.storage.queue import QueueMessage

from devhost.config import ConfigError, format_timespan, sync_thread_count
from devhost.ipc import (
    Channel,
    FunctionError,
    FunctionTimeout,
    Outcome,
    WorkerGone,
    error_text,
    failure_details,
    outcome_from,
)
from devhost.loader import index_functions, spec_from_description
from devhost.queue_listener import queue_payload
from devhost.stats import Stats
from devhost.storage import RequestCounter
from devhost.supervisor import Worker, WorkerStartError, describe_exit
from devhost.worker import Runner, build_trigger

# --- settings and small helpers ----------------------------------------------------------------


def test_sync_thread_count_default_and_setting() -> None:
    assert sync_thread_count({}, cpu_count=2) == 6  # min(32, cpus + 4)
    assert sync_thread_count({}, cpu_count=64) == 32
    assert sync_thread_count({"PYTHON_THREADPOOL_THREAD_COUNT": ""}, cpu_count=1) == 5
    assert sync_thread_count({"PYTHON_THREADPOOL_THREAD_COUNT": " 24 "}, cpu_count=2) == 24
    assert sync_thread_count({"PYTHON_THREADPOOL_THREAD_COUNT": "1"}, cpu_count=2) == 1


@pytest.mark.parametrize("raw", ["0", "-3", "two", "1.5"])
def test_sync_thread_count_rejects(raw: str) -> None:
    with pytest.raises(ConfigError, match="PYTHON_THREADPOOL_THREAD_COUNT must be a positive integer"):
        sync_thread_count({"PYTHON_THREADPOOL_THREAD_COUNT": raw})


def test_format_timespan() -> None:
    assert format_timespan(2) == "00:00:02"
    assert format_timespan(600) == "00:10:00"
    assert format_timespan(90061) == "1.01:01:01"
    assert format_timespan(1.5) == "00:00:01.5000000"


def test_describe_exit() -> None:
    assert describe_exit(3) == "exit code 3"
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(None) == "still running"


def test_request_counter_take_and_add() -> None:
    worker_side = RequestCounter({})
    worker_side.record("put", "http://acct.blob.core.windows.net/c/b")
    worker_side.record("GET", "http://acct.queue.core.windows.net/q/messages")
    taken = worker_side.take()
    assert taken == {"blob": {"PUT": 1}, "queue": {"GET": 1}}
    assert worker_side.take() == {}
    host_side = RequestCounter({})
    host_side.record("GET", "http://acct.queue.core.windows.net/q/messages")
    host_side.add(taken)
    assert host_side.snapshot()["queue"] == {"GET": 2, "total": 2}
    assert host_side.snapshot()["total"] == 3


def test_stats_provider() -> None:
    stats = Stats("i-1")
    stats.provide("worker", lambda: {"pid": 7})
    assert stats.snapshot()["worker"] == {"pid": 7}


# --- the pipe ----------------------------------------------------------------------------------


def test_channel_round_trip_and_eof() -> None:
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as reader, os.fdopen(write_fd, "wb") as writer:
        channel = Channel(reader, writer)
        message = ("invoke", 1, "f", "id-1", ("m", b"\x00body", 2, None))
        channel.send(message)
        channel.send(("done", 1, ("ok", {}, None), None))
        assert channel.recv() == message
        assert channel.recv()[0] == "done"
        channel.close_writer()
        with pytest.raises(EOFError):
            channel.recv()


def test_channel_partial_frame_is_eof() -> None:
    channel = Channel(io.BytesIO(b"\x00\x00\x00\x10abc"), io.BytesIO())
    with pytest.raises(EOFError):
        channel.recv()


def test_outcome_from() -> None:
    ok = outcome_from(("ok", {"out": [b"a"]}, (201, {"X": "1"}, b"b")))
    assert ok == Outcome({"out": [b"a"]}, (201, {"X": "1"}, b"b"))
    with pytest.raises(FunctionError) as caught:
        outcome_from(("error", "ValueError", "bad", "Traceback ..."))
    assert caught.value.type_name == "ValueError" and str(caught.value) == "ValueError: bad"
    assert failure_details(caught.value) == "\nTraceback ..."
    assert error_text(KeyError("k")) == "KeyError: 'k'"
    assert "KeyError" in failure_details(KeyError("k"))


# --- trigger objects built in the worker -------------------------------------------------------


def test_queue_payload_to_function_message() -> None:
    message = QueueMessage(content="aGk=")
    message.id = "m-1"
    message.dequeue_count = 2
    message.pop_receipt = "pr"
    message.inserted_on = datetime(2025, 1, 2, 3, 4, 5)  # naive from the SDK: UTC
    message.expires_on = datetime(2025, 1, 9, 3, 4, 5, tzinfo=UTC)
    message.next_visible_on = None
    built = build_trigger("queue", queue_payload(message, b"hi"))
    assert isinstance(built, func.QueueMessage)
    assert (built.id, built.dequeue_count, built.pop_receipt, built.get_body()) == ("m-1", 2, "pr", b"hi")
    assert built.insertion_time == datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert built.expiration_time is not None and built.expiration_time.tzinfo is not None


def test_http_and_timer_triggers() -> None:
    req = build_trigger("http", ("POST", "http://h/api/x?a=1", {"h": "v"}, {"a": "1"}, {"id": "7"}, b"{}"))
    assert isinstance(req, func.HttpRequest)
    assert (req.method, req.params["a"], req.route_params["id"], req.get_body()) == ("POST", "1", "7", b"{}")
    timer = build_trigger("timer", (True, {"Last": None}, {"AdjustForDST": True}))
    assert timer.past_due is True


# --- the runner (in this process) --------------------------------------------------------------


class FakeChannel:
    def __init__(self) -> None:
        self.sent: dict[int, tuple[Any, ...]] = {}
        self.cond = threading.Condition()

    def send(self, message: tuple[Any, ...]) -> None:
        with self.cond:
            self.sent[message[1]] = message[2]
            self.cond.notify_all()

    def wait(self, count: int) -> dict[int, tuple[Any, ...]]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.sent) >= count, timeout=10)
            return dict(self.sent)


def make_app() -> func.FunctionApp:
    """A fresh app each time: get_functions() may run once per app."""
    app = func.FunctionApp()

    @app.queue_trigger(arg_name="msg", queue_name="q", connection="AzureWebJobsStorage")
    @app.queue_output(arg_name="out", queue_name="next", connection="AzureWebJobsStorage")
    def relay(msg: func.QueueMessage, out: func.Out[list[str]]) -> None:
        if msg.get_body() == b"fail":
            raise RuntimeError("asked to fail")
        out.set(["a", "b"])

    @app.route(route="r", methods=["GET"])
    async def hello(req: func.HttpRequest) -> func.HttpResponse:
        return func.HttpResponse("hi " + req.params["n"], status_code=201, mimetype="text/plain")

    return app


def test_spec_description_round_trip() -> None:
    specs = [spec_from_description(s.describe()) for s in index_functions(make_app())]
    assert [(s.name, s.kind, s.is_async, s.func) for s in specs] == [
        ("relay", "queue", False, None),
        ("hello", "http", True, None),
    ]
    assert specs[0].trigger.get("queueName") == "q"
    assert [(b.type, b.name) for b in specs[0].outputs] == [("queue", "out")]


def test_runner_sync_async_outputs_and_errors(tmp_path: Path) -> None:
    channel = FakeChannel()
    runner = Runner(index_functions(make_app()), 1, channel, tmp_path, None)  # type: ignore[arg-type]
    runner.dispatch(("invoke", 1, "relay", "i-1", ("id", b"ok", 1, None, None, None, "pr")))
    runner.dispatch(("invoke", 2, "relay", "i-2", ("id", b"fail", 1, None, None, None, "pr")))
    runner.dispatch(("invoke", 3, "hello", "i-3", ("GET", "http://h/api/r?n=x", {}, {"n": "x"}, {}, b"")))
    runner.dispatch(("invoke", 4, "nope", "i-4", ()))
    sent = channel.wait(4)
    assert sent[1] == ("ok", {"out": [b"a", b"b"]}, None)
    assert sent[2][:3] == ("error", "RuntimeError", "asked to fail") and "asked to fail" in sent[2][3]
    status, headers, body = sent[3][2]
    assert (status, body, sent[3][1]) == (201, b"hi x", {})
    assert headers["Content-Type"].startswith("text/plain")
    assert sent[4][:2] == ("error", "LookupError")


# --- the supervisor with a real worker process -------------------------------------------------

TINY_APP = """
import os, time
import azure.functions as func

app = func.FunctionApp()

@app.route(route="sleep", methods=["GET"])
def sleep(req: func.HttpRequest) -> func.HttpResponse:
    time.sleep(float(req.params["s"]))
    if req.params.get("mark"):
        open(req.params["mark"], "w").close()
    return func.HttpResponse(str(os.getpid()))

@app.route(route="die", methods=["GET"])
def die(req: func.HttpRequest) -> func.HttpResponse:
    os._exit(5)
"""


def http(path: str, **params: str) -> tuple[Any, ...]:
    return ("GET", f"http://h/api/{path}", {}, params, {}, b"")


def test_supervisor_restarts_on_timeout_and_on_crash(tmp_path: Path) -> None:
    (tmp_path / "function_app.py").write_text(TINY_APP)
    worker = Worker(tmp_path, 4, 2.0, "unit", 20)
    try:
        assert [s.name for s in worker.start()] == ["sleep", "die"]
        first = worker.invoke("sleep", "a", http("sleep", s="0")).http
        assert first is not None and first[:2] == (200, {"Content-Type": "text/plain; charset=utf-8"})
        assert int(first[2]) == worker.snapshot()["pid"]
        results: dict[str, BaseException | Outcome] = {}

        def call(name: str, payload: tuple[Any, ...]) -> None:
            try:
                results[name] = worker.invoke("sleep", name, payload)
            except BaseException as exc:
                results[name] = exc

        # "slow" passes its 2 s timeout at t=2; "other" (t=1 to 2.5) is in flight then, within its own.
        late = tmp_path / "late-write"
        slow = threading.Thread(target=call, args=("slow", http("sleep", s="3", mark=str(late))))
        other = threading.Thread(target=call, args=("other", http("sleep", s="1.5")))
        slow_started = time.monotonic()
        slow.start()
        time.sleep(1.0)
        other.start()
        slow.join(10)
        other.join(10)
        assert isinstance(results["slow"], FunctionTimeout)
        assert isinstance(results["other"], WorkerGone)
        second = worker.invoke("sleep", "b", http("sleep", s="0")).http  # waits for the new worker
        assert second is not None and second[2] != first[2]
        with pytest.raises(WorkerGone, match="exit code 5"):
            worker.invoke("die", "d", http("die"))
        third = worker.invoke("sleep", "c", http("sleep", s="0")).http
        assert third is not None and third[2] not in (first[2], second[2])
        snap = worker.snapshot()
        assert (snap["restarts"], snap["timeouts"], snap["crashes"]) == (2, 1, 1)
        time.sleep(max(0.0, slow_started + 3.5 - time.monotonic()))  # when "slow" would have written
        assert not late.exists()
    finally:
        worker.stop()
    assert worker.snapshot()["pid"] is None


def test_supervisor_start_errors(tmp_path: Path) -> None:
    (tmp_path / "function_app.py").write_text("raise ImportError('no such thing')\n")
    with pytest.raises(WorkerStartError, match="no such thing"):
        Worker(tmp_path, 1, None, "unit", 20).start()
    (tmp_path / "function_app.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match=r"no azure\.functions\.FunctionApp instance"):
        Worker(tmp_path, 1, None, "unit", 20).start()
