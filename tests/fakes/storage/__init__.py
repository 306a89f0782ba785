"""The SDK-imitating storage account: the blob and queue calls of the Azure adapters, and no others.

`MemoryStorage`'s clients (`clients()` for `StorageClients`) stand in for azure-storage-blob's
`BlobServiceClient` and azure-storage-queue's `QueueServiceClient`, so the Azure adapters of
`shared.storage` (`AzureAccount`: `AzureBlobs`, `AzureQueue`, `BlobDocuments`, the staged writer)
run in the fast tier: tests/integration/test_port_contract.py's `[sdk]` variant. Everything else
runs on the ports in memory (`shared.storage.memory_account.MemoryAccount`).

Faithful where the adapters depend on it; tests/integration/test_storage_contract.py runs the same
assertions against this and against Azurite: blobs with ETags, `match_condition` IfMissing and
IfNotModified, `if_unmodified_since`, failures raised as the SDK raises them (its own error
processing builds them), metadata and index tags replaced by every write, listings in pages, Find
Blobs by Tags, ranged downloads (416 for a range of an empty blob), staged blocks; queues with
visibility timeouts, dequeue counts, pop receipts (a stale one refused: 400 PopReceiptMismatch),
updates, time-to-live (-1: never), the 64 KiB limit, and the SDK's own encode/decode policies and
pager. Keyword arguments the fake does not know raise TypeError: an adapter's new call fails here
until the fake (and its contract test) learn it.
"""

from tests.fakes.storage.account import MemoryStorage

__all__ = ["MemoryStorage"]
