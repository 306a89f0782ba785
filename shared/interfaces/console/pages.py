"""HTML of the console's pages, server-rendered; charts are inline SVG (pure functions, no I/O)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from shared.core.archive_layout import UNPARSED_PREFIX
from shared.indexes.entry_rows import EntryRow
from shared.interfaces.console.assets import CSS, JS
from shared.interfaces.console.by_queue import job_href
from shared.interfaces.console.charts import svg_bars, svg_lines
from shared.interfaces.console.queries import EntryView, JobView, Page, PoisonView
from shared.interfaces.console.queue_html import queue_links, queues_table
from shared.ledger import COMPLETED, POISONED, STATUSES
from shared.ledger.calls import downstream_of


def layout(title: str, body: str, base: str, csrf: str, who: str) -> str:
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<meta name=csrf content='{escape(csrf)}'><meta name=base content='{escape(base)}'>"
        f"<title>{escape(title)} · jobs console</title><style>{CSS}</style></head><body>"
        f"<nav><a href='{base}'>Overview</a><a href='{base}/jobs'>Jobs</a><a href='{base}/poison'>Poison</a><a href='{base}/audit'>Audit</a>"
        f"<span class=who>{escape(who)}</span></nav><main><h1>{escape(title)}</h1>"
        f"<p id=status></p>{body}</main><script>{JS}</script></body></html>"
    )


def fmt_s(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "> 1 h"
    return f"≤ {value:g} s"


def overview_fragment(figures: Mapping[str, Any], bounds: Sequence[float], base: str = "") -> str:
    depth = figures.get("depth") or {}
    cards = [
        ("jobs queue", depth.get("jobs")),
        ("poison queue", depth.get("poison")),
        ("parked queue", depth.get("parked")),
        ("in flight", figures.get("in_flight")),
        ("latency p50 (1 h)", fmt_s(figures.get("latency_p50_s"))),
        ("latency p95 (1 h)", fmt_s(figures.get("latency_p95_s"))),
    ]
    card_html = "".join(
        f"<div class=card data-card='{escape(k)}'>{escape(k)}<b>{escape('-' if v is None else str(v))}</b></div>"
        for k, v in cards
    )
    labels = [*(f"≤{b:g}s" for b in bounds), "more"]
    return (
        f"<div class=cards>{card_html}</div>"
        + queues_table(base, figures.get("queues") or [])
        + "<div class=charts>"
        + svg_lines("jobs per minute, last hour", figures.get("minutes", []), figures.get("series", {}))
        + svg_bars("enqueue-to-completion latency, last hour", labels, figures.get("latency_hist", []))
        + "</div>"
    )


def overview_page(figures: Mapping[str, Any], bounds: Sequence[float], base: str = "") -> str:
    return (
        f"<div id=overview>{overview_fragment(figures, bounds, base)}</div>"
        "<p class=muted>Refreshes every 5 s. Counters are kept in memory by each instance and written "
        "once a minute; queue depths are approximate.</p>"
    )


def jobs_page(
    page: Page,
    base: str,
    status: str,
    kind: str,
    id_part: str,
    reason_code: str = "",
    since: str = "",
    until: str = "",
    problems: Sequence[str] = (),
    queue: str = "",
    queues: Sequence[str] = (),
    every: bool = True,
) -> str:
    """`queues`: the declared queues the operator may see; `every`: they may see all at once."""
    options = "".join(
        f"<option{' selected' if s == status else ''}>{escape(s)}</option>" for s in ("", *STATUSES)
    )
    form = (
        f"<form method=get action='{base}/jobs'>id <input name=id value='{escape(id_part)}'> "
        f"status <select name=status>{options}</select> kind <input name=kind value='{escape(kind)}' size=10> "
        f"reason code <input name=reason_code value='{escape(reason_code)}' size=12> "
        f"created from <input name=from id=from value='{escape(since)}' size=20 placeholder='2026-11-25T10:00'> "
        f"to <input name=to id=to value='{escape(until)}' size=20> (UTC) "
        + (f"<input type=hidden name=queue value='{escape(queue)}'>" if queue else "")
        + "<button>Find</button></form>"
        + "".join(f"<p class=bad data-problem>{escape(p)}</p>" for p in problems)
    )
    several = len(queues) > 1
    rows = "".join(
        f"<tr><td><a href='{escape(job_href(base, (r.queue + '/' if r.queue else '') + r.id))}'>{escape(r.id)}</a></td>"
        f"<td>{escape(r.status)}</td>"
        f"<td>{escape(r.kind)}</td><td>{escape(r.created_at)}</td><td>{escape(r.updated_at)}</td>"
        + (f"<td data-col=queue>{escape(r.queue or queues[0])}</td>" if several else "")
        + "</tr>"
        for r in page.rows
    )
    query = {"status": status, "kind": kind, "id": id_part, "reason_code": reason_code}
    if queue:
        query["queue"] = queue
    query.update({k: v for k, v in (("from", since), ("to", until)) if v})

    def link(n: int, text: str, token: str = "") -> str:
        extra = {"token": token} if token else {}
        return f"<a href='{base}/jobs?{escape(urlencode({**query, 'page': n, **extra}))}'>{text}</a>"

    pager = (
        (link(1, "newest") + " · " if page.page > 1 else "")
        + f"page {page.page}"
        + (" · " + link(page.page + 1, "older →", page.next_token) if page.next_token else "")
        if page.pages < 0
        else (
            (link(page.page - 1, "← newer") + " " if page.page > 1 else "")
            + f"page {page.page} of {page.pages} ({page.total} jobs)"
            + (" " + link(page.page + 1, "older →") if page.page < page.pages else "")
        )
    )
    return (
        queue_links(base, "jobs", queues, queue, every)
        + f"{form}<p>{pager}</p><table id=jobs><tr><th>id</th>"
        + "<th>status</th><th>kind</th><th>created</th><th>updated</th>"
        + ("<th>queue</th>" if several else "")
        + f"</tr>{rows}</table>"
    )


def _facts(facts: Mapping[str, Any]) -> str:
    return ", ".join(
        f"{escape(k)}={escape(json.dumps(v) if not isinstance(v, str) else v)}" for k, v in facts.items()
    )


def _data_output(summary: object) -> str:
    """Where a data output's rows are (an aggregate job's `output.format` parquet or csv), if any."""
    output = summary.get("output") if isinstance(summary, dict) else None
    if not isinstance(output, dict) or not output.get("result_ref"):
        return ""
    return (
        f"<p id=result-data>the rows, as {escape(str(output.get('format', '')))}: "
        f"<code>{escape(str(output['result_ref']))}</code> ({escape(str(output.get('bytes', '?')))} bytes; "
        "read it from storage)</p>"
    )


def job_page(view: JobView, base: str, job_id: str, queue: str = "") -> str:
    """`queue`: the job's declared queue when it is not the default (its actions name the job
    `<queue>/<id>`)."""
    record = view.record
    key = f"{queue}/{job_id}" if queue else job_id
    on_queue = f"?{urlencode({'queue': queue})}" if queue else ""
    status = str(record.get("status", ""))
    items = "".join(
        f"<li data-event='{escape(t['event'])}'><span class=muted>{escape(t['at'])}</span> "
        f"<span class=ev>{escape(t['event'])}</span> <span class=facts>{_facts(t['facts'])}</span></li>"
        for t in view.timeline
    )
    result = ""
    if status == COMPLETED:
        result = (
            f"<h2>Result</h2><pre id=summary>{escape(json.dumps(record.get('summary', {}), indent=2))}</pre>"
            f"<p><a id=result-link href='{base}/jobs/{quote(job_id)}/result{escape(on_queue)}'>the result document</a></p>"
            + _data_output(record.get("summary"))
        )
    editor = ""
    if status == POISONED and view.envelope_text is not None:
        editor = (
            "<h2>Edit before replay</h2><p class=muted>The original stays in the poison archive; the change "
            "is recorded in the job's history. The id must stay the same.</p>"
            f"<textarea id=envelope data-job='{escape(key)}' spellcheck=false>{escape(view.envelope_text)}</textarea>"
            + (
                "<p class=muted id=expiry>expires_at "
                f"{escape(str(view.envelope.get('expires_at')))}: a replay after it is poisoned again "
                "<button id=extend-expiry data-do=extend-expiry>Extend expires_at by 24 h</button></p>"
                if view.envelope is not None and view.envelope.get("expires_at")
                else ""
            )
            + "<button id=validate data-do=edit data-op=validate>Validate</button>"
            "<button id=replay-edited data-do=edit data-op=replay-edited>Replay edited</button>"
            "<ul id=problems></ul>"
        )
    reason = record.get("reason")
    last = record.get("last_reason")
    return (
        f"<p>status <b id=job-status>{escape(status)}</b> · kind {escape(str(record.get('kind', '')))}"
        + (f" · queue <b id=job-queue>{escape(queue)}</b>" if queue else "")
        + (f" · reason <span id=reason class=bad>{escape(str(reason))}</span>" if reason else "")
        + (
            f" · last poisoned for <span class=muted>{escape(str(last))}</span>"
            if last and not reason
            else ""
        )
        + "</p>"
        + (f"<p id=waiting class=muted>{escape(str(view.waiting['reason']))}</p>" if view.waiting else "")
        + f"{_live(status, key)}<h2>Timeline</h2><ol class=timeline id=timeline>{items}</ol>"
        f"{_downstream(record)}{result}{editor}"
        f"<h2>Payload</h2><p class=muted>{escape(view.payload_note)}</p>"
        f"<pre id=payload>{escape(json.dumps(view.payload, indent=2))}</pre>"
        f"<h2>Record</h2><pre id=record>{escape(json.dumps(record, indent=2))}</pre>"
    )


def _downstream(record: Mapping[str, Any]) -> str:
    """Each attempt's downstream call: its status, or why none came (timeout, connection error)."""
    notes = downstream_of(record)
    if not notes:
        return ""
    return (
        "<h2>Downstream calls</h2><table id=downstream><tr><th>attempt</th><th>at</th>"
        f"<th>status</th><th>ms</th></tr>{''.join(_call_row(n) for n in notes)}</table>"
    )


