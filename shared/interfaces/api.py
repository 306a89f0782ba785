"""HTTP handlers: submit a job, read its status and result, health, and poison operations."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec

import azure.functions as func

from shared import poison
from shared.core import jsontext
from shared.core.envelope import ID_RE, ID_RULE
from shared.core.errors import EnvelopeError, MessageTooLarge, SettingsError, StorageThrottled
from shared.ledger import COMPLETED, Record
from shared.ledger.view import RecordView
from shared.observability import tracing
from shared.pipeline.gate import waiting_reason
from shared.pipeline.submit import (
    SUBMIT_CALLS,
    MessageOut,
    SubmissionBusy,
    request_queue,
    submit,
    validate_request,
)
from shared.poison import bulk
from shared.poison.audited import record_action
from shared.queues import UnknownQueue
from shared.runtime.wiring import Runtime, get_runtime
from shared.storage.clients import bounded_calls
from shared.storage.failures import NotFound, StorageError, failure_name
from shared.storage.limits import BlobTooLarge, result_limit_bytes

log = logging.getLogger("jobs.api")
P = ParamSpec("P")
MAX_REQUEST_BYTES = 100 * 1024 * 1024
STORAGE_RETRY_AFTER_S = 5
ADMIN = "admin key"
"""Who the audit names for the admin API's actions (a function key, not a person)."""
"""Retry-After of a 503 for a storage failure."""


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> func.HttpResponse:
    return func.HttpResponse(
        json.dumps(body, default=str), status_code=status, mimetype="application/json", headers=headers
    )


def _error(code: int, message: str, **extra: Any) -> func.HttpResponse:
    return _json(code, {"error": message, **extra})


def _guarded(
    handler: Callable[Concatenate[func.HttpRequest, Runtime, P], func.HttpResponse],
) -> Callable[Concatenate[func.HttpRequest, P], func.HttpResponse]:
    """Settings problems -> 503 naming the setting; storage outages -> 503; never a stack trace.
    The handler takes the request, the runtime, then any output bindings the wiring passes."""

    def wrapper(req: func.HttpRequest, /, *outputs: P.args, **named: P.kwargs) -> func.HttpResponse:
        try:
            return handler(req, get_runtime(), *outputs, **named)
        except SettingsError as exc:
            return _error(503, str(exc))
        except (StorageError, StorageThrottled) as exc:
            log.exception("storage error in %s", handler.__name__)
            return _json(
                503,
                {
                    "error": f"storage unavailable ({failure_name(exc)}); try again later",
                    "retry_after_s": STORAGE_RETRY_AFTER_S,
                },
                {"Retry-After": str(STORAGE_RETRY_AFTER_S)},
            )

    wrapper.__name__ = handler.__name__
    return wrapper


def _status_url(req: func.HttpRequest, job_id: str, rt: Runtime | None = None) -> str:
    base = req.url.split("/api/", 1)[0]
    queue = "" if rt is None or rt.queue.default else f"?queue={rt.queue.name}"
    return f"{base}/api/jobs/{job_id}{queue}"


@_guarded
def submit_job(req: func.HttpRequest, rt: Runtime, out: MessageOut | None = None) -> func.HttpResponse:
    """POST /api/jobs: 202 {id, status_url}; `"queue": "<name>"` picks a declared queue (default:
    the first; the status URL then says `?queue=`); 400 with problems (the app's own fields `attempt` and
    `continuation_seq` included); 409 if the id exists; 413 too large; 503 with Retry-After to retry.

    One request per id gets 202 (the ledger's conditional create decides); the same request
    retried after an error finishes the send and gets 202 (see shared/pipeline/submit.py). Its
    storage calls are bounded (`SUBMIT_CALLS`): a storage failure before the send answers 503
    within seconds; once the message is sent the answer is 202, whatever the write after it does.
    `out` (the function's queue output binding): the host sends the message when a 202 returns,
    and wakes its listener on the jobs queue at once; without it this function sends it."""
    body = req.get_body()
    if len(body) > MAX_REQUEST_BYTES:
        return _error(413, f"request body is {len(body)} bytes; the limit is {MAX_REQUEST_BYTES}")
    try:
        data = jsontext.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return _error(400, "request body is not JSON", problems=[f"body: {exc}"])
    try:
        lane, data = request_queue(rt, data)
        env = validate_request(lane, data)
        with (
            tracing.submission_span(env, req.headers) as env,
            bounded_calls(SUBMIT_CALLS),
        ):  # the caller's traceparent
            # the host's output binding sends to the default queue; another queue's message is sent here
            result = submit(lane, env, out if lane.queue.default else None)
    except EnvelopeError as exc:
        return _error(400, "invalid job", problems=exc.problems)
    except MessageTooLarge as exc:
        return _error(413, str(exc))
    except SubmissionBusy as exc:
        retry = str(exc.retry_after_s)
        return _json(503, {"error": str(exc), "retry_after_s": exc.retry_after_s}, {"Retry-After": retry})
    url = _status_url(req, env.id, lane)
    if not result.created:
        status = result.existing.status if result.existing else "unknown"
        what = "already exists" if result.same_request else "already exists (from another request)"
        return _error(
            409,
            f"job {env.id} {what}",
            id=env.id,
            status=status,
            status_url=url,
            same_request=result.same_request,
        )
    return _json(
        202,
        {"id": env.id, "status_url": url, "claim_checked": result.claim_checked},
        headers={"Location": url},
    )


