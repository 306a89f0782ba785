"""GET/POST /api/console/{*path}: authorise, check CSRF on changes, dispatch, answer.

Pages: `` (overview), `jobs`, `jobs/<id>`, `jobs/<id>/result`, `poison`, `audit`; `fragment/overview` (the
refreshed charts); JSON: `data/overview`, `data/jobs`, `data/jobs/<id>`, `data/poison`, `data/audit`; changes
(POST, CSRF token): `action/<replay|park|unpark|delete|purge|validate|replay-edited|op-start|op-cancel|
op-resume>`; bulk operations: `ops/<id>` (page) and `data/ops/<id>` (progress, per-item results).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, urlsplit

import azure.functions as func

from shared.core import jsontext
from shared.core.envelope import ID_RE
from shared.core.errors import SettingsError, StorageThrottled
from shared.interfaces import api
from shared.interfaces.console import actions, by_queue, pages, queries, queue_access, queue_html
from shared.interfaces.console.assets import CSP
from shared.interfaces.console.security import (
    CSRF_TTL_S,
    Denied,
    Principal,
    authorize,
    check_csrf,
    check_origin,
    cookie_token,
    csrf_secret,
    issue_token,
    keyed_refusal,
    public_origins,
    set_cookie,
    token_refusal,
)
from shared.observability import overview_counters
from shared.poison import bulk
from shared.queues import UnknownQueue
from shared.runtime.wiring import Runtime, get_runtime
from shared.storage.failures import StorageError, failure_name

log = logging.getLogger("jobs.console")
SAFE_HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": CSP,
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


@dataclasses.dataclass
class Call:
    req: func.HttpRequest
    path: str
    base: str
    principal: Principal
    headers: dict[str, str]
    env: Mapping[str, str]


def base_path(url: str) -> str:
    """The console's root path as the browser sees it (`/api/console`)."""
    path = urlsplit(url).path
    index = path.lower().find("/console")
    return quote(path[: index + len("/console")], safe="/") if index >= 0 else "/api/console"


def _json(status: int, body: Any) -> func.HttpResponse:
    return func.HttpResponse(
        json.dumps(body, default=str),
        status_code=status,
        mimetype="application/json",
    )


def secured(response: func.HttpResponse) -> func.HttpResponse:
    """`response` with the console's security headers (each replaces any the route set)."""
    for name, value in SAFE_HEADERS.items():
        response.headers[name] = value
    return response


def handle(
    req: func.HttpRequest, env: Mapping[str, str] | None = None, *, keyed: bool = False
) -> func.HttpResponse:
    """Every console answer, whichever route made it, leaves through here with `SAFE_HEADERS`.

    `keyed`: the admin-key route (`/api/console-api/...`, AuthLevel.ADMIN: the Functions host has
    checked the key, sent in the `x-functions-key` header). It serves the JSON routes only, to scripts."""
    return secured(_handle(req, os.environ if env is None else env, keyed))


def _handle(req: func.HttpRequest, env: Mapping[str, str], keyed: bool) -> func.HttpResponse:
    headers = {k.lower(): v for k, v in req.headers.items()}
    path = str(req.route_params.get("path") or "").strip("/")
    if keyed:
        refusal = keyed_refusal(headers, env)
        if refusal is not None:
            return _json(403, {"error": refusal})
        if not path.startswith(("data/", "action/")):
            return _json(
                404, {"error": "the admin-key route serves data/... and action/... only; pages need sign-in"}
            )
        principal = Principal(name="admin key", how="key")
    else:
        try:
            principal = authorize(headers, env)
        except Denied as denied:
            if denied.status == 401 and req.method == "GET" and not path.startswith(("data/", "fragment/")):
                back = quote(urlsplit(req.url).path, safe="/")  # a page: off to sign in, then back here
                login = f"/.auth/login/aad?post_login_redirect_uri={back}"
                return func.HttpResponse(status_code=302, headers={"Location": login})
            return _json(denied.status, {"error": str(denied)})
    call = Call(req, path, base_path(req.url), principal, headers, env)
    try:
        if req.method == "POST":
            return _post(call, keyed)
        if req.method != "GET":
            return _json(405, {"error": f"{req.method} is not supported; pages are GETs, changes POSTs"})
        return _get(call)
    except SettingsError as exc:
        return _json(503, {"error": str(exc)})
    except (StorageError, StorageThrottled) as exc:
        log.exception("console: storage error on %s", path)
        return _json(503, {"error": f"storage unavailable ({failure_name(exc)}); try again later"})