def _call_row(note: Mapping[str, Any]) -> str:
    status = note.get("status")
    shown = str(status) if isinstance(status, int) else str(note.get("error", "?"))
    good = isinstance(status, int) and status < 400
    attempt = str(note.get("attempt", ""))
    if note.get("replay"):
        attempt += f" (replay {note['replay']})"
    return (
        f"<tr data-status='{escape(shown)}'><td>{escape(attempt)}</td>"
        f"<td class=muted>{escape(str(note.get('at', '')))}</td>"
        f"<td class={'ok' if good else 'bad'}>{escape(shown)}</td><td>{escape(str(note.get('ms', '')))}</td></tr>"
    )


LIVE_STATUSES = ("queued", "in_progress", "retry_scheduled", "offloaded")


def _live(status: str, job_id: str) -> str:
    """While the job can still change: the page reloads itself, and it can be cancelled."""
    if status not in LIVE_STATUSES:
        return ""
    return (
        f"<p id=live data-running=1 class=muted>refreshing every 3 s while the job is {escape(status)} "
        f"<button id=cancel-job data-do=cancel-job data-job='{escape(job_id)}' "
        "data-confirm='Cancel this job? It is poisoned at its next delivery.'>Cancel job</button></p>"
    )


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 172800 else f"{seconds / 86400:.1f} d"


