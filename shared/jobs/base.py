"""What a job handler receives and returns."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from shared.config.settings import Settings
from shared.storage.clients import StorageClients


@dataclass(frozen=True)
class Completed:
    """The job is done; its result document is at `result_ref` ('<container>/<blob>')."""

    result_ref: str
    summary: Mapping[str, Any] = field(default_factory=dict)
    """Small facts copied into the ledger record (e.g. input_rows, engine)."""


@dataclass(frozen=True)
class Continue:
    """The work goes on elsewhere (e.g. a Spark run): check again after `delay_s`.

    The ledger keeps `state` and the job's status becomes `status`; a continuation message is
    enqueued with an initial visibility delay, and the handler is called again with
    `ctx.resume_state == state` when it arrives.
    """

    state: Mapping[str, Any]
    delay_s: int
    status: str = "offloaded"


Outcome = Completed | Continue


@dataclass
class JobContext:
    """Everything a handler may use. Handlers do their own I/O through `storage`."""

    job_id: str
    kind: str
    attempt: int
    payload: Mapping[str, Any]
    settings: Settings
    storage: StorageClients
    log: logging.LoggerAdapter[logging.Logger]
    checkpoint: Callable[[Mapping[str, Any]], None]
    """Save progress into the ledger record (never into the queue message)."""
    resume_state: Mapping[str, Any] | None = None
    """The `Continue.state` saved earlier, when this call continues an offloaded job."""
    progress: Mapping[str, Any] | None = None
    """The last checkpoint saved by an earlier attempt of this job, if any."""


class Handler(Protocol):
    """A job kind: validate its payload (pure) and run it."""

    def validate(self, payload: Mapping[str, Any]) -> None:
        """Raise PayloadError listing every problem; no I/O."""

    def run(self, ctx: JobContext) -> Outcome:
        """Do the work. Raise PermanentError / TransientError subclasses to say what comes next."""
        ...
