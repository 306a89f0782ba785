"""JSON documents with etags: the storage under the ledger and the poison archive.

`DocumentStore` is the protocol; `BlobDocuments` keeps each document as a blob in a container
(conditional writes with If-None-Match / If-Match), `MemoryDocuments` keeps them in a dict (tests
and the deterministic simulation). Both raise the same exceptions.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.storage.blob import ContainerClient, ContentSettings

from shared.errors import StorageThrottled
from shared.storage import error_code, is_throttled

_JSON = ContentSettings(content_type="application/json")


class Conflict(Exception):
    """A conditional write lost: the document exists (create) or changed (replace)."""

    read_back: bool = False
    """True when `current` holds the document as read right after the conflict."""
    current: Document | None = None


class DocumentExists(Conflict):
    """create() found a document already there."""


class DocumentChanged(Conflict):
    """replace() found the document changed (or gone) since it was read."""


@dataclass(frozen=True)
class Document:
    """A document as read or written, with the etag that guards the next change."""

    data: dict[str, Any]
    etag: str

    @property
    def status(self) -> str:
        return str(self.data.get("status", ""))


class DocumentStore(Protocol):
    """JSON documents by name, with conditional writes."""

    def read(self, name: str) -> Document | None:
        """The document, or None when there is none."""

    def create(self, name: str, data: dict[str, Any]) -> Document:
        """Write a new document; DocumentExists when one is there."""

    def replace(self, name: str, current: Document, data: dict[str, Any]) -> Document:
        """Overwrite `current`; DocumentChanged when it changed since it was read."""

    def upsert(self, name: str, data: dict[str, Any]) -> Document:
        """Write unconditionally."""

    def delete(self, name: str) -> None:
        """Delete; a missing document is not an error."""

    def names(self, prefix: str) -> Iterator[tuple[str, datetime | None]]:
        """(name, last modified) of the documents under `prefix`."""


def dump(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class BlobDocuments:
    """Documents as JSON blobs in one container."""

    def __init__(
        self, container: ContainerClient, metadata: Callable[[dict[str, Any]], dict[str, str]] | None = None
    ) -> None:
        self.container = container
        self.metadata = metadata
        """Blob metadata derived from each document, set by the same write (listings return it)."""

    def _meta(self, data: dict[str, Any]) -> dict[str, str] | None:
        return self.metadata(data) if self.metadata is not None else None

    def read(self, name: str) -> Document | None:
        try:
            downloader = self.container.get_blob_client(name).download_blob()
            raw = downloader.readall()
        except ResourceNotFoundError:
            return None
        except AzureError as exc:
            raise storage_failure(exc, "read", name) from exc
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            data = {"unreadable": True}
        return Document(
            data if isinstance(data, dict) else {"unreadable": True}, str(downloader.properties.etag)
        )

    def create(self, name: str, data: dict[str, Any]) -> Document:
        try:
            props = self.container.get_blob_client(name).upload_blob(
                dump(data),
                match_condition=MatchConditions.IfMissing,
                content_settings=_JSON,
                metadata=self._meta(data),
            )
        except (ResourceExistsError, ResourceModifiedError):
            raise DocumentExists(name) from None
        except HttpResponseError as exc:
            if error_code(exc) in ("BlobAlreadyExists", "ConditionNotMet"):
                raise DocumentExists(name) from None
            raise storage_failure(exc, "create", name) from exc
        except AzureError as exc:
            raise storage_failure(exc, "create", name) from exc
        return Document(data, str(props["etag"]))

    def replace(self, name: str, current: Document, data: dict[str, Any]) -> Document:
        try:
            props = self.container.get_blob_client(name).upload_blob(
                dump(data),
                overwrite=True,
                etag=current.etag,
                match_condition=MatchConditions.IfNotModified,
                content_settings=_JSON,
                metadata=self._meta(data),
            )
        except (ResourceModifiedError, ResourceNotFoundError):
            raise DocumentChanged(name) from None
        except HttpResponseError as exc:
            if error_code(exc) in ("ConditionNotMet", "BlobNotFound"):
                raise DocumentChanged(name) from None
            raise storage_failure(exc, "update", name) from exc
        except AzureError as exc:
            raise storage_failure(exc, "update", name) from exc
        return Document(data, str(props["etag"]))

    def upsert(self, name: str, data: dict[str, Any]) -> Document:
        try:
            props = self.container.get_blob_client(name).upload_blob(
                dump(data), overwrite=True, content_settings=_JSON, metadata=self._meta(data)
            )
        except AzureError as exc:
            raise storage_failure(exc, "write", name) from exc
        return Document(data, str(props["etag"]))

    def delete(self, name: str) -> None:
        with contextlib.suppress(ResourceNotFoundError):
            self.container.delete_blob(name)

    def names(self, prefix: str) -> Iterator[tuple[str, datetime | None]]:
        for blob in self.container.list_blobs(name_starts_with=prefix):
            yield blob.name, blob.last_modified


class MemoryDocuments:
    """Documents in a dict. `before` is called before every operation (fault injection)."""

    def __init__(
        self,
        clock: Callable[[], datetime],
        before: Callable[[str, str], Callable[[], None] | None] | None = None,
        label: str = "docs",
    ) -> None:
        self.clock = clock
        self.before = before
        self.label = label
        self.docs: dict[str, tuple[dict[str, Any], int, datetime]] = {}
        self._lock = threading.Lock()
        self._version = 0

    def _gate(self, op: str, name: str) -> Callable[[], None] | None:
        if not self.before:
            return None
        try:
            after = self.before(f"{self.label}.{op}", name)
        except AzureError as exc:
            raise storage_failure(exc, op, name) from exc
        if after is None:
            return None

        def answer_lost() -> None:
            try:
                after()
            except AzureError as exc:
                raise storage_failure(exc, op, name) from exc

        return answer_lost

    def _store(self, name: str, data: dict[str, Any]) -> Document:
        self._version += 1
        copy = json.loads(dump(data))
        self.docs[name] = (copy, self._version, self.clock())
        return Document(json.loads(dump(copy)), str(self._version))

    def read(self, name: str) -> Document | None:
        after = self._gate("read", name)
        with self._lock:
            found = self.docs.get(name)
            doc = None if found is None else Document(json.loads(dump(found[0])), str(found[1]))
        if after:
            after()
        return doc

    def create(self, name: str, data: dict[str, Any]) -> Document:
        after = self._gate("create", name)
        with self._lock:
            if name in self.docs:
                raise DocumentExists(name)
            doc = self._store(name, data)
        if after:
            after()
        return doc

    def replace(self, name: str, current: Document, data: dict[str, Any]) -> Document:
        after = self._gate("replace", name)
        with self._lock:
            found = self.docs.get(name)
            if found is None or str(found[1]) != current.etag:
                raise DocumentChanged(name)
            doc = self._store(name, data)
        if after:
            after()
        return doc

    def upsert(self, name: str, data: dict[str, Any]) -> Document:
        after = self._gate("upsert", name)
        with self._lock:
            doc = self._store(name, data)
        if after:
            after()
        return doc

    def delete(self, name: str) -> None:
        after = self._gate("delete", name)
        with self._lock:
            self.docs.pop(name, None)
        if after:
            after()

    def names(self, prefix: str) -> Iterator[tuple[str, datetime | None]]:
        after = self._gate("list", prefix)
        with self._lock:
            found = sorted((n, v[2]) for n, v in self.docs.items() if n.startswith(prefix))
        if after:
            after()
        yield from found


def storage_failure(exc: AzureError, action: str, name: str) -> Exception:
    """StorageThrottled for what may pass (5xx, 429, timeouts, connection errors); else `exc`."""
    if is_throttled(exc):
        status = getattr(exc, "status_code", None) or exc.__class__.__name__
        return StorageThrottled(f"{action} of {name} failed: storage busy ({status})")
    return exc