# -- pages and data ---------------------------------------------------------------------------


def _html(call: Call, title: str, body: str, status: int = 200) -> func.HttpResponse:
    secret, now, subject = csrf_secret(call.env), time.time(), call.principal.subject
    token = cookie_token(call.headers)
    headers = {}
    if token is None or token_refusal(token, subject, secret, now, ttl_s=CSRF_TTL_S / 2) is not None:
        token = issue_token(subject, secret, now)  # a page's token stays good for at least half the TTL
        headers["Set-Cookie"] = set_cookie(token, urlsplit(call.req.url).scheme == "https")
    who = f"{call.principal.name} ({call.principal.how})"
    return func.HttpResponse(
        pages.layout(title, body, call.base, token, who),
        status_code=status,
        mimetype="text/html",
        headers=headers,
    )


def _int(value: str | None, default: int) -> int:
    try:
        return int(value or default)
    except ValueError:
        return default


def _queue(rt: Runtime, params: Mapping[str, str]) -> str:
    """The declared queue a page or data route names (`?queue=`; "" for none: every queue's);
    UnknownQueue when it names one that is not declared."""
    queue = params.get("queue", "")
    return rt.for_queue(queue).queue.name if queue else ""


def _get(call: Call) -> func.HttpResponse:
    parts = call.path.split("/") if call.path else []
    try:
        return _get_page(call, parts)
    except (UnknownQueue, Denied) as exc:
        status = exc.status if isinstance(exc, Denied) else 404
        if parts and parts[0] in ("data", "fragment"):
            return _json(status, {"error": str(exc)})
        return _html(
            call, "Refused" if status == 403 else "Unknown queue", pages.message_page(str(exc)), status
        )


