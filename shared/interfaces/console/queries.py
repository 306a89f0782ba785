"""What the console's pages show, read from storage with a bounded number of requests.

- Overview: 3 queue-properties requests (jobs, poison, parked) and the other instances' counters
  of the last two hours: one table query; the serving process's own counters are in memory. With
  several queues (JOBS_QUEUES), the table of queues: a few requests a queue (by_queue.py).
- A job: its record, then its archive entries and latest edit by the names the record keeps
  (shared/interfaces/console/job_archive.py): no listing.
- Jobs: a page of the jobs index (shared/indexes/jobs.py): one query or a few, whatever the
  ledger's size. Finding a job by id is one read.
- Poison: a page of the entry index (shared/indexes/entries.py) and its counts.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from shared import poison
from shared.core import jsontext
from shared.indexes.entry_rows import EntryRow
from shared.indexes.jobs import IndexRow
from shared.interfaces.console import by_queue, job_archive
from shared.ledger.view import RecordView
from shared.observability import overview_counters
from shared.pipeline.gate import waiting_reason
from shared.poison.archive import LISTED_STATE, read_entry
from shared.poison.entry import ArchiveEntry
from shared.runtime.wiring import Runtime
from shared.storage.failures import NotFound
from shared.storage.limits import BlobTooLarge
from shared.storage.ports import Account

PAGE_SIZE = 50
PAYLOAD_SHOW_BYTES = 256 * 1024


# -- overview ---------------------------------------------------------------------------------


def queue_depth(rt: Runtime, name: str, account: Account | None = None) -> int | None:
    try:
        return (account or rt.account).raw_queue(name).depth()
    except NotFound:
        return None


def overview(rt: Runtime, queues: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Queue depths and the last hour's counters from every instance; with several declared
    queues, each one's row (`queues`: those only, the default queue's depths then the first's)."""
    now = rt.clock()
    own = overview_counters.installed_instance()
    hours = overview_counters.hours_to_read(now)
    docs: list[Mapping[str, Any]] = (
        [overview_counters.RECORDER.document(hour, own) for hour in hours] if own else []
    )
    docs.extend(rt.counters.read(hours, own))
    figures = overview_counters.merge(docs, now)
    first = rt.for_queue(queues[0] if queues else None)
    figures["depth"] = {
        "jobs": queue_depth(rt, first.settings.jobs_queue, first.account_of(first.queue.name)),
        "poison": queue_depth(rt, first.settings.poison_queue, first.account_of(first.queue.name)),
        "parked": queue_depth(rt, first.settings.parked_queue),
    }
    if len(rt.settings.queue_set) > 1:
        figures["queues"] = [dataclasses.asdict(row) for row in by_queue.queue_rows(rt, queues)]
    figures["documents_merged"] = len(docs)
    return figures


# -- jobs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    rows: list[IndexRow]
    page: int
    pages: int
    """-1 when paged by the index (the total is not counted: that would cost the history)."""
    total: int
    next_token: str = ""


def parse_when(text: str, end: bool = False) -> str:
    """An operator's time (`2026-11-25`, `2026-11-25T10:00`, with or without seconds, `Z` or an
    offset; no zone means UTC) as an ISO UTC stamp; a bare date is its first moment, or with `end`
    its last. "" for "". ValueError when unreadable (pure)."""
    text = text.strip()
    if not text:
        return ""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if end and len(text) == 10:
        moment = moment + timedelta(days=1) - timedelta(milliseconds=1)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def time_range(since_text: str, until_text: str) -> tuple[str, str, list[str]]:
    """(since, until, problems) from the jobs page's from/to fields (pure)."""
    problems: list[str] = []
    found = []
    for label, text, end in (("from", since_text, False), ("to", until_text, True)):
        try:
            found.append(parse_when(text, end))
        except ValueError:
            problems.append(f"{label}: a UTC time such as 2026-11-25T10:00 or a date")
            found.append("")
    since, until = found
    if since and until and since > until:
        problems.append("from: must not be after to")
    return since, until, problems


