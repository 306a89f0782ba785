"""One step of a bulk operation (shared/poison/bulk.py): the `run_op_step` trigger's work.

A step reads the operation's document, takes its next entries, applies the operation to each at
the operation's rate (shared/poison/pacing.py), sends the next step's message, then records
the progress with a conditional write. A message whose step is not the document's is ignored.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from shared.core.documents import Conflict, Document
from shared.core.envelope import decode_message, isoformat
from shared.core.messages import QueueMessageLike
from shared.indexes.entry_rows import EntryRow
from shared.indexes.keys import newest_first
from shared.poison.archive import LISTED_STATE, IndexWrites, read_entry
from shared.poison.bulk import op_name, send_step
from shared.poison.pacing import Pacer, step_plan, step_threads
from shared.poison.parking import DELETED, PARKED, delete_entry, park_entry, unpark_entry
from shared.poison.purge import purge_entry
from shared.poison.replay import replay_entry
from shared.runtime.wiring import Runtime, get_runtime

log = logging.getLogger("jobs.ops")
STEP_BUDGET_S = 15.0
"""A step starts no entry after this long (its first excepted): where the store is slower than
the rate, steps stay short (Cancel within seconds, far from the function timeout) and the rest
waits for the next step."""
FAILURES_KEPT = 500


# -- one step ---------------------------------------------------------------------------------


def run_step(rt: Runtime, body: bytes) -> str:
    """Carry out one step of an operation (the ops-queue trigger). Returns what it did."""
    try:
        msg = json.loads(body)
        op_id, step = str(msg["op"]), int(msg["step"])
    except (ValueError, KeyError, TypeError):
        log.warning("ops: a message that is not a step: %r", body[:200])
        return "ignored"
    doc = rt.archive.read(op_name(op_id))
    if doc is None or doc.data.get("status") != "running" or int(doc.data.get("step", 0)) != step:
        return "ignored"
    started = rt.monotonic()
    data = doc.data
    rate = float(data.get("rate_per_s") or 0)
    plan = step_plan(rate)
    items, cursor, finished = _next_items(rt, data, plan.size)
    writes = IndexWrites()
    pacer = Pacer(rate, rt.monotonic)

    def one(k: int) -> tuple[str, str] | None:
        pacer.wait(k, rt.sleep)
        if k and rt.monotonic() - started > STEP_BUDGET_S:
            return None  # not started: the next step takes it
        return _apply(rt, data, items[k][0], items[k][1], writes)

    with ThreadPoolExecutor(step_threads(rate, len(items)) if items else 1) as pool:
        outcomes = list(pool.map(one, range(len(items))))
    writes.flush(rt)
    done = outcomes.index(None) if None in outcomes else len(outcomes)
    if done < len(items):  # over its time budget (a slow store): the rest go to the next step
        cursor, finished = _cursor_after(data, cursor, items, done), False
    results = [
        (name, *outcome)
        for (name, _), outcome in zip(items[:done], outcomes[:done], strict=True)
        if outcome is not None
    ]
    if not finished:
        wait = step_plan(float(data.get("rate_per_s") or 0), rt.monotonic() - started, done)
        send_step(rt, op_id, step + 1, wait.delay_s)
    _record(rt, op_id, doc, step, cursor, results, finished)
    return "finished" if finished else "stepped"


def _cursor_after(
    data: dict[str, Any], cursor: dict[str, Any], items: list[tuple[str, EntryRow | None]], done: int
) -> dict[str, Any]:
    """The cursor after the step's first `done` items (`done` >= 1: the first always runs)."""
    cursor = dict(cursor)
    if data.get("names") is not None:
        cursor["i"] = int(cursor["i"]) - len(items) + done
    else:
        row = items[done - 1][1]
        assert row is not None
        cursor["after"] = row.key
    return cursor


