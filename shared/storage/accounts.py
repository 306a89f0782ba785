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

import logging
import threading
from collections.abc import Callable
from typing import Any

from shared.config.settings import Settings, StorageConnection
from shared.storage.azure_blobs import AzureBlobs
from shared.storage.azure_queues import AzureQueue
from shared.storage.blob_documents import BlobDocuments
from shared.storage.clients import StorageClients, clients_for
from shared.storage.failures import StorageError
from shared.storage.ports import Account, Tables
from shared.storage.tables import AzureTables, table_service

log = logging.getLogger("jobs.storage")


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


def _not_permitted(exc: StorageError) -> bool:
    """403: the identity may use the resource but not create it (roles scoped to it)."""
    return exc.status_code == 403 or (exc.error_code or "").startswith("Authorization")


def ensure_resources(account: Account, settings: Settings) -> list[str]:
    """Create the app's queues and containers if missing (start-up / deploy time, never per message).

    With identity-based storage the deployment creates them (infra/main.bicep) and the app's roles
    are scoped to each queue and container, which may not allow creating one: such a refusal is
    logged and skipped (a missing resource then fails its first real use, naming it). Returns the
    names that could not be checked that way.
    """
    skipped: list[str] = []

    def attempt(name: str, create: Callable[[], None]) -> None:
        try:
            create()
        except StorageError as exc:
            if not _not_permitted(exc):
                raise
            skipped.append(name)
            log.warning(
                "storage: not permitted to create %s (%s); expecting the deployment to have created it",
                name,
                exc.error_code or exc.status_code,
            )

    for queue in settings.queue_set:  # a queue in another account: its owner creates it
        own = (queue.name, queue.poison) if queue.connection is None else ()
        for name in (*own, queue.parked):  # parked copies stay in the app's account
            attempt(name, account.queue(name).create)
    for name in (
        settings.ledger_container,
        settings.results_container,
        settings.payloads_container,
        settings.poison_archive_container,
    ):
        attempt(name, account.blobs(name).create)
    return skipped
