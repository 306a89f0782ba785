"""The per-process runtime: settings, clients and handlers, built once on first use."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from azure.storage.queue import QueueClient

from shared.jobs import registry
from shared.jobs.base import Handler
from shared.ledger import Ledger
from shared.settings import Settings
from shared.storage import StorageClients, connect, ensure_resources
from shared.telemetry import configure_telemetry

log = logging.getLogger("jobs.runtime")


@dataclass
class Runtime:
    """What every invocation shares. Build with `get_runtime()` (or directly in tests)."""

    settings: Settings
    storage: StorageClients
    handlers: Mapping[str, Handler]
    instance: str

    def __post_init__(self) -> None:
        self.ledger = Ledger(self.storage.container(self.settings.ledger_container))
        self.jobs_queue: QueueClient = self.storage.queue(self.settings.jobs_queue)
        self.poison_queue: QueueClient = self.storage.raw_queue(self.settings.poison_queue)

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
    return Runtime(
        settings=settings, storage=storage, handlers=handlers or registry(enable_tests), instance=instance
    )


def get_runtime() -> Runtime:
    """The process's runtime; raises SettingsError (naming the setting) when settings are invalid."""
    global _runtime
    if _runtime is None:
        with _lock:
            if _runtime is None:
                _runtime = build_runtime(Settings.from_env())
    return _runtime