def _record(req: func.HttpRequest, rt: Runtime) -> Record | func.HttpResponse:
    """The ledger record named by the route's {id}, or the 400/404 answer."""
    job_id = req.route_params.get("id", "")
    if not ID_RE.match(job_id):
        return _error(400, f"id: {json.dumps(job_id)} {ID_RULE}")
    try:
        rt = rt.for_queue(req.params.get("queue") or None)
    except UnknownQueue as exc:
        return _error(400, f"queue: {exc}")
    record = rt.ledger.get(job_id)
    return _error(404, f"job {job_id} is unknown") if record is None else record


@_guarded
def get_job(req: func.HttpRequest, rt: Runtime) -> func.HttpResponse:
    """GET /api/jobs/{id}: the ledger record; `waiting` says why while it waits for a permit."""
    record = _record(req, rt)
    if isinstance(record, func.HttpResponse):
        return record
    lane = rt.for_queue(req.params.get("queue") or None)  # known: `_record` checked it
    waiting = waiting_reason(lane, req.route_params["id"], record)
    return _json(200, {**record.data, "waiting": waiting} if waiting else record.data)


@_guarded
def get_result(req: func.HttpRequest, rt: Runtime) -> func.HttpResponse:
    """GET /api/jobs/{id}/result: the result document; 409 until completed.

    A document is served up to the size MAX_GROUPS allows (`result_limit_bytes`); a larger one
    (a Spark run with more groups) is not read: 502 naming its size, the limit and the blob.
    """
    record = _record(req, rt)
    if isinstance(record, func.HttpResponse):
        return record
    job_id = req.route_params["id"]
    if record.status != COMPLETED:
        return _error(409, f"job {job_id} is {record.status}, not completed", status=record.status)
    view = RecordView.of(record)
    ref = view.result_ref
    if not ref:
        return _json(200, {"id": job_id, "summary": dict(view.summary)})
    container, _, name = ref.partition("/")
    limit = result_limit_bytes(rt.settings.max_groups)
    try:
        raw = rt.account.blobs(container).read_capped(name, limit)
    except NotFound:
        return _error(404, f"result {ref} of job {job_id} is missing")
    except BlobTooLarge as big:
        return _error(
            502,
            f"result {ref} of job {job_id} is {big.size} bytes, more than this API serves ({limit} bytes: "
            "MAX_GROUPS x 512 bytes a row + 64 KiB); read the blob from storage directly",
            result_ref=ref,
            result_bytes=big.size,
            limit_bytes=limit,
        )
    return func.HttpResponse(raw, status_code=200, mimetype="application/json")


def health(req: func.HttpRequest) -> func.HttpResponse:
    """GET /api/health (anonymous): 200 when settings are valid and storage answers."""
    try:
        rt = get_runtime()
    except SettingsError as exc:
        return _error(503, str(exc), status="unhealthy")
    except StorageError as exc:
        return _error(503, f"storage unreachable ({failure_name(exc)})", status="unhealthy")
    try:
        rt.account.blobs(rt.settings.ledger_container).check()
        rt.account.queue(rt.settings.jobs_queue).depth()
    except StorageError as exc:
        return _error(503, f"storage unreachable ({failure_name(exc)})", status="unhealthy")
    return _json(
        200, {"status": "ok", "queue": rt.settings.jobs_queue, "storage": rt.settings.storage.describe()}
    )


