"""The `Blobs` port and the `DocumentStore` on an in-memory account's containers (`MemoryAccount`).

Faithful where the app relies on it, as Blob storage answers (tests/integration/test_port_contract.py
runs the same cases here and on Azurite): ETags and conditional writes (If-None-Match: *, If-Match,
If-Unmodified-Since at whole seconds), metadata and index tags replaced by every write, listings in
name order and in pages of at most 5,000, ranged reads, staged blocks (the shipped
`StagedBlobWriter` on in-memory blocks). Every call is one request in the account's log, as the
REST request the Azure adapter sends (`PUT /devstoreaccount1/ledger/a.json`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, cast

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

from shared.blobio.reader import BlobChanged, UnexpectedResponse
from shared.blobio.stream import Range
from shared.core.documents import Document, DocumentChanged, DocumentExists, TagQuery, dump
from shared.core.errors import InputMissing
from shared.storage.failures import AlreadyExists, ConditionFailed, NotFound, StorageError
from shared.storage.limits import BlobTooLarge
from shared.storage.ports import BlobInfo
from shared.storage.staged import BLOCK_BYTES, StagedBlobWriter

if TYPE_CHECKING:
    import threading

    from azure.storage.blob import BlobClient

LIST_PAGE = 5000
"""Blobs one listing request answers at most (the service's page)."""
LOWER_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9]|-(?!-))*[a-z0-9]$")
"""Container and queue names: lower-case letters, digits, single hyphens inside."""
TAG_CHARS = re.compile(r"^[A-Za-z0-9 +\-./:=_]*$")
MAX_TAGS = 10


@dataclass
class StoredBlob:
    data: bytes
    etag: str
    last_modified: datetime
    content_type: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    blocks: tuple[tuple[str, int], ...] = ()
    """Committed blocks (id, size) of a blob made by Put Block List; none for a whole write."""


@dataclass
class StoredContainer:
    name: str
    blobs: dict[str, StoredBlob] = field(default_factory=dict)
    staged: dict[str, dict[str, bytes]] = field(default_factory=dict)
    """Uncommitted blocks by blob name, then block id; a commit or a whole write drops them."""


class BlobStore(Protocol):
    """What the containers' ports use of their account (`memory_account.MemoryAccount`)."""

    lock: threading.RLock
    containers: dict[str, StoredContainer]

    def log(self, method: str, path: str) -> None: ...
    def etag(self) -> str: ...
    def now(self) -> datetime: ...


def _sdk_error(status: int, code: str, message: str) -> HttpResponseError:
    """The error the SDK raises for an answer (what `failures.translate` reads of it)."""
    kind: type[HttpResponseError] = {404: ResourceNotFoundError}.get(status, HttpResponseError)
    exc = kind(message=message)
    exc.status_code = status
    exc.error_code = code  # type: ignore[attr-defined]  # the storage SDKs set it
    return exc


def refused(status: int, code: str, what: str) -> StorageError:
    """The app's storage error for an answer `status` / `code` (as `failures.translate` makes it)."""
    kind = {404: NotFound, 409: AlreadyExists, 412: ConditionFailed}.get(status, StorageError)
    return kind(f"{what}: {code}", status, code)


def check_name(name: str, what: str) -> None:
    """A container's or queue's name as the service checks it (400 otherwise)."""
    if not 3 <= len(name) <= 63:
        raise refused(400, "OutOfRangeInput", what)
    if not LOWER_NAME.match(name):
        raise refused(400, "InvalidResourceName", what)


def checked_tags(tags: Mapping[str, str] | None, what: str) -> dict[str, str]:
    """Blob index tags as the service takes them (400 otherwise: too many or too long, or a
    character it refuses)."""
    out = dict(tags or {})
    if len(out) > MAX_TAGS or any(not 1 <= len(k) <= 128 or len(v) > 256 for k, v in out.items()):
        raise refused(400, "TagsTooLarge", what)
    if any(not TAG_CHARS.match(k) or not TAG_CHARS.match(v) for k, v in out.items()):
        raise refused(400, "InvalidTag", what)
    return out


class _Container:
    """What the ports of one container share: the account, its lock and log, and the lookups."""

    def __init__(self, account: BlobStore, container: str) -> None:
        self.account = account
        self.container = container

    @property
    def name(self) -> str:
        return self.container

    def _request(self, method: str, blob: str = "", query: str = "") -> None:
        path = f"{self.container}/{blob}" if blob else self.container
        self.account.log(method, path + query)

    def _stored(self, what: str) -> StoredContainer:
        found = self.account.containers.get(self.container)
        if found is None:
            raise refused(404, "ContainerNotFound", what)
        return found

    def _blob(self, name: str, what: str) -> StoredBlob:
        found = self._stored(what).blobs.get(name)
        if found is None:
            raise refused(404, "BlobNotFound", what)
        return found

    def _put(
        self,
        name: str,
        data: bytes,
        content_type: str | None,
        metadata: dict[str, str] | None = None,
        tags: dict[str, str] | None = None,
        blocks: tuple[tuple[str, int], ...] = (),
    ) -> StoredBlob:
        stored = StoredBlob(
            data,
            self.account.etag(),
            self.account.now(),
            content_type,
            dict(metadata or {}),
            dict(tags or {}),
            blocks,
        )
        container = self._stored(f"writing {self.container}/{name}")
        container.blobs[name] = stored
        container.staged.pop(name, None)
        return stored

    def _pages(self, names: list[str], size: int | None) -> Iterator[list[str]]:
        """`names` (sorted) a page at a time, a request each (an empty listing is one empty page)."""
        per_page = min(size or LIST_PAGE, LIST_PAGE)
        start = 0
        while True:
            yield names[start : start + per_page]
            start += per_page
            if start >= len(names):
                return


