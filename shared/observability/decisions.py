"""One structured log record per decision, so 'what happened to job X' is answerable from logs."""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("jobs")

DECISIONS = (
    "claimed",
    "completed",
    "duplicate",
    "stale",
    "busy",
    "retry_scheduled",
    "poisoned",
    "failed",
    "offloaded",
    "resumed",
    "replayed",
    "archived",
    "already_poisoned",
    "storage_busy",
    "contended",
    "claim_lost",
    "over_share",
    "console_action",
)


class DecisionCounter:
    """Counts decisions in this process (summaries, benchmarks, the demo)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, decision: str) -> None:
        with self._lock:
            self._counts[decision] += 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


COUNTER = DecisionCounter()
_LISTENERS: list[Callable[[str, dict[str, Any]], None]] = []


def add_listener(listener: Callable[[str, dict[str, Any]], None]) -> None:
    """Call `listener(decision, fields)` on every decision of this process (the console's metrics)."""
    if listener not in _LISTENERS:
        _LISTENERS.append(listener)


def log_decision(
    decision: str,
    job_id: str | None,
    *,
    queue_message_id: str | None = None,
    dequeue_count: int | None = None,
    attempt: int | None = None,
    level: int = logging.INFO,
    **fields: Any,
) -> None:
    """Log one decision as a JSON line; the same fields go into the record's `extra` (customDimensions)."""
    COUNTER.add(decision)
    record: dict[str, Any] = {
        "decision": decision,
        "job_id": job_id or "-",
        "queue_message_id": queue_message_id or "-",
        "dequeue_count": dequeue_count,
        "attempt": attempt,
    }
    record.update(fields)
    for listener in _LISTENERS:
        try:
            listener(decision, record)
        except Exception:  # metrics must never fail a decision
            logger.debug("decision listener failed", exc_info=True)
    logger.log(level, json.dumps(record, default=str, ensure_ascii=False), extra=record)
