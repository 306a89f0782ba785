"""The console's actions and queries without a browser, the edge cases: on the in-memory account
and on Azurite."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from typing import Any

import pytest

from shared.core.envelope import isoformat, utcnow
from shared.interfaces.console import actions, job_archive, queries
from shared.pipeline.processing import process_message
from shared.runtime.wiring import Runtime
from tests.integration.backends import Backend
from tests.integration.helpers import message, queue_length
from tests.integration.ops_helpers import read_op, take_steps
from tests.integration.test_poison import drain_jobs, run_poison_trigger


@pytest.fixture
def rt(storage_backend: Backend) -> Runtime:
    return storage_backend.runtime()


def archived(rt: Runtime, job_id: str) -> list[tuple[str, dict[str, Any]]]:
    record = rt.ledger.get(job_id)
    assert record is not None
    return [(s.name, s.entry.to_data()) for s in job_archive.archived_bodies(rt, job_id, record.data)]


def poisoned(rt: Runtime, job_id: str, payload: dict[str, object]) -> str:
    """Poison a `fault` job the way the app does; returns its archive entry's name."""
    body = {"id": job_id, "kind": "fault", "payload": payload, "created_at": isoformat(utcnow())}
    process_message(message(json.dumps(body).encode()), rt)
    run_poison_trigger(rt)
    [(name, _)] = archived(rt, job_id)
    return name


def test_unpark_takes_only_its_own_message_and_leaves_others_visible(rt: Runtime) -> None:
    a, b = poisoned(rt, "pa", {"permanent": True}), poisoned(rt, "pb", {"permanent": True, "note": "b"})
    assert actions.park(rt, [a, b, a], "t") == {"parked": [a, b], "skipped": []}
    assert actions.park(rt, [a], "t") == {"parked": [], "skipped": [a]}, "parked once"
    assert queue_length(rt, rt.settings.parked_queue) == 2
    view = queries.poison_view(rt)
    assert {e.name for e in view.parked} == {a, b}
    assert view.archived == []
    assert actions.unpark(rt, [b], "t") == {"unparked": [b], "not_found": []}
    parked = rt.account.raw_queue(rt.settings.parked_queue)
    left = list(parked.peek_messages(max_messages=32))
    assert [json.loads(base64.b64decode(m.content))["id"] for m in left] == ["pa"], "a stays, visible at once"
    assert [e.name for e in queries.poison_view(rt).archived] == [b]


def test_a_parked_message_lives_as_long_as_its_entry(rt: Runtime) -> None:
    """Shipped settings: the archive keeps entries 90 days after their last write (the park), and
    the parked message expires 90 days after it is sent, so it never outlives its entry."""
    assert rt.settings.retention.archive == 90
    a = poisoned(rt, "pt", {"permanent": True})
    assert actions.park(rt, [a], "t") == {"parked": [a], "skipped": []}
    [msg] = rt.account.raw_queue(rt.settings.parked_queue).peek_messages(max_messages=32)
    assert msg.inserted_on is not None and msg.expires_on is not None
    assert msg.expires_on - msg.inserted_on == timedelta(days=90)


def test_replay_edited_refuses_what_it_cannot_do_and_enqueues_nothing(rt: Runtime) -> None:
    poisoned(rt, "e1", {"permanent": True})
    [(_, entry)] = archived(rt, "e1")
    env = {**json.loads(base64.b64decode(entry["body_b64"])), "payload": {"note": "x"}}
    with pytest.raises(actions.ActionRefused) as refused:
        actions.replay_edited(rt, "e1", json.dumps({**env, "id": "e2"}), "t")
    assert refused.value.problems == ["id: must stay e1 (an edit replays the same job)"]
    with pytest.raises(actions.ActionRefused) as refused:
        actions.replay_edited(rt, "e1", json.dumps({**env, "payload": {"sleep_s": "long"}}), "t")
    assert refused.value.problems == ["payload.sleep_s: must be a number"]
    assert queue_length(rt, rt.settings.jobs_queue) == 0
    assert actions.replay_edited(rt, "e1", json.dumps(env), "ann")["changes"] == [
        "payload.note",
        "payload.permanent",
    ]
    with pytest.raises(actions.ActionRefused) as refused:  # queued now, not poisoned
        actions.replay_edited(rt, "e1", json.dumps(env), "ann")
    assert refused.value.status == 409
    assert drain_jobs(rt) == 1
    record = rt.ledger.get("e1")
    assert record is not None and record.status == "completed" and record.data["replay_count"] == 1
    edit = job_archive.latest_edit(rt, "e1", record.data)
    assert edit is not None and edit["by"] == "ann"
    [(_, entry)] = archived(rt, "e1")
    assert entry["state"] == "replayed" and json.loads(base64.b64decode(entry["body_b64"]))["payload"] == {
        "permanent": True
    }, "the original stays in the archive"


def test_replay_batch_keeps_to_one_ticks_worth(rt: Runtime) -> None:
    ids = [f"r{i}" for i in range(6)]
    for job_id in ids:
        poisoned(rt, job_id, {"permanent": True})
    with pytest.raises(actions.ActionRefused):
        actions.replay_batch(rt, ids, 4.0, "t")  # 2 a tick at 4/s
    report = actions.replay_batch(rt, ids[:2], 4.0, "t")
    assert report["replayed"] == ids[:2] and queue_length(rt, rt.settings.jobs_queue) == 2


def test_delete_and_purge_from_the_console(rt: Runtime) -> None:
    a = poisoned(rt, "d1", {"permanent": True})
    b = poisoned(rt, "d2", {"permanent": True})
    with pytest.raises(actions.ActionRefused):
        actions.delete(rt, ["ledger/d1.json"], "t")
    assert actions.delete(rt, [a], "t") == {"deleted": [a]}
    assert [e.name for e in queries.poison_view(rt).archived] == [b], "deleted: no longer listed"
    op = actions.purge(rt, 1.0, "t")  # a purge is an operation the app carries out in steps
    take_steps(rt)
    assert read_op(rt, op["op"])["counts"] == {} and rt.archive.read(b) is not None
    op = actions.purge(rt, 0.0, "t")
    take_steps(rt)
    assert read_op(rt, op["op"])["counts"] == {"purged": 2}
    assert queries.poison_view(rt).archived == [] and rt.archive.read(a) is None


def test_the_jobs_page_reads_the_listing_metadata_of_real_ledger_writes(rt: Runtime) -> None:
    poisoned(rt, "m1", {"permanent": True})
    body = {
        "id": "m2",
        "kind": "noop",
        "payload": {},
        "created_at": isoformat(utcnow() + timedelta(seconds=1)),
    }
    process_message(message(json.dumps(body).encode()), rt)
    page = queries.jobs_page(rt)
    assert [(r.id, r.status, r.kind) for r in page.rows] == [
        ("m2", "completed", "noop"),
        ("m1", "poisoned", "fault"),
    ]
    assert [r.id for r in queries.jobs_page(rt, status="poisoned").rows] == ["m1"]