def _get_page(call: Call, parts: list[str]) -> func.HttpResponse:
    """A page or data route; UnknownQueue or Denied (a queue not the operator's) refuse it."""
    params = call.req.params
    who = call.principal
    if len(parts) == 3 and parts[0] == "jobs" and parts[2] == "result" and ID_RE.match(parts[1]):
        asked = params.get("queue", "")  # the API's route checks it (400 when not declared)
        if who.queues is not None:
            queue_access.check(who, asked or get_runtime().settings.queue_set.default.name)
        return api.get_result(
            func.HttpRequest(
                "GET",
                call.req.url,
                headers={},
                params={"queue": asked} if asked else {},
                route_params={"id": parts[1]},
                body=b"",
            )
        )
    rt = get_runtime()
    queue = queue_access.queue_for(rt, who, _queue(rt, params))
    lane, names = rt.for_queue(queue or None), rt.settings.queue_set.names
    if who.queues is not None:
        names = tuple(n for n in names if n in who.queues)
    if not parts:
        figures = queries.overview(rt, queue_access.shown(rt, who, queue))
        body = pages.overview_page(figures, overview_counters.LATENCY_BOUNDS_S, call.base)
        links = queue_html.queue_links(call.base, "", names, queue, who.queues is None)
        return _html(call, "Overview", links + body)
    if parts == ["fragment", "overview"]:
        figures = queries.overview(rt, queue_access.shown(rt, who, queue))
        body = pages.overview_fragment(figures, overview_counters.LATENCY_BOUNDS_S, call.base)
        return func.HttpResponse(body, status_code=200, mimetype="text/html")
    if parts[0] == "data":
        return _data(rt, parts[1:], params, queue, who)
    if parts[0] == "jobs" and len(parts) == 1:
        status, kind, id_part = params.get("status", ""), params.get("kind", ""), params.get("id", "").strip()
        if id_part and ID_RE.match(id_part):  # found by id: 1 read (a queue's, or each shown queue's)
            for each in (lane,) if queue else tuple(rt.for_queue(n) for n in names):
                if each.ledger.get(id_part) is not None:
                    where = by_queue.job_href(call.base, each.job_key(id_part))
                    return func.HttpResponse(status_code=303, headers={"Location": where})
        since, until, problems = queries.time_range(params.get("from", ""), params.get("to", ""))
        page = queries.jobs_page(
            rt,
            status,
            kind,
            id_part,
            _int(params.get("page"), 1),
            token=params.get("token", ""),
            reason_code=params.get("reason_code", ""),
            since=since,
            until=until,
            queue=queue or None,
        )
        return _html(
            call,
            "Jobs",
            pages.jobs_page(
                page,
                call.base,
                status,
                kind,
                id_part,
                params.get("reason_code", ""),
                params.get("from", ""),
                params.get("to", ""),
                problems,
                queue,
                names,
                who.queues is None,
            ),
        )
    if parts[0] == "jobs" and len(parts) == 2 and ID_RE.match(parts[1]):
        job_id = parts[1]
        view = queries.job_view(lane, job_id)
        shown = lane.job_key(job_id)
        if view is None:
            return _html(call, f"Job {shown}", pages.message_page(f"job {shown} is unknown"), 404)
        page_of = pages.job_page(view, call.base, job_id, "" if lane.queue.default else lane.queue.name)
        return _html(call, f"Job {shown}", page_of)
    if parts == ["poison"]:
        listed = queries.poison_view_of(rt, params, queue)
        return _html(call, "Poison", pages.poison_page(listed, call.base, names, who.queues is None))
    if parts == ["audit"]:
        queue_access.check(who, "")  # the audit spans every queue
        action = params.get("action", "")[:64]
        rows, next_key = rt.audit.page(params.get("after", ""), queries.PAGE_SIZE, action)
        return _html(call, "Audit", pages.audit_page(rows, call.base, next_key, action))
    if len(parts) == 2 and parts[0] == "ops":
        op = bulk.read(rt, parts[1]) if ID_RE.match(parts[1]) else None
        if op is None:
            return _html(call, "Operation", pages.message_page(f"no operation {parts[1]}"), 404)
        queue_access.check_op(who, op)
        return _html(call, f"Operation {parts[1]}", pages.op_page(op))
    if parts == ["poison", "entry"]:
        entry = queries.entry_view(rt, params.get("name", ""))
        if entry is None:
            return _html(call, "Entry", pages.message_page("no such archive entry"), 404)
        queue_access.check(who, entry.entry.queue or rt.settings.queue_set.default.name)
        return _html(call, f"Entry {entry.name}", pages.entry_page(entry))
    return _html(call, "Not found", pages.message_page(f"no console page at {call.path}"), 404)


