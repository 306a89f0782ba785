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

from shared.config.platform import in_azure
from shared.config.settings import Settings
from shared.core.backoff import RetryPolicy
from shared.core.documents import DocumentStore
from shared.core.errors import SettingsError
from shared.core.messages import MessageQueue, QueueSender
from shared.core.timers import Clock, ThreadTimers, Timers, system_clock
from shared.indexes.audit import SUFFIX as AUDIT_SUFFIX
from shared.indexes.audit import AuditLog
from shared.indexes.counters import SUFFIX as METRICS_SUFFIX
from shared.indexes.counters import TableCounters
from shared.indexes.entries import EntryIndex
from shared.indexes.entry_rows import SUFFIX as ENTRIES_SUFFIX
from shared.indexes.jobs import IndexedStore, JobIndex
from shared.indexes.keys import table_prefix
from shared.jobs import registry
from shared.jobs.base import Handler
from shared.jobs.kinds import app_policy, configure_kinds
from shared.ledger import Ledger
from shared.ledger.view import index_tags, listing_metadata
from shared.observability import overview_counters
from shared.observability.telemetry import configure_telemetry
from shared.permits.limit_settings import PermitSettings, read_permit_settings
from shared.permits.parked_messages import MemoryParking, Parking, QueueParking
from shared.permits.service import Permits
from shared.permits.store import DocumentPermitStore, PermitStore, memory_permit_store
from shared.queues import QueueSettings
from shared.runtime.lanes import build_lanes
from shared.storage.accounts import account_for, ensure_resources
from shared.storage.ports import Account, Tables
from shared.storage.tables import NoTableEndpoint

log = logging.getLogger("jobs.runtime")


@dataclass
class Runtime:
    """What every invocation shares. Build with `get_runtime()`, `Runtime.over(...)` in tests, or
    directly with in-memory parts (the deterministic simulation)."""

    settings: Settings
    account: Account
    """The app's storage account (`AzureWebJobsStorage`): its documents, tables and queues."""
    handlers: Mapping[str, Handler]
    instance: str
    ledger: Ledger
    ledger_docs: DocumentStore
    """The ledger's documents without the jobs index: writers that send their index rows
    together (replay, shared/poison/replay.py) write through it."""
    archive: DocumentStore
    """The poison archive (its layout: shared/core/archive_layout.py)."""
    jobs_queue: QueueSender
    poison_queue: MessageQueue
    """Sends copies (`send_message`); the sweeper and operators also peek, receive and delete."""
    job_index: JobIndex
    """The jobs index (Table storage): the console's jobs pages."""
    entry_index: EntryIndex
    """The poison archive's index (Table storage): its pages, replay and purge."""
    audit: AuditLog
    """The audit of operator actions (Table storage)."""
    counters: TableCounters
    """The overview's counters (Table storage)."""
    clock: Clock = system_clock
    timers: Timers = field(default_factory=ThreadTimers)
    sleep: Callable[[float], None] = time.sleep
    monotonic: Callable[[], float] = time.monotonic
    """The seconds `sleep` waits in: replays and bulk steps keep their rates on this pair
    (shared/poison/pacing.py); a test may give a fake pair."""
    retry_policies: Mapping[str, RetryPolicy] = field(default_factory=dict)
    """Each kind's retry policy (shared/jobs/kinds.py); a kind not listed: the app's settings."""
    lane: QueueSettings | None = None
    """The queue whose jobs this runtime serves (shared/runtime/lanes.py); None: the default's."""
    lanes: dict[str, Runtime] = field(default_factory=dict, repr=False)
    """Every declared queue's runtime, by name (`for_queue`); empty: this one serves them all."""
    queue_account: Account | None = None
    """The account holding this queue and its `-poison` queue (`QUEUE_<NAME>_CONNECTION`);
    None: `account`."""
    permit_settings: PermitSettings = field(default_factory=PermitSettings)
    permit_store: PermitStore | None = None
    """Where permits are kept (shared/permits): the container `PERMITS_CONTAINER`; None: in memory."""
    parking: Parking | None = None
    """Where waiting jobs' messages are parked (`QueueParking` on the jobs queue); None: in memory."""
    permits: Permits = field(init=False)
    """Concurrency and rate limits across instances (shared/permits)."""

    def __post_init__(self) -> None:
        store = self.permit_store or memory_permit_store(self.clock)
        parking = self.parking or MemoryParking(self.clock)
        self.permits = Permits(
            store, parking, self.clock, self.timers, self.permit_settings.lease_s, parking_of=self.parking_of
        )

    def parking_of(self, job: str) -> Parking:
        """Where the job named `job` (its `job_key`) parks: its own queue's lane's parking."""
        prefix = job.split("/", 1)[0] + "/" if "/" in job else ""
        for each in self.lanes.values():
            if each.queue.ledger_prefix == prefix:
                return each.permits.parking
        return self.permits.parking

    @classmethod
    def over(
        cls,
        settings: Settings,
        account: Account,
        handlers: Mapping[str, Handler],
        instance: str,
    ) -> Runtime:
        """A runtime on `account` (the configured one: `account_for(settings.storage)`;
        tests: a `MemoryAccount`). SettingsError when the account names no Table
        service: the indexes are not optional. The kinds' own settings are read and checked here
        (SettingsError naming each bad one)."""
        kinds = configure_kinds(settings, handlers)
        try:
            tables = account.tables()
        except NoTableEndpoint as exc:
            raise SettingsError(f"AzureWebJobsStorage: {exc}") from None
        ledger_store = account.documents(
            settings.ledger_container, metadata=listing_metadata, tags=index_tags
        )
        archive = account.documents(settings.poison_archive_container)
        job_index, entry_index, audit, counters = indexes(settings, tables, archive)
        permit_settings = read_permit_settings(
            settings.source, settings.jobs_queue, {q.name: q.max_concurrent for q in settings.queue_set}
        )
        rt = cls(
            settings=settings,
            account=account,
            handlers=kinds.handlers,
            instance=instance,
            ledger=Ledger(IndexedStore(ledger_store, job_index)),
            ledger_docs=ledger_store,
            archive=archive,
            jobs_queue=account.queue(settings.jobs_queue),
            poison_queue=account.raw_queue(settings.poison_queue),
            job_index=job_index,
            entry_index=entry_index,
            audit=audit,
            counters=counters,
            retry_policies=kinds.retry,
            permit_settings=permit_settings,
            permit_store=DocumentPermitStore(
                account.documents(permit_settings.container),
                ensure=account.blobs(permit_settings.container).create,
            ),
            parking=QueueParking(account.queue(settings.jobs_queue)),
        )
        return build_lanes(rt, handlers)  # the default queue's: each queue's is `for_queue(name)`

    @property
    def queue(self) -> QueueSettings:
        """The queue whose jobs this runtime serves."""
        return self.lane or self.settings.queue_set.default

    def for_queue(self, name: str | None = None) -> Runtime:
        """The runtime of the declared queue `name` (None: the default); UnknownQueue otherwise."""
        queue = self.settings.queue_set.get(name)
        return self.lanes.get(queue.name, self)

    def account_of(self, queue: str | None = None) -> Account:
        """The storage account holding the declared queue `queue` (None: the default) and its
        `-poison` queue; its `-parked` queue is in `account`."""
        return self.for_queue(queue).queue_account or self.account

    def job_key(self, job_id: str) -> str:
        """How handlers name the job: `<queue>/<id>` on a queue other than the default."""
        return self.queue.ledger_prefix + job_id

    def retry_policy(self, kind: str) -> RetryPolicy:
        """The kind's retry policy: its own, else the app's settings."""
        return self.retry_policies.get(kind) or app_policy(self.settings)

    def new_owner(self) -> str:
        """An owner id for one invocation's claim."""
        return f"{self.instance}/{uuid.uuid4().hex[:12]}"


