"""`MemoryDocuments`: the `DocumentStore` in a dict, with a hook for fault injection (tests, simulation)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from azure.core.exceptions import AzureError

from shared.core.documents import Document, DocumentChanged, DocumentExists, TagQuery, dump
from shared.storage.failures import storage_failure


class MemoryDocuments:
    """Documents in a dict. `before` is called before every operation (fault injection)."""

    def __init__(
        self,
        clock: Callable[[], datetime],
        before: Callable[[str, str], Callable[[], None] | None] | None = None,
        label: str = "docs",
        tags: Callable[[dict[str, Any]], dict[str, str]] | None = None,
    ) -> None:
        self.clock = clock
        self.tag_of = tags
        """Index tags derived from each document written (as `BlobDocuments.tags`)."""
        self.tags: dict[str, dict[str, str]] = {}
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
        if self.tag_of is not None:
            self.tags[name] = dict(self.tag_of(copy))
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
            self.tags.pop(name, None)
        if after:
            after()

    def find(self, query: TagQuery) -> Iterator[str]:
        after = self._gate("find", query.expression())
        with self._lock:
            found = sorted(name for name, tags in self.tags.items() if query.matches(tags))
        if after:
            after()
        yield from found

    def names(self, prefix: str) -> Iterator[tuple[str, datetime | None]]:
        after = self._gate("list", prefix)
        with self._lock:
            found = sorted((n, v[2]) for n, v in self.docs.items() if n.startswith(prefix))
        if after:
            after()
        yield from found
