"""The overview and a job's page list no blobs (a listing costs Azurite a scan of the account): their
requests counted, their content the same as the listing gave, records of before the change still
shown (by listing). On the in-memory account and on Azurite."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import asdict
from datetime import timedelta

import pytest

from shared import ledger
from shared.core.envelope import isoformat, utcnow
from shared.indexes.counters import TableCounters
from shared.interfaces.console import actions, job_archive, queries
from shared.observability import overview_counters
from shared.pipeline.processing import process_message
from shared.runtime.wiring import Runtime
from tests.integration.backends import Backend
from tests.integration.helpers import message
from tests.integration.test_console_actions import archived, poisoned
from tests.integration.test_poison import drain_jobs, run_poison_trigger

NEW_FIELDS = (ledger.POISON_DIGESTS, ledger.POISON_DIGESTS_PARTIAL, job_archive.LAST_EDIT)


@pytest.fixture
def rt(storage_backend: Backend) -> Runtime:
    return storage_backend.runtime()


def listings(rt: Runtime, seen: list[str]) -> list[str]:
    """The blob listings of the archive container among `seen` (`GET /<account>/<container>`)."""
    return [
        r
        for r in seen
        if r.startswith("GET ") and r.rstrip("/").endswith(f"/{rt.settings.poison_archive_container}")
    ]


def as_legacy(rt: Runtime, job_id: str) -> None:
    """Rewrite the job's record as the previous version wrote it: without the names."""
    record = rt.ledger.get(job_id)
    assert record is not None
    rt.ledger.store.replace(
        rt.ledger.name(job_id), record, {k: v for k, v in record.data.items() if k not in NEW_FIELDS}
    )


def counted_view(
    rt: Runtime, backend: Backend, monkeypatch: pytest.MonkeyPatch, job_id: str
) -> tuple[queries.JobView, list[str]]:
    sent: Callable[[], list[str]] = backend.record_requests(monkeypatch)
    view = queries.job_view(rt, job_id)
    seen = sent()
    monkeypatch.undo()
    assert view is not None
    return view, seen


def test_a_poisoned_jobs_page_reads_its_entry_by_name_and_lists_nothing(
    rt: Runtime, storage_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    poisoned(rt, "np1", {"permanent": True})
    view, seen = counted_view(rt, storage_backend, monkeypatch, "np1")
    assert listings(rt, seen) == [] and len(seen) == 2, seen  # the record, the entry
    [name] = view.archive_names
    assert name.startswith("jobs/np1/") and view.payload == {"permanent": True}
    assert view.envelope is not None and view.envelope["id"] == "np1"
    as_legacy(rt, "np1")
    legacy, seen = counted_view(rt, storage_backend, monkeypatch, "np1")
    assert len(listings(rt, seen)) == 1, "a record of before: its entries listed"
    assert asdict(legacy)["archive_names"] == [name] and legacy.payload == view.payload


def test_an_edit_and_a_second_poisoning_show_as_the_listing_showed_them(
    rt: Runtime, storage_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    poisoned(rt, "ne1", {"permanent": True})
    [(_, entry)] = archived(rt, "ne1")
    env = json.loads(base64.b64decode(entry["body_b64"]))
    actions.replay_edited(rt, "ne1", json.dumps({**env, "payload": {"permanent": True, "note": "x"}}), "ann")
    edited, seen = counted_view(rt, storage_backend, monkeypatch, "ne1")
    assert listings(rt, seen) == [] and len(seen) == 3, seen  # the record, the entry, the edit
    assert edited.payload == {"permanent": True, "note": "x"} and "as edited by ann" in edited.payload_note
    assert drain_jobs(rt) == 1  # the edited body poisons it again: a second entry, newer than the edit
    run_poison_trigger(rt)
    view, seen = counted_view(rt, storage_backend, monkeypatch, "ne1")
    assert listings(rt, seen) == [] and len(seen) == 4, seen  # the record, two entries, the edit
    assert len(view.archive_names) == 2 and view.payload == {"permanent": True, "note": "x"}
    assert view.payload_note == "from the archived message"
    as_legacy(rt, "ne1")
    legacy, seen = counted_view(rt, storage_backend, monkeypatch, "ne1")
    assert len(listings(rt, seen)) == 2, "a record of before: entries and edits listed"
    assert {**asdict(legacy), "record": None} == {**asdict(view), "record": None}, "the same page"
    newest = rt.archive.read(view.archive_names[0])
    assert newest is not None and newest.data["archived_at"] >= str(entry["archived_at"])


def test_a_job_never_poisoned_costs_one_read(
    rt: Runtime, storage_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = {"id": "nc1", "kind": "noop", "payload": {}, "created_at": isoformat(utcnow())}
    process_message(message(json.dumps(body).encode()), rt)
    view, seen = counted_view(rt, storage_backend, monkeypatch, "nc1")
    assert len(seen) == 1 and view.archive_names == [] and view.envelope is None, seen


def test_the_overview_queries_the_counters_table_and_lists_nothing(
    rt: Runtime, storage_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(rt.counters, TableCounters)
    now = utcnow()
    recorder = overview_counters.Recorder(clock=lambda: now)
    for _ in range(3):
        recorder.on_decision("completed", {"latency_s": 0.2})
    assert recorder.flush(rt.counters, "other:1") == 1
    old = overview_counters.Recorder(clock=lambda: now - timedelta(hours=50))
    old.on_decision("completed", {})
    old.flush(rt.counters, "gone:2")
    sent = storage_backend.record_requests(monkeypatch)
    figures = queries.overview(rt)
    seen = sent()
    monkeypatch.undo()
    assert listings(rt, seen) == [] and len(seen) == 4, seen  # 3 queue depths, 1 query
    assert figures["documents_merged"] == 1 and sum(figures["series"]["completed"]) == 3
    rt.archive.upsert(
        overview_counters.blob_name(overview_counters.hour_key(now - timedelta(hours=49)), "old:3"),
        {"hour": "x"},
    )
    rt.archive.upsert(overview_counters.blob_name(overview_counters.hour_key(now), "old:4"), {"hour": "x"})
    assert rt.counters.prune(now) == 2, "the expired entity and the expired blob of before the table"
    assert rt.counters.legacy_left, "a recent blob of before the table is still there"
    assert [name for name, _ in rt.archive.names(overview_counters.PREFIX)] == [
        overview_counters.blob_name(overview_counters.hour_key(now), "old:4")
    ]
    assert rt.counters.read(overview_counters.hours_to_read(now), None)[0]["instance"] == "other:1"
    assert rt.counters.prune(now + timedelta(hours=49)) == 2 and not rt.counters.legacy_left
    assert rt.counters.prune(now + timedelta(hours=49)) == 0
