"""Retention per container (issue 21): which blobs may be deleted, and when (pure rules).

The same rules are applied by the storage account's lifecycle policy in Azure (infra/main.bicep,
`managementPolicies`: deletion costs the app nothing) and, where no such policy exists (Azurite),
by the app itself. A rule deletes blobs of one container under a prefix, optionally only those
carrying an index tag, once not modified for `days` days. Never deleted: ledger records that are
not finished (no `state=done` tag), the archive's `edits/` audit, its `console/metrics/`
counters (shared/observability/overview_counters.py prunes those after 48 h), anything of a setting set to 0.
Reasons of entries still listed are not deleted either: the poison handler deletes a reason once
it has written the entry from it, and a reason is noted before its body's copy reaches the poison
queue (which keeps it at most 7 days), so it is due 7 days after any entry written from it.
Where the app applies them: shared/pipeline/retention_sweep.py.

The Table indexes next to the blobs follow them (`due_day_tables`, `entry_rows_cutoff`): no
lifecycle policy deletes table data, so the app does it in Azure too. A day table of the jobs
index (shared/indexes/jobs.py) goes once every record it lists is past the ledger's retention; an
entry-index row once its entry blob is past the archive's. The audit of operator actions
(shared/indexes/audit.py) has no retention: it is one row per operator action (a bulk operation is
one row, not one per entry), a few thousand rows a year, and purge and retention never touch it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from shared.core.archive_layout import JOBS_PREFIX, REASONS_PREFIX, UNPARSED_PREFIX
from shared.core.documents import TagQuery
from shared.core.envelope import isoformat
from shared.ledger import view as ledger_view

DAY_S = 86_400.0
REASON_EXTRA_DAYS = 7
"""Reasons outlive the archive entries written from them by the poison copy's TTL (7 days)."""
IDEMPOTENCY_MARGIN_S = DAY_S
"""How much longer than JOB_TTL_SECONDS a finished job's record must live (clock skew, late polls)."""
TABLE_MARGIN_DAYS = 1
"""How much longer than the blobs they list index tables and rows live: Azure's lifecycle policy
runs about once a day, so a blob may outlive its rule by a day; its index row outlives it."""
DAY_DIGITS = 8


@dataclass(frozen=True)
class Rule:
    """Delete blobs of `container` under `prefix` (with tag `tag` = `value` when given) not
    modified for `days` days."""

    name: str
    container: str
    prefix: str
    days: int
    tag: tuple[str, str] | None = None
    since_tag: str | None = None
    """An index tag holding when the blob got `tag` (its last write): where no lifecycle policy
    runs, `due_query` finds the due blobs with it instead of listing the container."""

    def cutoff(self, now: datetime) -> datetime:
        return now - timedelta(days=self.days)

    def due_query(self, now: datetime) -> TagQuery | None:
        """The Find Blobs by Tags query that returns exactly this rule's due blobs (pure); None
        when the rule has no time tag and its prefix must be listed."""
        if self.since_tag is None:
            return None
        return TagQuery(self.since_tag, "<", isoformat(self.cutoff(now)))

    def due(self, last_modified: datetime, now: datetime) -> bool:
        """True when a blob last modified then is past the rule (strictly, as Azure's policy)."""
        return last_modified < self.cutoff(now)


@dataclass(frozen=True)
class RetentionDays:
    """The retention settings, in days (0: keep forever)."""

    ledger: int = 30
    results: int = 30
    payloads: int = 30
    archive: int = 90


def rules(
    days: RetentionDays, ledger_container: str, results: str, payloads: str, archive: str
) -> list[Rule]:
    """The rules the settings give, in a stable order (settings of 0 give none)."""
    found = [
        Rule(
            "ledger-finished",
            ledger_container,
            "",
            days.ledger,
            (ledger_view.TAG_STATE, ledger_view.STATE_DONE),
            ledger_view.TAG_DONE_AT,
        ),
        Rule("results", results, "", days.results),
        Rule("payloads", payloads, "", days.payloads),
        Rule("archive-jobs", archive, JOBS_PREFIX, days.archive),
        Rule("archive-unparsed", archive, UNPARSED_PREFIX, days.archive),
        Rule("archive-reasons", archive, REASONS_PREFIX, days.archive and days.archive + REASON_EXTRA_DAYS),
    ]
    return [rule for rule in found if rule.days > 0]


