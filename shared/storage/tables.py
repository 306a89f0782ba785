"""A Table storage client for the account the app already uses (the console's indexes live there).

Azure Table storage serves the indexes (`shared/indexes/jobs.py`, `shared/poison/entry_index.py`):
newest-first keys, continuation tokens and server-side filters, which blob listings do not give.
Azurite serves tables on its table port (the connection string's `TableEndpoint`).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

from azure.core import MatchConditions
from azure.data.tables import TableClient, TableServiceClient, UpdateMode
from azure.data.tables._policies import TablesRetryPolicy

from shared.config.settings import StorageConnection
from shared.storage.clients import within_budget
from shared.storage.failures import AlreadyExists, NotFound, translated
from shared.storage.ports import Row, Table, TableOp, TablePage

KEPT_TABLE_CLIENTS = 64
"""Table clients kept per process (the jobs index adds one table a day; older ones are rebuilt)."""


class _TablesRetry(TablesRetryPolicy):
    """The Tables SDK's retry, cut to the `CallBudget` of `bounded_calls` (shared/storage/clients.py)."""

    def configure_retries(self, options: dict[str, Any]) -> dict[str, Any]:
        settings: dict[str, Any] = super().configure_retries(options)  # type: ignore[no-untyped-call]
        return within_budget(settings, options)


class _TableClient(TableClient):
    """A table client whose retry policy reads the current `CallBudget`."""

    def _configure_policies(self, **kwargs: Any) -> list[Any]:
        policies: list[Any] = super()._configure_policies(**kwargs)
        retry = _TablesRetry(**kwargs)  # type: ignore[no-untyped-call]
        return [retry if isinstance(p, TablesRetryPolicy) else p for p in policies]


class TableService(TableServiceClient):
    """A Table service whose table clients share no pipeline object, so threads can use them.

    The SDK's `get_table_client` (which `create_table` and `delete_table` call too) builds a
    pipeline over the service's own policy objects and relinks them (azure-core's `Pipeline`):
    a request in flight on another thread can then reach a policy whose `next` is not set yet
    and fail with AttributeError "'_SansIOHTTPPolicyRunner' object has no attribute 'next'"
    (seen in tests with 8 threads; reproduced ~4 in 6,000 upserts). Here each table's client is
    built on its own pipeline, once, under a lock, and reused."""

    def __init__(self, endpoint: str, **kwargs: Any) -> None:
        super().__init__(endpoint, **kwargs)
        self._tables: OrderedDict[str, TableClient] = OrderedDict()
        self._tables_lock = threading.Lock()

    def get_table_client(self, table_name: str, **kwargs: Any) -> TableClient:
        if kwargs:
            raise TypeError(f"unexpected options for a table client: {sorted(kwargs)}")
        with self._tables_lock:
            client = self._tables.get(table_name)
            if client is None:
                client = _TableClient(
                    self.url, table_name, credential=self.credential, api_version=self.api_version
                )
                self._tables[table_name] = client
                while len(self._tables) > KEPT_TABLE_CLIENTS:
                    self._tables.popitem(last=False)
            else:
                self._tables.move_to_end(table_name)
            return client

    def kept(self) -> list[str]:
        """The tables whose clients are kept, least recently used first."""
        with self._tables_lock:
            return list(self._tables)


def _row(entity: Any) -> Row:
    metadata = getattr(entity, "metadata", None) or {}
    return Row(entity, str(metadata.get("etag") or ""))


def _operation(op: TableOp) -> tuple[Any, ...]:
    """The SDK's form of one transaction operation."""
    if op.kind == "create":
        return ("create", dict(op.entity))
    options: dict[str, Any] = {}
    if op.kind in ("upsert", "update"):
        options["mode"] = UpdateMode.REPLACE
    if op.etag is not None:
        options.update(etag=op.etag, match_condition=MatchConditions.IfNotModified)
    if op.kind == "delete":
        keys = {"PartitionKey": op.entity["PartitionKey"], "RowKey": op.entity["RowKey"]}
        return ("delete", keys, options) if options else ("delete", keys)
    return (op.kind, dict(op.entity), options)