def _data(
    rt: Runtime, parts: list[str], params: Mapping[str, str], queue: str, who: Principal
) -> func.HttpResponse:
    if parts == ["overview"]:
        return _json(200, queries.overview(rt, queue_access.shown(rt, who, queue)))
    if parts == ["jobs"]:
        since, until, problems = queries.time_range(params.get("from", ""), params.get("to", ""))
        if problems:
            return _json(400, {"error": "; ".join(problems), "problems": problems})
        page = queries.jobs_page(
            rt,
            params.get("status", ""),
            params.get("kind", ""),
            params.get("id", ""),
            _int(params.get("page"), 1),
            token=params.get("token", ""),
            reason_code=params.get("reason_code", ""),
            since=since,
            until=until,
            queue=queue or None,
        )
        return _json(200, dataclasses.asdict(page))
    if len(parts) == 2 and parts[0] == "jobs" and ID_RE.match(parts[1]):
        view = queries.job_view(rt.for_queue(queue or None), parts[1])
        if view is None:
            return _json(404, {"error": f"job {parts[1]} is unknown"})
        return _json(200, {**dataclasses.asdict(view), "queue": rt.for_queue(queue or None).queue.name})
    if parts == ["poison"]:
        listed = queries.poison_view_of(rt, params, queue)
        return _json(200, dataclasses.asdict(listed))
    if parts in (["poison.csv"], ["poison.json"]):  # export: up to 1,000 entries of a state a request
        state = params.get("state", "poisoned")
        rows = queries.export_entries(
            rt, state, params.get("after", ""), _int(params.get("limit"), 1000), queue
        )
        if parts == ["poison.json"]:
            return _json(200, rows)
        return func.HttpResponse(
            queries.as_csv(rows),
            status_code=200,
            mimetype="text/csv",
            headers={"Content-Disposition": f"attachment; filename=poison-{quote(state)}.csv"},
        )
    if parts == ["audit"]:
        queue_access.check(who, "")  # the audit spans every queue
        found, next_key = rt.audit.page(
            params.get("after", ""), queries.PAGE_SIZE, params.get("action", "")[:64]
        )
        return _json(200, {"rows": [dataclasses.asdict(r) for r in found], "next": next_key})
    if len(parts) == 2 and parts[0] == "ops":
        op = bulk.read(rt, parts[1]) if ID_RE.match(parts[1]) else None
        if op is None:
            return _json(404, {"error": f"no operation {parts[1]}"})
        queue_access.check_op(who, op)
        return _json(200, op)
    if parts == ["entry"]:
        entry = queries.entry_view(rt, params.get("name", ""))
        if entry is None:
            return _json(404, {"error": "no such archive entry"})
        queue_access.check(who, entry.entry.queue or rt.settings.queue_set.default.name)
        return _json(200, entry.as_dict())
    return _json(404, {"error": "unknown data route"})


# -- changes ----------------------------------------------------------------------------------