def jobs_page(
    rt: Runtime,
    status: str = "",
    kind: str = "",
    id_part: str = "",
    page: int = 1,
    token: str = "",
    reason_code: str = "",
    since: str = "",
    until: str = "",
    queue: str | None = None,
) -> Page:
    """A page of jobs from the jobs index, newest first: one query or a few (O(page)), paged by
    `token`; `id_part` is an id prefix (the routes find a whole id by one read); `since` / `until`
    (ISO) keep to jobs created in that range (its day tables, a RowKey range in each); `queue`
    to one declared queue's jobs (None: every queue's)."""
    found = rt.job_index.page(
        status,
        kind,
        reason_code,
        token or None,
        PAGE_SIZE,
        id_prefix=id_part,
        since=since,
        until=until,
        queue=None if queue is None else rt.for_queue(queue).queue.ledger_prefix.rstrip("/"),
    )
    return Page(found.rows, max(1, page), -1, -1, found.next_token or "")


# -- one job ----------------------------------------------------------------------------------


TIMELINE_FIELDS = (
    "queue_message_id",
    "dequeue_count",
    "attempt",
    "owner",
    "delay_s",
    "seq",
    "error",
    "reason",
    "by",
    "changes",
    "submitter",
)


def timeline(history: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """History entries as timeline rows: when, what, and every fact each carries (the usual ones
    first; others, such as a Spark submission's, after them)."""
    rows = []
    for entry in history:
        keys = [k for k in TIMELINE_FIELDS if k in entry] + sorted(
            k for k in entry if k not in TIMELINE_FIELDS and k not in ("at", "event")
        )
        rows.append(
            {
                "at": str(entry.get("at", "")),
                "event": str(entry.get("event", "")),
                "facts": {k: entry[k] for k in keys if entry[k] not in (None, "", [])},
            }
        )
    return rows


@dataclass
class JobView:
    record: dict[str, Any]
    timeline: list[dict[str, Any]]
    envelope: dict[str, Any] | None
    """The newest archived (poisoned) body as JSON, when there is one: what the editor opens."""
    envelope_text: str | None
    payload: Any
    payload_note: str
    archive_names: list[str]
    waiting: dict[str, Any] | None = None
    """Why the job waits for a permit (shared/permits), while it does."""


def job_view(rt: Runtime, job_id: str) -> JobView | None:
    record = rt.ledger.get(job_id)
    if record is None:
        return None
    entries = job_archive.archived_bodies(rt, job_id, record.data)
    envelope: dict[str, Any] | None = None
    text: str | None = None
    if entries:
        text = entries[0].entry.body().decode("utf-8", errors="replace")
        try:
            parsed = jsontext.loads(text)
            envelope = parsed if isinstance(parsed, dict) else None
        except json.JSONDecodeError:
            envelope = None
    payload, note = _payload(rt, record.data, envelope)
    edit = job_archive.latest_edit(rt, job_id, record.data)
    if edit is not None and (not entries or str(edit.get("at", "")) > entries[0].entry.archived_at):
        try:
            payload = jsontext.loads(base64.b64decode(str(edit.get("body_b64", "")))).get("payload")
            note = f"as edited by {edit.get('by')} at {edit.get('at')} (the original is kept in the poison archive)"
        except (ValueError, AttributeError):
            pass
    return JobView(
        record=record.data,
        timeline=timeline(RecordView.of(record).history),
        envelope=envelope,
        envelope_text=json.dumps(envelope, indent=2) if envelope is not None else text,
        payload=payload,
        payload_note=note,
        archive_names=[e.name for e in entries],
        waiting=waiting_reason(rt, job_id, record),
    )


def _payload(rt: Runtime, record: Mapping[str, Any], envelope: Mapping[str, Any] | None) -> tuple[Any, str]:
    if envelope is not None and "payload" in envelope:
        return envelope["payload"], "from the archived message"
    ref = record.get("payload_ref") or (envelope or {}).get("payload_ref")
    if isinstance(ref, str) and ref:
        try:
            raw = rt.account.blobs(rt.settings.payloads_container).read_capped(ref, PAYLOAD_SHOW_BYTES)
        except NotFound:
            return None, f"claim-checked payload {ref} is missing"
        except BlobTooLarge as big:
            return None, f"claim-checked payload {ref} is {big.size} bytes: read it from storage"
        try:
            return jsontext.loads(raw), f"claim-checked: {rt.settings.payloads_container}/{ref}"
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None, f"claim-checked payload {ref} is not JSON"
    return None, "an inline payload travels in the message and is not kept in the ledger"


# -- poison -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EntryView:
    """One archive entry with its body shown as text when UTF-8, else as hex."""

    name: str
    entry: ArchiveEntry
    body_text: str | None
    body_hex: str | None

    def as_dict(self) -> dict[str, Any]:
        """The entry's fields, its name and its body as text or hex (the page's data route)."""
        shown = {"name": self.name, "body_text": self.body_text, "body_hex": self.body_hex}
        return {**self.entry.to_data(), **shown}


def entry_view(rt: Runtime, name: str) -> EntryView | None:
    """An entry of the poison archive by name (jobs/ or unparsed/ only): one read."""
    stored = read_entry(rt.archive, name)
    if stored is None:
        return None
    raw = stored.entry.body()
    try:
        text: str | None = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return EntryView(name, stored.entry, text, None if text is not None else raw.hex(" "))


@dataclass
class PoisonView:
    archived: list[EntryRow]
    parked: list[EntryRow]
    on_queue: list[dict[str, Any]]
    now: datetime
    next_archived: str = ""
    """The RowKey the next page of listed entries starts after ("" when this is the last)."""
    next_parked: str = ""
    paged: bool = False
    groups: dict[str, int] = field(default_factory=dict)
    """Listed entries per reason code (the counters: one query)."""
    reason_code: str = ""
    text: str = ""
    """The filter of the listed entries shown: a reason code (a group) and/or error text."""
    queue: str = ""
    """The declared queue whose entries are shown ("": every queue's)."""


def poison_view_of(rt: Runtime, params: Mapping[str, str], queue: str = "") -> PoisonView:
    """`poison_view` as a request's parameters ask (`after`, `after_parked`, `code`, `q`; `queue`:
    the declared queue the request names, checked by the caller)."""
    return poison_view(
        rt,
        params.get("after", ""),
        params.get("after_parked", ""),
        reason_code=params.get("code", "")[:64],
        text=params.get("q", "")[:200],
        queue=queue,
    )


def poison_view(
    rt: Runtime,
    after: str = "",
    after_parked: str = "",
    size: int = PAGE_SIZE,
    reason_code: str = "",
    text: str = "",
    queue: str = "",
) -> PoisonView:
    """With the entry index: a page of listed entries (one query; of a reason code's group with
    `reason_code`; a search with `text`: a bounded scan, `EntryIndex.scan`), a page of
    parked ones (one query), the counts per reason code (one query) and up to 32 messages still
    on the poison queue (one peek). `queue`: that declared queue's entries and poison queue."""
    listed, reached = rt.entry_index.scan(LISTED_STATE, after, size, reason_code, text.strip(), queue=queue)
    parked = rt.entry_index.page(PARKED, after_parked, size, queue=queue)
    default = rt.settings.queue_set.default.name
    return PoisonView(
        archived=listed,
        parked=parked,
        on_queue=poison.peek_poison_queue(rt.for_queue(queue or None)),
        now=rt.clock(),
        next_archived=reached,
        next_parked=parked[-1].key if len(parked) == size else "",
        paged=True,
        groups=rt.entry_index.counts(queue or None, default),
        reason_code=reason_code,
        text=text.strip(),
        queue=queue,
    )


EXPORT_FIELDS = ("name", "state", "job_id", "reason", "archived_at", "attempts", "body_bytes")


def export_entries(
    rt: Runtime, state: str, after: str = "", limit: int = 1000, queue: str = ""
) -> list[dict[str, Any]]:
    """Up to `limit` (<= 1,000) entries of a state (of `queue`, when given) from the entry index,
    newest first, after a RowKey; each row carries `key` (the next export's `after`)."""
    rows = rt.entry_index.page(state, after, max(1, min(1000, limit)), queue=queue)
    return [{**{f: getattr(r, f) for f in EXPORT_FIELDS}, "key": r.key} for r in rows]


def as_csv(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*EXPORT_FIELDS, "key"], extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


PARKED = "parked"
