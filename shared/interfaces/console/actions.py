"""What operators change from the console. Every action is logged as a decision (`console_action`)
naming who did it; pure planning (`rate_plan`, `describe_changes`) is separate from the I/O."""

from __future__ import annotations

import base64
import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared import ledger, poison
from shared.app.runtime import Runtime
from shared.app.sending import send_job
from shared.config import tracing
from shared.config.observability import log_decision
from shared.core import jsontext
from shared.core.documents import Conflict
from shared.core.envelope import Envelope, body_digest, encode_json, isoformat, parse_dict
from shared.core.errors import EnvelopeError, PayloadError
from shared.indexes.audit import change_values
from shared.interfaces.console.job_archive import archived_bodies, edit_name
from shared.ledger import Facts
from shared.ledger import operator as ledger_operator
from shared.pipeline.cancel import request_cancel
from shared.pipeline.submit import submit, validate_request
from shared.poison import bulk, bulk_step, parking
from shared.poison.archive import JOBS_PREFIX, LISTED_STATE, UNPARSED_PREFIX, set_state

log = logging.getLogger("jobs.console")
MAX_BATCH = 50


class ActionRefused(Exception):
    """An action that cannot be done as asked; `problems` name each field."""

    def __init__(self, message: str, problems: list[str] | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.problems = problems or []
        self.status = status


def logged(rt: Runtime, action: str, by: str, job_id: str | None = None, **fields: Any) -> None:
    """Log the action as a decision and record it in the audit table (one request, best effort)."""
    log_decision("console_action", job_id, action=action, by=by, **fields)
    if rt.audit is not None:
        target = job_id or str(fields.get("entry") or (f"op:{fields['op']}" if fields.get("op") else ""))
        rt.audit.record(rt.clock(), by, action, target, **fields)


# -- planning (pure) --------------------------------------------------------------------------


@dataclass(frozen=True)
class RatePlan:
    """A replay at `rate` per second, sent as batches of `batch` every `interval_s`."""

    batches: list[list[str]]
    interval_s: float


def rate_plan(ids: list[str], rate_per_s: float, tick_s: float = 0.5) -> RatePlan:
    """Split `ids` into batches so one batch per interval keeps to `rate_per_s` (each id once)."""
    if rate_per_s <= 0:
        raise ActionRefused("rate must be above 0", ["rate: must be a number of jobs per second above 0"])
    unique = list(dict.fromkeys(ids))
    size = max(1, min(MAX_BATCH, math.floor(rate_per_s * tick_s)))
    return RatePlan([unique[i : i + size] for i in range(0, len(unique), size)], size / rate_per_s)


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
    """Replay up to MAX_BATCH poisoned jobs at `rate_per_s`. With the entry index each id costs
    its own requests: its entry is read by the name the page sent (`names`, aligned with `ids`:
    the page's rows), else found by one query; without the index, the archive is listed."""
    plan = rate_plan(ids, rate_per_s)
    if len(plan.batches) != 1:  # the page sends one tick's worth per request (its progress bar)
        size = len(plan.batches[0])
        raise ActionRefused(f"give at most {size} job ids per request at this rate", [f"ids: at most {size}"])
    if rt.entry_index is None:
        report = poison.replay(rt, ids, rate_per_s=rate_per_s)
        logged(rt, "replay", by, None, ids=ids, replayed=len(report.replayed), rate_per_s=rate_per_s)
        return report.as_dict()
    out: dict[str, Any] = {"replayed": [], "skipped": [], "not_found": []}
    given = dict(zip(ids, names, strict=True)) if names is not None and len(names) == len(ids) else {}
    for job_id in dict.fromkeys(ids):
        name = given.get(job_id, "")
        if not name.startswith(f"{JOBS_PREFIX}{job_id}/"):  # only the job's own entries
            rows = rt.entry_index.page(LISTED_STATE, "", 1, job_id=job_id)
            name = rows[0].name if rows else ""
        doc = rt.archive.read(name) if name else None
        if doc is None or doc.data.get("job_id") != job_id:
            out["not_found"].append(job_id)
            continue
        outcome, reason = bulk_step.replay_entry(rt, name, doc, by)
        if outcome == "replayed":
            out["replayed"].append(job_id)
        else:
            out["skipped"].append({"id": job_id, "reason": reason})
    logged(rt, "replay", by, None, ids=ids, replayed=len(out["replayed"]), rate_per_s=rate_per_s)
    return out


# -- park / unpark / delete / purge -----------------------------------------------------------


def _entry(rt: Runtime, name: str) -> Any:
    if not name.startswith(JOBS_PREFIX) and not name.startswith("unparsed/"):
        raise ActionRefused(f"{name} is not a poison archive entry", [f"names: {name!r} is not an entry"])
    return rt.archive.read(name)


def park(rt: Runtime, names: list[str], by: str) -> dict[str, Any]:
    """Move entries aside (shared/poison/parking.py): read, send, write and the index row each."""
    parked: list[str] = []
    skipped: list[Any] = []
    for name in dict.fromkeys(names):
        doc = _entry(rt, name)
        outcome = parking.park_entry(rt, name, doc, by) if doc is not None else ("skipped", "no such entry")
        if outcome[0] == parking.PARKED:
            parked.append(name)
            logged(rt, "park", by, doc.data.get("job_id"), entry=name)
        else:
            skipped.append(name)
    return {"parked": parked, "skipped": skipped}


def unpark(rt: Runtime, names: list[str], by: str) -> dict[str, Any]:
    """List parked entries as poison again and delete their parked messages by id and receipt:
    a few requests per entry, whatever the parked queue's depth."""
    unparked: list[str] = []
    missing: list[str] = []
    notes: dict[str, str] = {}
    for name in dict.fromkeys(names):
        doc = _entry(rt, name)
        outcome, note = parking.unpark_entry(rt, name, doc, by) if doc is not None else ("not_found", "")
        if outcome != "unparked":
            missing.append(name)
            continue
        unparked.append(name)
        if note:
            notes[name] = note
        logged(rt, "unpark", by, doc.data.get("job_id"), entry=name)
    out: dict[str, Any] = {"unparked": unparked, "not_found": missing}
    if notes:
        out["notes"] = notes
    return out


def delete(rt: Runtime, names: list[str], by: str) -> dict[str, Any]:
    """Mark archive entries deleted (the operator confirmed in the page): no longer listed; purge
    removes them for good. A parked entry's parked message is deleted with it."""
    deleted: list[str] = []
    missing: list[str] = []
    for name in dict.fromkeys(names):
        doc = _entry(rt, name)
        outcome = parking.delete_entry(rt, name, doc, by)[0] if doc is not None else "not_found"
        if outcome != parking.DELETED:
            missing.append(name)
            continue
        deleted.append(name)
        logged(rt, "delete", by, doc.data.get("job_id"), entry=name)
    return {"deleted": deleted, **({"not_found": missing} if missing else {})}


def purge(rt: Runtime, older_than_days: float, by: str, dry_run: bool = False) -> dict[str, Any]:
    """Start a purge operation (in the app, in steps): poison entries only, never parked ones,
    edits, the audit or counters. Without the entry index: the old one-request purge of entries."""
    if rt.entry_index is None:
        names = poison.purge(rt, older_than_days, dry_run=dry_run)
        logged(rt, "purge", by, None, older_than_days=older_than_days, purged=len(names))
        return {"purged": names}
    op = bulk.start(
        rt,
        "purge",
        by,
        states=list(bulk.PURGE_STATES),
        older_than_days=older_than_days,
        rate_per_s=0,
        dry_run=dry_run,
    )
    logged(rt, "purge", by, None, older_than_days=older_than_days, op=op["id"], dry_run=dry_run)
    return {"op": op["id"], "status": op["status"], "dry_run": dry_run}


def cancel_job(rt: Runtime, job_id: str, by: str, reason: str = "") -> dict[str, Any]:
    """Ask to cancel a job, as the CLI does: poisoned at its next delivery (an offloaded run is
    cancelled then)."""
    try:
        said = request_cancel(rt, job_id, by=by, reason=reason or "cancelled from the console")
    except Conflict as exc:
        raise ActionRefused(f"not cancelled: {exc}", status=409) from None
    logged(rt, "cancel", by, job_id)
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
    logged(
        rt,
        "op_start",
        by,
        None,
        op=op["id"],
        kind=kind,
        dry_run=op["dry_run"],
        where=where,
        state=state,
        rate=rate,
    )
    return {"op": op["id"], "status": op["status"], "total": op["total"], "dry_run": op["dry_run"]}


def where_of(value: object) -> dict[str, str] | None:
    """An operation's filter from a request ({"reason_code", "text"}), or ActionRefused (pure)."""
    if value is None:
        return None
    problem = "where: {reason_code: a reason code (<= 64 chars), text: error text (<= 200 chars)}"
    if not isinstance(value, Mapping) or set(value) - {"reason_code", "text"}:
        raise ActionRefused(problem, [problem])
    code, text = value.get("reason_code") or "", value.get("text") or ""
    if not isinstance(code, str) or not isinstance(text, str) or len(code) > 64 or len(text) > 200:
        raise ActionRefused(problem, [problem])
    found = {k: v.strip() for k, v in (("reason_code", code), ("text", text)) if v.strip()}
    return found or None


def op_change(rt: Runtime, body: Mapping[str, Any], by: str, change: str) -> dict[str, Any]:
    op_id = body.get("op")
    if not isinstance(op_id, str) or not op_id:
        raise ActionRefused("op: an operation id", ["op: an operation id"])
    try:
        data = bulk.cancel(rt, op_id, by) if change == "cancel" else bulk.resume(rt, op_id, by)
    except bulk.OpRefused as exc:
        raise ActionRefused(str(exc), [str(exc)], status=409) from None
    logged(rt, f"op_{change}", by, None, op=op_id)
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
    record = rt.ledger.get(job_id)
    if record is None or record.status != ledger.POISONED:
        status = record.status if record else "unknown"
        raise ActionRefused(f"job {job_id} is {status}, not poisoned: nothing was enqueued", status=409)
    entries = archived_bodies(rt, job_id, record.data)
    original: dict[str, Any] = {}
    if entries:
        try:
            loaded = jsontext.loads(base64.b64decode(str(entries[0][1].get("body_b64", ""))))
            original = loaded if isinstance(loaded, dict) else {}
        except (ValueError, UnicodeDecodeError):
            original = {}
    changes = describe_changes(original, checked.data)
    body = encode_json(env).encode("utf-8")
    digest = body_digest(body)
    facts = Facts(rt.clock())
    rt.archive.upsert(
        edit_name(job_id, digest),
        {
            "job_id": job_id,
            "by": by,
            "at": isoformat(facts.now),
            "changes": changes,
            "original_entry": entries[0][0] if entries else None,
            "body_b64": base64.b64encode(body).decode("ascii"),
        },
    )
    try:
        rt.ledger.write(
            job_id,
            record,
            lambda prev: ledger_operator.replayed(
                ledger_operator.edited(prev, job_id, facts, by, changes, digest), env, facts
            ),
        )
    except Conflict:
        raise ActionRefused(f"job {job_id} changed meanwhile; reload and try again", status=409) from None
    send_job(rt, tracing.replayed(env))  # issue 36: a new trace linked to the first
    for name, _ in entries:
        set_state(rt.archive, name, "replayed", rt.clock(), rt.entry_index)
    logged(
        rt, "replay_edited", by, job_id, changes=change_values(original, checked.data, changes), digest=digest
    )
    return {"id": job_id, "replayed": True, "changes": changes}


def replay_fixed(rt: Runtime, name: str, text: str, by: str) -> dict[str, Any]:
    """Submit a fixed version of an unparsed body as a job, exactly as the API would (a new id
    unless given; 409 when that id exists), then mark the entry replayed (it stays archived)."""
    doc = _entry(rt, name)
    if doc is None or not name.startswith(UNPARSED_PREFIX) or doc.data.get("state") != LISTED_STATE:
        raise ActionRefused(f"{name} is not a listed unparsed entry", status=409)
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
        raise ActionRefused(f"job {result.envelope.id} exists ({status}): nothing was enqueued", status=409)
    set_state(rt.archive, name, "replayed", rt.clock(), rt.entry_index)
    logged(rt, "replay_fixed", by, result.envelope.id, entry=name)
    return {"id": result.envelope.id, "replayed": True}


def names_of(value: object, field_name: str = "names") -> list[str]:
    """A list of strings from a request body field, or ActionRefused naming it."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or not value:
        raise ActionRefused(
            f"{field_name}: a non-empty list of strings", [f"{field_name}: a non-empty list of strings"]
        )
    return list(value)


def ids_in(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(values))