def _entries_table(table_id: str, entries: list[EntryRow], base: str, now: datetime) -> str:
    rows = "".join(
        f"<tr><td><input type=checkbox class=pick data-job='{escape(e.job_id or '')}' data-name='{escape(e.name)}'></td>"
        + (
            f"<td><a href='{escape(job_href(base, e.job_id))}'>{escape(e.job_id)}</a></td>"
            if e.job_id and e.name.startswith("jobs/")
            else f"<td><a class=entry href='{base}/poison/entry?{escape(urlencode({'name': e.name}))}'>"
            f"{escape(e.job_id or 'unparsed')} (body)</a></td>"
        )
        + f"<td class=reason>{escape(e.reason)}</td><td>{_age(e.age_s(now))}</td><td>{e.attempts}</td></tr>"
        for e in entries
    )
    return (
        f"<table id={table_id}><tr><th><input type=checkbox data-do=pick-all data-table={table_id}></th>"
        f"<th>job</th><th>reason</th><th>age</th><th>attempts</th></tr>{rows}</table>"
    )


def poison_page(view: PoisonView, base: str, queues: Sequence[str] = (), every: bool = True) -> str:
    queue_rows = "".join(
        f"<tr><td>{escape(str(m.get('job_id') or '-'))}</td><td>{escape(str(m.get('queue_message_id')))}</td>"
        f"<td>{escape(str(m.get('dequeue_count')))}</td><td>{escape(str(m.get('inserted_on')))}</td></tr>"
        for m in view.on_queue
    )
    where = {k: v for k, v in (("code", view.reason_code), ("q", view.text), ("queue", view.queue)) if v}
    more = ""
    if view.next_archived:
        more += f" <a id=more-archived href='{base}/poison?{escape(urlencode({**where, 'after': view.next_archived}))}'>next page →</a>"
    if view.next_parked:
        parked_query = {"after_parked": view.next_parked, **({"queue": view.queue} if view.queue else {})}
        more += f" <a id=more-parked href='{base}/poison?{escape(urlencode(parked_query))}'>more parked →</a>"
    shown = f"{len(view.archived)} on this page" if view.paged else str(len(view.archived))
    filtered = bool(where)
    attrs = (
        (f" data-code='{escape(view.reason_code)}'" if view.reason_code else "")
        + (f" data-text='{escape(view.text)}'" if view.text else "")
        + (f" data-queue='{escape(view.queue)}'" if view.queue else "")
    )
    what = "all listed entries matching the search" if filtered else "all listed entries"
    bulk_row = (
        f"<p>{what}, in the app at the rate above: "
        f"<button id=replay-all-dry data-do=op data-op=replay data-state=poisoned data-dry=1{attrs}>Count (dry run)</button>"
        f"<button id=replay-all data-do=op data-op=replay data-state=poisoned{attrs} "
        f"data-confirm='Replay {escape(what)}?'>Replay {'all matching' if filtered else 'all listed'}</button></p>"
        if view.paged
        else ""
    )
    heading = "Archived" + (
        f" matching {escape(' and '.join(f'{k}={v!r}' for k, v in where.items()))}" if filtered else ""
    )
    return (
        queue_links(base, "poison", queues, view.queue, every)
        + _groups_and_search(view, base)
        + f"<h2>{heading} ({shown})</h2>{more and '<p>' + more + '</p>'}"
        "<p>rate <input id=rate value=10 size=4> jobs/s <button id=replay data-do=replay-selected>Replay selected</button>"
        "<progress id=progress value=0 max=1></progress> <span id=progress-text></span></p>"
        "<p><button id=park data-do=entries data-op=park data-table=archived>Park selected</button>"
        "<button id=delete data-do=entries data-op=delete data-table=archived "
        "data-confirm='Delete {n} archive entries for good?'>Delete selected</button> "
        "purge older than <input id=days value=30 size=3> days <button id=purge data-do=purge>Purge</button></p>"
        + bulk_row
        + (
            f"<p>export listed entries: <a id=export-csv href='{base}/data/poison.csv'>CSV</a> · "
            f"<a id=export-json href='{base}/data/poison.json'>JSON</a> (1,000 a file; `after` pages on)</p>"
            if view.paged
            else ""
        )
        + _entries_table("archived", view.archived, base, view.now)
        + f"<h2>Parked ({len(view.parked)})</h2>"
        "<p><button id=unpark data-do=entries data-op=unpark data-table=parked>Unpark selected</button></p>"
        + _entries_table("parked", view.parked, base, view.now)
        + f"<h2>Still on the poison queue ({len(view.on_queue)}, first 32)</h2>"
        "<table id=on-queue><tr><th>job</th><th>message id</th><th>dequeues</th><th>inserted</th></tr>"
        f"{queue_rows}</table>"
    )