def problems(days: RetentionDays, job_ttl_s: float) -> list[str]:
    """What breaks idempotency or operators' work (pure; see docs/reliability.md, "Retention")."""
    found = []
    if days.ledger and days.ledger * DAY_S < job_ttl_s + IDEMPOTENCY_MARGIN_S:
        found.append(
            f"LEDGER_RETENTION_DAYS ({days.ledger}) must exceed JOB_TTL_SECONDS ({job_ttl_s:g} s) by at "
            "least a day: a finished job's record must outlive every message that may still run it"
        )
    if days.payloads and days.payloads * DAY_S < job_ttl_s + IDEMPOTENCY_MARGIN_S:
        found.append(
            f"PAYLOADS_RETENTION_DAYS ({days.payloads}) must exceed JOB_TTL_SECONDS ({job_ttl_s:g} s) by "
            "at least a day: a queued job's claim-checked payload must outlive its message"
        )
    if days.results and days.ledger and days.results > days.ledger:
        found.append(
            f"RESULTS_RETENTION_DAYS ({days.results}) must not exceed LEDGER_RETENTION_DAYS "
            f"({days.ledger}): a result nobody can find by its job is only cost"
        )
    return found


def day_tables_last_due(now: datetime, ledger_days: int, job_ttl_s: float) -> date | None:
    """The newest UTC day whose jobs-index table may be dropped as of `now`; None when the ledger
    keeps its records forever (pure).

    A table lists the jobs created on its day. A job runs (and completes) at the latest
    JOB_TTL_SECONDS after its creation (later messages are poisoned as expired), and its finished
    record goes `ledger_days` after completion: by the end of the day + the TTL + the ledger's
    days, every finished record the table lists is gone; TABLE_MARGIN_DAYS more covers the
    lifecycle policy running once a day. Unfinished and poisoned records are kept by the ledger
    but leave the jobs list with their day (the archive lists poisoned jobs, a job's own page
    reads its record)."""
    if ledger_days <= 0:
        return None
    span = timedelta(days=1 + ledger_days + TABLE_MARGIN_DAYS, seconds=job_ttl_s)
    return (now.astimezone(UTC) - span).date()


def table_day(name: str, prefix: str) -> date | None:
    """The day of a jobs-index table name (`<prefix><YYYYMMDD>`), None for any other name (pure)."""
    digits = name[len(prefix) :]
    if not name.startswith(prefix) or len(digits) != DAY_DIGITS or not digits.isdigit():
        return None
    try:
        return datetime.strptime(digits, "%Y%m%d").date()
    except ValueError:
        return None


def due_day_tables(names: Iterable[str], prefix: str, last: date) -> list[str]:
    """The jobs-index tables among `names` of days up to `last` (`day_tables_last_due`), oldest
    first; a name that is not `<prefix><YYYYMMDD>` is never due (pure)."""
    return sorted(name for name in names if (day := table_day(name, prefix)) is not None and day <= last)


def day_tables_filter(prefix: str, last: date) -> str:
    """The list-tables query returning the day tables up to `last` (and no later one) (pure)."""
    return f"TableName ge '{prefix}0' and TableName le '{prefix}{last.strftime('%Y%m%d')}'"


def entry_rows_cutoff(now: datetime, archive_days: int) -> datetime | None:
    """Entry-index rows written (and first archived) before this are due: their entry blob, not
    written since either, is past the archive's retention; None when entries are kept forever (pure)."""
    if archive_days <= 0:
        return None
    return now - timedelta(days=archive_days + TABLE_MARGIN_DAYS)
