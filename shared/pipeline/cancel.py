"""An operator cancels one job: it is poisoned at its next delivery, offloaded work stopped.

The request is a ledger fact (`cancel_requested`); the job's own next delivery (a continuation
of an offloaded job comes within SPARK_POLL_MAX_SECONDS) sees it and poisons the job with reason
`cancelled`, through the usual path: the body is archived (replayable), a Spark run is cancelled
on its cluster and its concurrency slot freed, and the ledger records both.
"""

from __future__ import annotations

from shared.core.documents import Conflict
from shared.ledger import Facts
from shared.ledger import operator as ledger_operator
from shared.runtime.wiring import Runtime


def request_cancel(rt: Runtime, job_id: str, by: str = "operator", reason: str = "") -> str:
    """Ask to cancel `job_id`; what happened, in words. Conflict (with why) when it cannot be."""
    record = rt.ledger.get(job_id)
    if record is None:
        raise Conflict(f"job {job_id} is unknown")
    facts = Facts(rt.clock(), owner=by)
    rt.ledger.write(
        job_id, record, lambda prev: ledger_operator.cancel_requested(prev, job_id, facts, by, reason)
    )
    return (
        f"job {job_id} ({record.status}): cancel requested; it is poisoned at its next delivery "
        "(an offloaded job's run is cancelled then)"
    )
