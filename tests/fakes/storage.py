"""An in-memory storage account: the blob, queue and table calls the app makes, and no others.

`MemoryStorage` holds containers, queues and tables behind one lock. Its clients (`clients()` for
`StorageClients`, `table_service()` for the console's indexes) stand in for azure-storage-blob's
`BlobServiceClient`, azure-storage-queue's `QueueServiceClient` and azure-data-tables'
`TableServiceClient`, so `process_message`, the poison handler and the operator tools run unchanged
in logic tests, without Azurite.

Faithful where the app's guarantees depend on it; tests/integration/test_storage_contract.py runs
the same assertions against this and against Azurite:

- blobs: ETags; `match_condition` IfMissing (If-None-Match: *, also what `overwrite=False` sends)
  and IfNotModified (If-Match), `if_unmodified_since`; failures raised as the SDK raises them (its
  own error processing builds them: the same classes, status codes and `error_code`s); metadata and
  index tags replaced by every write (none given: cleared); listings by prefix in name order, in
  pages; Find Blobs by Tags (consistent at once here, where the service's index may lag); ranged
  downloads with their Content-Range, 416 for a range of an empty blob.
- queues: visibility timeouts on send and receive, dequeue counts, pop receipts (a stale one is
  refused: 400 PopReceiptMismatch), time-to-live (-1: never), the 64 KiB message limit; the SDK's
  own encode/decode policies and pager (`receive_messages(max_messages=n)` takes one message a
  request, lazily, as the SDK does).
- tables: create/upsert (merge or replace)/update (If-Match)/delete/get, queries with OData filters
  (comparisons joined by `and`: what the app sends) in pages with continuation tokens, entity group
  transactions (all or nothing), the SDK's value rules (ints are Int32) and the key rules.

Time comes from `clock`: the real time by default; `ManualClock` (only a test moves it) or
`SkippingClock` (the real time, plus what a test skipped) let a test wait without sleeping. Every call is
logged in `requests` as the REST request it stands for (`PUT /devstoreaccount1/ledger/a.json`), so
request counts can be asserted here as they are over HTTP. Keyword arguments the fake does not know
raise TypeError, and filters it cannot evaluate raise NotImplementedError: a new call of the app
fails here until the fake (and its contract test) learn it, rather than passing unchecked.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import itertools
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http import HTTPStatus
from typing import IO, Any, NoReturn, cast

from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.core.paging import ItemPaged
from azure.data.tables import (
    EdmType,
    TableEntity,
    TableItem,
    TableServiceClient,
    TableTransactionError,
    UpdateMode,
)
from azure.data.tables._error import (
    _ERROR_TYPE_NOT_SUPPORTED,
    _ERROR_VALUE_TOO_LARGE,
    _decode_error,
    _validate_storage_tablename,
)
from azure.data.tables._serialize import _get_match_condition
from azure.storage.blob import (
    BlobProperties,
    BlobServiceClient,
    BlobType,
    ContainerProperties,
    ContentSettings,
    FilteredBlob,
)
from azure.storage.blob._serialize import get_modify_conditions
from azure.storage.blob._shared.response_handlers import process_storage_error as _process_blob_error
from azure.storage.queue import QueueMessage, QueueProperties, QueueServiceClient, StorageErrorCode
from azure.storage.queue._message_encoding import (
    MessageDecodePolicy,
    MessageEncodePolicy,
    NoDecodePolicy,
    NoEncodePolicy,
)
from azure.storage.queue._models import MessagesPaged
from azure.storage.queue._shared.response_handlers import process_storage_error as _process_queue_error

from shared.storage.clients import StorageClients

ACCOUNT = "devstoreaccount1"
NEVER = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
"""The expiry the service reports for a message put with time-to-live -1."""
MAX_MESSAGE_BYTES = 64 * 1024
DEFAULT_TTL_S = 7 * 24 * 3600
MAX_VISIBILITY_S = 7 * 24 * 3600
TABLE_PAGE = 1000
"""Entities a query answers at most (the service's limit, whatever `results_per_page` asks)."""
LIST_PAGE = 5000
TRANSACTION_LIMIT = 100
MAX_KEY_CHARS = 1024
MAX_STRING_CHARS = 32 * 1024
"""A string property holds at most 64 KiB of UTF-16."""
MAX_PROPERTIES = 255
_FORBIDDEN_KEY = re.compile(r"[/\\#?\x00-\x1f\x7f-\x9f]")
_LOWER_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?!-))*[a-z0-9]$")
"""Container and queue names: lower-case letters, digits, single hyphens inside."""
_TAG_CHARS = re.compile(r"^[A-Za-z0-9 +\-./:=_]*$")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

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
    """The real time, plus what a test skipped (`advance`): the account's time passes at once,
    while the app's own clock (the real time) does not move."""

    def __init__(self) -> None:
        self.skipped = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.skipped

    def advance(self, seconds: float) -> None:
        self.skipped += timedelta(seconds=seconds)


def _seconds(moment: datetime) -> datetime:
    """A time as the service reports it in headers and listings: whole seconds."""
    return moment.replace(microsecond=0)


# -- errors, built by the SDKs' own error processing ----------------------------------------


class _ErrorResponse:
    """The parts of an HTTP error response that azure-core's exceptions and the SDKs read."""

    def __init__(self, status: int, code: str) -> None:
        self.status_code = status
        self.reason = HTTPStatus(status).phrase
        self.headers = {"x-ms-error-code": code}
        self.content_type = "application/xml"

    def text(self, encoding: str | None = None) -> str:
        return ""


def _raw_error(status: int, code: str, message: str) -> HttpResponseError:
    """What the SDKs' generated layer raises for an answer (its error map: 404 and 409), before the
    client's error processing."""
    kind: type[HttpResponseError] = {404: ResourceNotFoundError, 409: ResourceExistsError}.get(
        status, HttpResponseError
    )
    return kind(message=message, response=cast(Any, _ErrorResponse(status, code)))


def _processed(process: Callable[[HttpResponseError], NoReturn], raw: HttpResponseError) -> HttpResponseError:
    try:
        process(raw)
    except HttpResponseError as exc:
        return exc
    raise AssertionError("the SDK's error processing always raises")


def blob_error(status: int, code: str, message: str) -> HttpResponseError:
    """The exception azure-storage-blob raises for this answer."""
    return _processed(_process_blob_error, _raw_error(status, code, message))