def _post(call: Call, keyed: bool = False) -> func.HttpResponse:
    # A key in a header is itself the CSRF defence (no other site can make a browser send it).
    origins = public_origins(call.env)
    if keyed:
        refusal = check_origin(call.headers, call.req.url, origins)
    else:
        refusal = check_csrf(
            "POST",
            call.headers,
            call.req.url,
            subject=call.principal.subject,
            secret=csrf_secret(call.env),
            now=time.time(),
            origins=origins,
        )
    if refusal is not None:
        log.warning("console: refused a change to %s: %s", call.path, refusal)
        return _json(403, {"error": refusal})
    parts = call.path.split("/")
    if len(parts) != 2 or parts[0] != "action" or parts[1] not in ACTIONS:
        return _json(404, {"error": f"unknown action {call.path}; known: {', '.join(sorted(ACTIONS))}"})
    try:
        body = jsontext.loads(call.req.get_body() or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _json(400, {"error": "request body is not JSON"})
    if not isinstance(body, dict):
        return _json(400, {"error": "request body must be a JSON object"})
    rt = get_runtime()
    try:
        queue_access.check_action(rt, call.principal, parts[1], body)
    except Denied as denied:
        return _json(denied.status, {"error": str(denied)})
    try:
        return _json(200, ACTIONS[parts[1]](rt, body, call.principal.name))
    except actions.ActionRefused as refused:
        return _json(refused.status, {"error": str(refused), "problems": refused.problems})


def _rate(body: Mapping[str, Any]) -> float:
    rate = body.get("rate", 10)
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1000:
        raise actions.ActionRefused(
            "rate: jobs per second in (0, 1000]", ["rate: jobs per second in (0, 1000]"]
        )
    return float(rate)


def _days(body: Mapping[str, Any]) -> float:
    days = body.get("older_than_days")
    if isinstance(days, bool) or not isinstance(days, int | float) or days < 0:
        raise actions.ActionRefused("older_than_days: a number >= 0", ["older_than_days: a number >= 0"])
    return float(days)


def _lane(rt: Runtime, key: str) -> tuple[Runtime, str]:
    """The runtime of a job as the pages name it (`<queue>/<id>`, or an id of the default queue)
    and its id; ActionRefused when the queue is not declared or the id is not one."""
    queue, job_id = by_queue.split_key(key)
    if not ID_RE.match(job_id):
        raise actions.ActionRefused("job_id: a job id", ["job_id: a job id, or <queue>/<id>"])
    try:
        return rt.for_queue(queue or None), job_id
    except UnknownQueue as exc:
        raise actions.ActionRefused(f"job_id: {exc}", [f"job_id: {exc}"]) from None


def _job_and_text(body: Mapping[str, Any]) -> tuple[str, str]:
    job_id, text = body.get("job_id"), body.get("envelope")
    problems = []
    if not isinstance(job_id, str) or not ID_RE.match(by_queue.split_key(job_id)[1]):
        problems.append("job_id: a job id")
    if not isinstance(text, str):
        problems.append("envelope: the edited envelope as JSON text")
    if problems:
        raise actions.ActionRefused("; ".join(problems), problems)
    assert isinstance(job_id, str) and isinstance(text, str)
    return job_id, text


def _entry_and_text(body: Mapping[str, Any]) -> tuple[str, str]:
    name, text = body.get("name"), body.get("envelope")
    if not isinstance(name, str) or not isinstance(text, str):
        problems = ["name: an archive entry name", "envelope: the fixed envelope as JSON text"]
        raise actions.ActionRefused("; ".join(problems), problems)
    return name, text


def _job_id(body: Mapping[str, Any]) -> str:
    job_id = body.get("job_id")
    if not isinstance(job_id, str) or not ID_RE.match(by_queue.split_key(job_id)[1]):
        raise actions.ActionRefused("job_id: a job id", ["job_id: a job id"])
    return job_id


def _validate(rt: Runtime, body: Mapping[str, Any], by: str) -> dict[str, Any]:
    key, text = _job_and_text(body)
    lane, job_id = _lane(rt, key)
    checked = actions.check_edit(lane, job_id, text)
    return {"valid": not checked.problems, "problems": checked.problems}


def _replay_edited(rt: Runtime, body: Mapping[str, Any], by: str) -> dict[str, Any]:
    key, text = _job_and_text(body)
    lane, job_id = _lane(rt, key)
    return actions.replay_edited(lane, job_id, text, by)


def _cancel(rt: Runtime, body: Mapping[str, Any], by: str) -> dict[str, Any]:
    lane, job_id = _lane(rt, _job_id(body))
    return actions.cancel_job(lane, job_id, by, str(body.get("reason") or ""))


ACTIONS: dict[str, Callable[[Runtime, Mapping[str, Any], str], dict[str, Any]]] = {
    "replay": lambda rt, b, by: actions.replay_batch(
        rt,
        actions.names_of(b.get("ids"), "ids"),
        _rate(b),
        by,
        actions.names_of(b["names"]) if b.get("names") is not None else None,
    ),
    "park": lambda rt, b, by: actions.park(rt, actions.names_of(b.get("names")), by),
    "unpark": lambda rt, b, by: actions.unpark(rt, actions.names_of(b.get("names")), by),
    "delete": lambda rt, b, by: actions.delete(rt, actions.names_of(b.get("names")), by),
    "purge": lambda rt, b, by: actions.purge(rt, _days(b), by, dry_run=bool(b.get("dry_run"))),
    "op-start": actions.start_op,
    "cancel": _cancel,
    "op-cancel": lambda rt, b, by: actions.op_change(rt, b, by, "cancel"),
    "op-resume": lambda rt, b, by: actions.op_change(rt, b, by, "resume"),
    "validate": _validate,
    "replay-edited": _replay_edited,
    "replay-fixed": lambda rt, b, by: actions.replay_fixed(rt, *_entry_and_text(b), by),
}
