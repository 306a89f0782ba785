"""Issue 21 on Azurite (no lifecycle policy there): `python -m shared.interfaces.cli retention` applies the
retention rules. Blobs of every kind are seeded through the app's own writes; last-modified
cannot be set, so `--now` moves forward instead: a dry run deletes nothing and reports the exact
counts, the real run deletes exactly those, and what the rules never delete survives."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from devstack.azurite import Azurite
from shared import ledger
from shared.core import archive_layout
from shared.core.envelope import Envelope, isoformat
from shared.indexes.entry_rows import EntryState
from shared.interfaces import cli
from shared.ledger import Facts
from shared.ledger import send as ledger_send
from shared.pipeline import retention_sweep as retention_apply
from shared.poison import archive
from shared.poison.entry import ArchiveEntry
from shared.runtime.wiring import Runtime
from tests.integration.helpers import runtime_for, sdk

pytestmark = pytest.mark.azurite

DONE = ["done-1", "done-2", "done-3"]
EDIT = "edits/listed-1/abc.json"
COUNTER = "console/metrics/2026-01-01T00.json"


def _seed(rt: Runtime) -> dict[str, set[str]]:
    """Three completed records, one in progress, one poisoned, one queued; results, payloads;
    archive entries (listed, replayed, unparsed), reasons, an edit and a counter. Names by container."""
    now = rt.clock()

    def env(job_id: str) -> Envelope:
        return Envelope(id=job_id, kind="noop", created_at=now, payload={})

    def claim(job_id: str) -> ledger.Record:
        return rt.ledger.write(
            job_id, None, lambda p: ledger.claimed(p, env(job_id), Facts(now, "m", 1, "h/1"), 30)
        )

    def complete(job_id: str) -> ledger.Change:
        return lambda p: ledger.completed(p, job_id, Facts(now), 1, "", {}, 0.1)

    for job_id in DONE:
        record = claim(job_id)
        rt.ledger.write(job_id, record, complete(job_id))
    claim("running")
    rt.ledger.write("poisoned", None, lambda p: ledger.poisoned(p, "poisoned", Facts(now), "bad", "x", b"{}"))
    rt.ledger.write(
        "queued",
        None,
        lambda p: ledger_send.queued(env("queued"), Facts(now), request="r", submitter="s", send_lease_s=30),
    )
    results = sdk(rt).container(rt.settings.results_container)
    payloads = sdk(rt).container(rt.settings.payloads_container)
    for job_id in DONE:
        results.upload_blob(f"{job_id}.json", b"{}")
    payloads.upload_blob("payloads/p1.json", b"{}")
    payloads.upload_blob("payloads/p2.json", b"{}")

    names: dict[str, set[str]] = {"archive": set()}
    entries: tuple[tuple[str | None, bytes, str, bool], ...] = (
        ("listed-1", b'{"id": "listed-1"}', archive.LISTED_STATE, True),
        ("replayed-1", b'{"id": "replayed-1"}', "replayed", True),
        (None, b"\xff not json", archive.LISTED_STATE, False),
    )
    for entry_job_id, body, state, owned in entries:
        archive.note_reason(rt.archive, body, "why", entry_job_id, "code", under_claim=False, now=now)
        entry = ArchiveEntry.new(
            body,
            entry_job_id,
            owned,
            EntryState(state),
            "why",
            now=now,
            queue_message_id="q",
            dequeue_count=5,
            record=None,
        )
        with archive.index_writes(rt) as writes:
            names["archive"].add(archive.write_entry(rt.archive, entry, writes))
    rt.archive.upsert(EDIT, {"by": "alice"})
    rt.archive.upsert(COUNTER, {"count": 1})
    return names


def _names(rt: Runtime, container: str) -> set[str]:
    return {b.name for b in sdk(rt).container(container).list_blobs()}


def _run(rt: Runtime, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    monkeypatch.setattr("shared.runtime.wiring._runtime", rt)
    assert cli.main(["retention", *args]) == 0
    return capsys.readouterr().out


def _counts(out: str) -> dict[str, tuple[str, ...]]:
    """Rule name -> (due, deleted, kept, changed) from the CLI's table."""
    rows = [line.split() for line in out.splitlines()]
    return {
        row[0]: tuple(row[-4:])
        for row in rows
        if row and row[0].startswith(("ledger-", "results", "payloads", "archive-"))
    }


