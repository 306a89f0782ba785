"""A storage account as one value: `AzureAccount` hands out the account's ports (documents,
tables, queues) on the SDK's clients, built once per account and shared by invocations.

The app holds the host's account (`AzureWebJobsStorage`) as `Runtime.account`. A second account
is a second value: `account_for(connection)` with the `StorageConnection` its own setting names
(`Settings`' `storage_connection(env, "<NAME>")` reads `<NAME>` as a connection string or
`<NAME>__accountName` / `__blobServiceUri` / `__queueServiceUri` / `__serviceUri` and the
identity ones, as for `AzureWebJobsStorage`); then `.queue(name)`, `.tables()`, `.blobs(c)`,
`.documents(c)`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from shared.config.settings import StorageConnection
from shared.storage.azure_blobs import AzureBlobs
from shared.storage.azure_queues import AzureQueue
from shared.storage.blob_documents import BlobDocuments
from shared.storage.clients import StorageClients, clients_for
from shared.storage.ports import Tables
from shared.storage.tables import AzureTables, table_service


class AzureAccount:
    """One Azure storage account: its blob and queue clients (`clients`) and its Table service,
    built on first use (a connection without a table endpoint fails then: NoTableEndpoint), or
    `tables` when given."""

    def __init__(
        self,
        clients: StorageClients,
        connection: StorageConnection,
        tables: Tables | None = None,
    ) -> None:
        self.clients = clients
        self.connection = connection
        self._tables = tables
        self._lock = threading.Lock()

    def documents(
        self,
        container: str,
        *,
        metadata: Callable[[dict[str, Any]], dict[str, str]] | None = None,
        tags: Callable[[dict[str, Any]], dict[str, str]] | None = None,
    ) -> BlobDocuments:
        return BlobDocuments(self.clients.container(container), metadata=metadata, tags=tags)

    def blobs(self, container: str) -> AzureBlobs:
        return AzureBlobs(self.clients.container(container))

    def tables(self) -> Tables:
        with self._lock:
            if self._tables is None:
                self._tables = AzureTables(table_service(self.connection))
            return self._tables

    def queue(self, name: str) -> AzureQueue:
        return AzureQueue(self.clients.queue(name))

    def raw_queue(self, name: str) -> AzureQueue:
        return AzureQueue(self.clients.raw_queue(name))

    def describe(self) -> str:
        return self.connection.describe()


def account_for(connection: StorageConnection) -> AzureAccount:
    """The account `connection` names. No network request is made here."""
    return AzureAccount(clients_for(connection), connection)