def _groups_and_search(view: PoisonView, base: str) -> str:
    """Listed entries by reason code with counts (each group opens, counts or replays in the app),
    and the search by error text (within a reason code or all)."""
    if not view.paged:
        return ""
    mine = {"queue": view.queue} if view.queue else {}
    in_queue = f" data-queue='{escape(view.queue)}'" if view.queue else ""
    rows = "".join(
        f"<tr data-group='{escape(code)}'><td><a href='{base}/poison?{escape(urlencode({'code': code, **mine}))}'>"
        f"{escape(code)}</a></td><td data-count='{escape(code)}'>{n}</td><td>"
        f"<button data-do=op data-op=replay data-state=poisoned data-code='{escape(code)}'{in_queue} data-dry=1>Count (dry run)</button>"
        f"<button data-do=op data-op=replay data-state=poisoned data-code='{escape(code)}'{in_queue} "
        f"data-confirm='Replay the {n} listed entries of {escape(code)} at the rate below?'>Replay group</button></td></tr>"
        for code, n in view.groups.items()
    )
    codes = "".join(
        f"<option{' selected' if c == view.reason_code else ''}>{escape(c)}</option>"
        for c in dict.fromkeys(["", *view.groups, *([view.reason_code] if view.reason_code else [])])
    )
    return (
        f"<h2>By reason code ({sum(view.groups.values())} listed)</h2><table id=groups><tr><th>reason code</th>"
        f"<th>listed</th><th>in the app, at the rate below</th></tr>{rows}</table>"
        f"<form method=get action='{base}/poison' id=search>error text <input name=q id=q value='{escape(view.text)}' size=30> "
        f"reason code <select name=code id=code>{codes}</select>"
        + (f"<input type=hidden name=queue value='{escape(view.queue)}'>" if view.queue else "")
        + " <button>Search</button>"
        + (f" <a href='{base}/poison'>clear</a>" if view.reason_code or view.text or view.queue else "")
        + "</form>"
    )


