"""What operators change from the console. Every action is recorded (shared/poison/audited.py:
a decision naming who did it, and an audit row); the work is the poison package's (replay, park,
purge, bulk operations); pure checks (`describe_changes`, `where_of`) are separate from the I/O."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.core import jsontext
from shared.core.archive_layout import edit_name, is_entry_name
from shared.core.documents import Conflict
from shared.core.envelope import Envelope, body_digest, encode_json, isoformat, parse_dict
from shared.core.errors import EnvelopeError, PayloadError
from shared.indexes.audit import change_values
from shared.interfaces.console.job_archive import archived_bodies
from shared.ledger import operator as ledger_operator
from shared.pipeline.cancel import request_cancel
from shared.pipeline.submit import submit, validate_request
from shared.poison import bulk, pacing, parking, replay
from shared.poison.archive import IndexWrites, StoredEntry, index_writes, read_entry
from shared.poison.audited import record_action
from shared.poison.purge import start_purge
from shared.runtime.wiring import Runtime

log = logging.getLogger("jobs.console")


class ActionRefused(Exception):
    """An action that cannot be done as asked; `problems` name each field."""

    def __init__(self, message: str, problems: list[str] | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.problems = problems or []
        self.status = status


# -- checks (pure) ----------------------------------------------------------------------------


def tick_size(rate_per_s: float) -> int:
    """Job ids a replay request may carry at `rate_per_s`: one tick's worth (shared/poison/pacing.py)."""
    if rate_per_s <= 0:
        raise ActionRefused("rate must be above 0", ["rate: must be a number of jobs per second above 0"])
    return pacing.per_window(rate_per_s, pacing.TICK_S, pacing.TICK_ITEMS)