def test_dry_run_counts_and_the_real_run_deletes_exactly_the_due_blobs(
    azurite: Azurite, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no local.settings.json
    rt = runtime_for(azurite)
    s = rt.settings
    _seed(rt)
    containers = [s.ledger_container, s.results_container, s.payloads_container, s.poison_archive_container]
    before = {c: _names(rt, c) for c in containers}
    assert len(before[s.poison_archive_container]) == 8  # 2 jobs/, 1 unparsed/, 3 reasons/, edit, counter
    start = rt.clock()

    def at(days: int) -> str:
        return isoformat(start + timedelta(days=days, hours=1))

    # day 31: finished records, results and payloads due; every archive blob younger than its rule
    out = _run(rt, monkeypatch, capsys, "--dry-run", "--now", at(31))
    assert "dry run: nothing deleted" in out and "8 would be deleted; 6 requests" in out
    assert _counts(out) == {
        "ledger-finished": ("3", "0", "-", "0"),
        "results": ("3", "0", "0", "0"),
        "payloads": ("2", "0", "0", "0"),
        "archive-jobs": ("0", "0", "2", "0"),
        "archive-unparsed": ("0", "0", "1", "0"),
        "archive-reasons": ("0", "0", "3", "0"),
    }
    assert {c: _names(rt, c) for c in containers} == before
    out = _run(rt, monkeypatch, capsys, "--now", at(31))
    assert _counts(out)["ledger-finished"] == ("3", "3", "-", "0")
    assert "8 due, 8 deleted, 0 kept (written since listed); 14 requests" in out
    assert _names(rt, s.ledger_container) == {"running.json", "poisoned.json", "queued.json"}
    assert _names(rt, s.results_container) == set() == _names(rt, s.payloads_container)
    assert _names(rt, s.poison_archive_container) == before[s.poison_archive_container]

    # day 93: archive entries due (listed or not), their reasons 7 days later; edits, counters never
    out = _run(rt, monkeypatch, capsys, "--now", at(93))
    assert _counts(out)["archive-jobs"] == ("2", "2", "0", "0")
    assert _counts(out)["archive-reasons"] == ("0", "0", "3", "0")
    left = _names(rt, s.poison_archive_container)
    assert (
        {n for n in left if n.startswith(archive_layout.REASONS_PREFIX)} and EDIT in left and COUNTER in left
    )
    assert not any(n.startswith((archive_layout.JOBS_PREFIX, archive_layout.UNPARSED_PREFIX)) for n in left)

    out = _run(rt, monkeypatch, capsys, "--now", at(3650))
    assert _counts(out)["archive-reasons"] == ("3", "3", "0", "0")
    assert _names(rt, s.poison_archive_container) == {EDIT, COUNTER}
    assert _names(rt, s.ledger_container) == {"running.json", "poisoned.json", "queued.json"}


def test_costs_follow_what_is_deleted_and_batches_are_bounded(azurite: Azurite) -> None:
    """Ledger: one query page per `page` due records (none for the others), one delete each;
    a run stops at its limit and the next goes on."""
    rt = runtime_for(azurite)
    _seed(rt)
    now = rt.clock() + timedelta(days=31, hours=1)
    rules = [r for r in rt.settings.retention_rules() if r.name == "ledger-finished"]
    targets = retention_apply.blob_targets(rt)
    first = retention_apply.apply(targets, rules, now, dry_run=False, page=2, limit=2)
    assert (first.due, first.deleted, first.stopped_at_limit) == (2, 2, True)
    rest = retention_apply.apply(targets, rules, now, dry_run=False, page=2)
    assert (rest.due, rest.deleted, rest.stopped_at_limit) == (1, 1, False)
    assert rest.requests == 2  # one query page, one delete: nothing read of the records kept
    none_due = retention_apply.apply(targets, rules, now, dry_run=False, page=2)
    assert (none_due.due, none_due.requests) == (0, 1)


def test_a_blob_written_again_after_the_cutoff_is_kept(azurite: Azurite) -> None:
    """Due when listed, written since (a replay resetting the record): the conditional delete keeps it."""
    rt = runtime_for(azurite)
    sdk(rt).container(rt.settings.results_container).upload_blob("r.json", b"{}")
    target = retention_apply.blob_targets(rt)(rt.settings.results_container)
    assert not target.delete_unmodified("r.json", rt.clock() - timedelta(days=1))
    assert not target.delete_unmodified("missing.json", rt.clock())
    assert target.delete_unmodified("r.json", rt.clock() + timedelta(minutes=1))


def test_the_sweep_timer_applies_the_blob_rules_only_when_the_app_is_asked_to(azurite: Azurite) -> None:
    azure = retention_apply.on_timer(runtime_for(azurite))  # Azure: the lifecycle policy deletes blobs
    assert azure is not None and azure.rules == [] and azure.tables is not None  # tables: always
    rt = runtime_for(azurite, RETENTION_BY_APP="true")
    _seed(rt)
    report = retention_apply.on_timer(rt)
    assert report is not None and report.rules and report.due == 0  # nothing old yet
    assert retention_apply.on_timer(rt) is None  # at most every TIMER_EVERY_S
    assert isinstance(report.now, datetime)
