"""An in-memory storage account: the blob and queue calls the app makes, and no others.

`MemoryStorage` holds containers, queues and tables behind one lock. Its clients (`clients()` for
`StorageClients`) stand in for azure-storage-blob's `BlobServiceClient` and azure-storage-queue's
`QueueServiceClient`; its tables are the `Tables` port in memory (`shared.storage.memory_tables`,
held to Azure's answers by tests/integration/test_table_port.py). `app_account()` is the app's
`Account` on all three, so `process_message`, the poison handler and the operator tools run
unchanged in logic tests, without Azurite.

Faithful where the app's guarantees depend on it; tests/integration/test_storage_contract.py runs
the same assertions against this and against Azurite:

- blobs: ETags; `match_condition` IfMissing (If-None-Match: *, also what `overwrite=False` sends)
  and IfNotModified (If-Match), `if_unmodified_since`; failures raised as the SDK raises them (its
  own error processing builds them: the same classes, status codes and `error_code`s); metadata and
  index tags replaced by every write (none given: cleared); listings by prefix in name order, in
  pages; Find Blobs by Tags (consistent at once here, where the service's index may lag); ranged
  downloads with their Content-Range, 416 for a range of an empty blob; staged blocks (Put Block,
  Put Block List of staged blocks, replacing the blob and dropping the other uncommitted ones; Get
  Block List).
- queues: visibility timeouts on send and receive, dequeue counts, pop receipts (a stale one is
  refused: 400 PopReceiptMismatch), time-to-live (-1: never), the 64 KiB message limit; the SDK's
  own encode/decode policies and pager (`receive_messages(max_messages=n)` takes one message a
  request, lazily, as the SDK does).

A module per service: `blobs.py`, `queues.py`; `account.py` holds them and the tables behind one
lock, one clock and one request log; `common.py` has the limits, the clocks and the SDKs' errors.
Import from the package (`from tests.fakes.storage import MemoryStorage`).

Time comes from `clock`: the real time by default; `ManualClock` (only a test moves it) or
`SkippingClock` (the real time, plus what a test skipped) let a test wait without sleeping. Every call is
logged in `requests` as the REST request it stands for (`PUT /devstoreaccount1/ledger/a.json`), so
request counts can be asserted here as they are over HTTP. Keyword arguments the fake does not know
raise TypeError, and filters it cannot evaluate raise NotImplementedError: a new call of the app
fails here until the fake (and its contract test) learn it, rather than passing unchecked.
"""

from tests.fakes.storage.account import MemoryStorage
from tests.fakes.storage.blobs import (
    MemoryBlobClient,
    MemoryBlobService,
    MemoryContainerClient,
    MemoryDownloader,
)
from tests.fakes.storage.common import (
    ACCOUNT,
    Clock,
    ManualClock,
    SkippingClock,
    blob_error,
    queue_error,
    real_time,
)
from tests.fakes.storage.queues import MemoryQueueClient, MemoryQueueService

__all__ = [
    "ACCOUNT",
    "Clock",
    "ManualClock",
    "MemoryBlobClient",
    "MemoryBlobService",
    "MemoryContainerClient",
    "MemoryDownloader",
    "MemoryQueueClient",
    "MemoryQueueService",
    "MemoryStorage",
    "SkippingClock",
    "blob_error",
    "parse_tag_filter",
    "queue_error",
    "real_time",
]
