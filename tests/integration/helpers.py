"""Helpers for integration tests against the session's Azurite."""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import azure.functions as func

from devstack.azurite import Azurite
from devstack.hostproc import HostProcess, host_env, init_storage
from shared.config.settings import Settings, StorageConnection
from shared.jobs import registry
from shared.runtime.wiring import Runtime, build_runtime
from shared.storage.clients import StorageClients, clients_for


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def settings_env(connection_string: str, **extra: str) -> dict[str, str]:
    """App settings on a storage account, with queue and container names of their own."""
    return {
        "AzureWebJobsStorage": connection_string,
        "JOBS_QUEUE": unique("jobs"),
        "LEDGER_CONTAINER": unique("ledger"),
        "RESULTS_CONTAINER": unique("results"),
        "PAYLOADS_CONTAINER": unique("payloads"),
        "POISON_ARCHIVE_CONTAINER": unique("archive"),
        **extra,
    }


def settings_for(azurite: Azurite, **extra: str) -> Settings:
    return Settings.from_env(settings_env(azurite.connection_string, **extra))


@functools.cache
def _clients(connection: StorageConnection) -> StorageClients:
    return clients_for(connection)


def sdk(rt: Runtime) -> StorageClients:
    """The storage SDK's clients on the runtime's account (Azurite), for what a test checks beyond
    the ports (tags, properties, block lists, containers of its own); the app uses `rt.account`."""
    return _clients(rt.settings.storage)


def runtime_for(azurite: Azurite, handlers: Mapping[str, Any] | None = None, **extra: str) -> Runtime:
    return build_runtime(
        settings_for(azurite, **extra), handlers=handlers or registry(enable_test_kinds=True)
    )


def message(
    body: bytes | Mapping[str, Any], dequeue_count: int | None = 1, msg_id: str | None = None
) -> func.QueueMessage:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return func.queue.QueueMessage(  # type: ignore[no-untyped-call]
        id=msg_id or uuid.uuid4().hex, body=raw, dequeue_count=dequeue_count, pop_receipt="r"
    )


def drain_raw(rt: Runtime, queue: str) -> list[bytes]:
    """Receive and delete every visible message of a queue; return decoded bodies."""
    client = rt.account.raw_queue(queue)
    out = []
    for msg in client.receive_messages(max_messages=32, visibility_timeout=30):
        out.append(base64.b64decode(msg.content))
        client.delete_message(msg)
    return out


def queue_length(rt: Runtime, queue: str) -> int:
    return rt.account.raw_queue(queue).depth()


@contextlib.contextmanager
def local_host(
    azurite: Azurite, settings: Mapping[str, str], log: Path, instance_id: str = "host-1"
) -> Iterator[HostProcess]:
    """The local host (the repo's host.json) on `azurite` with `settings`, once `cli init` made its
    queues, containers and tables; stopped on leaving."""
    env = host_env(azurite.connection_string, settings)
    init_storage(env)
    process = HostProcess(env, instance_id=instance_id, log_path=log).start()
    try:
        yield process
    finally:
        process.stop()


def host_call(host: HostProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """`method /api/<path>` on the host (bytes as they are, anything else as JSON): its status
    and JSON answer (an error's text that is not JSON: `{"error": text}`)."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(f"{host.url}/api/{path}", data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:  # e.g. a call in a worker the job kills fails with text
        text = exc.read()
        try:
            return exc.code, json.loads(text or b"null")
        except ValueError:
            return exc.code, {"error": text.decode("utf-8", "replace")}
