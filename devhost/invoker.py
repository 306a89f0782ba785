"""Function calls: arguments and `func.Out` parameters (worker side), queue outputs (host side)."""

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


def prepare_call(
    spec: FunctionSpec, trigger_value: Any, app_dir: Path, invocation_id: str | None = None
) -> PreparedCall:
    outs: dict[str, OutValue[Any]] = {b.name: OutValue() for b in spec.outputs if b.name != "$return"}
    kwargs: dict[str, Any] = {spec.trigger.name: trigger_value, **outs}
    if spec.wants_context:
        kwargs["context"] = Context(spec.name, str(app_dir), invocation_id or str(uuid.uuid4()))
    return PreparedCall(kwargs, outs)


def output_value(name: str, prepared: PreparedCall, return_value: Any) -> Any:
    """The value of output binding `name`: the return value for `$return`, else the `func.Out`."""
    return return_value if name == "$return" else prepared.outs[name].get()


def queue_output_bodies(
    spec: FunctionSpec, prepared: PreparedCall, return_value: Any
) -> dict[str, list[bytes]]:
    """Message bodies per queue output binding, as the worker hands them to the host."""
    return {
        b.name: message_bodies(output_value(b.name, prepared, return_value))
        for b in spec.outputs
        if b.type == "queue"
    }


def send_queue_outputs(
    outputs: list[QueueOutput],
    bodies: dict[str, list[bytes]],
    clients: QueueClients,
    encoding: str,
    notify: Callable[[str], None],
) -> int:
    """After a successful call, write queue output bindings (creating queues) and wake listeners."""
    sent = 0
    for out in outputs:
        messages = bodies.get(out.binding.name) or []
        if not messages:
            continue
        queue = clients.queue(out.connection, out.queue_name)
        for body in messages:
            send_create_if_missing(queue, encode_body(body, encoding))
            sent += 1
        notify(out.queue_name)
    return sent