class MemoryBlobs(_Container):
    """The blobs of one container of a `MemoryAccount`."""

    def _label(self, name: str) -> str:
        return f"{self.container}/{name}"

    def read(self, name: str) -> bytes:
        with self.account.lock:
            self._request("GET", name)
            return self._blob(name, f"reading {self._label(name)}").data

    def read_capped(self, name: str, limit: int) -> bytes:
        with self.account.lock:
            self._request("GET", name)
            data = self._blob(name, f"reading {self._label(name)}").data
        if len(data) > limit:
            raise BlobTooLarge(len(data), limit)
        return data

    def read_range(self, name: str, offset: int, length: int, etag: str | None = None) -> tuple[bytes, str]:
        what = f"reading {self._label(name)}"
        with self.account.lock:
            self._request("GET", name)
            blob = self._blob(name, what)
            if etag is not None and etag != blob.etag:
                raise refused(412, "ConditionNotMet", what)
            if offset >= len(blob.data):
                raise refused(416, "InvalidRange", what)
            return blob.data[offset : offset + length], blob.etag

    def write(
        self, name: str, data: bytes | str, *, content_type: str | None = None, overwrite: bool = True
    ) -> None:
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        what = f"writing {self._label(name)}"
        with self.account.lock:
            self._request("PUT", name)
            if not overwrite and name in self._stored(what).blobs:
                raise refused(409, "BlobAlreadyExists", what)
            self._put(name, raw, content_type)

    def writer(self, name: str, content_type: str, block_bytes: int | None = None) -> StagedBlobWriter:
        blob = cast("BlobClient", _BlockBlob(self, name))
        return StagedBlobWriter(blob, content_type, block_bytes or BLOCK_BYTES)

    def exists(self, name: str) -> bool:
        with self.account.lock:
            self._request("HEAD", name)
            found = self.account.containers.get(self.container)
            return found is not None and name in found.blobs

    def delete(self, name: str, unmodified_since: datetime | None = None) -> bool:
        with self.account.lock:
            self._request("DELETE", name)
            found = self.account.containers.get(self.container)
            blob = None if found is None else found.blobs.get(name)
            if found is None or blob is None:
                return False
            if unmodified_since is not None and blob.last_modified > unmodified_since.replace(microsecond=0):
                return False
            del found.blobs[name]
            return True

    def pages(self, prefix: str = "", size: int | None = None) -> Iterator[list[BlobInfo]]:
        with self.account.lock:
            blobs = dict(self._stored(f"listing {self._label(prefix)}").blobs)
        names = sorted(n for n in blobs if n.startswith(prefix))
        for page in self._pages(names, size):
            with self.account.lock:
                self._request("GET")
            yield [BlobInfo(n, blobs[n].last_modified, len(blobs[n].data)) for n in page]

    def found(self, query: TagQuery, size: int | None = None) -> Iterator[list[str]]:
        with self.account.lock:
            blobs = self._stored(f"finding blobs of {self.container}").blobs
            names = sorted(n for n, b in blobs.items() if query.matches(b.tags))
        for page in self._pages(names, size):
            with self.account.lock:
                self._request("GET")
            yield page

    def check(self) -> None:
        with self.account.lock:
            self._request("GET")
            self._stored(f"container {self.container}")

    def create(self) -> None:
        with self.account.lock:
            self._request("PUT")
            check_name(self.container, f"creating container {self.container}")
            self.account.containers.setdefault(self.container, StoredContainer(self.container))

    def ranges(self, name: str) -> MemoryRanges:
        return MemoryRanges(self, name)


@dataclass(frozen=True)
class MemoryRanges:
    """Ranged reads of one in-memory blob, answering as `shared.blobio.reader.HttpRanges` does."""

    blobs: MemoryBlobs
    blob: str

    @property
    def label(self) -> str:
        return f"{self.blobs.container}/{self.blob}"

    def get_into(self, view: memoryview, offset: int, etag: str | None) -> Range:
        account = self.blobs.account
        with account.lock:
            self.blobs._request("GET", self.blob)
            container = account.containers.get(self.blobs.container)
            stored = None if container is None else container.blobs.get(self.blob)
            if stored is None:
                what = "container" if container is None else "blob"
                raise InputMissing(f"input {self.label} does not exist ({what} not found)")
            if etag is not None and etag != stored.etag:
                raise BlobChanged(f"input {self.label} changed while it was being read")
            data, current = stored.data, stored.etag
        if offset >= len(data):
            if offset == 0:
                return Range(0, 0, current)
            raise UnexpectedResponse(f"GET {self.label} at {offset}: 416 InvalidRange")
        part = data[offset : offset + len(view)]
        view[: len(part)] = part
        return Range(len(part), len(data), current)


