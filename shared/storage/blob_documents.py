"""`BlobDocuments`: the `DocumentStore` of JSON documents as blobs in one container."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
)
from azure.storage.blob import ContainerClient, ContentSettings

from shared.core.documents import Conflict, Document, DocumentChanged, DocumentExists, TagQuery, dump
from shared.storage.failures import NotFound, error_code, storage_failure

_JSON = ContentSettings(content_type="application/json")
_EXISTS = ("BlobAlreadyExists", "ConditionNotMet")
"""What a create If-None-Match: * meets when the blob is there (besides ResourceExistsError)."""
_CHANGED = ("ConditionNotMet", "BlobNotFound")
"""What a replace If-Match meets when the blob changed or went (besides ResourceModifiedError)."""


@contextlib.contextmanager
def _failing(
    action: str,
    name: str,
    conflict: type[Conflict] | None = None,
    lost: tuple[type[AzureError], ...] = (),
    codes: tuple[str, ...] = (),
) -> Iterator[None]:
    """The SDK's errors of one call: those meaning a conditional write lost (`lost`, or an answer
    with one of `codes`) become `conflict`; others `storage_failure` (StorageThrottled when worth
    retrying, else this package's: a read's NotFound is its caller's)."""
    try:
        yield
    except AzureError as exc:
        if conflict is not None and (
            isinstance(exc, lost) or (isinstance(exc, HttpResponseError) and error_code(exc) in codes)
        ):
            raise conflict(name) from None
        raise storage_failure(exc, action, name) from exc


class BlobDocuments:
    """Documents as JSON blobs in one container."""

    def __init__(
        self,
        container: ContainerClient,
        metadata: Callable[[dict[str, Any]], dict[str, str]] | None = None,
        tags: Callable[[dict[str, Any]], dict[str, str]] | None = None,
    ) -> None:
        self.container = container
        self.metadata = metadata
        """Blob metadata derived from each document, set by the same write (listings return it)."""
        self.tags = tags
        """Blob index tags derived from each document, set by the same write (`find` queries them);
        a write whose document has none clears them."""

    def _meta(self, data: dict[str, Any]) -> dict[str, str] | None:
        return self.metadata(data) if self.metadata is not None else None

    def _extra(self, data: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments of every write: metadata, and index tags when this store keeps them."""
        extra: dict[str, Any] = {"metadata": self._meta(data)}
        if self.tags is not None:
            extra["tags"] = self.tags(data) or None  # none given: the overwrite clears them
        return extra

    def read(self, name: str) -> Document | None:
        try:
            with _failing("read", name):
                downloader = self.container.get_blob_client(name).download_blob()
                raw = downloader.readall()
        except NotFound:
            return None
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            data = {"unreadable": True}
        return Document(
            data if isinstance(data, dict) else {"unreadable": True}, str(downloader.properties.etag)
        )

    def create(self, name: str, data: dict[str, Any]) -> Document:
        with _failing("create", name, DocumentExists, (ResourceExistsError, ResourceModifiedError), _EXISTS):
            props = self.container.get_blob_client(name).upload_blob(
                dump(data),
                match_condition=MatchConditions.IfMissing,
                content_settings=_JSON,
                **self._extra(data),
            )
        return Document(data, str(props["etag"]))

    def replace(self, name: str, current: Document, data: dict[str, Any]) -> Document:
        with _failing(
            "update", name, DocumentChanged, (ResourceModifiedError, ResourceNotFoundError), _CHANGED
        ):
            props = self.container.get_blob_client(name).upload_blob(
                dump(data),
                overwrite=True,
                etag=current.etag,
                match_condition=MatchConditions.IfNotModified,
                content_settings=_JSON,
                **self._extra(data),
            )
        return Document(data, str(props["etag"]))

    def upsert(self, name: str, data: dict[str, Any]) -> Document:
        with _failing("write", name):
            props = self.container.get_blob_client(name).upload_blob(
                dump(data), overwrite=True, content_settings=_JSON, **self._extra(data)
            )
        return Document(data, str(props["etag"]))

    def delete(self, name: str) -> None:
        with contextlib.suppress(NotFound), _failing("delete", name):
            self.container.delete_blob(name)

    def find(self, query: TagQuery) -> Iterator[str]:
        with _failing("find", query.expression()):
            for blob in self.container.find_blobs_by_tags(query.expression()):
                yield blob.name

    def names(self, prefix: str) -> Iterator[tuple[str, datetime | None]]:
        with _failing("list", prefix):
            for blob in self.container.list_blobs(name_starts_with=prefix):
                yield blob.name, blob.last_modified
