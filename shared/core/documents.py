"""JSON documents with etags: the storage under the ledger and the poison archive.

`DocumentStore` is the protocol; `shared.storage.blob_documents.BlobDocuments` keeps each document as a
blob in a container (conditional writes with If-None-Match / If-Match), `shared.storage.memory_documents.MemoryDocuments`
keeps them in a dict (tests and the deterministic simulation). Both raise the same exceptions. This
module imports no storage SDK, so the pure ledger above it loads none.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Protocol


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


@dataclass(frozen=True)
class TagQuery:
    """One comparison on a blob index tag: `key op value` (string order, as Azure compares tags)."""

    key: str
    op: str
    value: str

    OPS: ClassVar[tuple[str, ...]] = ("=", "<", "<=", ">", ">=")

    def __post_init__(self) -> None:
        if self.op not in self.OPS or "'" in self.value or '"' in self.key:
            raise ValueError(f"unsupported tag query: {self.key!r} {self.op} {self.value!r}")

    def expression(self) -> str:
        """The Find Blobs by Tags expression (`"key" < 'value'`)."""
        return f"\"{self.key}\" {self.op} '{self.value}'"

    def matches(self, tags: Mapping[str, str]) -> bool:
        """The same comparison evaluated in memory (a blob without the tag never matches)."""
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

    def find(self, query: TagQuery) -> Iterator[str]:
        """Names of the documents whose index tags match `query` (one request per 5,000 found)."""


def dump(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
