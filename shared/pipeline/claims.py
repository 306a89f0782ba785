"""Our claim on one job's ledger record while an invocation runs it (its heartbeat, its writes)."""

from __future__ import annotations

import logging
import threading

from shared import ledger
from shared.core.documents import Conflict
from shared.core.errors import ClaimLost
from shared.core.timers import Timer
from shared.ledger import Facts, Record
from shared.runtime.wiring import Runtime

log = logging.getLogger("jobs.processing")


class ClaimKeeper:
    """Our claim on one job's record. Every write of this invocation goes through it; a
    heartbeat renews the lease until `stop()`."""

    def __init__(self, rt: Runtime, job_id: str, owner: str, record: Record, mine: set[str]) -> None:
        self.rt = rt
        self.job_id = job_id
        self.owner = owner
        self.record = record
        self.mine = mine
        self.lost = False
        self._lock = threading.RLock()
        self._stopped = False
        self._timer: Timer | None = None

    def write(self, change: ledger.Change) -> Record:
        """Apply one transition to our record; ClaimLost when another writer changed it."""
        with self._lock:
            try:
                self.record = self.rt.ledger.write(self.job_id, self.record, change, self.mine)
            except Conflict:
                self.lost = True
                raise ClaimLost(
                    f"job {self.job_id}: another invocation took over the ledger record"
                ) from None
            return self.record

    def start(self) -> None:
        with self._lock:
            if not self._stopped:
                self._timer = self.rt.timers.call_later(self.rt.settings.heartbeat_s, self._beat)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            if self._timer is not None:
                self._timer.cancel()

    def _beat(self) -> None:
        with self._lock:
            if self._stopped:
                return
            facts = Facts(self.rt.clock(), owner=self.owner)
            try:
                self.write(lambda prev: ledger.renewed(prev, facts, self.rt.settings.claim_lease_s))
            except ClaimLost:
                log.warning("job %s: claim lost to another invocation; heartbeat stopped", self.job_id)
                return
            except Exception as exc:  # the next beat tries again, well inside the lease
                log.warning("job %s: claim renewal failed (%s); retrying at the next beat", self.job_id, exc)
            # the cadence counts from this beat's start: a slow failing renewal does not push the next one out
            wait = self.rt.settings.heartbeat_s - (self.rt.clock() - facts.now).total_seconds()
            self._timer = self.rt.timers.call_later(max(0.0, wait), self._beat)
