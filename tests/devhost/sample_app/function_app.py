"""Test app for devhost: records every call into the JSONL file named by DEVHOST_TEST_RECORD.

Queue bodies are JSON commands: {"action": "ok" | "fail" | "sleep" | "exit" | "overlap", "seconds": float,
"first_delivery_only": bool}. "exit" ends the worker process (os._exit); "overlap" counts the calls
running at once; "first_delivery_only" makes "sleep" and "exit" act only at dequeue count 1.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import azure.functions as func

app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)
_lock = threading.Lock()
_overlap = threading.Condition()
_running = 0


def record(**fields: Any) -> None:
    line = json.dumps({"pid": os.getpid(), "time": time.time(), **fields}, default=str)
    with _lock, open(os.environ["DEVHOST_TEST_RECORD"], "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


@app.queue_trigger(arg_name="msg", queue_name="%JOBS_QUEUE%", connection="AzureWebJobsStorage")
def process_job(msg: func.QueueMessage) -> None:
    body = msg.get_body().decode("utf-8", errors="replace")
    record(
        fn="process_job",
        event="start",
        id=msg.id,
        dequeue_count=msg.dequeue_count,
        pop_receipt=msg.pop_receipt,
        body=body,
        insertion_time=msg.insertion_time.isoformat() if msg.insertion_time else None,
        tz=str(msg.insertion_time.tzinfo) if msg.insertion_time else None,
    )
    command = json.loads(body)
    action = command.get("action", "ok")
    if command.get("first_delivery_only"):
        assert msg.dequeue_count is not None  # the host always sets it
        if msg.dequeue_count > 1:
            action = "ok"
    if action == "sleep":
        time.sleep(float(command.get("seconds", 1)))
    elif action == "fail":
        raise RuntimeError("asked to fail")
    elif action == "exit":
        os._exit(3)
    elif action == "overlap":
        assert msg.id is not None  # the host always sets it
        overlap(msg.id)
    record(fn="process_job", event="end", id=msg.id, dequeue_count=msg.dequeue_count)


def overlap(message_id: str) -> None:
    """Record how many calls run at once; wait (up to 5 s) for a second one, then stay 0.3 s more."""
    global _running
    with _overlap:
        _running += 1
        record(fn="process_job", event="overlap", id=message_id, running=_running,
               threads=os.environ.get("PYTHON_THREADPOOL_THREAD_COUNT"))  # fmt: skip
        _overlap.notify_all()
        _overlap.wait_for(lambda: _running >= 2, timeout=5)
    time.sleep(0.3)
    with _overlap:
        _running -= 1


@app.queue_trigger(arg_name="msg", queue_name="%POISON_WATCH_QUEUE%", connection="AzureWebJobsStorage")
async def handle_poison(msg: func.QueueMessage) -> None:
    record(
        fn="handle_poison",
        id=msg.id,
        dequeue_count=msg.dequeue_count,
        body=msg.get_body().decode("utf-8", errors="replace"),
    )


@app.route(route="jobs/{id}/result", methods=["GET"])
def job_result(req: func.HttpRequest) -> func.HttpResponse:
    payload = {"id": req.route_params.get("id"), "params": dict(req.params), "method": req.method}
    return func.HttpResponse(json.dumps(payload), mimetype="application/json")


@app.route(route="jobs", methods=["POST"])
@app.queue_output(arg_name="out", queue_name="%JOBS_QUEUE%", connection="AzureWebJobsStorage")
def submit_job(req: func.HttpRequest, out: func.Out[str]) -> func.HttpResponse:
    out.set(req.get_body().decode("utf-8"))
    return func.HttpResponse("accepted", status_code=202)


@app.route(route="boom", methods=["GET"])
def boom(req: func.HttpRequest) -> func.HttpResponse:
    if req.params.get("exit"):
        os._exit(4)  # the worker process dies in the middle of the request
    raise ValueError("boom")


@app.timer_trigger(schedule="%TICK_SCHEDULE%", arg_name="timer", run_on_startup=False)
def tick(timer: func.TimerRequest) -> None:
    record(fn="tick", past_due=timer.past_due)
