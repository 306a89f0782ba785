"""A cap on Spark runs in flight across every instance: slot records with conditional writes.

Slot `i` is the document `spark-slots/slot-<i>.json` in the ledger container (job ids never hold
a '/', so it is never a job's record): `{"holder": <job id> | null, "until": <unix time>, "since": <unix time the holder took it>}`.
A job takes a free slot before its first submit (conditional create or replace: one winner),
renews it at each tracking step, and frees it when its run ends (completed, given up, poisoned).
A slot whose holder stopped renewing (an instance that died, a job poisoned by the host) is free
again once `until` has passed.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.core.documents import Conflict, DocumentStore
from shared.spark.config import SparkSettings

PREFIX = "spark-slots/"
log = logging.getLogger("jobs.spark.slots")


def slot_name(index: int) -> str:
    return f"{PREFIX}slot-{index}.json"


def is_free_for(data: Mapping[str, Any] | None, job_id: str, now: float) -> bool:
    """May `job_id` take (or keep) a slot holding `data`? (pure)"""
    if data is None:
        return True
    holder = data.get("holder")
    if holder in (None, "", job_id):
        return True
    try:
        return float(data.get("until") or 0) < now
    except (TypeError, ValueError):
        return True


def lease_seconds(poll_max_s: float, step_budget_s: float) -> float:
    """How long a slot stays taken without renewal: three polling intervals at their cap, one
    step, and ten minutes for queue and retry delays."""
    return 3 * poll_max_s + step_budget_s + 600


def run_slots(store: DocumentStore, spark: SparkSettings) -> Slots:
    """The SPARK_MAX_CONCURRENT_RUNS slots of these settings, kept in `store`."""
    return Slots(store, spark.max_concurrent_runs, lease_seconds(spark.poll_max_s, spark.step_budget_s))


@dataclass
class Slots:
    """`cap` slots in `store`; `cap` 0 means no cap (every call succeeds, nothing is written)."""

    store: DocumentStore
    cap: int
    lease_s: float
    clock: Callable[[], float] = time.time

    def acquire(self, job_id: str) -> int | None:
        """A slot for `job_id` (the one it holds already, if any); None when all are taken."""
        if self.cap <= 0:
            return -1
        start = zlib.crc32(job_id.encode()) % self.cap  # spread jobs over the slots
        for step in range(self.cap):
            index = (start + step) % self.cap
            if self._take(index, job_id):
                return index
        return None

    def renew(self, job_id: str, index: int | None) -> bool:
        """Extend our hold; False when the slot is no longer ours (its lease ran out and it was taken)."""
        if self.cap <= 0 or index is None or index < 0:
            return True
        if index >= self.cap:  # the cap was lowered: give the slot up, and look for one again
            return False
        return self._take(index, job_id, only_ours=True)

    def release(self, job_id: str, index: int | None = None) -> None:
        """Free the slot `job_id` holds: `index` first, then any other (a slot taken again after
        a lapse may have another index). A slot held by someone else is left alone."""
        if self.cap <= 0:
            return
        hint = [index] if index is not None and 0 <= index < self.cap else []
        for i in [*hint, *(i for i in range(self.cap) if i != index)]:
            if self._free(i, job_id):
                return

    def _free(self, index: int, job_id: str) -> bool:
        name = slot_name(index)
        current = self.store.read(name)
        if current is None or current.data.get("holder") != job_id:
            return False
        try:
            self.store.replace(name, current, {"holder": None, "until": 0, "released_by": job_id})
        except Conflict:
            log.info("slot %s changed while %s released it; left as it is", index, job_id)
        return True

    def held_since(self) -> list[float]:
        """When each live slot was taken (unix time): one read per slot (the queue-metrics sample)."""
        now, out = self.clock(), []
        for index in range(max(0, self.cap)):
            doc = self.store.read(slot_name(index))
            data = doc.data if doc else None
            if data is not None and data.get("holder") and not is_free_for(data, "", now):
                since = data.get("since")
                out.append(float(since) if isinstance(since, int | float) and since > 0 else now)
        return out

    def holders(self) -> list[str | None]:
        """Who holds each slot now (None: free). For tests and operators."""
        now, out = self.clock(), []
        for index in range(max(0, self.cap)):
            doc = self.store.read(slot_name(index))
            data = doc.data if doc else None
            live = data is not None and data.get("holder") and not is_free_for(data, "", now)
            out.append(str(data["holder"]) if live and data else None)
        return out

    def _take(self, index: int, job_id: str, only_ours: bool = False) -> bool:
        name = slot_name(index)
        now = self.clock()
        current = self.store.read(name)
        since = current.data.get("since") if current and current.data.get("holder") == job_id else None
        data = {"holder": job_id, "until": now + self.lease_s, "since": since if since else now}
        if only_ours and (current is None or current.data.get("holder") != job_id):
            return False
        if not is_free_for(current.data if current else None, job_id, now):
            return False
        try:
            if current is None:
                self.store.create(name, data)
            else:
                self.store.replace(name, current, data)
        except Conflict:  # another instance moved first
            return False
        return True
