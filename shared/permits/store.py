"""The permit store (a port): each key's permits document, and a note per waiting job.

`DocumentPermitStore` keeps them as JSON documents with etags: over the account's documents port
(`Account.documents`: Azure Blob storage, conditional writes with If-Match / If-None-Match, one
request a write) in production and the integration tests, over `MemoryDocuments` in unit tests. Names:
`keys/<key>.json` (the key is URL-quoted) and `waiting/<job id>.json`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

from shared.core.documents import Document, DocumentStore

T = TypeVar("T")


class PermitStore(Protocol):
    """Where permits are kept. `write` is conditional: it creates when `current` is None, else
    replaces `current`; a lost race raises `shared.core.documents.Conflict`."""

    def read(self, key: str) -> Document | None: ...
    def write(self, key: str, data: dict[str, Any], current: Document | None) -> Document: ...
    def note_waiting(self, job: str, note: dict[str, Any]) -> None: ...
    def waiting_note(self, job: str) -> dict[str, Any] | None: ...
    def clear_waiting(self, job: str) -> None: ...


class DocumentPermitStore:
    """The permit store on a `DocumentStore` (Blob or in memory). `ensure` creates its container
    when a write finds none (a runtime whose start-up did not create resources): the `Blobs`
    port's `create`, which raises the app's storage errors and takes one already there as done."""

    def __init__(self, documents: DocumentStore, ensure: Callable[[], None] | None = None) -> None:
        self.documents = documents
        self.ensure = ensure

    @staticmethod
    def key_name(key: str) -> str:
        return f"keys/{quote(key, safe='')}.json"

    def read(self, key: str) -> Document | None:
        return self.documents.read(self.key_name(key))

    def write(self, key: str, data: dict[str, Any], current: Document | None) -> Document:
        name = self.key_name(key)
        if current is None:
            return self._created(lambda: self.documents.create(name, data))
        return self.documents.replace(name, current, data)

    def note_waiting(self, job: str, note: dict[str, Any]) -> None:
        self._created(lambda: self.documents.upsert(f"waiting/{job}.json", note))

    def waiting_note(self, job: str) -> dict[str, Any] | None:
        doc = self.documents.read(f"waiting/{job}.json")
        return doc.data if doc is not None else None

    def clear_waiting(self, job: str) -> None:
        self.documents.delete(f"waiting/{job}.json")

    def _created(self, write: Callable[[], T]) -> T:
        try:
            return write()
        except Exception as exc:
            if self.ensure is None or getattr(exc, "error_code", None) != "ContainerNotFound":
                raise
        self.ensure()
        return write()


def memory_permit_store(clock: Callable[[], datetime]) -> DocumentPermitStore:
    """The permit store in memory (tests, the simulation, a runtime built without storage)."""
    from shared.storage.memory_documents import MemoryDocuments

    return DocumentPermitStore(MemoryDocuments(clock, label="permits"))