class AzureTable:
    """The `Table` port on an SDK table client: one request a call (`rows`: one a page)."""

    def __init__(self, service: TableServiceClient, name: str) -> None:
        self._service = service
        self._name = name
        self.client = service.get_table_client(name)

    @property
    def name(self) -> str:
        return self._name

    def create(self) -> None:
        with contextlib.suppress(AlreadyExists), translated(f"creating table {self._name}"):
            self._service.create_table(self._name)

    def drop(self) -> None:
        with translated(f"deleting table {self._name}"):
            self._service.delete_table(self._name)

    def get(self, partition: str, row: str) -> Row | None:
        try:
            with translated(f"reading {row} of {self._name}"):
                return _row(self.client.get_entity(partition, row))
        except NotFound:
            return None

    def insert(self, entity: Mapping[str, Any]) -> str:
        with translated(f"creating {entity.get('RowKey')} in {self._name}"):
            return str(self.client.create_entity(dict(entity)).get("etag") or "")

    def upsert(self, entity: Mapping[str, Any]) -> None:
        with translated(f"writing {entity.get('RowKey')} of {self._name}"):
            self.client.upsert_entity(dict(entity), mode=UpdateMode.REPLACE)

    def update(self, entity: Mapping[str, Any], etag: str) -> str:
        with translated(f"updating {entity.get('RowKey')} of {self._name}"):
            done = self.client.update_entity(
                dict(entity),
                mode=UpdateMode.REPLACE,
                etag=etag,
                match_condition=MatchConditions.IfNotModified,
            )
        return str(done.get("etag") or "")

    def delete(self, partition: str, row: str, etag: str | None = None) -> None:
        condition: dict[str, Any] = (
            {"match_condition": MatchConditions.Unconditionally}
            if etag is None
            else {"etag": etag, "match_condition": MatchConditions.IfNotModified}
        )
        with translated(f"deleting {row} of {self._name}"):
            self.client.delete_entity(partition, row, **condition)

    def query(
        self,
        where: str,
        *,
        size: int | None = None,
        select: Sequence[str] | None = None,
        continuation: Any = None,
    ) -> TablePage:
        with translated(f"querying {self._name}"):
            pager = self.client.query_entities(
                where, results_per_page=size, select=list(select) if select else None
            ).by_page(continuation_token=continuation)
            got = [_row(e) for e in next(pager, [])]
        return TablePage(got, getattr(pager, "continuation_token", None))

    def rows(
        self, where: str, *, size: int | None = None, select: Sequence[str] | None = None
    ) -> Iterator[Row]:
        with translated(f"querying {self._name}"):
            for e in self.client.query_entities(
                where, results_per_page=size, select=list(select) if select else None
            ):
                yield _row(e)

    def transact(self, ops: Sequence[TableOp]) -> list[str | None]:
        with translated(f"a transaction of {len(ops)} on {self._name}"):
            answers = self.client.submit_transaction([_operation(op) for op in ops])
        return [
            None if op.kind == "delete" else str((answer or {}).get("etag") or "") or None
            for op, answer in zip(ops, answers, strict=False)
        ]


class AzureTables:
    """The `Tables` port on an account's Table service."""

    def __init__(self, service: TableServiceClient) -> None:
        self.service = service

    def table(self, name: str) -> AzureTable:
        return AzureTable(self.service, name)

    def names(self, where: str) -> list[str]:
        with translated("listing tables"):
            return [t.name for t in self.service.query_tables(where)]


def query_rows(table: Table, where: str, size: int, max_queries: int) -> list[Row]:
    """Up to `size` entities matching `where`, in key order: one query, more only while the service
    answers a short page with a continuation (at most `max_queries`); none when the table is missing."""
    rows: list[Row] = []
    cont: Any = None
    try:
        for _ in range(max_queries):
            page = table.query(where, size=size - len(rows), continuation=cont)
            rows.extend(page.rows[: size - len(rows)])
            cont = page.continuation
            if len(rows) >= size or not cont:
                break
    except NotFound:
        return []
    return rows


def upsert_creating(table: Table, entity: Mapping[str, Any]) -> None:
    """Upsert (replace) `entity`; when its table is missing, create it and upsert again: one
    request while the table exists."""
    try:
        table.upsert(entity)
    except NotFound:
        table.create()
        table.upsert(entity)


class NoTableEndpoint(Exception):
    """The connection names no table endpoint (a connection string with blob and queue only)."""


def table_service(conn: StorageConnection) -> TableService:
    """The Table service of the configured account; NoTableEndpoint when it cannot be named.

    Identity based: `AzureWebJobsStorage__tableServiceUri` (the deployment sets it), else derived
    from the account name or from the blob service uri."""
    from shared.storage.clients import DEV_CONNECTION, credential_for

    if conn.connection_string is not None:
        text = conn.connection_string
        if text == "UseDevelopmentStorage=true":
            text = f"{DEV_CONNECTION}TableEndpoint=http://127.0.0.1:10002/devstoreaccount1;"
        parts = dict(p.split("=", 1) for p in text.split(";") if "=" in p)
        if "TableEndpoint" not in parts and "AccountName" not in parts:
            raise NoTableEndpoint("the storage connection string names no TableEndpoint or AccountName")
        if "TableEndpoint" not in parts and "BlobEndpoint" in parts:
            raise NoTableEndpoint("the storage connection string names a BlobEndpoint but no TableEndpoint")
        return cast(TableService, TableService.from_connection_string(text))  # the SDK builds `cls(...)`
    url = conn.table_endpoint()
    if url is None:
        raise NoTableEndpoint(
            "identity-based storage names no table service: set AzureWebJobsStorage__tableServiceUri "
            "or AzureWebJobsStorage__accountName"
        )
    return TableService(url, credential=credential_for(conn))