def entry_page(view: EntryView) -> str:
    """An archived body as text (or hex when not UTF-8), and an editor to fix and replay it."""
    entry = view.entry
    shown = (
        f"<pre id=body-text>{escape(view.body_text)}</pre>"
        if view.body_text is not None
        else f"<p class=muted>not UTF-8: shown as hex</p><pre id=body-hex>{escape(view.body_hex or '')}</pre>"
    )
    editor = ""
    if entry.listed and view.name.startswith(UNPARSED_PREFIX):
        editor = (
            "<h2>Fix and replay</h2><p class=muted>Submitted as a new job (as the API would); this entry "
            "stays in the archive, marked replayed.</p>"
            f"<textarea id=fixed data-entry='{escape(view.name)}' spellcheck=false>"
            f"{escape(view.body_text or '')}</textarea>"
            "<button id=replay-fixed data-do=fix>Replay fixed</button><ul id=problems></ul>"
        )
    return (
        f"<p>state <b id=entry-state>{escape(entry.state)}</b> · "
        f"{entry.body_bytes} bytes · reason <span id=reason class=bad>"
        f"{escape(entry.reason)}</span></p><h2>Body</h2>{shown}{editor}"
    )


def op_page(op: Mapping[str, Any]) -> str:
    """A bulk operation's progress, counts and failures (the page refreshes itself while it runs)."""
    total = op.get("total")
    counts = "".join(
        f"<tr><td>{escape(str(k))}</td><td data-count='{escape(str(k))}'>{int(v)}</td></tr>"
        for k, v in sorted((op.get("counts") or {}).items())
    )
    failures = "".join(
        f"<tr><td>{escape(str(f.get('name')))}</td><td>{escape(str(f.get('outcome')))}</td>"
        f"<td>{escape(str(f.get('reason')))}</td></tr>"
        for f in op.get("failures") or []
    )
    running = op.get("status") == "running"
    buttons = (
        f"<button id=op-cancel data-do=op-change data-op=cancel data-id='{escape(str(op.get('id')))}'>Cancel</button>"
        f"<button id=op-resume data-do=op-change data-op=resume data-id='{escape(str(op.get('id')))}'>Resume</button>"
        if running
        else ""
    )
    return (
        f"<p id=op data-status='{escape(str(op.get('status')))}' data-running='{int(running)}'>"
        f"{escape(str(op.get('kind')))}{' (dry run)' if op.get('dry_run') else ''} by {escape(str(op.get('by')))} "
        f"· <b id=op-status>{escape(str(op.get('status')))}</b> · <span id=op-done>{int(op.get('done') or 0)}</span>"
        f"{' of ' + str(int(total)) if total is not None else ''} done · step {int(op.get('step') or 0)} "
        f"· updated {escape(str(op.get('updated_at')))}</p>"
        + (
            f"<p id=op-where>over {escape(', '.join(op.get('states') or []))} entries matching "
            f"{escape(', '.join(f'{k}={v!r}' for k, v in (op.get('where') or {}).items()))}</p>"
            if op.get("where")
            else ""
        )
        + f"{buttons}"
        f"<h2>Results</h2><table id=op-counts>{counts}</table>"
        f"<h2>Not done ({len(op.get('failures') or [])})</h2><table id=op-failures>"
        f"<tr><th>entry</th><th>outcome</th><th>reason</th></tr>{failures}</table>"
    )


