"""The console overview's counters in Table storage: a refresh is one query, no blob listing.

Table `<archive container, letters and digits>metrics`, one entity per (hour, instance):
PartitionKey the hour (`YYYY-MM-DDTHH`), RowKey the instance, `doc` the hour's document as JSON
(shared/observability/overview_counters.py; an hour's is ~8 KB, a string property holds 64 KiB). A refresh reads the two
hours it shows with one range query on PartitionKey; a flush is one upsert; pruning is one range
query (the hours past `RETENTION_H`) and a delete per entity found.

Counter blobs written before this table (`console/metrics/` in the archive container) are not read
(the overview shows the last hour: after an upgrade it fills from the new documents); they are
still pruned after `RETENTION_H`, by a listing once an hour in each process until none is left.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from shared.core.documents import DocumentStore
from shared.indexes.keys import quoted
from shared.observability import overview_counters
from shared.storage.failures import NotFound
from shared.storage.ports import Tables
from shared.storage.tables import upsert_creating

log = logging.getLogger("jobs.console.metrics")
SUFFIX = "metrics"


def hours_filter(hours: list[str]) -> str:
    """The query of the entities of `hours` (consecutive: one PartitionKey range) (pure)."""
    first, last = min(hours), max(hours)
    return f"PartitionKey ge {quoted(first)} and PartitionKey le {quoted(last)}"


def expired_filter(now: datetime, retention_h: int = overview_counters.RETENTION_H) -> str:
    """The query of the entities older than `retention_h` hours (pure)."""
    return f"PartitionKey lt {quoted(overview_counters.hour_key(now - timedelta(hours=retention_h)))}"


def entity_of(hour: str, instance: str, doc: Mapping[str, Any]) -> dict[str, Any]:
    return {"PartitionKey": hour, "RowKey": overview_counters.instance_key(instance), "doc": json.dumps(doc)}


class TableCounters:
    """An `overview_counters.CounterStore` over one table; `legacy`: the counter blobs pruned until gone."""

    def __init__(self, tables: Tables, name: str, legacy: DocumentStore) -> None:
        self.name = name
        self.table = tables.table(name)
        self.legacy = legacy
        self.legacy_left = True

    def ensure(self) -> None:
        self.table.create()

    def write(self, hour: str, instance: str, doc: Mapping[str, Any]) -> None:
        upsert_creating(self.table, entity_of(hour, instance, doc))

    def read(self, hours: list[str], skip_instance: str | None) -> list[Mapping[str, Any]]:
        """The documents of `hours`: one query."""
        skip = overview_counters.instance_key(skip_instance) if skip_instance is not None else None
        try:
            found = list(self.table.rows(hours_filter(hours), size=1000))
        except NotFound:
            return []
        docs: list[Mapping[str, Any]] = []
        for entity in found:
            if entity.get("RowKey") == skip:
                continue
            try:
                doc = json.loads(str(entity.get("doc") or ""))
            except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
                log.warning(
                    "console metrics: %s/%s is not JSON", entity.get("PartitionKey"), entity.get("RowKey")
                )
                continue
            if isinstance(doc, dict):
                docs.append(doc)
        return docs

    def prune(self, now: datetime) -> int:
        """Delete the hours past `RETENTION_H` (and the counter blobs of before the table)."""
        try:
            due = list(self.table.rows(expired_filter(now), select=["PartitionKey", "RowKey"]))
        except NotFound:
            due = []
        for entity in due:
            with contextlib.suppress(NotFound):
                self.table.delete(str(entity["PartitionKey"]), str(entity["RowKey"]))
        return len(due) + self._prune_legacy(now)

    def _prune_legacy(self, now: datetime) -> int:
        if not self.legacy_left:
            return 0
        names = [name for name, _ in self.legacy.names(overview_counters.PREFIX)]
        gone = overview_counters.expired(names, now)
        for name in gone:
            self.legacy.delete(name)
        self.legacy_left = len(gone) < len(names)
        return len(gone)
