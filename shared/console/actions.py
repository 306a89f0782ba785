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

from shared import jsontext, ledger, poison
from shared.console.queries import EDITS_PREFIX, PARKED, archived_bodies
from shared.documents import Conflict
from shared.envelope import Envelope, body_digest, encode_json, isoformat, parse_dict
from shared.errors import EnvelopeError, PayloadError
from shared.ledger import Facts
from shared.messages import NEVER_EXPIRE
from shared.observability import log_decision
from shared.poison.archive import JOBS_PREFIX, LISTED_STATE, UNPARSED_PREFIX, set_state
from shared.runtime import Runtime
from shared.submit import send_job, submit, validate_request

log = logging.getLogger("jobs.console")
MAX_BATCH = 50
UNPARK_SCAN_BATCHES = 20
"""Receive batches (32 messages each) an unpark looks through on the parked queue."""


class ActionRefused(Exception):
    """An action that cannot be done as asked; `problems` name each field."""

    def __init__(self, message: str, problems: list[str] | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.problems = problems or []
        self.status = status


def logged(action: str, by: str, job_id: str | None = None, **fields: Any) -> None:
    log_decision("console_action", job_id, action=action, by=by, **fields)


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


def replay_batch(rt: Runtime, ids: list[str], rate_per_s: float, by: str) -> dict[str, Any]:
    """Replay up to MAX_BATCH poisoned jobs at `rate_per_s` (see shared/poison/operations.replay)."""
    plan = rate_plan(ids, rate_per_s)
    if len(plan.batches) != 1:  # the page sends one tick's worth per request (its progress bar)
        size = len(plan.batches[0])
        raise ActionRefused(f"give at most {size} job ids per request at this rate", [f"ids: at most {size}"])
    report = poison.replay(rt, ids, rate_per_s=rate_per_s)
    logged("replay", by, None, ids=ids, replayed=len(report.replayed), rate_per_s=rate_per_s)
    return report.as_dict()


# -- park / unpark / delete / purge -----------------------------------------------------------


def _entry(rt: Runtime, name: str) -> Any:
    if not name.startswith(JOBS_PREFIX) and not name.startswith("unparsed/"):
        raise ActionRefused(f"{name} is not a poison archive entry", [f"names: {name!r} is not an entry"])
    return rt.archive.read(name)


def park(rt: Runtime, names: list[str], by: str) -> dict[str, list[str]]:
    """Move entries aside: their body goes to the parked queue and the entry is marked `parked`
    (no longer listed or replayed as poison). Unpark brings them back."""
    parked, skipped = [], []
    queue = rt.storage.raw_queue(rt.settings.parked_queue)
    for name in dict.fromkeys(names):
        doc = _entry(rt, name)
        if doc is None or doc.data.get("state") != LISTED_STATE:
            skipped.append(name)
            continue
        sent = queue.send_message(str(doc.data.get("body_b64", "")), time_to_live=NEVER_EXPIRE)
        data = {**doc.data, "state": PARKED, "parked_message_id": getattr(sent, "id", None)}
        data["events"] = [
            *(doc.data.get("events") or []),
            {"at": isoformat(rt.clock()), "event": PARKED, "by": by},
        ]
        try:
            rt.archive.replace(name, doc, data)
        except Conflict:
            skipped.append(name)
            continue
        parked.append(name)
        logged("park", by, doc.data.get("job_id"), entry=name)
    return {"parked": parked, "skipped": skipped}


def unpark(rt: Runtime, names: list[str], by: str) -> dict[str, list[str]]:
    """Take the entries' messages off the parked queue and list the entries as poison again."""
    wanted: dict[str, str] = {}
    for name in dict.fromkeys(names):
        doc = _entry(rt, name)
        if doc is not None and doc.data.get("state") == PARKED:
            wanted[str(doc.data.get("digest"))] = name
    queue = rt.storage.raw_queue(rt.settings.parked_queue)
    found: dict[str, str] = {}
    for _ in range(UNPARK_SCAN_BATCHES):
        if len(found) == len(wanted):
            break
        batch = list(queue.receive_messages(max_messages=32, visibility_timeout=30))
        if not batch:
            break
        for msg in batch:
            try:
                digest = body_digest(base64.b64decode(str(msg.content or ""), validate=True))
            except ValueError:
                digest = ""
            if digest in wanted:
                queue.delete_message(msg)
                found[digest] = wanted[digest]
            else:  # not ours: visible again at once
                queue.update_message(msg, visibility_timeout=0)
    for name in found.values():
        doc = rt.archive.read(name)
        if doc is None:
            continue
        data = {**doc.data, "state": LISTED_STATE}
        data.pop("parked_message_id", None)
        data["events"] = [
            *(doc.data.get("events") or []),
            {"at": isoformat(rt.clock()), "event": "unparked", "by": by},
        ]
        rt.archive.replace(name, doc, data)
        logged("unpark", by, doc.data.get("job_id"), entry=name)
    missing = [name for name in wanted.values() if name not in found.values()]
    return {"unparked": list(found.values()), "not_found": missing}


def delete(rt: Runtime, names: list[str], by: str) -> dict[str, list[str]]:
    """Delete archive entries (the operator confirmed in the page)."""
    deleted = []
    for name in dict.fromkeys(names):
        doc = _entry(rt, name)
        if doc is None:
            continue
        rt.archive.delete(name)
        deleted.append(name)
        logged("delete", by, doc.data.get("job_id"), entry=name)
    return {"deleted": deleted}


def purge(rt: Runtime, older_than_days: float, by: str) -> dict[str, Any]:
    names = poison.purge(rt, older_than_days)
    logged("purge", by, None, older_than_days=older_than_days, purged=len(names))
    return {"purged": names}


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
    entries = archived_bodies(rt, job_id)
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
        f"{EDITS_PREFIX}{job_id}/{digest}.json",
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
            lambda prev: ledger.replayed(ledger.edited(prev, job_id, facts, by, changes, digest), env, facts),
        )
    except Conflict:
        raise ActionRefused(f"job {job_id} changed meanwhile; reload and try again", status=409) from None
    send_job(rt, env)
    for name, _ in entries:
        set_state(rt.archive, name, "replayed", rt.clock())
    logged("replay_edited", by, job_id, changes=changes, digest=digest)
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
    set_state(rt.archive, name, "replayed", rt.clock())
    logged("replay_fixed", by, result.envelope.id, entry=name)
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
