"""Bulk operations, purge and unpark at scale (counts, never timings), on the in-memory account and
on Azurite."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from shared import ledger
from shared.core.envelope import isoformat
from shared.indexes.entry_rows import EntryState
from shared.interfaces.console import actions, queries
from shared.ledger import Facts
from shared.observability import overview_counters
from shared.pipeline.processing import process_message
from shared.poison import archive, bulk, bulk_step, replay
from shared.poison.archive import index_writes, note_reason, write_entry
from shared.poison.entry import ArchiveEntry
from shared.runtime import sending
from shared.runtime.wiring import Runtime
from tests.integration.backends import Backend
from tests.integration.helpers import drain_raw, message, queue_length
from tests.integration.ops_helpers import paced_runtime, read_op, take_steps


@pytest.fixture
def rt(storage_backend: Backend) -> Runtime:
    return paced_runtime(storage_backend)


def poisoned_noop(rt: Runtime, job_id: str) -> str:
    """A poisoned job whose archived body is a valid noop envelope (replayable); its entry name."""
    now = rt.clock()
    body = json.dumps({"id": job_id, "kind": "noop", "payload": {}, "created_at": isoformat(now)}).encode()
    env_data = {"id": job_id, "kind": "noop", "created_at": isoformat(now), "status": "queued"}
    rt.ledger.create(job_id, {**env_data, "history": []})
    record = rt.ledger.get(job_id)
    rt.ledger.write(
        job_id, record, lambda prev: ledger.poisoned(prev, job_id, Facts(now), "bench", None, body)
    )
    entry = ArchiveEntry.new(
        body,
        job_id,
        True,
        EntryState.POISONED,
        "test",
        now=now,
        queue_message_id=None,
        dequeue_count=5,
        record=None,
    )
    with index_writes(rt) as writes:
        return write_entry(rt.archive, entry, writes)


def test_purge_deletes_poison_entries_only(rt: Runtime) -> None:
    listed = poisoned_noop(rt, "pg-listed")
    kept = poisoned_noop(rt, "pg-parked")
    actions.park(rt, [kept], "t")
    rt.archive.upsert("edits/pg-listed/abc.json", {"job_id": "pg-listed", "by": "t"})
    rt.archive.upsert(f"{overview_counters.PREFIX}2026010100/pg-instance.json", {"completed": [1]})
    note_reason(rt.archive, b"another body", "why", "pg-other", None, under_claim=True, now=rt.clock())
    dry = actions.purge(rt, 0.0, "t", dry_run=True)
    take_steps(rt)
    assert read_op(rt, dry["op"])["counts"] == {"counted": 1}, "the dry run counts and changes nothing"
    assert rt.archive.read(listed) is not None
    op = actions.purge(rt, 0.0, "t")
    take_steps(rt)
    done = read_op(rt, op["op"])
    assert done["status"] == "done" and done["counts"] == {"purged": 1}
    assert rt.archive.read(listed) is None
    left = {name for name, _ in rt.archive.names("")}
    assert kept in left, "parked entries are kept"
    assert "edits/pg-listed/abc.json" in left
    assert any(n.startswith(overview_counters.PREFIX) for n in left), "counters are kept"
    assert any(n.startswith("reasons/") for n in left), "reasons of bodies not purged are kept"
    assert any(n.startswith(bulk.OPS_PREFIX) for n in left), "the operations (the audit of bulk actions)"
    assert queue_length(rt, rt.settings.parked_queue) == 1, "no parked message stranded"
    assert [e.name for e in queries.poison_view(rt).parked] == [kept]
    assert [r["name"] for r in queries.export_entries(rt, "parked")] == [kept]


def test_a_bulk_replay_killed_half_way_and_resumed_applies_each_job_once(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [poisoned_noop(rt, f"kill-{i:02d}") for i in range(12)]
    op = bulk.start(rt, "replay", "t", names=names, rate_per_s=4)  # 4 entries a step: 3 steps
    real_set_state = archive.set_state  # what `bulk` calls until patched
    crashes = {"left": 1}

    def crashing(*args: Any, **kwargs: Any) -> Any:
        if args[2] == "replayed" and args[1] == names[5] and crashes["left"]:
            crashes["left"] -= 1
            raise RuntimeError("killed: the job was sent, its entry not yet marked")
        return real_set_state(*args, **kwargs)

    monkeypatch.setattr(replay, "set_state", crashing)

    def step(body: bytes) -> None:
        try:
            bulk_step.run_step(rt, body)
        except RuntimeError:
            bulk_step.run_step(rt, body)  # the host delivers the same step again

    take_steps(rt, on_step=step)
    assert crashes["left"] == 0
    done = read_op(rt, op["id"])
    assert done["status"] == "done" and done["counts"] == {"replayed": 12} and done["failures"] == []
    bodies = drain_raw(rt, rt.settings.jobs_queue)
    sent = sorted(json.loads(b)["id"] for b in bodies)
    # the killed step cannot tell whether names[5]'s message went out: it sends it again
    assert sent == sorted([f"kill-{i:02d}" for i in range(12)] + ["kill-05"]), (
        "each sent, the killed one twice"
    )
    for body in bodies:
        process_message(message(body), rt)
    for i in range(12):
        record = rt.ledger.get(f"kill-{i:02d}")
        assert record is not None and record.status == ledger.COMPLETED
        assert sum(1 for h in record.data["history"] if h["event"] == "completed") == 1


def test_cancel_stops_an_operation_at_its_next_step(rt: Runtime) -> None:
    names = [poisoned_noop(rt, f"cancel-{i}") for i in range(6)]
    op = bulk.start(rt, "replay", "t", names=names, rate_per_s=2)
    assert actions.op_change(rt, {"op": op["id"]}, "t", "cancel")["status"] == "cancelled"
    take_steps(rt)
    assert read_op(rt, op["id"])["done"] == 0
    assert queue_length(rt, rt.settings.jobs_queue) == 0


def test_unpark_of_the_last_of_1000_parked_entries(rt: Runtime) -> None:
    def one(i: int) -> str:
        name = poisoned_noop(rt, f"park-{i:04d}")
        assert actions.park(rt, [name], "t")["parked"] == [name]
        return name

    with ThreadPoolExecutor(8) as pool:
        names = list(pool.map(one, range(1000)))
    assert queue_length(rt, rt.settings.parked_queue) == 1000
    answer = actions.unpark(rt, [names[-1]], "t")
    assert answer == {"unparked": [names[-1]], "not_found": []}
    assert queue_length(rt, rt.settings.parked_queue) == 999
    entry = rt.archive.read(names[-1])
    assert entry is not None and entry.data["state"] == "poisoned"
    assert names[-1] in {e.name for e in queries.poison_view(rt, size=1000).archived}


def test_bulk_park_and_unpark_keep_the_parked_queue_in_step(rt: Runtime) -> None:
    names = [poisoned_noop(rt, f"bp-{i}") for i in range(3)]
    parked = bulk.start(rt, "park", "t", names=[*names, "jobs/bp-x/none.json"], rate_per_s=100)
    take_steps(rt)
    done = read_op(rt, parked["id"])
    assert done["counts"] == {"parked": 3, "not_found": 1}
    assert done["failures"] == [
        {"name": "jobs/bp-x/none.json", "outcome": "not_found", "reason": "no such archive entry"}
    ]
    assert queue_length(rt, rt.settings.parked_queue) == 3
    unparked = bulk.start(rt, "unpark", "t", states=["parked"], rate_per_s=100)
    take_steps(rt)
    assert read_op(rt, unparked["id"])["counts"] == {"unparked": 3}
    assert queue_length(rt, rt.settings.parked_queue) == 0
    assert {e.name for e in queries.poison_view(rt).archived} >= set(names)


def test_the_cli_and_api_purge_deletes_poison_entries_only_too(rt: Runtime) -> None:
    from shared import poison

    listed = poisoned_noop(rt, "cli-listed")
    kept = poisoned_noop(rt, "cli-parked")
    actions.park(rt, [kept], "t")
    rt.archive.upsert("edits/cli-listed/abc.json", {"job_id": "cli-listed"})
    rt.archive.upsert(f"{overview_counters.PREFIX}2026010100/cli.json", {"completed": [1]})
    op = poison.start_purge(rt, 0.0, "cli")
    take_steps(rt)
    assert read_op(rt, op["id"])["counts"] == {"purged": 1}  # the parked entry is never visited
    left = {name for name, _ in rt.archive.names("")}
    assert kept in left and "edits/cli-listed/abc.json" in left
    assert f"{overview_counters.PREFIX}2026010100/cli.json" in left and listed not in left


def test_a_bulk_replay_step_costs_five_requests_an_entry_and_leaves_both_indexes_right(
    rt: Runtime, storage_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [poisoned_noop(rt, f"cost-{i:02d}") for i in range(40)]
    listed_before = sum(rt.entry_index.counts().values())
    op = bulk.start(rt, "replay", "t", names=names, rate_per_s=0)  # no rate: one step
    sent = storage_backend.record_requests(monkeypatch)
    assert take_steps(rt) == 1
    seen = sent()
    monkeypatch.undo()
    done = read_op(rt, op["id"])
    assert done["status"] == "done" and done["counts"] == {"replayed": 40}
    # per entry: entry GET, record GET, record PUT, message, entry PUT; per step: the document's
    # read and write, the index transactions (entry rows moved, job rows upserted); take_steps'
    # own receive, delete and queue-length calls on the ops queue are not the step's; the listed
    # counts per reason code (up to SHARDS counter rows touched) change in one transaction after
    # one query of the counters
    in_step = [r for r in seen if "-ops" not in r]
    assert len(in_step) <= 5 * 40 + 5 + 2, sorted(set(seen))
    assert sum(rt.entry_index.counts().values()) == listed_before - 40
    batches = sum(1 for r in seen if r.startswith("POST") and "$batch" in r)
    assert batches == 4, "four transactions: rows upserted, rows deleted, job rows, counters"
    assert rt.entry_index.page("poisoned", size=100) == []
    assert {r.name for r in rt.entry_index.page("replayed", size=100)} == set(names)
    rows = rt.job_index.page(id_prefix="cost-", size=100).rows
    assert len(rows) == 40 and {r.status for r in rows} == {"queued"}
    record = rt.ledger.get("cost-00")
    assert record is not None and record.data["replayed_by"] == f"op:{op['id']}"
    assert queue_length(rt, rt.settings.jobs_queue) == 40


def test_a_bulk_replay_killed_between_the_ledger_write_and_the_message_still_sends_the_job(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [poisoned_noop(rt, f"gap-{i}") for i in range(3)]
    op = bulk.start(rt, "replay", "t", names=names, rate_per_s=0)
    real_send = sending.send_job  # what `bulk` calls until patched
    crashes = {"left": 1}

    def crashing(rt_: Runtime, env: Any) -> Any:
        if env.id == "gap-1" and crashes["left"]:
            crashes["left"] -= 1
            raise RuntimeError("killed: the record says queued, no message sent")
        return real_send(rt_, env)

    monkeypatch.setattr(replay, "send_job", crashing)

    def step(body: bytes) -> None:
        try:
            bulk_step.run_step(rt, body)
        except RuntimeError:
            record = rt.ledger.get("gap-1")
            assert record is not None and record.status == ledger.QUEUED, "the gap this test is about"
            bulk_step.run_step(rt, body)  # the host delivers the same step again

    take_steps(rt, on_step=step)
    assert crashes["left"] == 0
    assert read_op(rt, op["id"])["counts"] == {"replayed": 3}
    bodies = drain_raw(rt, rt.settings.jobs_queue)
    assert "gap-1" in {json.loads(b)["id"] for b in bodies}, "the job was not lost"
    for body in bodies:
        process_message(message(body), rt)
    for i in range(3):
        record = rt.ledger.get(f"gap-{i}")
        assert record is not None and record.status == ledger.COMPLETED
        assert sum(1 for h in record.data["history"] if h["event"] == "completed") == 1


def test_a_step_killed_before_its_index_writes_is_redone_and_fixes_the_indexes(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [poisoned_noop(rt, f"flush-{i:02d}") for i in range(8)]
    op = bulk.start(rt, "replay", "t", names=names, rate_per_s=0)
    real_flush = archive.IndexWrites.flush
    crashes = {"left": 1}

    def crashing(self: archive.IndexWrites, rt_: Runtime) -> None:
        if crashes["left"]:
            crashes["left"] -= 1
            raise RuntimeError("killed: every job sent and entry marked, no index written")
        real_flush(self, rt_)

    monkeypatch.setattr(archive.IndexWrites, "flush", crashing)

    def step(body: bytes) -> None:
        try:
            bulk_step.run_step(rt, body)
        except RuntimeError:
            bulk_step.run_step(rt, body)  # the host delivers the same step again

    take_steps(rt, on_step=step)
    done = read_op(rt, op["id"])
    assert done["counts"] == {"replayed": 8} and crashes["left"] == 0
    assert sorted(json.loads(b)["id"] for b in drain_raw(rt, rt.settings.jobs_queue)) == sorted(
        f"flush-{i:02d}" for i in range(8)
    ), "each sent once"
    assert rt.entry_index.page("poisoned", size=100) == []
    assert {r.name for r in rt.entry_index.page("replayed", size=100)} == set(names)


def test_a_step_paces_its_entries_at_the_rate(rt: Runtime) -> None:
    names = [poisoned_noop(rt, f"pace-{i:02d}") for i in range(10)]
    bulk.start(rt, "replay", "t", names=names, rate_per_s=20)  # 10 entries: one step of 0.45 s at least
    started = rt.monotonic()
    assert take_steps(rt) == 1
    assert rt.monotonic() - started >= 9 / 20


def test_a_step_over_its_time_budget_leaves_the_rest_to_the_next_step(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [poisoned_noop(rt, f"budget-{i}") for i in range(3)]
    monkeypatch.setattr(bulk_step, "STEP_BUDGET_S", 0.0)  # a store slower than any rate: one entry a step
    op = bulk.start(rt, "replay", "t", names=names, rate_per_s=0)
    assert take_steps(rt) == 3
    done = read_op(rt, op["id"])
    assert done["status"] == "done" and done["counts"] == {"replayed": 3} and done["done"] == 3
    assert queue_length(rt, rt.settings.jobs_queue) == 3
    purge = bulk.start(rt, "delete", "t", states=["replayed"], rate_per_s=0)
    assert take_steps(rt) == 4, "three cut steps over the index, then one that finds none"
    assert read_op(rt, purge["id"])["counts"] == {"deleted": 3}


def test_a_console_replay_of_ten_ids_costs_five_requests_a_job_and_a_few(
    rt: Runtime, storage_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = [poisoned_noop(rt, f"ten-{i}") for i in range(10)]
    ids = [n.split("/")[1] for n in names]
    listed_before = sum(rt.entry_index.counts().values())  # the page's counts (as the console shows them)
    sent = storage_backend.record_requests(monkeypatch)
    answer = actions.replay_batch(rt, ids, 20, "alice", names)
    seen = sent()
    monkeypatch.undo()
    assert answer == {"replayed": ids, "skipped": [], "not_found": []}
    # per job: entry GET, record GET, record PUT, message, entry PUT; then the entry rows (upsert,
    # delete), the job rows, the counters (a query and a transaction) and the audit row
    assert len(seen) <= 5 * 10 + 6, sorted(seen)
    assert sum(rt.entry_index.counts().values()) == listed_before - 10
    assert {r.name for r in rt.entry_index.page("replayed", size=100)} == set(names)
    assert rt.entry_index.page("poisoned", size=100) == []
    assert {r.status for r in rt.job_index.page(id_prefix="ten-", size=100).rows} == {"queued"}
    record = rt.ledger.get(ids[0])
    assert record is not None and record.data["replayed_by"] == "alice"


def test_the_admin_purge_dry_run_starts_the_purge_operation_and_lists_nothing(
    rt: Runtime, storage_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    import azure.functions as func

    from shared.interfaces import api

    names = [poisoned_noop(rt, f"dry-{i}") for i in range(3)]
    monkeypatch.setattr(api, "get_runtime", lambda: rt)
    sent = storage_backend.record_requests(monkeypatch)
    body = json.dumps({"older_than_days": 0, "dry_run": True}).encode()
    answer = api.purge_poison(func.HttpRequest("POST", "http://h/api/poison/purge", body=body))
    seen = sent()
    assert answer.status_code == 202, answer.get_body()
    started = json.loads(answer.get_body())
    assert started["dry_run"] is True
    assert len(seen) <= 3 and not any(r.startswith("GET") for r in seen), seen  # document, message, audit
    take_steps(rt)
    assert read_op(rt, started["op"])["counts"] == {"counted": 3}
    assert all(rt.archive.read(n) is not None for n in names), "a dry run deletes nothing"