def queue_error(status: int, code: str, message: str) -> HttpResponseError:
    """The exception azure-storage-queue raises for this answer."""
    return _processed(_process_queue_error, _raw_error(status, code, message))


def table_error(status: int, code: str, message: str) -> HttpResponseError:
    """The exception azure-data-tables raises for this answer."""
    return cast(HttpResponseError, _decode_error(_ErrorResponse(status, code), message))  # type: ignore[no-untyped-call]


def _unknown(kwargs: Mapping[str, Any], call: str) -> None:
    if kwargs:
        raise TypeError(
            f"the in-memory {call} does not take {sorted(kwargs)} (teach it, and its contract test)"
        )


def _check_name(name: str, error: Callable[[int, str, str], HttpResponseError]) -> None:
    if not 3 <= len(name) <= 63:
        raise error(
            400, "OutOfRangeInput", "The specified resource name length is not within the permissible limits."
        )
    if not _LOWER_NAME.match(name):
        raise error(400, "InvalidResourceName", "The specified resource name contains invalid characters.")


# -- the account ------------------------------------------------------------------------------


@dataclass
class _Blob:
    data: bytes
    etag: str
    last_modified: datetime
    created: datetime
    metadata: dict[str, str]
    tags: dict[str, str]
    content_settings: ContentSettings


@dataclass
class _Container:
    name: str
    etag: str
    last_modified: datetime
    metadata: dict[str, str]
    blobs: dict[str, _Blob] = field(default_factory=dict)


@dataclass
class _Message:
    id: str
    text: str
    seq: int
    inserted_on: datetime
    expires_on: datetime
    visible_at: datetime
    pop_receipt: str
    dequeue_count: int = 0


@dataclass
class _Queue:
    name: str
    metadata: dict[str, str]
    messages: dict[str, _Message] = field(default_factory=dict)

    def live(self, now: datetime) -> list[_Message]:
        """Messages not expired (expired ones are dropped), oldest first."""
        for gone in [m.id for m in self.messages.values() if m.expires_on <= now]:
            del self.messages[gone]
        return sorted(self.messages.values(), key=lambda m: m.seq)


@dataclass(frozen=True)
class _Entity:
    props: dict[str, Any]
    etag: str
    timestamp: datetime


@dataclass
class _Table:
    name: str
    entities: dict[tuple[str, str], _Entity] = field(default_factory=dict)


class MemoryStorage:
    """One storage account in memory: blob containers, queues and tables."""

    def __init__(self, clock: Clock = real_time, account: str = ACCOUNT) -> None:
        self.clock = clock
        self.account = account
        self.lock = threading.RLock()
        self.containers: dict[str, _Container] = {}
        self.queues: dict[str, _Queue] = {}
        self.tables: dict[str, _Table] = {}
        """By lower-case name: table names are case-insensitive."""
        self.requests: list[str] = []
        """Every call, as the REST request it stands for: `METHOD /account/path`."""
        self._seq = itertools.count(1)
        self.blob = MemoryBlobService(self)
        self.queue_service = MemoryQueueService(self)
        self.table_service_client = MemoryTableService(self)

    def clients(self) -> StorageClients:
        """The app's blob and queue clients, on this account."""
        return StorageClients(
            blob=cast(BlobServiceClient, self.blob),
            queue_service=cast(QueueServiceClient, self.queue_service),
        )

    def table_service(self) -> TableServiceClient:
        """The Table service of this account (for `Runtime.over(tables=...)`)."""
        return cast(TableServiceClient, self.table_service_client)

    def wait(self, seconds: float) -> None:
        """Let `seconds` of this account's time pass: at once when its clock can skip ahead."""
        advance = getattr(self.clock, "advance", None)
        if callable(advance):
            advance(seconds)
        else:
            time.sleep(seconds)

    def url(self, path: str = "") -> str:
        return f"memory://{self.account}/{path}"

    def log(self, method: str, path: str) -> None:
        self.requests.append(f"{method} /{self.account}/{path}")

    def next_seq(self) -> int:
        return next(self._seq)

    def blob_etag(self) -> str:
        return f'"0x8DE{self.next_seq():013X}"'

    def container(self, name: str) -> _Container:
        found = self.containers.get(name)
        if found is None:
            raise blob_error(404, "ContainerNotFound", "The specified container does not exist.")
        return found


# -- blobs --------------------------------------------------------------------------------------


def _blob_bytes(data: Any, encoding: str) -> bytes:
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    if isinstance(data, str):
        return data.encode(encoding)
    if hasattr(data, "read"):
        read = cast(IO[Any], data).read()
        return read.encode(encoding) if isinstance(read, str) else bytes(read)
    if isinstance(data, Iterable):
        return b"".join(bytes(chunk) for chunk in data)
    raise TypeError(f"unsupported data type: {type(data)}")


def _check_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    out = dict(metadata or {})
    for key, value in out.items():
        if not _IDENTIFIER.match(key) or not str(value).isascii():
            raise blob_error(
                400,
                "InvalidMetadata",
                "The metadata specified is invalid. It has characters that are not permitted.",
            )
    return out


def _check_tags(tags: Mapping[str, str] | None) -> dict[str, str]:
    out = dict(tags or {})
    if len(out) > 10 or any(
        not 1 <= len(k) <= 128 or len(v) > 256 or not _TAG_CHARS.match(k) or not _TAG_CHARS.match(v)
        for k, v in out.items()
    ):
        raise blob_error(
            400,
            "InvalidTag",
            "The tags specified are invalid. It contains characters that are not permitted.",
        )
    return out


def _unmet(blob: _Blob | None, conditions: Any) -> HttpResponseError | None:
    """The answer to a write whose conditions fail (None when they hold)."""
    if conditions.if_none_match is not None:
        if conditions.if_none_match != "*":
            raise NotImplementedError("If-None-Match with an ETag")
        if blob is not None:
            return blob_error(409, "BlobAlreadyExists", "The specified blob already exists.")
    not_met = blob_error(
        412, "ConditionNotMet", "The condition specified using HTTP conditional header(s) is not met."
    )
    if conditions.if_match is not None and (
        blob is None or (conditions.if_match != "*" and conditions.if_match != blob.etag)
    ):
        return not_met
    since = conditions.if_unmodified_since
    if since is not None and blob is not None and blob.last_modified > _seconds(since):
        return not_met
    since = conditions.if_modified_since
    if since is not None and (blob is None or blob.last_modified <= _seconds(since)):
        return not_met
    return None