def _next_items(
    rt: Runtime, data: dict[str, Any], size: int
) -> tuple[list[tuple[str, EntryRow | None]], dict[str, Any], bool]:
    """The step's items (name, index row when listed from the index), the cursor after them, and
    whether the operation has no more."""
    cursor = dict(data.get("cursor") or {})
    names = data.get("names")
    if names is not None:
        i = int(cursor.get("i", 0))
        chunk = names[i : i + size]
        cursor["i"] = i + len(chunk)
        return [(n, None) for n in chunk], cursor, cursor["i"] >= len(names)
    states = list(data.get("states") or [])
    bound = ""
    if data.get("older_than_days") is not None:
        cutoff = rt.clock() - timedelta(days=float(data["older_than_days"]))
        bound = newest_first(isoformat(cutoff), "")
    while int(cursor.get("state", 0)) < len(states):
        state = states[int(cursor["state"])]
        after = max(str(cursor.get("after") or ""), bound)
        where = data.get("where") or {}
        rows, reached = rt.entry_index.scan(
            state,
            after,
            size,
            str(where.get("reason_code") or ""),
            str(where.get("text") or ""),
            queue=str(where.get("queue") or ""),
        )
        if rows or reached:  # a search that found nothing in its budget goes on from `reached`
            cursor["after"] = reached or rows[-1].key
            return [(r.name, r) for r in rows], cursor, False
        cursor["state"], cursor["after"] = int(cursor["state"]) + 1, ""
    return [], cursor, True


def _apply(
    rt: Runtime, op: dict[str, Any], name: str, row: EntryRow | None, writes: IndexWrites
) -> tuple[str, str]:
    """(outcome, reason) for one entry; its index writes are left in `writes`. A dry run over states
    counts the rows the index gives (no read); over names, the entries that exist."""
    kind, by = str(op["kind"]), f"op:{op['id']}"
    if op.get("dry_run") and row is not None:  # counted from the index: no read per entry
        return "counted", row.state
    stored = read_entry(rt.archive, name)
    if stored is None:
        if row is not None:  # a row left by an entry gone: it follows
            writes.remove(row)
        return "not_found", "no such archive entry"
    state = stored.entry.state
    mine = stored.entry.acted_by(by)
    if op.get("dry_run"):
        return "counted", state
    if kind == "replay":
        return replay_entry(rt, stored, by, writes, mine)
    if kind == "purge":
        return purge_entry(rt, stored, writes)
    if kind == "park":
        return park_entry(rt, stored, by, writes) if not (state == PARKED and mine) else (PARKED, "")
    if kind == "unpark":
        if state == LISTED_STATE and mine:
            return "unparked", ""
        return unpark_entry(rt, stored, by, writes)
    if state == DELETED and mine:
        return DELETED, ""
    return delete_entry(rt, stored, by, writes)


def _record(
    rt: Runtime,
    op_id: str,
    doc: Document,
    step: int,
    cursor: dict[str, Any],
    results: list[tuple[str, str, str]],
    finished: bool,
) -> None:
    """The step's progress, merged into the document (a cancel written meanwhile stands)."""
    current: Document | None = doc
    for _ in range(5):
        if current is None:
            return
        data = dict(current.data)
        counts = dict(data.get("counts") or {})
        failures = list(data.get("failures") or [])
        for name, outcome, reason in results:
            counts[outcome] = counts.get(outcome, 0) + 1
            if outcome not in ("replayed", "purged", "parked", "unparked", "deleted", "counted"):
                failures.append({"name": name, "outcome": outcome, "reason": reason})
        data.update(
            counts=counts,
            failures=failures[-FAILURES_KEPT:],
            recent=[{"name": n, "outcome": o, "reason": r} for n, o, r in results[-20:]],
            done=int(data.get("done") or 0) + len(results),
            cursor=cursor,
            step=step + 1,
            updated_at=isoformat(rt.clock()),
        )
        if finished and data.get("status") == "running":
            data["status"] = "done"
        try:
            rt.archive.replace(op_name(op_id), current, data)
            return
        except Conflict:
            current = rt.archive.read(op_name(op_id))


def handle_op_message(msg: QueueMessageLike, rt: Runtime | None = None) -> None:
    """The ops-queue trigger: one step (the host deletes the message when this returns)."""
    run_step(rt or get_runtime(), decode_message(msg.get_body() or b""))


def drain(rt: Runtime, receive: Callable[[], list[bytes]], limit: int = 10_000) -> int:
    """Run steps from `receive` until it gives nothing (tests and tools); steps run."""
    ran = 0
    while ran < limit:
        bodies = receive()
        if not bodies:
            return ran
        for body in bodies:
            run_step(rt, body)
            ran += 1
    return ran
