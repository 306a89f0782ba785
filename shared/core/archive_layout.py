"""The poison archive's layout, in one place (pure): where each document goes in the
poison-archive container. The archive's code is shared/poison/; the retention rules
(shared/config/retention.py) name the same prefixes.

  jobs/<job id>/<body digest>.json   one entry per distinct poisoned body of a job (`<job id>`:
                                     `<queue>/<id>` on a queue other than the default)
  unparsed/<body digest>.json        bodies that are not their job's: not base64, JSON or UTF-8,
                                     no readable id, or an id whose record is another body's
  reasons/<body digest>.json         why the app itself poisoned a body (written before the copy)
  edits/<job id>/<body digest>.json  an operator's edit of a job's envelope, replayed
Beside them, not entries: ops/ (bulk operations, shared/poison/bulk.py) and the overview's
counters without a table (shared/indexes/metrics.py).
"""

from __future__ import annotations

from typing import Final

JOBS_PREFIX: Final = "jobs/"
UNPARSED_PREFIX: Final = "unparsed/"
REASONS_PREFIX: Final = "reasons/"
EDITS_PREFIX: Final = "edits/"
ENTRY_PREFIXES: Final = (JOBS_PREFIX, UNPARSED_PREFIX)
"""The namespaces of entries (listed, replayed, purged); reasons and edits are not entries."""


def entry_name(job_id: str | None, digest: str, owned: bool = True) -> str:
    """Entries of valid envelopes, and of invalid ones whose job record they created, go under
    their job; other bodies under unparsed/ (the id they carry, if any, is kept in the entry but
    cannot be trusted to be theirs)."""
    return f"{JOBS_PREFIX}{job_id}/{digest}.json" if job_id and owned else f"{UNPARSED_PREFIX}{digest}.json"


def reason_name(digest: str) -> str:
    return f"{REASONS_PREFIX}{digest}.json"


def edit_name(job_id: str, digest: str) -> str:
    """Where an operator's edit of the job's envelope is kept (shared/poison/replay.py `replay_edit`)."""
    return f"{EDITS_PREFIX}{job_id}/{digest}.json"


def is_entry_name(name: str) -> bool:
    return name.startswith(ENTRY_PREFIXES)


def is_job_entry_of(name: str, job_id: str) -> bool:
    """True when `name` is one of the job's own entries (`jobs/<id>/<digest>.json`). `job_id` is
    the job's key: `<queue>/<id>` on a queue other than the default, so `jobs/<queue>/...` holds
    that queue's jobs' entries, never the entries of a default-queue job named like the queue."""
    head = f"{JOBS_PREFIX}{job_id}/"
    return name.startswith(head) and "/" not in name[len(head) :]
