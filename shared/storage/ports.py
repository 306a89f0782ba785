"""The storage ports: what the rest of the app asks of an account's tables, blobs and queues.

Protocols only, and the plain values they pass (no storage SDK is imported here). `shared.storage`
implements them for Azure (`tables`, `azure_blobs`, `azure_queues`, bundled by
`accounts.AzureAccount`) and in memory (`memory_blobs`, `memory_queues`, `memory_tables`, bundled
by `memory_account.MemoryAccount`: tests, the handler kit and the deterministic simulation). Every method raises `shared.storage.failures`' exceptions (`NotFound`, `AlreadyExists`,
`ConditionFailed`, `StorageBusy`, `StorageError`), never an SDK's. The documents port is
`shared.core.documents.DocumentStore`; `MessageQueue` and `QueueSender` (shared/core/messages.py)
are the queue's sending and reading sides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol

from shared.blobio.stream import Ranges
from shared.core.documents import DocumentStore, TagQuery
from shared.core.messages import MessageQueue

TRANSACTION_SIZE = 100
"""Operations one entity group transaction may hold (Table storage's limit)."""


class Row(dict[str, Any]):
    """A table entity as read: its properties, and the ETag that guards its next change."""

    def __init__(self, entity: Mapping[str, Any], etag: str = "") -> None:
        super().__init__(entity)
        self.etag = etag


@dataclass(frozen=True)
class TablePage:
    """One query's answer: its rows, and the token of the next page (None: the last)."""

    rows: list[Row]
    continuation: Any = None


@dataclass(frozen=True)
class TableOp:
    """One operation of an entity group transaction: `upsert` (replace), `create`, `update`
    (replace, If-Match `etag`) or `delete` (If-Match `etag`; None: unconditionally)."""

    kind: Literal["upsert", "create", "update", "delete"]
    entity: Mapping[str, Any]
    etag: str | None = None


class Table(Protocol):
    """One table of an account. Filters are OData (`PartitionKey eq 'x' and RowKey gt 'y'`)."""

    @property
    def name(self) -> str: ...

    def create(self) -> None:
        """Create the table; one already there is no error."""

    def drop(self) -> None:
        """Delete the table; one already gone is no error."""

    def get(self, partition: str, row: str) -> Row | None:
        """The entity, or None when it (or the table) is missing."""

    def insert(self, entity: Mapping[str, Any]) -> str:
        """Create the entity; AlreadyExists when it is there. Returns its ETag."""

    def upsert(self, entity: Mapping[str, Any]) -> None:
        """Write the entity whole (replace); NotFound when the table is missing."""

    def update(self, entity: Mapping[str, Any], etag: str) -> str:
        """Replace the entity If-Match `etag`; ConditionFailed / NotFound. Returns the new ETag."""

    def delete(self, partition: str, row: str, etag: str | None = None) -> None:
        """Delete the entity (If-Match `etag` when given); NotFound / ConditionFailed."""

    def query(
        self,
        where: str,
        *,
        size: int | None = None,
        select: Sequence[str] | None = None,
        continuation: Any = None,
    ) -> TablePage:
        """One query request: up to `size` rows matching `where` from `continuation` on."""

    def rows(
        self, where: str, *, size: int | None = None, select: Sequence[str] | None = None
    ) -> Iterator[Row]:
        """Every row matching `where`, a query per page of `size`."""

    def transact(self, ops: Sequence[TableOp]) -> list[str | None]:
        """One entity group transaction (one partition, at most `TRANSACTION_SIZE` operations, all
        or nothing); each operation's new ETag (None for a delete)."""


class Tables(Protocol):
    """An account's Table service."""

    def table(self, name: str) -> Table: ...

    def names(self, where: str) -> list[str]:
        """Names of the tables matching the OData filter on `TableName` (a query per 1,000)."""


def in_transactions(table: Table, ops: Sequence[TableOp], one: Callable[[TableOp], None]) -> int:
    """Run `ops` (one partition) as entity group transactions of `TRANSACTION_SIZE`; a
    transaction that fails (a row gone, a reset connection, a missing table) is done operation by
    operation with `one` (which handles its own failures). Returns the requests sent."""
    from shared.storage.failures import StorageError

    sent = 0
    for i in range(0, len(ops), TRANSACTION_SIZE):
        chunk = ops[i : i + TRANSACTION_SIZE]
        sent += 1
        try:
            table.transact(chunk)
            continue
        except StorageError:
            pass
        for op in chunk:
            sent += 1
            one(op)
    return sent


@dataclass(frozen=True)
class BlobInfo:
    """A blob as listed."""

    name: str
    last_modified: datetime | None = None
    size: int = 0


class BlobWriter(Protocol):
    """A binary file written into one blob: nothing is visible until `commit` (one blob whole)."""

    def write(self, data: bytes | bytearray | memoryview) -> int: ...
    def tell(self) -> int: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...
    def writable(self) -> bool: ...

    @property
    def closed(self) -> bool: ...

    @property
    def size(self) -> int:
        """Bytes written so far."""

    @property
    def blocks(self) -> int:
        """Blocks staged so far."""

    def commit(self) -> int:
        """Make the blob exactly the bytes written (replacing any of that name); its size."""


class Blobs(Protocol):
    """One container of an account: blobs by name."""

    @property
    def name(self) -> str: ...

    def read(self, name: str) -> bytes:
        """The blob's bytes; NotFound when it (or the container) is missing."""

    def read_capped(self, name: str, limit: int) -> bytes:
        """The blob's bytes when it holds at most `limit` (one ranged GET of `limit` + 1 bytes);
        `shared.storage.limits.BlobTooLarge` (with its full size) otherwise."""

    def read_range(self, name: str, offset: int, length: int, etag: str | None = None) -> tuple[bytes, str]:
        """Bytes [offset, offset + length) and the blob's ETag; If-Match `etag` when given
        (ConditionFailed when it changed)."""

    def write(
        self, name: str, data: bytes | str, *, content_type: str | None = None, overwrite: bool = True
    ) -> None:
        """Upload the blob whole (one request); `overwrite=False`: AlreadyExists when it is there."""

    def writer(self, name: str, content_type: str, block_bytes: int | None = None) -> BlobWriter:
        """A file whose bytes become the blob at `commit` (staged a block at a time)."""

    def exists(self, name: str) -> bool: ...

    def delete(self, name: str, unmodified_since: datetime | None = None) -> bool:
        """Delete the blob (unless written after `unmodified_since`); False when it is gone or kept."""

    def pages(self, prefix: str = "", size: int | None = None) -> Iterator[list[BlobInfo]]:
        """The blobs under `prefix` in name order, a request per page of `size`."""

    def found(self, query: TagQuery, size: int | None = None) -> Iterator[list[str]]:
        """Names of the blobs whose index tags match `query`, a request per page of `size`."""

    def check(self) -> None:
        """One request that fails (NotFound, StorageError) unless the container answers."""

    def create(self) -> None:
        """Create the container; one already there is no error."""

    def ranges(self, name: str) -> Ranges:
        """Ranged reads of the blob (shared/blobio: the aggregate engine's input)."""


class Queue(MessageQueue, Protocol):
    """One queue of an account: `MessageQueue`'s calls, its depth, and its creation."""

    @property
    def name(self) -> str: ...

    def delete_message(self, message: Any, pop_receipt: str | None = None) -> None:
        """Delete a received message (or one by id and `pop_receipt`); NotFound when it is gone,
        StorageError `PopReceiptMismatch` when it was received again since."""

    def update_message(
        self,
        message: Any,
        pop_receipt: str | None = None,
        content: Any = None,
        *,
        visibility_timeout: int = 0,
    ) -> str:
        """Make a received message (or one by id and `pop_receipt`) visible `visibility_timeout`
        seconds from now, with `content` when given; its new pop receipt (the old one is spent).
        Fails as `delete_message` does."""

    def depth(self) -> int:
        """The service's approximate count of messages (one request)."""

    def create(self) -> None:
        """Create the queue; one already there is no error."""


class Account(Protocol):
    """One storage account: its documents, tables and queues. The app holds one (the host's
    `AzureWebJobsStorage`, `Runtime.account`); another account is another value of the same type
    (`shared.storage.accounts.account_for(connection)`), handing out its own ports."""

    def documents(
        self,
        container: str,
        *,
        metadata: Callable[[dict[str, Any]], dict[str, str]] | None = None,
        tags: Callable[[dict[str, Any]], dict[str, str]] | None = None,
    ) -> DocumentStore:
        """JSON documents in `container` (`metadata` and index `tags` derived from each write)."""

    def blobs(self, container: str) -> Blobs:
        """The blobs of `container`."""

    def tables(self) -> Tables:
        """The account's Table service (NoTableEndpoint when its connection names none)."""

    def queue(self, name: str) -> Queue:
        """A queue whose messages are base64 text (as the Functions host reads them)."""

    def raw_queue(self, name: str) -> Queue:
        """A queue whose message text is sent and read unchanged (poison copies)."""

    def describe(self) -> str:
        """The account, for logs (never a key)."""