def _detail(details: Mapping[str, Any]) -> str:
    """An audit row's details: an edit's fields as `field: old → new`, the rest as key=value."""
    parts = []
    for change in details.get("changes") or []:
        if isinstance(change, Mapping):
            parts.append(
                f"<li data-field='{escape(str(change.get('field')))}'><code>{escape(str(change.get('field')))}</code>: "
                f"<del>{escape(str(change.get('old')))}</del> → <ins>{escape(str(change.get('new')))}</ins></li>"
            )
        else:
            parts.append(f"<li><code>{escape(str(change))}</code></li>")
    rest = {k: v for k, v in details.items() if k != "changes" and v not in (None, "", [])}
    return (f"<ul class=changes>{''.join(parts)}</ul>" if parts else "") + _facts(rest)


def audit_page(rows: Sequence[Any], base: str, next_key: str, action: str = "") -> str:
    """Every operator action, newest first (who, what, when, on what; an edit's old and new values)."""

    def target(value: str) -> str:
        if value.startswith("op:"):
            return f"<a href='{base}/ops/{quote(value[3:])}'>{escape(value)}</a>"
        if value.startswith(("jobs/", "unparsed/")):
            return f"<a href='{base}/poison/entry?{escape(urlencode({'name': value}))}'>{escape(value)}</a>"
        return f"<a href='{base}/jobs/{quote(value)}'>{escape(value)}</a>" if value else ""

    body = "".join(
        f"<tr data-action='{escape(r.action)}'><td>{escape(r.at)}</td><td>{escape(r.by)}</td>"
        f"<td>{escape(r.action)}</td><td>{target(r.target)}</td><td>{_detail(r.details)}</td></tr>"
        for r in rows
    )
    query = {"action": action} if action else {}
    more = (
        f"<p><a id=more-audit href='{base}/audit?{escape(urlencode({**query, 'after': next_key}))}'>older →</a></p>"
        if next_key
        else ""
    )
    return (
        f"<form method=get action='{base}/audit'>action <input name=action value='{escape(action)}' size=14> "
        f"<button>Filter</button> <a href='{base}/audit'>newest</a></form>"
        f"<table id=audit><tr><th>when</th><th>who</th><th>what</th><th>on</th><th>details</th></tr>{body}</table>{more}"
    )


def message_page(text: str) -> str:
    return f"<p class=bad>{escape(text)}</p>"
