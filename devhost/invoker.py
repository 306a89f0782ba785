"""Calling user functions: sync or async, with `func.Out` output parameters and queue outputs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import azure.functions as func

from devhost.config import resolve_setting_refs
from devhost.decisions import encode_body
from devhost.loader import Binding, FunctionSpec
from devhost.queue_ops import send_create_if_missing
from devhost.storage import QueueClients

T = TypeVar("T")


class OutValue(func.Out[T], Generic[T]):
    """The object passed for an output binding parameter (`msg: func.Out[str]`)."""

    def __init__(self) -> None:
        self._value: T | None = None

    def set(self, val: T) -> None:
        self._value = val

    def get(self) -> T:
        return self._value  # type: ignore[return-value]


@dataclass
class Context:
    """What the worker passes to a parameter named `context` (subset of func.Context)."""

    function_name: str
    function_directory: str
    invocation_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    trace_context: Any = None
    retry_context: Any = None
    thread_local_storage: Any = field(default_factory=threading.local)


class EventLoopThread:
    """One asyncio loop in a daemon thread, shared by all `async def` functions."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="devhost-asyncio", daemon=True).start()
                self._loop = loop
        return asyncio.run_coroutine_threadsafe(coro, self._loop)


@dataclass(frozen=True)
class QueueOutput:
    binding: Binding
    queue_name: str
    connection: str | None


def resolve_queue_outputs(spec: FunctionSpec, environ: dict[str, str]) -> list[QueueOutput]:
    outputs = []
    for b in spec.outputs:
        if b.type == "queue":
            name = resolve_setting_refs(str(b.get("queueName", "")), environ, f"function {spec.name}")
            outputs.append(QueueOutput(b, name.lower(), b.get("connection")))
    return outputs


def message_bodies(value: Any) -> list[bytes]:
    """Queue output values the Python worker accepts: str, bytes, QueueMessage, or a list of them."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value.encode("utf-8")]
    if isinstance(value, bytes | bytearray):
        return [bytes(value)]
    if isinstance(value, func.QueueMessage):
        return [value.get_body()]
    if isinstance(value, list | tuple):
        return [body for item in value for body in message_bodies(item)]
    raise TypeError(f"unsupported queue output value of type {type(value).__name__}")


@dataclass
class PreparedCall:
    kwargs: dict[str, Any]
    outs: dict[str, OutValue[Any]]


def prepare_call(spec: FunctionSpec, trigger_value: Any, app_dir: Path) -> PreparedCall:
    outs: dict[str, OutValue[Any]] = {b.name: OutValue() for b in spec.outputs if b.name != "$return"}
    kwargs: dict[str, Any] = {spec.trigger.name: trigger_value, **outs}
    if spec.wants_context:
        kwargs["context"] = Context(spec.name, str(app_dir))
    return PreparedCall(kwargs, outs)


def call_function(
    spec: FunctionSpec, kwargs: dict[str, Any], loop: EventLoopThread, on_future: Callable[[Any], None]
) -> Any:
    """Run the function in the calling thread (sync) or on the loop thread (async), blocking."""
    if spec.is_async:
        future = loop.submit(spec.func(**kwargs))
        on_future(future)
        return future.result()
    return spec.func(**kwargs)


def send_queue_outputs(
    outputs: list[QueueOutput],
    prepared: PreparedCall,
    return_value: Any,
    clients: QueueClients,
    encoding: str,
    notify: Callable[[str], None],
) -> int:
    """After a successful call, write queue output bindings (creating queues) and wake listeners."""
    sent = 0
    for out in outputs:
        name = out.binding.name
        value = return_value if name == "$return" else prepared.outs[name].get()
        bodies = message_bodies(value)
        if not bodies:
            continue
        queue = clients.queue(out.connection, out.queue_name)
        for body in bodies:
            send_create_if_missing(queue, encode_body(body, encoding))
            sent += 1
        notify(out.queue_name)
    return sent