class _BlockBlob:
    """The two calls `StagedBlobWriter` makes of a block blob (Put Block, Put Block List), in
    memory; failing as the SDK's `BlobClient` does (the writer translates them, naming the block)."""

    def __init__(self, blobs: MemoryBlobs, name: str) -> None:
        self.blobs = blobs
        self.container_name = blobs.container
        self.blob_name = name

    def stage_block(self, block_id: str, data: bytes, length: int | None = None) -> None:
        with self.blobs.account.lock:
            self.blobs._request("PUT", self.blob_name, "?comp=block")
            container = self.blobs.account.containers.get(self.container_name)
            if container is None:
                raise _sdk_error(404, "ContainerNotFound", "The specified container does not exist.")
            container.staged.setdefault(self.blob_name, {})[block_id] = bytes(data[:length])

    def commit_block_list(self, block_list: list[Any], content_settings: Any = None) -> None:
        with self.blobs.account.lock:
            self.blobs._request("PUT", self.blob_name, "?comp=blocklist")
            container = self.blobs.account.containers.get(self.container_name)
            if container is None:
                raise _sdk_error(404, "ContainerNotFound", "The specified container does not exist.")
            staged = container.staged.get(self.blob_name, {})
            ids = [block.id for block in block_list]
            if any(i not in staged for i in ids):
                raise _sdk_error(400, "InvalidBlockList", "The specified block list is invalid.")
            content_type = getattr(content_settings, "content_type", None)
            data = b"".join(staged[i] for i in ids)
            blocks = tuple((i, len(staged[i])) for i in ids)
            self.blobs._put(self.blob_name, data, content_type, blocks=blocks)


class MemoryBlobDocuments(_Container):
    """JSON documents as blobs of one container of a `MemoryAccount` (as `BlobDocuments`)."""

    def __init__(
        self,
        account: BlobStore,
        container: str,
        metadata: Callable[[dict[str, Any]], dict[str, str]] | None = None,
        tags: Callable[[dict[str, Any]], dict[str, str]] | None = None,
    ) -> None:
        super().__init__(account, container)
        self.metadata = metadata
        self.tags = tags

    def _write(self, name: str, data: dict[str, Any]) -> Document:
        raw = dump(data)
        meta = self.metadata(data) if self.metadata is not None else None
        tags = checked_tags(self.tags(data), f"writing {self.container}/{name}") if self.tags else None
        stored = self._put(name, raw, "application/json", meta, tags)
        return Document(json.loads(raw), stored.etag)

    def read(self, name: str) -> Document | None:
        with self.account.lock:
            self._request("GET", name)
            found = self.account.containers.get(self.container)
            stored = None if found is None else found.blobs.get(name)
            if stored is None:
                return None
            raw, etag = stored.data, stored.etag
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            data = {"unreadable": True}
        return Document(data if isinstance(data, dict) else {"unreadable": True}, etag)

    def create(self, name: str, data: dict[str, Any]) -> Document:
        with self.account.lock:
            self._request("PUT", name)
            if name in self._stored(f"creating {self.container}/{name}").blobs:
                raise DocumentExists(name)
            return self._write(name, data)

    def replace(self, name: str, current: Document, data: dict[str, Any]) -> Document:
        with self.account.lock:
            self._request("PUT", name)
            stored = self._stored(f"updating {self.container}/{name}").blobs.get(name)
            if stored is None or stored.etag != current.etag:
                raise DocumentChanged(name)
            return self._write(name, data)

    def upsert(self, name: str, data: dict[str, Any]) -> Document:
        with self.account.lock:
            self._request("PUT", name)
            return self._write(name, data)

    def delete(self, name: str) -> None:
        with self.account.lock:
            self._request("DELETE", name)
            found = self.account.containers.get(self.container)
            if found is not None:
                found.blobs.pop(name, None)

    def find(self, query: TagQuery) -> Iterator[str]:
        with self.account.lock:
            blobs = self._stored(f"finding in {self.container}").blobs
            names = sorted(n for n, b in blobs.items() if query.matches(b.tags))
        for page in self._pages(names, None):
            with self.account.lock:
                self._request("GET")
            yield from page

    def names(self, prefix: str) -> Iterator[tuple[str, datetime | None]]:
        with self.account.lock:
            blobs = dict(self._stored(f"listing {self.container}/{prefix}").blobs)
        listed = sorted(n for n in blobs if n.startswith(prefix))
        for page in self._pages(listed, None):
            with self.account.lock:
                self._request("GET")
            yield from ((n, blobs[n].last_modified) for n in page)