@_guarded
def list_poison(req: func.HttpRequest, rt: Runtime) -> func.HttpResponse:
    """GET /api/poison[?state=poisoned&after=<key>&limit=100&code=<reason code>&q=<text>&queue=<name>]: a page
    of archived poison entries (newest first, from the entry index: O(page); `queue`: that queue's
    only), `next` (the `after` of the next page, "" at the end), the counts per reason code and the
    messages still on the poison queue (`queue`'s, default: the first's)."""
    try:
        limit = min(1000, max(1, int(req.params.get("limit") or 100)))
    except ValueError:
        return _error(400, "limit: a number of entries in [1, 1000]")
    queue = req.params.get("queue") or ""
    try:
        lane = rt.for_queue(queue or None)
    except UnknownQueue as exc:
        return _error(400, f"queue: {exc}")
    rows, reached = rt.entry_index.scan(
        req.params.get("state") or "poisoned",
        req.params.get("after", ""),
        limit,
        req.params.get("code", "")[:64],
        req.params.get("q", "")[:200].strip(),
        queue=queue,
    )
    return _json(
        200,
        {
            "archived": [dataclasses.asdict(r) for r in rows],
            "next": reached,
            "counts": rt.entry_index.counts(queue or None, rt.settings.queue_set.default.name),
            "on_queue": poison.peek_poison_queue(lane),
        },
    )


@_guarded
def replay_poison(req: func.HttpRequest, rt: Runtime) -> func.HttpResponse:
    """POST /api/poison/replay {"ids": [...] | "all": true, "rate": 10, "dry_run": false, "queue":
    "<name>"}. Each job goes back to the queue it was poisoned on; `queue` says which queue's jobs
    the ids name (default: the first; an id may also be given as `<queue>/<id>`, as listed) or,
    with `all`, keeps to that queue's. `all` with the entry index starts a bulk operation (202:
    its id, and the listed count now); see `GET /api/console-api/data/ops/<id>` or
    `python -m shared.interfaces.cli ops show <id>`."""
    try:
        body = jsontext.loads(req.get_body() or b"{}")
    except json.JSONDecodeError:
        return _error(400, "request body is not JSON")
    if not isinstance(body, dict):
        return _error(400, "request body must be a JSON object")
    queue = body.get("queue") or ""
    try:
        rt = rt.for_queue(queue if isinstance(queue, str) else "?")
    except UnknownQueue as exc:
        return _error(400, f"queue: {exc}")
    ids = body.get("ids")
    if not body.get("all") and not (isinstance(ids, list) and all(isinstance(i, str) for i in ids)):
        return _error(400, "give ids: [job ids] or all: true")
    rate = body.get("rate", 10)
    if not isinstance(rate, int | float) or rate <= 0 or rate > 1000:
        return _error(400, "rate: must be a number of messages per second in (0, 1000]")
    if body.get("all"):  # a bulk operation the app runs in steps
        op = bulk.start(
            rt,
            "replay",
            "api",
            states=["poisoned"],
            rate_per_s=float(rate),
            dry_run=bool(body.get("dry_run")),
            where={"queue": queue} if queue else None,
        )
        record_action(
            rt, "api", ADMIN, "op_start", op=op["id"], kind="replay", state="poisoned", rate=rate,
            dry_run=op["dry_run"], queue=queue or None,
        )  # fmt: skip
        listed = sum(rt.entry_index.counts(queue or None, rt.settings.queue_set.default.name).values())
        return _json(
            202, {"op": op["id"], "status": op["status"], "dry_run": op["dry_run"], "listed": listed}
        )
    report = poison.replay_jobs(rt, ids, "api", rate_per_s=float(rate), dry_run=bool(body.get("dry_run")))
    return _json(200, report.as_dict())


@_guarded
def purge_poison(req: func.HttpRequest, rt: Runtime) -> func.HttpResponse:
    """POST /api/poison/purge {"older_than_days": N, "dry_run": false}: starts the purge operation
    (shared/poison/purge.py; 202: its id), as the console and the CLI do; a dry run counts in the
    operation's document what the purge would delete. Two requests, whatever the archive's size."""
    try:
        body = jsontext.loads(req.get_body() or b"{}")
    except json.JSONDecodeError:
        return _error(400, "request body is not JSON")
    days = body.get("older_than_days")
    if not isinstance(days, int | float) or days < 0:
        return _error(400, "older_than_days: required, a number >= 0")
    op = poison.start_purge(rt, float(days), "api", dry_run=bool(body.get("dry_run")))
    record_action(rt, "api", ADMIN, "purge", op=op["id"], older_than_days=days, dry_run=op["dry_run"])
    return _json(202, {"op": op["id"], "status": op["status"], "dry_run": op["dry_run"]})
