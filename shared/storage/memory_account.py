"""`MemoryAccount`: the `Account` port in memory, for tests, the handler kit and the simulation.

One storage account's containers, queues and tables behind one lock, one clock and one request
log (`requests`: every call as the REST request its Azure adapter sends, `PUT
/devstoreaccount1/ledger/a.json`, so request counts are asserted the same way as over HTTP). It
hands out the ports as `AzureAccount` does: `documents` and `blobs` of a container (the same
blobs: a document is a JSON blob), `tables` (`memory_tables.MemoryTables`), `queue` (base64 text)
and `raw_queue`. tests/integration/test_port_contract.py runs the same cases on it and on Azurite.

Time comes from `clock`: the real time by default; `ManualClock` (only a test moves it) or
`SkippingClock` (the real time plus what a test skipped) let a test wait without sleeping
(`wait`). Shipped with the app, as a broker's stub is, so a handler's own tests need no Azurite.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.storage.memory_blobs import MemoryBlobDocuments, MemoryBlobs, StoredContainer
from shared.storage.memory_queues import MemoryQueue, StoredQueue
from shared.storage.memory_tables import MemoryTables

ACCOUNT = "devstoreaccount1"

Clock = Callable[[], datetime]


def real_time() -> datetime:
    return datetime.now(UTC)


class ManualClock:
    """Time that moves only when a test says so."""

    def __init__(self, start: datetime = datetime(2026, 1, 1, tzinfo=UTC)) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class SkippingClock:
    """The real time, plus what a test skipped (`advance`): the account's time passes at once."""

    def __init__(self) -> None:
        self.skipped = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.skipped

    def advance(self, seconds: float) -> None:
        self.skipped += timedelta(seconds=seconds)


class MemoryAccount:
    """One storage account in memory: blob containers, queues and tables."""

    def __init__(self, clock: Clock = real_time, name: str = ACCOUNT) -> None:
        self.clock = clock
        self.name = name
        self.lock = threading.RLock()
        self.requests: list[str] = []
        """Every call, as the REST request it stands for: `METHOD /account/path`."""
        self.containers: dict[str, StoredContainer] = {}
        self.queues: dict[str, StoredQueue] = {}
        self.table_service = MemoryTables(clock, name, self.requests, self.lock)
        self._seq = itertools.count(1)

    def documents(
        self,
        container: str,
        *,
        metadata: Callable[[dict[str, Any]], dict[str, str]] | None = None,
        tags: Callable[[dict[str, Any]], dict[str, str]] | None = None,
    ) -> MemoryBlobDocuments:
        return MemoryBlobDocuments(self, container, metadata, tags)

    def blobs(self, container: str) -> MemoryBlobs:
        return MemoryBlobs(self, container)

    def tables(self) -> MemoryTables:
        return self.table_service

    def queue(self, name: str) -> MemoryQueue:
        return MemoryQueue(self, name, encode=True)

    def raw_queue(self, name: str) -> MemoryQueue:
        return MemoryQueue(self, name, encode=False)

    def describe(self) -> str:
        return f"in-memory account {self.name}"

    def wait(self, seconds: float) -> None:
        """Let `seconds` of this account's time pass: at once when its clock can skip ahead."""
        advance = getattr(self.clock, "advance", None)
        if callable(advance):
            advance(seconds)
        else:
            time.sleep(seconds)

    def log(self, method: str, path: str) -> None:
        self.requests.append(f"{method} /{self.name}/{path}")

    def next_seq(self) -> int:
        return next(self._seq)

    def etag(self) -> str:
        return f'"0x8DE{self.next_seq():013X}"'

    def now(self) -> datetime:
        """The time as the service reports it in headers and listings: whole seconds."""
        return self.clock().replace(microsecond=0)
