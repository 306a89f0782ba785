"""The account: containers and queues behind one lock, one clock, one request log."""

from __future__ import annotations

import itertools
import threading
from typing import cast

from azure.storage.blob import BlobServiceClient
from azure.storage.queue import QueueServiceClient

from shared.storage.clients import StorageClients
from tests.fakes.storage.blobs import ContainerRecord, MemoryBlobService
from tests.fakes.storage.common import ACCOUNT, Clock, blob_error, real_time
from tests.fakes.storage.queues import MemoryQueueService, QueueRecord


class MemoryStorage:
    """One storage account in memory: blob containers and queues, behind the SDK's clients."""

    def __init__(self, clock: Clock = real_time, account: str = ACCOUNT) -> None:
        self.clock = clock
        self.account = account
        self.lock = threading.RLock()
        self.containers: dict[str, ContainerRecord] = {}
        self.queues: dict[str, QueueRecord] = {}
        self.requests: list[str] = []
        """Every call, as the REST request it stands for: `METHOD /account/path`."""
        self._seq = itertools.count(1)
        self.blob = MemoryBlobService(self)
        self.queue_service = MemoryQueueService(self)

    def clients(self) -> StorageClients:
        """The app's blob and queue clients, on this account."""
        return StorageClients(
            blob=cast(BlobServiceClient, self.blob),
            queue_service=cast(QueueServiceClient, self.queue_service),
        )

    def url(self, path: str = "") -> str:
        return f"memory://{self.account}/{path}"

    def log(self, method: str, path: str) -> None:
        self.requests.append(f"{method} /{self.account}/{path}")

    def next_seq(self) -> int:
        return next(self._seq)

    def blob_etag(self) -> str:
        return f'"0x8DE{self.next_seq():013X}"'

    def container(self, name: str) -> ContainerRecord:
        found = self.containers.get(name)
        if found is None:
            raise blob_error(404, "ContainerNotFound", "The specified container does not exist.")
        return found
