"""HTML of the console by queue (issue 46), pure: the overview's table of queues and the
queue picker of the jobs and poison pages (shown with several declared queues only)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import urlencode


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _shown(value: object) -> str:
    return "-" if value is None else str(value)


def queues_table(base: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """Each queue's backlog, oldest message, running against its limit, poisoned ("" for none)."""
    if not rows:
        return ""
    body = "".join(
        f"<tr data-queue='{escape(str(r['name']))}'>"
        f"<td><a href='{base}/jobs?{escape(urlencode({'queue': r['name']}))}'>{escape(str(r['name']))}</a>"
        + (" <span class=muted>(default)</span>" if r.get("default") else "")
        + f"</td><td data-col=depth>{_shown(r.get('depth'))}</td>"
        f"<td data-col=oldest>{_age(float(r.get('oldest_age_s') or 0.0)) if r.get('depth') else '-'}</td>"
        f"<td data-col=running>{_running(r)}</td>"
        f"<td data-col=poisoned><a href='{base}/poison?{escape(urlencode({'queue': r['name']}))}'>"
        f"{int(r.get('poisoned') or 0)}</a></td>"
        f"<td data-col=poison-queue>{_shown(r.get('poison_depth'))}</td>"
        f"<td class=muted>{escape(str(r.get('account') or 'app'))}</td></tr>"
        for r in rows
    )
    return (
        "<h2>Queues</h2><table id=queues><tr><th>queue</th><th>backlog</th><th>oldest message</th>"
        "<th>running / limit</th><th>poisoned (listed)</th><th>on its poison queue</th><th>account</th></tr>"
        f"{body}</table>"
    )


def _running(row: Mapping[str, Any]) -> str:
    limit = row.get("max_concurrent")
    if limit is None:
        return "<span class=muted>no limit</span>"
    waiting = int(row.get("waiting") or 0)
    return f"{int(row.get('running') or 0)} / {int(limit)}" + (f" ({waiting} waiting)" if waiting else "")


def queue_links(base: str, page: str, names: Sequence[str], selected: str, allow_all: bool = True) -> str:
    """Links to the page of each queue (and of all of them, `allow_all`): "" with one queue to show."""
    if len(names) < 2 and (allow_all or not names):
        return ""
    choices = ([("", "all queues")] if allow_all else []) + [(n, n) for n in names]
    links = " · ".join(
        f"<b data-queue-shown='{escape(n)}'>{escape(label)}</b>"
        if n == selected
        else f"<a href='{base}/{page}"
        + (f"?{escape(urlencode({'queue': n}))}" if n else "")
        + f"'>{escape(label)}</a>"
        for n, label in choices
    )
    return f"<p id=queue-picker>queue: {links}</p>"
