"""A delivery's facts, and poisoning a body: the copy on `<queue>-poison` with its reason noted."""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass
from typing import Any

from shared.core.envelope import best_effort_id
from shared.core.errors import EnvelopeError
from shared.core.messages import NEVER_EXPIRE
from shared.ledger import Facts
from shared.observability.decisions import log_decision
from shared.poison.archive import note_reason
from shared.runtime.wiring import Runtime


@dataclass(frozen=True)
class Delivery:
    """Facts about this delivery, for records and logs."""

    message_id: str | None
    dequeue_count: int | None
    body: bytes
    queue: str = ""
    """The declared queue, when the app has several (JOBS_QUEUES): its decisions, and the job
    metrics counted from them, say it."""

    def fields(self, attempt: int | None = None) -> dict[str, Any]:
        said = {"queue": self.queue} if self.queue else {}
        return {
            "queue_message_id": self.message_id,
            "dequeue_count": self.dequeue_count,
            "attempt": attempt,
            **said,
        }


def send_poison_copy(
    rt: Runtime, body: bytes, reason: str, job_id: str | None, code: str | None, *, under_claim: bool
) -> None:
    """Note why (by the body's digest), then put a copy of the body on <queue>-poison.

    The copy is base64 text, which `decode_message` gives back as `body` byte for byte (a body
    that is not UTF-8 included), as do the host's own raw moves of what it received."""
    note_reason(rt.archive, body, reason, job_id, code, under_claim=under_claim, now=rt.clock())
    rt.poison_queue.send_message(base64.b64encode(body).decode("ascii"), time_to_live=NEVER_EXPIRE)


def poison_unparsed(rt: Runtime, delivery: Delivery, exc: EnvelopeError) -> None:
    """A message that is not a valid envelope: poison it at once, with the problems as its reason.

    A body whose id is well formed gets a `poisoned` record when that job has none (a create
    only: it never changes another job's record), so the job answers with its reason at once."""
    job_id = exc.job_id or best_effort_id(delivery.body)
    reason = f"{exc.reason_code}: {exc}"
    if exc.job_id is not None:
        rt.ledger.create_rejected(exc.job_id, Facts(rt.clock()), reason, exc.reason_code, delivery.body)
    send_poison_copy(rt, delivery.body, reason, job_id, exc.reason_code, under_claim=False)
    log_decision(
        "poisoned",
        job_id,
        reason=reason,
        reason_code=exc.reason_code,
        level=logging.WARNING,
        **delivery.fields(),
    )