def indexes(
    settings: Settings, tables: Tables, archive: DocumentStore
) -> tuple[JobIndex, EntryIndex, AuditLog, TableCounters]:
    """The console's indexes on `tables`, named after the containers they index."""
    archive_tables = table_prefix(settings.poison_archive_container)
    return (
        JobIndex(tables, table_prefix(settings.ledger_container)),
        EntryIndex(tables, archive_tables + ENTRIES_SUFFIX),
        AuditLog(tables, archive_tables + AUDIT_SUFFIX),
        TableCounters(tables, archive_tables + METRICS_SUFFIX, archive),
    )


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
    account = account_for(settings.storage)
    if create_resources:
        ensure_resources(account, settings)  # once per process, never per message
    enable_tests = os.environ.get("ENABLE_TEST_KINDS", "").lower() in ("1", "true", "yes")
    instance = f"{socket.gethostname()}:{os.getpid()}"
    log.info("runtime ready: %s, queue %s", settings.storage.describe(), settings.jobs_queue)
    runtime = Runtime.over(settings, account, handlers or registry(enable_tests), instance)
    if create_resources:
        ensure_console_resources(runtime)
    if os.environ.get("FUNCTIONS_WORKER_RUNTIME") or in_azure(os.environ):  # a Functions worker
        # console counters: flushed on a timer, never per message
        overview_counters.install(runtime.counters, instance)
    return runtime


def ensure_console_resources(rt: Runtime) -> None:
    """The entry index's table and the bulk operations' queue (start-up, never per message)."""
    from shared.storage.failures import StorageError, failure_name

    try:
        rt.entry_index.ensure()
        rt.audit.ensure()
        rt.counters.ensure()
        rt.account.queue(f"{rt.settings.jobs_queue}-ops").create()
    except StorageError as exc:  # identity scoped to its resources: the deployment creates them
        if not exc.answered:  # no answer at all: not a refusal
            raise
        log.warning("console resources not created here (%s)", failure_name(exc))


def get_runtime() -> Runtime:
    """The process's runtime; raises SettingsError (naming the setting) when settings are invalid."""
    global _runtime
    if _runtime is None:
        with _lock:
            if _runtime is None:
                _runtime = build_runtime(Settings.from_env())
    return _runtime
