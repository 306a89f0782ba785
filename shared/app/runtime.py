"""The per-process runtime: settings, stores, queues, clock and handlers, built once on first use."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shared.config.platform import in_azure
from shared.config.settings import Settings
from shared.config.telemetry import configure_telemetry
from shared.core.documents import DocumentStore
from shared.core.messages import QueueSender
from shared.core.timers import Clock, ThreadTimers, Timers, system_clock
from shared.indexes import metrics
from shared.indexes.audit import SUFFIX as AUDIT_SUFFIX
from shared.indexes.audit import AuditLog
from shared.indexes.counters import SUFFIX as METRICS_SUFFIX
from shared.indexes.counters import TableCounters
from shared.indexes.entries import SUFFIX as ENTRIES_SUFFIX
from shared.indexes.entries import EntryIndex
from shared.indexes.jobs import IndexedStore, JobIndex
from shared.indexes.keys import table_prefix
from shared.jobs import registry
from shared.jobs.base import Handler
from shared.ledger import Ledger
from shared.ledger.view import index_tags, listing_metadata
from shared.storage.blob_documents import BlobDocuments
from shared.storage.clients import StorageClients, connect, ensure_resources
from shared.storage.tables import NoTableEndpoint, table_service

if TYPE_CHECKING:
    from azure.data.tables import TableServiceClient

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
    job_index: JobIndex | None = None
    """The jobs index (Table storage), None without a table endpoint: the console then lists blobs."""
    entry_index: EntryIndex | None = None
    """The poison archive's index (Table storage), None likewise."""
    audit: AuditLog | None = None
    """The audit of operator actions (Table storage), None likewise."""
    counters: metrics.CounterStore | None = None
    """The overview's counters (Table storage); None: blobs in the archive container (`counter_store`)."""

    @classmethod
    def over(
        cls,
        settings: Settings,
        storage: StorageClients,
        handlers: Mapping[str, Handler],
        instance: str,
        tables: TableServiceClient | None = None,
    ) -> Runtime:
        """A runtime on the configured storage account; its Table service is `tables` when given
        (tests: an in-memory account), else the configured account's."""
        archive_tables = table_prefix(settings.poison_archive_container)
        try:
            tables = tables if tables is not None else table_service(settings.storage)
            job_index: JobIndex | None = JobIndex(tables, table_prefix(settings.ledger_container))
            entry_index: EntryIndex | None = EntryIndex(tables, archive_tables + ENTRIES_SUFFIX)
            audit: AuditLog | None = AuditLog(tables, archive_tables + AUDIT_SUFFIX)
        except NoTableEndpoint as exc:
            log.warning("no console indexes: %s", exc)
            tables = job_index = entry_index = None
            audit = None
        ledger_store: DocumentStore = BlobDocuments(
            storage.container(settings.ledger_container), metadata=listing_metadata, tags=index_tags
        )
        archive = BlobDocuments(storage.container(settings.poison_archive_container))
        counters = (
            TableCounters(tables, archive_tables + METRICS_SUFFIX, archive) if tables is not None else None
        )
        return cls(
            settings=settings,
            storage=storage,
            handlers=handlers,
            instance=instance,
            ledger=Ledger(IndexedStore(ledger_store, job_index) if job_index else ledger_store),
            archive=archive,
            jobs_queue=storage.queue(settings.jobs_queue),
            poison_queue=storage.raw_queue(settings.poison_queue),
            job_index=job_index,
            entry_index=entry_index,
            audit=audit,
            counters=counters,
        )

    def counter_store(self) -> metrics.CounterStore:
        """Where the overview's counters are kept: the table, else blobs in the archive container."""
        return self.counters if self.counters is not None else metrics.BlobCounters(self.archive)

    def new_owner(self) -> str:
        """An owner id for one invocation's claim."""
        return f"{self.instance}/{uuid.uuid4().hex[:12]}"


_lock = threading.Lock()
_runtime: Runtime | None = None


def build_runtime(
    settings: Settings, *, create_resources: bool = True, handlers: Mapping[str, Handler] | None = None
) -> Runtime:
    configure_telemetry(
        os.environ.get("APPLICATIONINSIGHTS_CONNECTION_STRING"),
        logger_name="jobs",
        otlp_endpoint=settings.otlp_endpoint,
    )
    storage = connect(settings)
    if create_resources:
        ensure_resources(storage, settings)  # once per process, never per message
    enable_tests = os.environ.get("ENABLE_TEST_KINDS", "").lower() in ("1", "true", "yes")
    instance = f"{socket.gethostname()}:{os.getpid()}"
    log.info("runtime ready: %s, queue %s", settings.storage.describe(), settings.jobs_queue)
    runtime = Runtime.over(settings, storage, handlers or registry(enable_tests), instance)
    if create_resources:
        ensure_console_resources(runtime)
    if os.environ.get("FUNCTIONS_WORKER_RUNTIME") or in_azure(os.environ):  # a Functions worker
        # console counters: flushed on a timer, never per message
        metrics.install(runtime.counter_store(), instance)
    return runtime


def ensure_console_resources(rt: Runtime) -> None:
    """The entry index's table and the bulk operations' queue (start-up, never per message)."""
    from azure.core.exceptions import HttpResponseError, ResourceExistsError

    try:
        if rt.entry_index is not None:
            rt.entry_index.ensure()
        if rt.audit is not None:
            rt.audit.ensure()
        if isinstance(rt.counters, TableCounters):
            rt.counters.ensure()
        with contextlib.suppress(ResourceExistsError):
            rt.storage.queue_service.create_queue(f"{rt.settings.jobs_queue}-ops")
    except HttpResponseError as exc:  # identity scoped to its resources: the deployment creates them
        log.warning("console resources not created here (%s)", exc.__class__.__name__)


def get_runtime() -> Runtime:
    """The process's runtime; raises SettingsError (naming the setting) when settings are invalid."""
    global _runtime
    if _runtime is None:
        with _lock:
            if _runtime is None:
                _runtime = build_runtime(Settings.from_env())
    return _runtime
