"""Bulk operations on the poison archive, carried out by the app in bounded steps.

An operation is a document `ops/<id>.json` in the archive container and a chain of messages on
`<jobs queue>-ops`, one per step: `{"op": id, "step": n}`. A step (the `run_op_step` trigger) reads
the document, takes at most `step_size` items from where the last step stopped (a cursor into an
explicit list of entry names, or the RowKey reached in the entry index of a state), applies the
operation to each, sends the next step's message (delayed to keep the rate), then records the
progress with a conditional write. A message whose step is not the document's is ignored, so a
redelivered or duplicated message never runs a step twice; a crash before the progress write makes
the host redeliver the step, which redoes only idempotent work (an entry already replayed by this
operation counts as replayed; a job already queued again is never sent twice). The trigger message
itself is never touched (the host owns its pop receipt). `resume` re-sends the current step of an
operation whose chain broke (its messages poisoned); `cancel` stops it at the next step.

Here: starting, reading, cancelling and resuming an operation. One step's run (the trigger) is in
`shared/poison/bulk_step.py`; how many entries a step takes and at what pace, in
`shared/poison/pacing.py`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from shared.core.archive_layout import is_entry_name
from shared.core.documents import Conflict
from shared.core.envelope import isoformat
from shared.core.messages import NEVER_EXPIRE
from shared.indexes.entry_rows import EntryState
from shared.observability.decisions import log_decision
from shared.poison.parking import PARKED
from shared.runtime.wiring import Runtime

OPS_PREFIX = "ops/"
KINDS = ("replay", "purge", "park", "unpark", "delete")
PURGE_STATES = tuple(s for s in EntryState if s != EntryState.PARKED)
"""States purge deletes from; `parked` is never among them (parked entries stay until unparked or
deleted explicitly)."""


class OpRefused(Exception):
    """An operation that cannot start or change as asked."""


def ops_queue_name(jobs_queue: str) -> str:
    return f"{jobs_queue}-ops"


def op_name(op_id: str) -> str:
    return f"{OPS_PREFIX}{op_id}.json"


# -- starting, cancelling, reading -------------------------------------------------------------


def start(
    rt: Runtime,
    kind: str,
    by: str,
    *,
    names: list[str] | None = None,
    states: list[str] | None = None,
    older_than_days: float | None = None,
    rate_per_s: float = 50.0,
    dry_run: bool = False,
    where: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Create the operation and send its first step: two requests, whatever its size. `where`
    ({"reason_code", "text", "queue"}) keeps an operation over states to the entries matching it
    (`EntryIndex.scan`): the operation is the filter, not a list of rows."""
    if kind not in KINDS:
        raise OpRefused(f"unknown operation {kind!r}; known: {', '.join(KINDS)}")
    if names is None and not states:
        raise OpRefused("give entry names or states to select entries")
    if names is not None and not all(is_entry_name(n) for n in names):
        raise OpRefused("names must be poison archive entries (jobs/... or unparsed/...)")
    if where and names is not None:
        raise OpRefused("a filter selects entries by state: give states, not names")
    if kind == "purge" and states and PARKED in states:
        raise OpRefused("purge never deletes parked entries: unpark or delete them first")
    now = rt.clock()
    op_id = f"{now.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}"
    doc = {
        "id": op_id,
        "kind": kind,
        "by": by,
        "created_at": isoformat(now),
        "updated_at": isoformat(now),
        "dry_run": dry_run,
        "rate_per_s": rate_per_s,
        "names": list(dict.fromkeys(names)) if names is not None else None,
        "states": states,
        "older_than_days": older_than_days,
        "where": {k: v for k, v in (where or {}).items() if v} or None,
        "cursor": {"i": 0, "state": 0, "after": ""},
        "step": 1,
        "status": "running",
        "total": len(set(names)) if names is not None else None,
        "done": 0,
        "counts": {},
        "failures": [],
        "recent": [],
    }
    rt.archive.create(op_name(op_id), doc)
    send_step(rt, op_id, 1, 0)
    log_decision("op_started", None, op=op_id, kind=kind, by=by, dry_run=dry_run)
    return doc


def send_step(rt: Runtime, op_id: str, step: int, delay_s: int) -> None:
    rt.account.queue(ops_queue_name(rt.settings.jobs_queue)).send_message(
        json.dumps({"op": op_id, "step": step}), visibility_timeout=delay_s or None, time_to_live=NEVER_EXPIRE
    )


def read(rt: Runtime, op_id: str) -> dict[str, Any] | None:
    doc = rt.archive.read(op_name(op_id))
    return doc.data if doc is not None else None


def cancel(rt: Runtime, op_id: str, by: str) -> dict[str, Any]:
    return _set_status(rt, op_id, "cancelled", by)


def resume(rt: Runtime, op_id: str, by: str) -> dict[str, Any]:
    """Send the operation's current step again (its chain broke: a step's message was poisoned).
    A duplicate is harmless: only the message whose step is the document's runs."""
    data = read(rt, op_id)
    if data is None:
        raise OpRefused(f"no operation {op_id}")
    if data.get("status") != "running":
        raise OpRefused(f"operation {op_id} is {data.get('status')}")
    send_step(rt, op_id, int(data["step"]), 0)
    log_decision("op_resumed", None, op=op_id, by=by, step=data["step"])
    return data


def _set_status(rt: Runtime, op_id: str, status: str, by: str) -> dict[str, Any]:
    for _ in range(5):
        doc = rt.archive.read(op_name(op_id))
        if doc is None:
            raise OpRefused(f"no operation {op_id}")
        if doc.data.get("status") != "running":
            return doc.data
        data = {**doc.data, "status": status, "updated_at": isoformat(rt.clock()), f"{status}_by": by}
        try:
            rt.archive.replace(op_name(op_id), doc, data)
            return data
        except Conflict:
            continue
    raise OpRefused(f"operation {op_id} kept changing; try again")
