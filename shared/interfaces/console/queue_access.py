"""An operator limited to some queues (`Principal.queues`: QUEUE_<NAME>_CONSOLE_ROLES / _GROUPS)
sees and acts on those queues' jobs only; a refusal says why and which setting grants more.

Pages and data routes: a request that names another queue is refused; one that names none is
served for the operator's first queue (`queue_for`). Pages that span every queue (the audit,
purge) are refused. Actions: each job (`<queue>/<id>`), archive entry (its `queue`, one read an
entry) or operation (its `where.queue`) they touch must be on one of the operator's queues.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from shared.interfaces.console.by_queue import split_key
from shared.interfaces.console.security import Denied, Principal
from shared.poison import bulk
from shared.poison.archive import read_entry
from shared.queues import setting_name
from shared.runtime.wiring import Runtime

EVERY_QUEUE_ACTIONS = frozenset({"purge"})
"""Actions over every queue's entries: refused to an operator limited to some queues."""
JOB_ACTIONS = frozenset({"cancel", "validate", "replay-edited"})
ENTRY_ACTIONS = frozenset({"park", "unpark", "delete", "replay-fixed"})


def refusal(principal: Principal, queue: str) -> str:
    """Why `principal` may not see or act on `queue` (pure)."""
    mine = ", ".join(sorted(principal.queues or ()))
    return (
        f"{principal.name} may operate the jobs of queue {mine} only, not of {queue or 'every queue'} "
        f"(granted by {setting_name(queue, 'CONSOLE_ROLES') if queue else 'CONSOLE_ALLOWED_ROLES'} / "
        f"{setting_name(queue, 'CONSOLE_GROUPS') if queue else 'CONSOLE_ALLOWED_GROUPS'})"
    )


def check(principal: Principal, queue: str) -> None:
    """Denied(403) unless `principal` may operate `queue` ("": every queue)."""
    if principal.queues is not None and queue not in principal.queues:
        raise Denied(403, refusal(principal, queue))


def queue_for(rt: Runtime, principal: Principal, asked: str) -> str:
    """The queue a page shows: the one asked for (checked), else "" (every queue), or for a
    limited operator their first declared queue."""
    if asked:
        check(principal, asked)
        return asked
    if principal.queues is None:
        return ""
    return next(name for name in rt.settings.queue_set.names if name in principal.queues)


def shown(rt: Runtime, principal: Principal, queue: str) -> tuple[str, ...] | None:
    """The queues the overview shows: the one asked for, else the operator's (None: every one)."""
    if queue:
        return (queue,)
    if principal.queues is None:
        return None
    return tuple(name for name in rt.settings.queue_set.names if name in principal.queues)


def check_action(rt: Runtime, principal: Principal, action: str, body: Mapping[str, Any]) -> None:
    """Denied(403) when a limited operator's action touches a job, entry or operation of a queue
    not theirs (reads: one per named entry or operation)."""
    if principal.queues is None:
        return
    default = rt.settings.queue_set.default.name
    if action in EVERY_QUEUE_ACTIONS:
        check(principal, "")
    if action in JOB_ACTIONS or action == "replay":
        keys = body.get("ids") if action == "replay" else [body.get("job_id")]
        for key in _strings(keys):
            check(principal, split_key(key)[0] or default)
    if action in ENTRY_ACTIONS or action == "replay":
        names = body.get("names") if action != "replay-fixed" else [body.get("name")]
        _check_entries(rt, principal, _strings(names), default)
    if action == "op-start":
        if body.get("names") is not None:
            _check_entries(rt, principal, _strings(body.get("names")), default)
        else:
            check(principal, _op_queue(body))
    if action in ("op-cancel", "op-resume"):
        op = bulk.read(rt, str(body.get("op") or "")) or {}
        check(principal, _op_queue(op))


def check_op(principal: Principal, op: Mapping[str, Any]) -> None:
    """Denied(403) when a limited operator asks for an operation over other queues."""
    check(principal, _op_queue(op))


def _op_queue(op: Mapping[str, Any]) -> str:
    where = op.get("where")
    return str(where.get("queue") or "") if isinstance(where, Mapping) else ""


def _check_entries(rt: Runtime, principal: Principal, names: Iterable[str], default: str) -> None:
    for name in dict.fromkeys(names):
        stored = read_entry(rt.archive, name) if name else None
        if stored is not None:
            check(principal, stored.entry.queue or default)


def _strings(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
