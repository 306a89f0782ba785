"""The language worker: a child process that imports function_app.py and runs its functions.

The host (devhost.supervisor) starts it with the protocol of `devhost.ipc` on stdin/stdout; both
are moved to other descriptors first, so that print() in the app goes to stderr. Sync functions of
every trigger share one thread pool (PYTHON_THREADPOOL_THREAD_COUNT threads); `async def`
functions run on one event loop thread. When the host's end of the pipe closes (the host stopped
or died), the worker exits at once, whatever is still running.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

import azure.functions as func
from azure.functions.queue import QueueMessage as FuncQueueMessage
from azure.functions.timer import TimerRequest

from devhost.config import ConfigError
from devhost.http_server import to_reply
from devhost.invoker import (
    EventLoopThread,
    PreparedCall,
    output_value,
    prepare_call,
    queue_output_bodies,
)
from devhost.ipc import Channel, HttpResult
from devhost.loader import FunctionSpec, load_functions
from devhost.logs import setup_logging
from devhost.storage import RequestCounter

log = logging.getLogger("devhost.worker")


def build_trigger(kind: str, payload: tuple[Any, ...]) -> Any:
    """The trigger argument the Python worker builds from what the host sends."""
    if kind == "queue":
        message_id, body, dequeue_count, expires, inserted, next_visible, pop_receipt = payload
        return FuncQueueMessage(  # type: ignore[no-untyped-call]
            id=message_id,
            body=body,
            dequeue_count=dequeue_count,
            expiration_time=expires,
            insertion_time=inserted,
            time_next_visible=next_visible,
            pop_receipt=pop_receipt,
        )
    if kind == "http":
        method, url, headers, params, route_params, body = payload
        return func.HttpRequest(
            method, url, headers=headers, params=params, route_params=route_params, body=body
        )
    if kind == "timer":
        past_due, schedule_status, schedule = payload
        return TimerRequest(past_due=past_due, schedule_status=schedule_status, schedule=schedule)
    raise ValueError(f"unknown trigger kind {kind!r}")


def http_result(spec: FunctionSpec, prepared: PreparedCall, return_value: Any) -> HttpResult | None:
    """The HTTP response of an HTTP-triggered function (named `http` output, else the return value)."""
    if spec.kind != "http":
        return None
    named = [b.name for b in spec.outputs if b.type == "http" and b.name != "$return"]
    reply = to_reply(output_value(named[0], prepared, return_value) if named else return_value)
    return reply.status, reply.headers, reply.body


def ok_result(spec: FunctionSpec, prepared: PreparedCall, return_value: Any) -> tuple[Any, ...]:
    bodies = queue_output_bodies(spec, prepared, return_value)
    return "ok", bodies, http_result(spec, prepared, return_value)


def error_result(exc: BaseException) -> tuple[Any, ...]:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return "error", type(exc).__name__, str(exc), text


class Runner:
    """Runs invocations: sync functions on the shared pool, async ones on the event loop."""

    def __init__(
        self,
        specs: list[FunctionSpec],
        threads: int,
        channel: Channel,
        app_dir: Path,
        counter: RequestCounter | None,
    ) -> None:
        self.specs = {spec.name: spec for spec in specs}
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sync-fn")
        self.loop = EventLoopThread()
        self.channel = channel
        self.app_dir = app_dir
        self.counter = counter

    def dispatch(self, message: tuple[Any, ...]) -> None:
        if message[0] != "invoke":
            log.warning("worker: ignoring unknown message %r", message[0])
            return
        _, seq, name, invocation_id, payload = message
        spec = self.specs.get(name)
        if spec is None:
            self._send(seq, error_result(LookupError(f"no function named {name!r} in this worker")))
        elif spec.is_async:
            self.loop.submit(self._run_async(seq, spec, invocation_id, payload))
        else:
            self.pool.submit(self._run_sync, seq, spec, invocation_id, payload)

    def _prepare(self, spec: FunctionSpec, invocation_id: str, payload: tuple[Any, ...]) -> PreparedCall:
        return prepare_call(spec, build_trigger(spec.kind, payload), self.app_dir, invocation_id)

    def _run_sync(self, seq: int, spec: FunctionSpec, invocation_id: str, payload: tuple[Any, ...]) -> None:
        try:
            prepared = self._prepare(spec, invocation_id, payload)
            assert spec.func is not None
            result = ok_result(spec, prepared, spec.func(**prepared.kwargs))
        except BaseException as exc:  # SystemExit from the app is a failed invocation too
            result = error_result(exc)
        self._send(seq, result)

    async def _run_async(
        self, seq: int, spec: FunctionSpec, invocation_id: str, payload: tuple[Any, ...]
    ) -> None:
        try:
            prepared = self._prepare(spec, invocation_id, payload)
            assert spec.func is not None
            result = ok_result(spec, prepared, await spec.func(**prepared.kwargs))
        except BaseException as exc:
            result = error_result(exc)
        self._send(seq, result)

    def _send(self, seq: int, result: tuple[Any, ...]) -> None:
        requests = self.counter.take() if self.counter is not None else None
        try:
            self.channel.send(("done", seq, result, requests or None))
        except (OSError, ValueError):  # the host has gone: nothing left to report to
            os._exit(0)


def take_stdio() -> Channel:
    """The protocol on (copies of) stdin/stdout; fd 0 becomes /dev/null and fd 1 goes to stderr."""
    reader = os.fdopen(os.dup(0), "rb")
    writer = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return Channel(reader, writer)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="devhost.worker")
    parser.add_argument("--app-dir", required=True, type=Path)
    parser.add_argument("--threads", required=True, type=int)
    parser.add_argument("--instance-id", required=True)
    parser.add_argument("--log-level", type=int, default=logging.INFO)
    parser.add_argument("--count-requests", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    channel = take_stdio()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the host decides
    setup_logging(args.instance_id, args.log_level)
    counter = None
    if args.count_requests:
        counter = RequestCounter(os.environ)
        counter.install()
    try:
        specs = load_functions(args.app_dir)
    except ConfigError as exc:
        channel.send(("error", "config", str(exc)))
        return 2
    except BaseException:
        channel.send(("error", "import", traceback.format_exc()))
        return 1
    channel.send(("ready", os.getpid(), [spec.describe() for spec in specs]))
    runner = Runner(specs, args.threads, channel, args.app_dir, counter)
    while True:
        try:
            message = channel.recv()
        except (EOFError, OSError):
            return 0  # the host closed the pipe or died
        runner.dispatch(message)


def run(argv: list[str] | None = None) -> NoReturn:
    code = main(argv)
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)  # do not wait for invocations still running: the host is gone or asked us to go


if __name__ == "__main__":
    run()
