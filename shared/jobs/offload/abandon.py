"""Work a job handed elsewhere (a Spark run) is stopped when the job is poisoned.

A handler that offloads work may offer `abandon(settings, storage, job_id, state) -> facts | None`: stop the work
that the saved continuation `state` describes (best effort) and say what was done, for the
ledger (`ledger.run_cancelled`). Called on every path that poisons a job holding a continuation.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from shared.config.settings import Settings
from shared.core.errors import InputDataError, RunAbandoned
from shared.storage.ports import Account

log = logging.getLogger("jobs.abandon")


@runtime_checkable
class Abandons(Protocol):
    def abandon(
        self, settings: Settings, storage: Account, job_id: str, state: Mapping[str, Any]
    ) -> Mapping[str, Any] | None:
        """Stop the offloaded work of `state`; what was done (None: nothing to stop)."""
        ...


def abandon_work(
    handler: object,
    settings: Settings,
    storage: Account,
    record: Mapping[str, Any] | None,
    exc: BaseException | None,
) -> dict[str, Any] | None:
    """Stop the offloaded work of a job about to be poisoned; facts for the ledger, or None.

    A run the handler already gave up (RunAbandoned) or that ended with bad input data is not
    cancelled again. Never raises: poisoning goes on whatever the cancel did.
    """
    if isinstance(exc, RunAbandoned):
        return exc.cancelled_run
    if isinstance(exc, InputDataError):
        return None
    continuation = (record or {}).get("continuation")
    state = continuation.get("state") if isinstance(continuation, Mapping) else None
    job_id = (record or {}).get("id")
    if not isinstance(state, Mapping) or not isinstance(handler, Abandons) or not isinstance(job_id, str):
        return None
    try:
        facts = handler.abandon(settings, storage, job_id, state)
    except Exception as error:  # the ledger says the cancel was not done; the job is poisoned anyway
        log.warning("could not stop offloaded work: %s", error)
        return {"cancelled": False, "error": f"{error.__class__.__name__}: {error}"[:500]}
    return dict(facts) if facts is not None else None
