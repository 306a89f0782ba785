"""The per-process runtime: settings, stores, queues, clock and handlers, built once on first use."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared import metrics
from shared.blob_documents import BlobDocuments
from shared.documents import DocumentStore
from shared.jobs import registry
from shared.jobs.base import Handler
from shared.ledger import Ledger, index_tags, listing_metadata
from shared.messages import QueueSender
from shared.platform import in_azure
from shared.settings import Settings
from shared.storage import StorageClients, connect, ensure_resources
from shared.telemetry import configure_telemetry
from shared.timers import Clock, ThreadTimers, Timers, system_clock

log = logging.getLogger("jobs.runtime")


@dataclass
class Runtime:
    """What every invocation shares. Build with `get_runtime()`, `Runtime.over(...)` in tests, or
    directly with in-memory parts (the deterministic simulation)."""

    settings: Settings
    storage: StorageClients
    """Clients for handlers' own I/O (inputs, results, claim-checked payloads)."""
    handlers: Mapping[str, Handler]
    instance: str
    ledger: Ledger
    archive: DocumentStore
    """The poison archive (see shared/poison/archive.py for its layout)."""
    jobs_queue: QueueSender
    poison_queue: Any
    """Sends copies (`send_message`); the sweeper and operators also peek, receive and delete."""
    clock: Clock = system_clock
    timers: Timers = field(default_factory=ThreadTimers)
    sleep: Callable[[float], None] = time.sleep

    @classmethod
    def over(
        cls, settings: Settings, storage: StorageClients, handlers: Mapping[str, Handler], instance: str
    ) -> Runtime:
        """A runtime on the configured storage account."""
        return cls(
            settings=settings,
            storage=storage,
            handlers=handlers,
            instance=instance,
            ledger=Ledger(
                BlobDocuments(
                    storage.container(settings.ledger_container), metadata=listing_metadata, tags=index_tags
                )
            ),
            archive=BlobDocuments(storage.container(settings.poison_archive_container)),
            jobs_queue=storage.queue(settings.jobs_queue),
            poison_queue=storage.raw_queue(settings.poison_queue),
        )

    def new_owner(self) -> str:
        """An owner id for one invocation's claim."""
        return f"{self.instance}/{uuid.uuid4().hex[:12]}"


_lock = threading.Lock()
_runtime: Runtime | None = None


def build_runtime(
    settings: Settings, *, create_resources: bool = True, handlers: Mapping[str, Handler] | None = None
) -> Runtime:
    configure_telemetry(os.environ.get("APPLICATIONINSIGHTS_CONNECTION_STRING"), logger_name="jobs")
    storage = connect(settings)
    if create_resources:
        ensure_resources(storage, settings)  # once per process, never per message
    enable_tests = os.environ.get("ENABLE_TEST_KINDS", "").lower() in ("1", "true", "yes")
    instance = f"{socket.gethostname()}:{os.getpid()}"
    log.info("runtime ready: %s, queue %s", settings.storage.describe(), settings.jobs_queue)
    runtime = Runtime.over(settings, storage, handlers or registry(enable_tests), instance)
    if os.environ.get("FUNCTIONS_WORKER_RUNTIME") or in_azure(os.environ):  # a Functions worker
        metrics.install(runtime.archive, instance)  # console counters: flushed on a timer, never per message
    return runtime


def get_runtime() -> Runtime:
    """The process's runtime; raises SettingsError (naming the setting) when settings are invalid."""
    global _runtime
    if _runtime is None:
        with _lock:
            if _runtime is None:
                _runtime = build_runtime(Settings.from_env())
    return _runtime