def _properties(container: str, name: str, blob: _Blob, metadata: bool = True) -> BlobProperties:
    props = BlobProperties()
    props.name = name
    props.container = container
    props.etag = blob.etag
    props.last_modified = blob.last_modified
    props.creation_time = blob.created
    props.size = len(blob.data)
    props.metadata = dict(blob.metadata) if metadata else {}
    props.content_settings = copy.copy(blob.content_settings)
    props.blob_type = BlobType.BLOCKBLOB
    props.tag_count = len(blob.tags) or None
    return props


class MemoryDownloader:
    """What `download_blob` gives: the bytes of the range asked for, and the blob's properties
    (`content_range` names the range and the blob's full size)."""

    def __init__(self, data: bytes, properties: BlobProperties) -> None:
        self._data = data
        self.properties = properties
        self.size = len(data)
        self.name = properties.name
        self.container = properties.container

    def readall(self) -> bytes:
        return self._data

    def readinto(self, stream: IO[bytes]) -> int:
        stream.write(self._data)
        return len(self._data)


class MemoryBlobClient:
    """One blob of a `MemoryStorage` (azure-storage-blob's `BlobClient`, as the app uses it)."""

    def __init__(self, account: MemoryStorage, container: str, blob: str) -> None:
        self.account = account
        self.container_name = container
        self.blob_name = blob
        self.url = account.url(f"{container}/{blob}")

    def _path(self) -> str:
        return f"{self.container_name}/{self.blob_name}"

    def upload_blob(
        self,
        data: Any,
        blob_type: BlobType | str = BlobType.BLOCKBLOB,
        length: int | None = None,
        metadata: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        if blob_type not in (BlobType.BLOCKBLOB, "BlockBlob"):
            raise NotImplementedError("only block blobs")
        overwrite = bool(kwargs.pop("overwrite", False))
        conditions = get_modify_conditions(kwargs)  # the SDK's own reading of etag / match_condition
        if not overwrite and not any(
            (
                conditions.if_match,
                conditions.if_none_match,
                conditions.if_modified_since,
                conditions.if_unmodified_since,
            )
        ):
            conditions.if_none_match = "*"  # what the SDK sends for overwrite=False
        raw = _blob_bytes(data, kwargs.pop("encoding", "UTF-8"))
        if length is not None:
            raw = raw[:length]
        settings = kwargs.pop("content_settings", None) or ContentSettings()
        tags = _check_tags(kwargs.pop("tags", None))
        meta = _check_metadata(metadata)
        kwargs.pop("timeout", None)
        _unknown(kwargs, "upload_blob")
        with self.account.lock:
            self.account.log("PUT", self._path())
            container = self.account.container(self.container_name)
            existing = container.blobs.get(self.blob_name)
            failed = _unmet(existing, conditions)
            if failed is not None:
                raise failed
            now = _seconds(self.account.clock())
            blob = _Blob(
                raw,
                self.account.blob_etag(),
                now,
                existing.created if existing else now,
                meta,
                tags,
                copy.copy(settings),
            )
            container.blobs[self.blob_name] = blob
            return {
                "etag": blob.etag,
                "last_modified": blob.last_modified,
                "content_md5": bytearray(hashlib.md5(raw).digest()),
                "request_server_encrypted": True,
            }

    def download_blob(
        self, offset: int | None = None, length: int | None = None, **kwargs: Any
    ) -> MemoryDownloader:
        kwargs.pop("max_concurrency", None)
        kwargs.pop("timeout", None)
        if kwargs.pop("encoding", None) is not None:
            raise NotImplementedError("download_blob(encoding=...)")
        _unknown(kwargs, "download_blob")
        if length is not None and offset is None:
            raise ValueError("Offset value must not be None if length is set.")
        with self.account.lock:
            self.account.log("GET", self._path())
            blob = self.account.container(self.container_name).blobs.get(self.blob_name)
            if blob is None:
                raise blob_error(404, "BlobNotFound", "The specified blob does not exist.")
            total = len(blob.data)
            if offset is None:
                start, end = 0, total - 1
                content_range = f"bytes 0-{total - 1}/{total}" if total else None
            else:
                if offset >= total:  # a ranged GET of an empty blob too (the SDK raises it)
                    raise blob_error(
                        416,
                        "InvalidRange",
                        "The range specified is invalid for the current size of the resource.",
                    )
                start = offset
                end = min(total - 1, offset + length - 1 if length is not None else total - 1)
                content_range = f"bytes {start}-{end}/{total}"
            data = blob.data[start : end + 1]
            props = _properties(self.container_name, self.blob_name, blob)
            props.content_range = content_range
            props.size = len(data)
            return MemoryDownloader(data, props)

    def exists(self, **kwargs: Any) -> bool:
        kwargs.pop("timeout", None)
        _unknown(kwargs, "exists")
        with self.account.lock:
            self.account.log("HEAD", self._path())
            container = self.account.containers.get(self.container_name)
            return container is not None and self.blob_name in container.blobs

    def delete_blob(self, delete_snapshots: str | None = None, **kwargs: Any) -> None:
        conditions = get_modify_conditions(kwargs)
        kwargs.pop("timeout", None)
        _unknown(kwargs, "delete_blob")
        with self.account.lock:
            self.account.log("DELETE", self._path())
            container = self.account.container(self.container_name)
            blob = container.blobs.get(self.blob_name)
            if blob is None:
                raise blob_error(404, "BlobNotFound", "The specified blob does not exist.")
            failed = _unmet(blob, conditions)
            if failed is not None:
                raise failed
            del container.blobs[self.blob_name]


@dataclass(frozen=True)
class _TagTerm:
    key: str
    op: str
    value: str

    def holds(self, tags: Mapping[str, str]) -> bool:
        have = tags.get(self.key)
        if have is None:
            return False
        return {
            "=": have == self.value,
            "<": have < self.value,
            "<=": have <= self.value,
            ">": have > self.value,
            ">=": have >= self.value,
        }[self.op]


_TAG_TERM = re.compile(r"""\s*"([^"]+)"\s*(<=|>=|=|<|>)\s*'([^']*)'\s*""")


def parse_tag_filter(expression: str) -> list[_TagTerm]:
    """A Find Blobs by Tags expression: `"key" op 'value'` terms joined by AND."""
    terms = []
    for part in re.split(r"\s+AND\s+", expression.strip(), flags=re.IGNORECASE):
        found = _TAG_TERM.fullmatch(part)
        if found is None:
            raise NotImplementedError(f"tag filter not understood by the in-memory account: {expression!r}")
        terms.append(_TagTerm(*found.groups()))
    return terms


class MemoryContainerClient:
    """One container of a `MemoryStorage` (azure-storage-blob's `ContainerClient`, as used)."""

    def __init__(self, account: MemoryStorage, name: str) -> None:
        self.account = account
        self.container_name = name
        self.url = account.url(name)

    def create_container(
        self, metadata: Mapping[str, str] | None = None, public_access: str | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        kwargs.pop("timeout", None)
        _unknown(kwargs, "create_container")
        _check_name(self.container_name, blob_error)
        with self.account.lock:
            self.account.log("PUT", self.container_name)
            if self.container_name in self.account.containers:
                raise blob_error(409, "ContainerAlreadyExists", "The specified container already exists.")
            now = _seconds(self.account.clock())
            made = _Container(self.container_name, self.account.blob_etag(), now, _check_metadata(metadata))
            self.account.containers[self.container_name] = made
            return {"etag": made.etag, "last_modified": made.last_modified}

    def get_container_properties(self, **kwargs: Any) -> ContainerProperties:
        kwargs.pop("timeout", None)
        _unknown(kwargs, "get_container_properties")
        with self.account.lock:
            self.account.log("GET", self.container_name)
            found = self.account.container(self.container_name)
            props = ContainerProperties()
            props.name = found.name
            props.etag = found.etag
            props.last_modified = found.last_modified
            props.metadata = dict(found.metadata)
            return props

    def exists(self, **kwargs: Any) -> bool:
        kwargs.pop("timeout", None)
        _unknown(kwargs, "exists")
        with self.account.lock:
            self.account.log("GET", self.container_name)
            return self.container_name in self.account.containers

    def get_blob_client(self, blob: str, snapshot: str | None = None) -> MemoryBlobClient:
        if snapshot is not None:
            raise NotImplementedError("snapshots")
        return MemoryBlobClient(self.account, self.container_name, blob)

    def upload_blob(
        self,
        name: str,
        data: Any,
        blob_type: BlobType | str = BlobType.BLOCKBLOB,
        length: int | None = None,
        metadata: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> MemoryBlobClient:
        blob = self.get_blob_client(name)
        blob.upload_blob(data, blob_type, length, metadata, **kwargs)
        return blob

    def download_blob(
        self, blob: str, offset: int | None = None, length: int | None = None, **kwargs: Any
    ) -> MemoryDownloader:
        return self.get_blob_client(blob).download_blob(offset, length, **kwargs)

    def delete_blob(self, blob: str, delete_snapshots: str | None = None, **kwargs: Any) -> None:
        self.get_blob_client(blob).delete_blob(delete_snapshots, **kwargs)

    def list_blobs(
        self, name_starts_with: str | None = None, include: str | list[str] | None = None, **kwargs: Any
    ) -> ItemPaged[BlobProperties]:
        size = min(int(kwargs.pop("results_per_page", None) or LIST_PAGE), LIST_PAGE)
        kwargs.pop("timeout", None)
        _unknown(kwargs, "list_blobs")
        wanted = {include} if isinstance(include, str) else set(include or ())
        if wanted - {"metadata", "tags"}:
            raise NotImplementedError(f"list_blobs(include={sorted(wanted)})")
        prefix = name_starts_with or ""

        def page(marker: str | None) -> tuple[str | None, list[BlobProperties]]:
            with self.account.lock:
                self.account.log("GET", self.container_name)
                blobs = self.account.container(self.container_name).blobs
                names = sorted(n for n in blobs if n.startswith(prefix) and (marker is None or n >= marker))
                items = []
                for name in names[:size]:
                    props = _properties(self.container_name, name, blobs[name], "metadata" in wanted)
                    if "tags" in wanted:
                        props.tags = dict(blobs[name].tags) or None
                    items.append(props)
                return (names[size] if len(names) > size else None), items

        return ItemPaged(page, _identity)

    def find_blobs_by_tags(self, filter_expression: str, **kwargs: Any) -> ItemPaged[FilteredBlob]:
        size = min(int(kwargs.pop("results_per_page", None) or LIST_PAGE), LIST_PAGE)
        kwargs.pop("timeout", None)
        _unknown(kwargs, "find_blobs_by_tags")
        terms = parse_tag_filter(filter_expression)

        def page(marker: str | None) -> tuple[str | None, list[FilteredBlob]]:
            with self.account.lock:
                self.account.log("GET", self.container_name)
                blobs = self.account.container(self.container_name).blobs
                names = sorted(
                    n
                    for n, b in blobs.items()
                    if all(t.holds(b.tags) for t in terms) and (marker is None or n >= marker)
                )
                items = [
                    FilteredBlob(
                        name=n,
                        container_name=self.container_name,
                        tags={t.key: blobs[n].tags[t.key] for t in terms},
                    )
                    for n in names[:size]
                ]
                return (names[size] if len(names) > size else None), items

        return ItemPaged(page, _identity)


def _identity(answer: Any) -> Any:
    return answer


class MemoryBlobService:
    """The Blob service of a `MemoryStorage` (azure-storage-blob's `BlobServiceClient`, as used)."""

    def __init__(self, account: MemoryStorage) -> None:
        self.account = account
        self.url = account.url()
        self.account_name = account.account

    def get_container_client(self, container: str) -> MemoryContainerClient:
        return MemoryContainerClient(self.account, container)

    def get_blob_client(self, container: str, blob: str, snapshot: str | None = None) -> MemoryBlobClient:
        return self.get_container_client(container).get_blob_client(blob, snapshot)

    def create_container(
        self,
        name: str,
        metadata: Mapping[str, str] | None = None,
        public_access: str | None = None,
        **kwargs: Any,
    ) -> MemoryContainerClient:
        container = self.get_container_client(name)
        container.create_container(metadata, public_access, **kwargs)
        return container


# -- queues -------------------------------------------------------------------------------------


@dataclass
class _PeekedItem:
    """A message as the SDK's generated layer gives it (what `QueueMessage._from_generated` and the
    decode policies read)."""

    message_id: str
    insertion_time: datetime
    expiration_time: datetime
    dequeue_count: int
    message_text: str


@dataclass
class _ReceivedItem(_PeekedItem):
    pop_receipt: str
    time_next_visible: datetime


@dataclass
class _Batch:
    items_property: list[_ReceivedItem]


class MemoryQueueClient:
    """One queue of a `MemoryStorage` (azure-storage-queue's `QueueClient`, as the app uses it),
    with the SDK's encode and decode policies."""

    def __init__(
        self,
        account: MemoryStorage,
        name: str,
        encode: MessageEncodePolicy | None = None,
        decode: MessageDecodePolicy | None = None,
    ) -> None:
        self.account = account
        self.queue_name = name
        self.url = account.url(name)
        self._encode = encode or NoEncodePolicy()
        self._decode = decode or NoDecodePolicy()

    def _queue(self) -> _Queue:
        found = self.account.queues.get(self.queue_name)
        if found is None:
            raise queue_error(404, "QueueNotFound", "The specified queue does not exist.")
        return found

    def create_queue(self, *, metadata: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        kwargs.pop("timeout", None)
        _unknown(kwargs, "create_queue")
        _check_name(self.queue_name, queue_error)
        with self.account.lock:
            self.account.log("PUT", self.queue_name)
            found = self.account.queues.get(self.queue_name)
            if found is None:
                self.account.queues[self.queue_name] = _Queue(self.queue_name, dict(metadata or {}))
                return
            if found.metadata != dict(metadata or {}):
                raise queue_error(409, "QueueAlreadyExists", "The specified queue already exists.")
            # 204: the same queue is there; the SDK raises it as ResourceExistsError
            exists = ResourceExistsError(
                message="Queue already exists\nErrorCode:QueueAlreadyExists",
                response=cast(Any, _ErrorResponse(204, "QueueAlreadyExists")),
            )
            exists.error_code = StorageErrorCode.queue_already_exists  # type: ignore[attr-defined]
            raise exists

    def send_message(
        self,
        content: Any,
        *,
        visibility_timeout: int | None = None,
        time_to_live: int | None = None,
        **kwargs: Any,
    ) -> QueueMessage:
        kwargs.pop("timeout", None)
        _unknown(kwargs, "send_message")
        self._encode.configure(require_encryption=False, key_encryption_key=None, resolver=None)
        text = self._encode(content)
        delay = int(visibility_timeout or 0)
        ttl = DEFAULT_TTL_S if time_to_live is None else int(time_to_live)
        with self.account.lock:
            self.account.log("POST", f"{self.queue_name}/messages")
            queue = self._queue()
            if not 0 <= delay <= MAX_VISIBILITY_S or ttl == 0 or ttl < -1:
                raise queue_error(
                    400,
                    "OutOfRangeQueryParameterValue",
                    "One of the query parameters specified in the request URI is outside the permissible range.",
                )
            if ttl != -1 and delay >= ttl:
                raise queue_error(
                    400,
                    "InvalidQueryParameterValue",
                    "Value for one of the query parameters specified in the request URI is invalid.",
                )
            if len(text.encode("utf-8")) > MAX_MESSAGE_BYTES:
                raise queue_error(
                    413,
                    "RequestBodyTooLarge",
                    "The request body is too large and exceeds the maximum permissible limit.",
                )
            now = self.account.clock()
            msg = _Message(
                id=str(uuid.uuid4()),
                text=text,
                seq=self.account.next_seq(),
                inserted_on=now,
                expires_on=NEVER if ttl == -1 else now + timedelta(seconds=ttl),
                visible_at=now + timedelta(seconds=delay),
                pop_receipt=uuid.uuid4().hex,
            )
            queue.messages[msg.id] = msg
            return QueueMessage(
                content=content,
                id=msg.id,
                inserted_on=_seconds(msg.inserted_on),
                expires_on=_seconds(msg.expires_on),
                pop_receipt=msg.pop_receipt,
                next_visible_on=_seconds(msg.visible_at),
            )

    def _receive(self, number_of_messages: int | None = None, *, visibility_timeout: int | None) -> _Batch:
        """One Get Messages request (the SDK's pager calls it once a page, and processes its errors)."""
        count = 1 if number_of_messages is None else number_of_messages
        lease = 30 if visibility_timeout is None else visibility_timeout
        with self.account.lock:
            self.account.log("GET", f"{self.queue_name}/messages")
            if self.queue_name not in self.account.queues:
                raise _raw_error(404, "QueueNotFound", "The specified queue does not exist.")
            if not 1 <= count <= 32 or not 1 <= lease <= MAX_VISIBILITY_S:
                raise _raw_error(
                    400,
                    "OutOfRangeQueryParameterValue",
                    "One of the query parameters specified in the request URI is outside the permissible range.",
                )
            now = self.account.clock()
            taken = [m for m in self.account.queues[self.queue_name].live(now) if m.visible_at <= now][:count]
            items = []
            for msg in taken:
                msg.dequeue_count += 1
                msg.pop_receipt = uuid.uuid4().hex
                msg.visible_at = now + timedelta(seconds=lease)
                items.append(
                    _ReceivedItem(
                        msg.id,
                        _seconds(msg.inserted_on),
                        _seconds(msg.expires_on),
                        msg.dequeue_count,
                        msg.text,
                        msg.pop_receipt,
                        _seconds(msg.visible_at),
                    )
                )
        self._decode.configure(require_encryption=False, key_encryption_key=None, resolver=None)
        self._decode(cast(Any, None), items, {})
        return _Batch(items)

    def receive_messages(
        self,
        *,
        messages_per_page: int | None = None,
        visibility_timeout: int | None = None,
        max_messages: int | None = None,
        **kwargs: Any,
    ) -> ItemPaged[QueueMessage]:
        kwargs.pop("timeout", None)
        _unknown(kwargs, "receive_messages")
        if max_messages is not None and messages_per_page is not None and max_messages < messages_per_page:
            raise ValueError("max_messages must be greater or equal to messages_per_page")
        command = functools.partial(self._receive, visibility_timeout=visibility_timeout)
        return ItemPaged(
            command,
            results_per_page=messages_per_page,
            page_iterator_class=MessagesPaged,
            max_messages=max_messages,
        )

    def peek_messages(self, max_messages: int | None = None, **kwargs: Any) -> list[QueueMessage]:
        kwargs.pop("timeout", None)
        _unknown(kwargs, "peek_messages")
        if max_messages and not 1 <= max_messages <= 32:
            raise ValueError("Number of messages to peek should be between 1 and 32")
        with self.account.lock:
            self.account.log("GET", f"{self.queue_name}/messages")
            now = self.account.clock()
            visible = [m for m in self._queue().live(now) if m.visible_at <= now][: max_messages or 1]
            items = [
                _PeekedItem(m.id, _seconds(m.inserted_on), _seconds(m.expires_on), m.dequeue_count, m.text)
                for m in visible
            ]
        self._decode.configure(require_encryption=False, key_encryption_key=None, resolver=None)
        self._decode(cast(Any, None), items, {})
        return [QueueMessage._from_generated(item) for item in items]

    def delete_message(self, message: Any, pop_receipt: str | None = None, **kwargs: Any) -> None:
        kwargs.pop("timeout", None)
        _unknown(kwargs, "delete_message")
        try:
            message_id = message.id
            receipt = pop_receipt or message.pop_receipt
        except AttributeError:
            message_id, receipt = message, pop_receipt
        if receipt is None:
            raise ValueError("pop_receipt must be present")
        with self.account.lock:
            self.account.log("DELETE", f"{self.queue_name}/messages/{message_id}")
            queue = self._queue()
            live = {m.id: m for m in queue.live(self.account.clock())}
            found = live.get(message_id)
            if found is None:
                raise queue_error(404, "MessageNotFound", "The specified message does not exist.")
            if found.pop_receipt != receipt:
                raise queue_error(
                    400,
                    "PopReceiptMismatch",
                    "The specified pop receipt did not match the pop receipt for a dequeued message.",
                )
            del queue.messages[message_id]

    def get_queue_properties(self, **kwargs: Any) -> QueueProperties:
        kwargs.pop("timeout", None)
        _unknown(kwargs, "get_queue_properties")
        with self.account.lock:
            self.account.log("GET", self.queue_name)
            queue = self._queue()
            props = QueueProperties()
            props.name = self.queue_name
            props.metadata = dict(queue.metadata)
            props.approximate_message_count = len(queue.live(self.account.clock()))
            return props


class MemoryQueueService:
    """The Queue service of a `MemoryStorage` (azure-storage-queue's `QueueServiceClient`, as used)."""

    def __init__(self, account: MemoryStorage) -> None:
        self.account = account
        self.url = account.url()

    def get_queue_client(
        self,
        queue: str,
        *,
        message_encode_policy: MessageEncodePolicy | None = None,
        message_decode_policy: MessageDecodePolicy | None = None,
    ) -> MemoryQueueClient:
        return MemoryQueueClient(self.account, queue, message_encode_policy, message_decode_policy)

    def create_queue(
        self, name: str, metadata: Mapping[str, str] | None = None, **kwargs: Any
    ) -> MemoryQueueClient:
        queue = self.get_queue_client(name)
        queue.create_queue(metadata=metadata, **kwargs)
        return queue


# -- tables -------------------------------------------------------------------------------------


class _Refused(Exception):
    """An entity operation the service refuses: its status, code and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def error(self) -> HttpResponseError:
        return table_error(self.status, self.code, self.message)


def _stored(entity: Mapping[str, Any]) -> dict[str, Any]:
    """An entity's properties as the SDK sends them (None left out) and the service keeps them."""
    pk, rk = entity.get("PartitionKey"), entity.get("RowKey")
    if pk is None:
        raise ValueError("PartitionKey must be present in an entity")
    if rk is None:
        raise ValueError("RowKey must be present in an entity")
    out: dict[str, Any] = {}
    for name, value in entity.items():
        if value is None:
            continue
        kind = type(value)
        if kind is int:
            if not -(2**31) <= value < 2**31:
                raise TypeError(_ERROR_VALUE_TOO_LARGE.format(str(value), EdmType.INT32))
        elif kind not in (str, bool, float, bytes, datetime):
            raise TypeError(_ERROR_TYPE_NOT_SUPPORTED.format(type(value)))
        out[name] = value
    for key in (pk, rk):
        if not isinstance(key, str) or len(key) > MAX_KEY_CHARS or _FORBIDDEN_KEY.search(key):
            raise _Refused(400, "OutOfRangeInput", "One of the request inputs is out of range.")
    if len(out) > MAX_PROPERTIES:
        raise _Refused(400, "TooManyProperties", "The entity contains more properties than allowed.")
    if any(isinstance(v, str) and len(v) > MAX_STRING_CHARS for v in out.values()):
        raise _Refused(
            400, "PropertyValueTooLarge", "The property value exceeds the maximum allowed size (64KB)."
        )
    return out


def _entity_path(table: str, pk: str, rk: str) -> str:
    return f"{table}(PartitionKey='{pk}',RowKey='{rk}')"


class _Filter:
    """An OData filter of comparisons joined by `and` (what the app sends), evaluated on a row."""

    TOKEN = re.compile(
        r"\s*(?:datetime(?P<datetime>'[^']*')|(?P<string>'(?:[^']|'')*')|(?P<number>-?\d+)(?![\w.])|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<other>\S))"
    )
    OPS: dict[str, Callable[[Any, Any], bool]] = {
        "eq": lambda a, b: bool(a == b),
        "ne": lambda a, b: bool(a != b),
        "gt": lambda a, b: bool(a > b),
        "ge": lambda a, b: bool(a >= b),
        "lt": lambda a, b: bool(a < b),
        "le": lambda a, b: bool(a <= b),
    }

    def __init__(self, text: str) -> None:
        self.text = text
        tokens: list[tuple[str, Any]] = []
        for found in self.TOKEN.finditer(text):
            if found.group("datetime") is not None:
                try:
                    moment = datetime.fromisoformat(found.group("datetime")[1:-1].replace("Z", "+00:00"))
                except ValueError:
                    self._refuse()
                tokens.append(("value", moment))
            elif found.group("string") is not None:
                tokens.append(("value", found.group("string")[1:-1].replace("''", "'")))
            elif found.group("number") is not None:
                tokens.append(("value", int(found.group("number"))))
            elif found.group("word") is not None:
                word = found.group("word")
                if word in ("true", "false"):
                    tokens.append(("value", word == "true"))
                else:
                    tokens.append(("word", word))
            else:
                self._refuse()
        groups: list[list[tuple[str, Any]]] = [[]]
        for token in tokens:
            if token == ("word", "and"):
                groups.append([])
            else:
                groups[-1].append(token)
        self.terms: list[tuple[str, str, Any]] = []
        for group in groups:
            kinds = [kind for kind, _ in group]
            if kinds != ["word", "word", "value"] or group[1][1] not in self.OPS:
                self._refuse()
            self.terms.append((group[0][1], group[1][1], group[2][1]))

    def _refuse(self) -> NoReturn:
        raise NotImplementedError(f"OData filter not understood by the in-memory account: {self.text!r}")

    def holds(self, row: Mapping[str, Any]) -> bool:
        for name, op, value in self.terms:
            have = row.get(name)
            comparable = have is not None and (
                type(have) is type(value) or (type(have) in (int, float) and type(value) in (int, float))
            )
            if not comparable or not self.OPS[op](have, value):
                return False
        return True


class MemoryTableClient:
    """One table of a `MemoryStorage` (azure-data-tables' `TableClient`, as the app uses it)."""

    def __init__(self, account: MemoryStorage, name: str) -> None:
        self.account = account
        self.table_name = name
        self.url = account.url(name)

    def _table(self) -> _Table:
        found = self.account.tables.get(self.table_name.lower())
        if found is None:
            raise _Refused(404, "TableNotFound", "The table specified does not exist.")
        return found

    def _etag(self, now: datetime) -> str:
        return f"W/\"datetime'{now.strftime('%Y-%m-%dT%H%%3A%M%%3A%S')}.{self.account.next_seq():07d}Z'\""

    def _out(self, entity: _Entity, select: Iterable[str] | None = None) -> TableEntity:
        props = entity.props if select is None else {k: entity.props[k] for k in select if k in entity.props}
        out = TableEntity(copy.deepcopy(props))
        out._metadata = {"etag": entity.etag, "timestamp": entity.timestamp}
        return out

    def _apply(
        self,
        entities: dict[tuple[str, str], _Entity],
        operation: str,
        entity: Mapping[str, Any],
        options: Mapping[str, Any],
    ) -> dict[str, Any]:
        """One entity operation on `entities` (a table's, or a transaction's copy); its answer."""
        props = _stored(entity) if operation != "delete" else dict(entity)
        key = (str(props["PartitionKey"]), str(props["RowKey"]))
        current = entities.get(key)
        now = self.account.clock()
        if operation == "create":
            if current is not None:
                raise _Refused(409, "EntityAlreadyExists", "The specified entity already exists.")
        elif operation in ("update", "delete"):
            condition = _get_match_condition(  # type: ignore[no-untyped-call]
                etag=options.get("etag"),
                match_condition=options.get("match_condition") or MatchConditions.Unconditionally,
            )
            if current is None:
                raise _Refused(404, "ResourceNotFound", "The specified resource does not exist.")
            if condition == MatchConditions.IfNotModified and options.get("etag") != current.etag:
                raise _Refused(
                    412,
                    "UpdateConditionNotSatisfied",
                    "The update condition specified in the request was not satisfied.",
                )
            if operation == "delete":
                del entities[key]
                return {}
        elif operation != "upsert":
            raise ValueError(f"unknown transaction operation {operation!r}")
        mode = options.get("mode", UpdateMode.MERGE)
        if mode == UpdateMode.MERGE and current is not None and operation != "create":
            props = {**current.props, **props}
        entities[key] = _Entity(props, self._etag(now), now)
        return {"etag": entities[key].etag, "date": _seconds(now), "version": "2019-02-02"}

    def _one(
        self, method: str, operation: str, entity: Mapping[str, Any], options: Mapping[str, Any]
    ) -> dict[str, Any]:
        with self.account.lock:
            pk, rk = entity.get("PartitionKey"), entity.get("RowKey")
            self.account.log(method, _entity_path(self.table_name, str(pk), str(rk)))
            try:
                return self._apply(self._table().entities, operation, entity, options)
            except _Refused as refused:
                raise refused.error() from None

    def create_entity(self, entity: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        kwargs.pop("timeout", None)
        _unknown(kwargs, "create_entity")
        with self.account.lock:
            self.account.log("POST", self.table_name)
            try:
                return self._apply(self._table().entities, "create", entity, {})
            except _Refused as refused:
                raise refused.error() from None

    def upsert_entity(
        self, entity: Mapping[str, Any], mode: UpdateMode = UpdateMode.MERGE, **kwargs: Any
    ) -> dict[str, Any]:
        kwargs.pop("timeout", None)
        _unknown(kwargs, "upsert_entity")
        return self._one("PUT" if mode == UpdateMode.REPLACE else "MERGE", "upsert", entity, {"mode": mode})

    def update_entity(
        self,
        entity: Mapping[str, Any],
        mode: UpdateMode = UpdateMode.MERGE,
        *,
        etag: str | None = None,
        match_condition: MatchConditions | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        kwargs.pop("timeout", None)
        _unknown(kwargs, "update_entity")
        if match_condition and not etag and isinstance(entity, TableEntity):
            etag = entity.metadata.get("etag")
        options = {"mode": mode, "etag": etag, "match_condition": match_condition}
        return self._one("PUT" if mode == UpdateMode.REPLACE else "MERGE", "update", entity, options)

    def delete_entity(self, *args: Any, **kwargs: Any) -> None:
        entity = kwargs.pop("entity", None) or (args[0] if args and isinstance(args[0], Mapping) else None)
        if entity is not None:
            pk, rk = entity["PartitionKey"], entity["RowKey"]
        else:
            pk = kwargs.pop("partition_key", None) or args[0]
            rk = kwargs.pop("row_key", None) or args[1]
        etag = kwargs.pop("etag", None)
        match_condition = kwargs.pop("match_condition", None)
        if match_condition and entity is not None and not etag and isinstance(entity, TableEntity):
            etag = entity.metadata.get("etag")
        kwargs.pop("timeout", None)
        _unknown(kwargs, "delete_entity")
        options = {"etag": etag, "match_condition": match_condition}
        try:
            self._one("DELETE", "delete", {"PartitionKey": pk, "RowKey": rk}, options)
        except HttpResponseError as exc:
            if exc.status_code != 404:  # the SDK answers a missing entity (or table) with nothing
                raise

    def get_entity(
        self, partition_key: str, row_key: str, *, select: str | list[str] | None = None, **kwargs: Any
    ) -> TableEntity:
        kwargs.pop("timeout", None)
        _unknown(kwargs, "get_entity")
        with self.account.lock:
            self.account.log("GET", _entity_path(self.table_name, partition_key, row_key))
            try:
                found = self._table().entities.get((partition_key, row_key))
            except _Refused as refused:
                raise refused.error() from None
            if found is None:
                raise table_error(404, "ResourceNotFound", "The specified resource does not exist.")
            return self._out(found, [select] if isinstance(select, str) else select)

    def query_entities(
        self,
        query_filter: str,
        *,
        select: str | list[str] | None = None,
        results_per_page: int | None = None,
        **kwargs: Any,
    ) -> ItemPaged[TableEntity]:
        kwargs.pop("timeout", None)
        if kwargs.pop("parameters", None):
            raise NotImplementedError("query_entities(parameters=...)")
        _unknown(kwargs, "query_entities")
        where = _Filter(query_filter)
        size = min(results_per_page or TABLE_PAGE, TABLE_PAGE)
        fields = [s.strip() for s in select.split(",")] if isinstance(select, str) else select

        def page(token: Mapping[str, str] | None) -> tuple[dict[str, str] | None, list[TableEntity]]:
            with self.account.lock:
                self.account.log("GET", f"{self.table_name}()")
                try:
                    entities = self._table().entities
                except _Refused as refused:
                    raise refused.error() from None
                start = (token["PartitionKey"], token["RowKey"]) if token else None
                keys = sorted(
                    k
                    for k, e in entities.items()
                    if (start is None or k >= start) and where.holds({**e.props, "Timestamp": e.timestamp})
                )
                items = [self._out(entities[k], fields) for k in keys[:size]]
                following = keys[size] if len(keys) > size else None
                token_out = {"PartitionKey": following[0], "RowKey": following[1]} if following else None
                return token_out, items

        return ItemPaged(page, _identity)

    def submit_transaction(self, operations: Iterable[Any], **kwargs: Any) -> list[Mapping[str, Any]]:
        kwargs.pop("timeout", None)
        _unknown(kwargs, "submit_transaction")
        steps: list[tuple[str, Mapping[str, Any], Mapping[str, Any]]] = []
        for op in operations:
            if not isinstance(op, tuple) or len(op) not in (2, 3):
                raise TypeError(
                    "The value of 'operations' must be an iterator of Tuples. Please check documentation for correct Tuple format."
                )
            steps.append((str(getattr(op[0], "value", op[0])).lower(), op[1], op[2] if len(op) == 3 else {}))
        with self.account.lock:
            self.account.log("POST", "$batch")
            try:
                table = self._table()
            except _Refused as refused:
                raise self._transaction_error(0, refused) from None
            keys = [(str(e.get("PartitionKey")), str(e.get("RowKey"))) for _, e, _ in steps]
            if len({pk for pk, _ in keys}) > 1:
                raise self._transaction_error(
                    0,
                    _Refused(
                        400,
                        "CommandsInBatchActOnDifferentPartitions",
                        "All commands in a batch must operate on same entity group.",
                    ),
                )
            if len(steps) > TRANSACTION_LIMIT:
                raise self._transaction_error(
                    0,
                    _Refused(
                        400,
                        "InvalidInput",
                        "The batch request operation exceeds the maximum 100 changes per change set.",
                    ),
                )
            if len(set(keys)) < len(keys):
                raise self._transaction_error(
                    0,
                    _Refused(
                        400,
                        "InvalidDuplicateRow",
                        "The batch request contains multiple changes with same row key.",
                    ),
                )
            work = dict(table.entities)
            answers: list[Mapping[str, Any]] = []
            for index, (operation, entity, options) in enumerate(steps):
                try:
                    answers.append(self._apply(work, operation, entity, options))
                except _Refused as refused:
                    raise self._transaction_error(index, refused) from None
            table.entities = work
            return answers

    @staticmethod
    def _transaction_error(index: int, refused: _Refused) -> TableTransactionError:
        error = TableTransactionError(
            message=f"{index}:{refused.message}",
            response=cast(Any, _ErrorResponse(refused.status, refused.code)),
        )
        error.error_code = refused.code  # type: ignore[attr-defined]
        return error


class MemoryTableService:
    """The Table service of a `MemoryStorage` (azure-data-tables' `TableServiceClient`, as used)."""

    def __init__(self, account: MemoryStorage) -> None:
        self.account = account
        self.url = account.url()

    def get_table_client(self, table_name: str) -> MemoryTableClient:
        return MemoryTableClient(self.account, table_name)

    def create_table(self, table_name: str, **kwargs: Any) -> MemoryTableClient:
        kwargs.pop("timeout", None)
        _unknown(kwargs, "create_table")
        _validate_storage_tablename(table_name)  # type: ignore[no-untyped-call]
        with self.account.lock:
            self.account.log("POST", "Tables")
            if table_name.lower() in self.account.tables:
                raise table_error(409, "TableAlreadyExists", "The table specified already exists.")
            self.account.tables[table_name.lower()] = _Table(table_name)
        return self.get_table_client(table_name)

    def delete_table(self, table_name: str, **kwargs: Any) -> None:
        """Delete a table and its entities; a missing table is no error (as the SDK answers a 404)."""
        kwargs.pop("timeout", None)
        _unknown(kwargs, "delete_table")
        with self.account.lock:
            self.account.log("DELETE", f"Tables('{table_name}')")
            self.account.tables.pop(table_name.lower(), None)

    def query_tables(self, query_filter: str, **kwargs: Any) -> ItemPaged[TableItem]:
        size = min(int(kwargs.pop("results_per_page", None) or TABLE_PAGE), TABLE_PAGE)
        kwargs.pop("timeout", None)
        if kwargs.pop("parameters", None):
            raise NotImplementedError("query_tables(parameters=...)")
        _unknown(kwargs, "query_tables")
        where = _Filter(query_filter)

        def page(marker: str | None) -> tuple[str | None, list[TableItem]]:
            with self.account.lock:
                self.account.log("GET", "Tables")
                names = sorted(
                    t.name
                    for t in self.account.tables.values()
                    if where.holds({"TableName": t.name}) and (marker is None or t.name >= marker)
                )
                return (names[size] if len(names) > size else None), [TableItem(n) for n in names[:size]]

        return ItemPaged(page, _identity)


__all__ = [
    "ManualClock",
    "MemoryStorage",
    "SkippingClock",
    "blob_error",
    "parse_tag_filter",
    "queue_error",
    "real_time",
    "table_error",
]