def describe_changes(before: Mapping[str, Any], after: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The fields that differ, as dotted paths (`payload.limit`), sorted."""
    changes = []
    for key in sorted(set(before) | set(after)):
        path = f"{prefix}{key}"
        old, new = before.get(key), after.get(key)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            changes.extend(describe_changes(old, new, f"{path}."))
        elif old != new or (key in before) != (key in after):
            changes.append(path)
    return changes


# -- replay -----------------------------------------------------------------------------------


def replay_batch(
    rt: Runtime, ids: list[str], rate_per_s: float, by: str, names: list[str] | None = None
) -> dict[str, Any]:
    """Replay up to one tick's worth of poisoned jobs (shared/poison/replay.py): each entry is read
    by the name the page sent (`names`, aligned with `ids`: the page's rows), else found by one
    query of the entry index; the index writes go out together (5 requests a job, then a few)."""
    size = tick_size(rate_per_s)
    if len(dict.fromkeys(ids)) > size:  # the page sends one tick's worth per request (its progress bar)
        raise ActionRefused(f"give at most {size} job ids per request at this rate", [f"ids: at most {size}"])
    given = names if names is not None and len(names) == len(ids) else None
    report = replay.replay_jobs(rt, ids, by, names=given)
    skipped = [{"id": i, "reason": report.reasons.get(i, "")} for i in ids if i in report.reasons]
    out: dict[str, Any] = {
        "replayed": report.replayed,
        "skipped": [s for s in skipped if s["id"] not in report.not_found],
        "not_found": report.not_found,
    }
    record_action(rt, "console", by, "replay", ids=ids, replayed=len(out["replayed"]), rate_per_s=rate_per_s)
    return out


# -- park / unpark / delete / purge -----------------------------------------------------------


def _checked(name: str) -> str:
    if not is_entry_name(name):
        raise ActionRefused(f"{name} is not a poison archive entry", [f"names: {name!r} is not an entry"])
    return name


def _each_entry(
    rt: Runtime,
    names: list[str],
    action: str,
    by: str,
    apply: Callable[[StoredEntry, IndexWrites], tuple[str, str]],
    done: str,
) -> tuple[list[str], list[str], dict[str, str]]:
    """Apply one action to each named entry (once each), recorded when its outcome is `done`; the
    index rows go together at the end. (done names, the others, notes by name)."""
    ok: list[str] = []
    other: list[str] = []
    notes: dict[str, str] = {}
    with index_writes(rt) as writes:
        for name in dict.fromkeys(names):
            stored = read_entry(rt.archive, _checked(name))
            outcome, note = apply(stored, writes) if stored is not None else ("not_found", "no such entry")
            if outcome != done or stored is None:
                other.append(name)
                continue
            ok.append(name)
            if note:
                notes[name] = note
            record_action(rt, "console", by, action, job_id=stored.entry.job_id, entry=name)
    return ok, other, notes


def park(rt: Runtime, names: list[str], by: str) -> dict[str, Any]:
    """Move entries aside (shared/poison/parking.py): read, send, write and the index row each."""
    parked, skipped, _ = _each_entry(
        rt, names, "park", by, lambda s, w: parking.park_entry(rt, s, by, w), parking.PARKED
    )
    return {"parked": parked, "skipped": skipped}


def unpark(rt: Runtime, names: list[str], by: str) -> dict[str, Any]:
    """List parked entries as poison again and delete their parked messages by id and receipt:
    a few requests per entry, whatever the parked queue's depth."""
    unparked, missing, notes = _each_entry(
        rt, names, "unpark", by, lambda s, w: parking.unpark_entry(rt, s, by, w), "unparked"
    )
    out: dict[str, Any] = {"unparked": unparked, "not_found": missing}
    if notes:
        out["notes"] = notes
    return out


def delete(rt: Runtime, names: list[str], by: str) -> dict[str, Any]:
    """Mark archive entries deleted (the operator confirmed in the page): no longer listed; purge
    removes them for good. A parked entry's parked message is deleted with it."""
    deleted, missing, _ = _each_entry(
        rt, names, "delete", by, lambda s, w: parking.delete_entry(rt, s, by, w), parking.DELETED
    )
    return {"deleted": deleted, **({"not_found": missing} if missing else {})}


def purge(rt: Runtime, older_than_days: float, by: str, dry_run: bool = False) -> dict[str, Any]:
    """Start a purge operation (shared/poison/purge.py: in the app, in steps): poison entries
    only, never parked ones, edits, the audit or counters."""
    op = start_purge(rt, older_than_days, by, dry_run=dry_run)
    record_action(rt, "console", by, "purge", older_than_days=older_than_days, op=op["id"], dry_run=dry_run)
    return {"op": op["id"], "status": op["status"], "dry_run": dry_run}


def cancel_job(rt: Runtime, job_id: str, by: str, reason: str = "") -> dict[str, Any]:
    """Ask to cancel a job, as the CLI does: poisoned at its next delivery (an offloaded run is
    cancelled then)."""
    try:
        said = request_cancel(rt, job_id, by=by, reason=reason or "cancelled from the console")
    except Conflict as exc:
        raise ActionRefused(f"not cancelled: {exc}", status=409) from None
    record_action(rt, "console", by, "cancel", job_id=job_id)
    return {"id": job_id, "cancel_requested": True, "said": said}


def start_op(rt: Runtime, body: Mapping[str, Any], by: str) -> dict[str, Any]:
    """Start a bulk operation: {kind, names | state, rate, dry_run, older_than_days}."""
    kind = str(body.get("kind", ""))
    names = body.get("names")
    state = body.get("state")
    if names is not None:
        names = names_of(names)
    elif not isinstance(state, str) or not state:
        raise ActionRefused("give names, or a state to select all entries in it", ["names|state: required"])
    rate = body.get("rate", 50)
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1000:
        raise ActionRefused("rate: items per second in (0, 1000]", ["rate: items per second in (0, 1000]"])
    days = body.get("older_than_days")
    where = where_of(body.get("where"))
    try:
        op = bulk.start(
            rt,
            kind,
            by,
            names=names,
            states=[state] if names is None and isinstance(state, str) else None,
            older_than_days=float(days) if isinstance(days, int | float) else None,
            rate_per_s=float(rate),
            dry_run=bool(body.get("dry_run")),
            where=where,
        )
    except bulk.OpRefused as exc:
        raise ActionRefused(str(exc), [str(exc)]) from None
    record_action(
        rt,
        "console",
        by,
        "op_start",
        op=op["id"],
        kind=kind,
        dry_run=op["dry_run"],
        where=where,
        state=state,
        rate=rate,
    )
    return {"op": op["id"], "status": op["status"], "total": op["total"], "dry_run": op["dry_run"]}


def where_of(value: object) -> dict[str, str] | None:
    """An operation's filter from a request ({"reason_code", "text", "queue"}), or ActionRefused (pure)."""
    if value is None:
        return None
    problem = (
        "where: {reason_code: a reason code (<= 64 chars), text: error text (<= 200 chars), "
        "queue: a declared queue}"
    )
    if not isinstance(value, Mapping) or set(value) - {"reason_code", "text", "queue"}:
        raise ActionRefused(problem, [problem])
    code, text, queue = value.get("reason_code") or "", value.get("text") or "", value.get("queue") or ""
    if not all(isinstance(v, str) for v in (code, text, queue)) or len(code) > 64 or len(text) > 200:
        raise ActionRefused(problem, [problem])
    if len(queue) > 64:
        raise ActionRefused(problem, [problem])
    pairs = (("reason_code", code), ("text", text), ("queue", queue))
    found = {k: v.strip() for k, v in pairs if v.strip()}
    return found or None


def op_change(rt: Runtime, body: Mapping[str, Any], by: str, change: str) -> dict[str, Any]:
    op_id = body.get("op")
    if not isinstance(op_id, str) or not op_id:
        raise ActionRefused("op: an operation id", ["op: an operation id"])
    try:
        data = bulk.cancel(rt, op_id, by) if change == "cancel" else bulk.resume(rt, op_id, by)
    except bulk.OpRefused as exc:
        raise ActionRefused(str(exc), [str(exc)], status=409) from None
    record_action(rt, "console", by, f"op_{change}", op=op_id)
    return {"op": op_id, "status": data.get("status"), "step": data.get("step")}


# -- edit before replay -----------------------------------------------------------------------


@dataclass
class Checked:
    """An edited envelope: parsed, or the problems by field."""

    envelope: Envelope | None
    data: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def check_edit(rt: Runtime, job_id: str, text: str) -> Checked:
    """Validate an edited envelope as the function would: the envelope parser (`parse_dict`), then
    the kind's own payload validation. The id must stay the job's."""
    try:
        data = jsontext.loads(text)
    except json.JSONDecodeError as exc:
        return Checked(
            None, problems=[f"envelope: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"]
        )
    if not isinstance(data, dict):
        return Checked(None, problems=["envelope: must be a JSON object"])
    problems: list[str] = []
    if data.get("id") != job_id:
        problems.append(f"id: must stay {job_id} (an edit replays the same job)")
    try:
        env = parse_dict(data, rt.handlers.keys())
    except EnvelopeError as exc:
        return Checked(None, data, problems + exc.problems)
    if env.payload is not None:
        try:
            rt.handlers[env.kind].validate(env.payload)
        except PayloadError as exc:
            problems.extend(exc.problems)
    return Checked(None if problems else env, data, problems)


def replay_edited(rt: Runtime, job_id: str, text: str, by: str) -> dict[str, Any]:
    """Replay a poisoned job with an edited envelope under the same id. The original stays in the
    archive (its entries are marked replayed); the edited body is kept under edits/; the ledger
    records `edited` (who, which fields) then `replayed`, in one write."""
    checked = check_edit(rt, job_id, text)
    if checked.envelope is None:
        raise ActionRefused("the edited envelope is invalid; nothing was enqueued", checked.problems)
    env = checked.envelope.with_attempt(0)
    try:
        record = replay.poisoned_record(rt, job_id)
    except replay.ReplayRefused as exc:
        raise ActionRefused(str(exc), status=exc.status) from None
    entries = archived_bodies(rt, job_id, record.data)
    original: dict[str, Any] = {}
    if entries:
        try:
            loaded = jsontext.loads(entries[0].entry.body())
            original = loaded if isinstance(loaded, dict) else {}
        except (ValueError, UnicodeDecodeError):
            original = {}
    changes = describe_changes(original, checked.data)
    body = encode_json(env).encode("utf-8")
    digest = body_digest(body)
    rt.archive.upsert(
        edit_name(rt.job_key(job_id), digest),
        {
            "job_id": job_id,
            "by": by,
            "at": isoformat(rt.clock()),
            "changes": changes,
            "original_entry": entries[0].name if entries else None,
            "body_b64": base64.b64encode(body).decode("ascii"),
        },
    )
    try:
        replay.replay_edit(
            rt,
            env,
            record,
            [e.name for e in entries],
            by,
            lambda prev, facts: ledger_operator.edited(prev, job_id, facts, by, changes, digest),
        )
    except replay.ReplayRefused as exc:
        raise ActionRefused(str(exc), status=exc.status) from None
    record_action(
        rt,
        "console",
        by,
        "replay_edited",
        job_id=job_id,
        changes=change_values(original, checked.data, changes),
        digest=digest,
    )
    return {"id": job_id, "replayed": True, "changes": changes}


def replay_fixed(rt: Runtime, name: str, text: str, by: str) -> dict[str, Any]:
    """Submit a fixed version of an unparsed body as a job, exactly as the API would (a new id
    unless given; 409 when that id exists), then mark the entry replayed (it stays archived):
    shared/poison/replay.py `replay_fixed`."""

    def send(rt: Runtime) -> str:  # the entry's queue's
        try:
            data = jsontext.loads(text)
        except json.JSONDecodeError as exc:
            problems = [f"envelope: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"]
            raise ActionRefused("the fixed envelope is invalid; nothing was enqueued", problems) from None
        try:
            result = submit(rt, validate_request(rt, data))
        except EnvelopeError as exc:
            raise ActionRefused("the fixed envelope is invalid; nothing was enqueued", exc.problems) from None
        if not result.created:
            status = result.existing.status if result.existing else "unknown"
            raise ActionRefused(
                f"job {result.envelope.id} exists ({status}): nothing was enqueued", status=409
            )
        return result.envelope.id

    try:
        job_id = replay.replay_fixed(rt, _checked(name), by, send)
    except replay.ReplayRefused as exc:
        raise ActionRefused(str(exc), status=exc.status) from None
    record_action(rt, "console", by, "replay_fixed", job_id=job_id, entry=name)
    return {"id": job_id, "replayed": True}


def names_of(value: object, field_name: str = "names") -> list[str]:
    """A list of strings from a request body field, or ActionRefused naming it."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or not value:
        raise ActionRefused(
            f"{field_name}: a non-empty list of strings", [f"{field_name}: a non-empty list of strings"]
        )
    return list(value)


def ids_in(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))
