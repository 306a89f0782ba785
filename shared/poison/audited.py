"""Operator actions on record, in one place: every change an operator makes through the console,
the CLI or the admin API (replays, park / unpark / delete, purges, bulk operations, cancels) is
recorded here (`record_action`): logged as a `console_action` decision (its `via` says which
interface) and written as a row of the audit table (shared/indexes/audit.py: one request, best
effort)."""

from __future__ import annotations

from typing import Any, Literal

from shared.observability.decisions import log_decision
from shared.runtime.wiring import Runtime

Via = Literal["console", "cli", "api"]


def target_of(job_id: str | None, entry: str | None, op: str | None) -> str:
    """What an action was on, for its audit row: the job, else the entry, else `op:<id>` (pure)."""
    return job_id or entry or (f"op:{op}" if op else "")


def record_action(
    rt: Runtime,
    via: Via,
    by: str,
    action: str,
    *,
    job_id: str | None = None,
    entry: str | None = None,
    op: str | None = None,
    **details: Any,
) -> None:
    """Log the action as a decision and record it in the audit table (one request, best effort)."""
    named: dict[str, Any] = {k: v for k, v in (("entry", entry), ("op", op)) if v}
    log_decision("console_action", job_id, action=action, by=by, via=via, **named, **details)
    rt.audit.record(rt.clock(), by, action, target_of(job_id, entry, op), **named, via=via, **details)
