"""A job's poison archive entries and its latest operator edit, for its page: read by name.

The job's ledger record names them: `poison_digests` (each body that poisoned the job: its entry is
`jobs/<id>/<digest>.json`) and `last_edit_digest` (`edits/<id>/<digest>.json`), written by the
ledger writes that poison the job and replay an edit, so the page sends no listing (a listing by
prefix costs Azurite a scan of every blob of the account: ~750 ms at a million).

Records written before those fields existed (or poisoned more often than the record keeps) fall
back to listing `jobs/<id>/` or `edits/<id>/`, as the console did before. Not named by the record,
so not shown: copies archived under the job without changing its record (a stale or duplicate
message of the job, one sent back to be re-checked, another body of an already poisoned job;
they stay on the poison page) and an edit whose replay was refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.core.archive_layout import EDITS_PREFIX, JOBS_PREFIX, edit_name, entry_name, is_job_entry_of
from shared.ledger import POISON_DIGESTS_PARTIAL, ever_archived, history_events, poison_digests_of
from shared.poison.archive import StoredEntry, read_entry
from shared.runtime.wiring import Runtime

LAST_EDIT = "last_edit_digest"


@dataclass(frozen=True)
class ArchivePlan:
    """How to find a job's archive entries and its latest edit: by name, or (legacy) by listing."""

    entries: tuple[str, ...] = ()
    list_entries: bool = False
    edit: str | None = None
    list_edits: bool = False


def plan(job_id: str, record: Mapping[str, Any]) -> ArchivePlan:
    """What the job's record says about its archive entries and edits (pure). Names it does not
    keep, or keeps damaged (not a list of digests, not a string), fall back to the listing."""
    digests = poison_digests_of(record)
    named = digests is not None and not record.get(POISON_DIGESTS_PARTIAL)
    last_edit = record.get(LAST_EDIT)
    edit = edit_name(job_id, last_edit) if isinstance(last_edit, str) and last_edit else None
    return ArchivePlan(
        entries=tuple(entry_name(job_id, d) for d in digests or ()) if named else (),
        list_entries=not named and ever_archived(record),
        edit=edit,
        list_edits=edit is None and bool(record.get("edit_count") or "edited" in history_events(record)),
    )


def archived_bodies(rt: Runtime, job_id: str, record: Mapping[str, Any]) -> list[StoredEntry]:
    """The job's poison archive entries, newest first: one read per entry the record names; a
    listing of `jobs/<id>/` only for a record that does not name them. `rt`: the job's queue's
    (its entries are under `jobs/<queue>/<id>/` on a queue other than the default)."""
    job_id = rt.job_key(job_id)
    found = plan(job_id, record)
    names = (
        [name for name, _ in rt.archive.names(f"{JOBS_PREFIX}{job_id}/") if is_job_entry_of(name, job_id)]
        if found.list_entries
        else found.entries
    )
    entries = [found for found in (read_entry(rt.archive, name) for name in names) if found is not None]
    return sorted(entries, key=lambda found: found.entry.archived_at, reverse=True)


def latest_edit(rt: Runtime, job_id: str, record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The newest operator edit of the job's envelope: one read of the edit the record names; a
    listing of `edits/<id>/` (and a read each) only for a record that does not name it."""
    job_id = rt.job_key(job_id)
    found = plan(job_id, record)
    if found.edit is not None:
        doc = rt.archive.read(found.edit)
        return doc.data if doc is not None else None
    if not found.list_edits:
        return None
    head = f"{EDITS_PREFIX}{job_id}/"
    docs = [rt.archive.read(n) for n, _ in rt.archive.names(head) if "/" not in n[len(head) :]]
    edits = [d.data for d in docs if d is not None]
    return max(edits, key=lambda d: str(d.get("at", ""))) if edits else None
