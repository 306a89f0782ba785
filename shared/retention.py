"""Retention per container (issue 21): which blobs may be deleted, and when (pure rules).

The same rules are applied by the storage account's lifecycle policy in Azure (infra/main.bicep,
`managementPolicies`: deletion costs the app nothing) and, where no such policy exists (Azurite),
by the app itself. A rule deletes blobs of one container under a prefix, optionally only those
carrying an index tag, once not modified for `days` days. Never deleted: ledger records that are
not finished (no `state=done` tag), the archive's `edits/` audit, its `console/metrics/`
counters (shared/metrics.py prunes those after 48 h), anything of a setting set to 0.
Reasons of entries still listed are not deleted either: the poison handler deletes a reason once
it has written the entry from it, and a reason is noted before its body's copy reaches the poison
queue (which keeps it at most 7 days), so it is due 7 days after any entry written from it.
Where the app applies them: shared/retention_apply.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from shared import ledger_view
from shared.documents import TagQuery
from shared.envelope import isoformat

# The poison archive's layout (shared/poison/archive.py, which imports settings: not imported
# here; a unit test checks these are its prefixes).
JOBS_PREFIX = "jobs/"
UNPARSED_PREFIX = "unparsed/"
REASONS_PREFIX = "reasons/"

DAY_S = 86_400.0
REASON_EXTRA_DAYS = 7
"""Reasons outlive the archive entries written from them by the poison copy's TTL (7 days)."""
IDEMPOTENCY_MARGIN_S = DAY_S
"""How much longer than JOB_TTL_SECONDS a finished job's record must live (clock skew, late polls)."""


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
