"""The poison handler and operator tools, on the in-memory account and on Azurite (a replay killed
half-way runs the CLI as a process: Azurite only)."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from devstack.azurite import Azurite
from shared import poison
from shared.pipeline.processing import process_message
from shared.runtime.wiring import Runtime
from tests.integration.backends import Backend
from tests.integration.effects import count_effects
from tests.integration.helpers import message, queue_length, runtime_for
from tests.integration.ops_helpers import paced_runtime, read_op, take_steps

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def rt(storage_backend: Backend) -> Runtime:
    return paced_runtime(storage_backend, MAX_ATTEMPTS="3")


@pytest.fixture
def azurite_rt(azurite: Azurite) -> Runtime:
    return runtime_for(azurite, MAX_ATTEMPTS="3")


def run_poison_trigger(rt: Runtime) -> int:
    """What the host does for handle_poison: receive each poison message, call, delete."""
    client = rt.account.raw_queue(rt.settings.poison_queue)
    handled = 0
    while True:
        batch = list(client.receive_messages(max_messages=32, visibility_timeout=60))
        if not batch:
            return handled
        for msg in batch:
            body = base64.b64decode(msg.content)
            poison.handle_poison_message(message(body, msg.dequeue_count, msg.id), rt)
            client.delete_message(msg)
            handled += 1


def drain_jobs(rt: Runtime) -> int:
    """What the host does for process_job, until the queue is empty."""
    client = rt.account.raw_queue(rt.settings.jobs_queue)
    done = 0
    while True:
        batch = list(client.receive_messages(max_messages=32, visibility_timeout=60))
        if not batch:
            return done
        for msg in batch:
            process_message(message(base64.b64decode(msg.content), msg.dequeue_count, msg.id), rt)
            client.delete_message(msg)
            done += 1


GARBAGE = [
    b"",
    b"not base64 and not json",
    b"\xff\xfe\xfd\x00\x01",
    b'{"id": ',
    b"[]",
    b"null",
    json.dumps({"id": "../../etc", "kind": "noop"}).encode(),
    json.dumps({"id": "ok-id", "kind": 5}).encode(),
    b"{" * 5000,
    os.urandom(48_000),
]


@pytest.mark.parametrize("body", GARBAGE, ids=[f"garbage{i}" for i in range(len(GARBAGE))])
def test_poison_handler_survives_garbage(rt: Runtime, body: bytes) -> None:
    poison.handle_poison_message(message(body), rt)  # must not raise
    archive = rt.account.blobs(rt.settings.poison_archive_container)
    names = [b.name for page in archive.pages() for b in page if not b.name.startswith("reasons/")]
    assert len(names) == 1
    entry = json.loads(archive.read(names[0]))
    assert base64.b64decode(entry["body_b64"]) == body
    assert entry["reason"]


def test_poisoned_job_is_archived_with_its_reason_and_history(rt: Runtime) -> None:
    process_message(message({"id": "p1", "kind": "fault", "payload": {"permanent": True}}), rt)
    assert run_poison_trigger(rt) == 1
    [entry] = poison.list_poisoned(rt)
    assert entry.job_id == "p1" and entry.reason.startswith("bad_input_data:") and entry.attempts == 1
    record = rt.ledger.get("p1")
    assert record is not None and record.status == "poisoned"


def test_host_poisoned_job_gets_the_last_error_as_reason(rt: Runtime) -> None:
    body = {"id": "p2", "kind": "fault", "payload": {"crash": True}}
    with pytest.raises(RuntimeError):
        process_message(message(body), rt)
    # the host then moves the body to -poison after maxDequeueCount failures:
    poison.handle_poison_message(message(body), rt)
    [entry] = poison.list_poisoned(rt)
    assert "maxDequeueCount" in entry.reason and "RuntimeError: fault: unexpected crash" in entry.reason
    assert rt.ledger.get("p2").status == "poisoned"  # type: ignore[union-attr]


def test_copy_of_a_completed_job_does_not_unmark_it(rt: Runtime) -> None:
    body = {"id": "p3", "kind": "noop", "payload": {}}
    process_message(message(body), rt)
    poison.handle_poison_message(message(body), rt)
    assert rt.ledger.get("p3").status == "completed"  # type: ignore[union-attr]
    assert poison.list_poisoned(rt) == []
    assert poison.list_poisoned(rt, include_done=True)[0].state == "duplicate_of_completed"


def poison_many(rt: Runtime, count: int, marker: str) -> list[str]:
    ids = [f"r{i:03d}-{uuid.uuid4().hex[:6]}" for i in range(count)]
    for job_id in ids:
        payload = {"fail_unless_blob": marker, "effect": True}
        process_message(message({"id": job_id, "kind": "fault", "payload": payload}), rt)
    assert run_poison_trigger(rt) == count
    return ids


def effects_per_job(rt: Runtime) -> dict[str, int]:
    """Executions per job that reached the side effect; none may be a repeat."""
    counted = count_effects(rt.account.blobs(rt.settings.results_container))
    assert sum(counted.repeats.values()) == 0
    assert counted.applied == counted.runs
    return dict(counted.runs)


def test_replay_moves_each_job_once_at_the_rate_limit(rt: Runtime) -> None:
    ids = poison_many(rt, 100, "fix-1")
    dry = poison.replay_jobs(rt, None, dry_run=True, rate_per_s=1000)
    assert len(dry.replayed) == 100 and queue_length(rt, rt.settings.jobs_queue) == 0
    rt.account.blobs(rt.settings.results_container).write("fix-1", b"fixed", overwrite=False)
    started = rt.monotonic()
    report = poison.replay_jobs(rt, None, rate_per_s=40)
    elapsed = rt.monotonic() - started
    assert sorted(report.replayed) == sorted(ids)
    assert elapsed >= 99 / 40  # the rate limit held
    assert queue_length(rt, rt.settings.jobs_queue) == 100
    assert drain_jobs(rt) == 100
    assert effects_per_job(rt) == dict.fromkeys(ids, 1)
    assert all(rt.ledger.get(i).status == "completed" for i in ids)  # type: ignore[union-attr]
    again = poison.replay_jobs(rt, None, rate_per_s=1000)  # nothing left to replay
    assert again.replayed == []


def test_replay_of_selected_ids_skips_completed_and_unknown(rt: Runtime) -> None:
    ids = poison_many(rt, 3, "fix-2")
    rt.account.blobs(rt.settings.results_container).write("fix-2", b"fixed", overwrite=False)
    rt.ledger.write(ids[0], rt.ledger.get(ids[0]), lambda prev: {**(prev or {}), "status": "completed"})
    report = poison.replay_jobs(rt, [ids[0], ids[1], "nope"], rate_per_s=1000)
    assert (
        report.skipped_completed == [ids[0]] and report.replayed == [ids[1]] and report.not_found == ["nope"]
    )


@pytest.mark.integration
def test_replay_killed_half_way_and_run_again_loses_nothing(azurite_rt: Runtime, azurite: Azurite) -> None:
    rt = azurite_rt
    ids = poison_many(rt, 100, "fix-3")
    rt.account.blobs(rt.settings.results_container).write("fix-3", b"fixed", overwrite=False)
    s = rt.settings
    env = {
        **os.environ,
        "AzureWebJobsStorage": azurite.connection_string,
        "JOBS_QUEUE": s.jobs_queue,
        "LEDGER_CONTAINER": s.ledger_container,
        "RESULTS_CONTAINER": s.results_container,
        "PAYLOADS_CONTAINER": s.payloads_container,
        "POISON_ARCHIVE_CONTAINER": s.poison_archive_container,
        "ENABLE_TEST_KINDS": "1",
        "PYTHONPATH": REPO,
    }
    cmd = [
        sys.executable,
        "-m",
        "shared.interfaces.cli",
        "poison",
        "replay",
        "--all",
        "--here",
        "--rate",
        "25",
    ]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while queue_length(rt, s.jobs_queue) < 30 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    moved = queue_length(rt, s.jobs_queue)
    assert 0 < moved < 100, moved  # it really was interrupted half-way
    second = subprocess.run(
        [*cmd[:-2], "--rate", "200"], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert second.returncode == 0, second.stderr
    drain_jobs(rt)
    assert effects_per_job(rt) == dict.fromkeys(ids, 1)
    assert all(rt.ledger.get(i).status == "completed" for i in ids)  # type: ignore[union-attr]
    assert poison.list_poisoned(rt) == []


def purged(rt: Runtime, days: float, dry_run: bool = False) -> dict[str, int]:
    """Start the purge as every caller does, carry out its steps here, and return its counts."""
    op = poison.start_purge(rt, days, "t", dry_run=dry_run)
    take_steps(rt)
    return dict(read_op(rt, op["id"])["counts"])


def test_purge_removes_old_archive_entries(rt: Runtime) -> None:
    poison.handle_poison_message(message(b"junk"), rt)
    assert purged(rt, 1.0) == {}
    assert purged(rt, 0.0, dry_run=True) == {"counted": 1}
    assert len(poison.list_poisoned(rt, include_done=True)) == 1
    assert purged(rt, 0.0) == {"purged": 1}
    assert poison.list_poisoned(rt, include_done=True) == []


def put_poison(rt: Runtime, body: bytes) -> None:
    """A body on the poison queue, as the host moves it there (base64 of what it received)."""
    rt.account.raw_queue(rt.settings.poison_queue).send_message(base64.b64encode(body).decode("ascii"))


def test_the_sweeper_archives_only_what_the_host_will_not_hand_over(
    rt: Runtime, storage_backend: Backend
) -> None:
    """A `-poison` message dequeued maxDequeueCount times (its handler kept failing) is never handed
    to handle_poison again: the sweeper archives it. One dequeued fewer times is left to the trigger."""
    queue = rt.account.raw_queue(rt.settings.poison_queue)
    body = json.dumps({"id": "sw1", "kind": "noop", "payload": {}}).encode()
    put_poison(rt, body)
    assert poison.sweep(rt) == 0, "a fresh message is the trigger's"
    for _ in range(rt.settings.max_dequeue_count):
        assert len(list(queue.receive_messages(max_messages=1, visibility_timeout=1))) == 1
        storage_backend.wait(1.5)  # the failed handler's lease ends: the message is back
    assert [m.dequeue_count for m in queue.peek_messages(max_messages=32)] == [rt.settings.max_dequeue_count]
    assert poison.sweep(rt) == 1
    assert queue_length(rt, rt.settings.poison_queue) == 0
    [entry] = poison.list_poisoned(rt)
    assert entry.job_id == "sw1" and entry.reason.startswith("the host moved it after maxDequeueCount")
    assert rt.ledger.get("sw1").status == "poisoned"  # type: ignore[union-attr]


def test_peek_lists_what_waits_on_the_poison_queue_without_taking_it(rt: Runtime) -> None:
    put_poison(rt, json.dumps({"id": "pk1", "kind": "noop"}).encode())
    put_poison(rt, b"\xff not a job")
    peeked = poison.peek_poison_queue(rt)
    assert [(p["job_id"], p["dequeue_count"]) for p in peeked] == [("pk1", 0), (None, 0)]
    assert queue_length(rt, rt.settings.poison_queue) == 2 and poison.list_poisoned(rt) == []


def test_a_copy_of_a_job_whose_claim_is_live_is_sent_back_for_a_recheck(rt: Runtime) -> None:
    from datetime import timedelta

    from shared.core.envelope import isoformat, utcnow

    lease = isoformat(utcnow() + timedelta(minutes=5))
    rt.ledger.create(
        "lc1", {"id": "lc1", "status": "in_progress", "attempt": 0, "owner": "other", "lease_until": lease}
    )
    poison.handle_poison_message(message({"id": "lc1", "kind": "noop", "payload": {}}), rt)
    [entry] = poison.list_poisoned(rt, include_done=True)
    assert entry.state == "rechecked" and rt.ledger.get("lc1").data["owner"] == "other"  # type: ignore[union-attr]
    assert queue_length(rt, rt.settings.jobs_queue) == 1, "sent back to the jobs queue"
    assert rt.account.raw_queue(rt.settings.jobs_queue).peek_messages() == [], (
        "invisible until the claim ends"
    )


def test_unpark_says_when_its_parked_message_was_taken_or_gone(rt: Runtime) -> None:
    from shared.interfaces.console import actions

    for job_id in ("up1", "up2"):
        process_message(message({"id": job_id, "kind": "fault", "payload": {"permanent": True}}), rt)
    assert run_poison_trigger(rt) == 2
    names = sorted(e.name for e in poison.list_poisoned(rt))
    assert actions.park(rt, names, "t")["parked"] == names
    parked = rt.account.raw_queue(rt.settings.parked_queue)
    taken = list(parked.receive_messages(max_messages=1, visibility_timeout=30))  # someone took one
    assert len(taken) == 1
    answer = actions.unpark(rt, names, "t")
    assert answer["unparked"] == names
    notes = list(answer["notes"].values())
    assert len(notes) == 1 and notes[0].startswith("its parked message could not be deleted"), notes
    parked.delete_message(taken[0])
    assert queue_length(rt, rt.settings.parked_queue) == 0
    assert sorted(e.name for e in poison.list_poisoned(rt)) == names, "listed again"
