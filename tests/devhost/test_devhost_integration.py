"""devhost against a real Azurite: queue trigger semantics, HTTP, timers, competing instances.

The sample app (sample_app/host.json): batchSize 4, maxDequeueCount 3, visibilityTimeout 2 s,
maxPollingInterval 1 s. Each test has its own queue and record file.
"""

from __future__ import annotations

import base64
import itertools
import json
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from devhost_support import SAMPLE_APP, Scenario, queue_exists, queue_is_empty, settled_counts, wait_for

from devhost.queue_ops import delete_message

pytestmark = pytest.mark.integration

VISIBILITY_TIMEOUT = 2.0
MAX_DEQUEUE = 3
TIMESTAMP_RESOLUTION = 1.0  # Azurite keeps whole seconds


def b64(command: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(command).encode()).decode()


def test_success_deletes_message(scenario: Scenario) -> None:
    host = scenario.start()  # the queue does not exist yet: the listener must not create it
    q = scenario.queue(scenario.jobs_queue)
    time.sleep(0.5)
    assert not queue_exists(q)
    q.create_queue()
    q.send_message(b64({"action": "ok", "n": 1}))
    end = wait_for(lambda: scenario.records("process_job", "end"), 10, "the call to finish")
    start = scenario.records("process_job", "start")[0]
    assert start["dequeue_count"] == 1 and start["tz"] == "UTC"
    assert json.loads(start["body"]) == {"action": "ok", "n": 1}
    assert end[0]["id"] == start["id"]
    wait_for(lambda: queue_is_empty(q), 10, "the message to be deleted")
    stats = wait_for(
        lambda: (s := host.stats())["queues"][scenario.jobs_queue]["deletes"] == 1 and s, 5, "stats"
    )
    counts = stats["queues"][scenario.jobs_queue]
    assert (counts["invocations"], counts["successes"], counts["failures"]) == (1, 1, 0)
    assert host.log().count("does not exist (yet)") == 2  # logged once per queue, not per poll
    assert host.stop() == 0


def test_failing_message_retries_then_poison(scenario: Scenario) -> None:
    poison = f"{scenario.jobs_queue}-poison"
    scenario.settings["POISON_WATCH_QUEUE"] = poison  # the async poison handler consumes the copy
    host = scenario.start()
    q = scenario.queue(scenario.jobs_queue)
    q.create_queue()
    raw = b64({"action": "fail", "job": "j-1"})
    original = q.send_message(raw)
    handled = wait_for(lambda: scenario.records("handle_poison"), 20, "the poison handler")
    calls = scenario.records("process_job", "start")
    assert [c["dequeue_count"] for c in calls] == [1, 2, 3]
    assert {c["id"] for c in calls} == {original.id}
    assert len({c["pop_receipt"] for c in calls}) == 3
    gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(calls)]
    assert all(g >= VISIBILITY_TIMEOUT - TIMESTAMP_RESOLUTION for g in gaps), gaps
    assert handled[0]["id"] != original.id  # a new message in <queue>-poison
    assert handled[0]["body"] == json.dumps({"action": "fail", "job": "j-1"})
    assert handled[0]["dequeue_count"] == 1
    wait_for(lambda: queue_is_empty(q), 5, "the original to be deleted")
    counts = settled_counts(host, scenario.jobs_queue, "poison_moves", 1)
    assert (counts["failures"], counts["releases"], counts["poison_moves"]) == (3, 2, 1)
    time.sleep(1.5)
    assert len(scenario.records("process_job")) == 3  # never called again
    assert host.stop() == 0


def test_undecodable_message_goes_to_poison_without_call(scenario: Scenario) -> None:
    q = scenario.queue(scenario.jobs_queue)
    q.create_queue()
    original = q.send_message("this is not base64 {!}")
    host = scenario.start()
    poison = scenario.queue(f"{scenario.jobs_queue}-poison")
    copies = wait_for(
        lambda: queue_exists(poison) and list(poison.peek_messages(max_messages=5)), 10, "poison copy"
    )
    assert copies[0].content == "this is not base64 {!}"  # raw text copied
    assert copies[0].id != original.id
    wait_for(lambda: queue_is_empty(q), 5, "the original to be deleted")
    assert scenario.records("process_job") == []
    counts = settled_counts(host, scenario.jobs_queue, "poison_moves", 1)
    assert (counts["undecodable"], counts["poison_moves"], counts["invocations"]) == (1, 1, 0)
    assert host.stop() == 0


def test_dequeue_count_above_max_goes_to_poison_without_call(scenario: Scenario) -> None:
    q = scenario.queue(scenario.jobs_queue)
    q.create_queue()
    raw = b64({"action": "ok", "job": "over"})
    q.send_message(raw)
    for _ in range(MAX_DEQUEUE):  # someone else dequeued it 3 times and let the lease expire
        got = wait_for(lambda: list(q.receive_messages(visibility_timeout=1, max_messages=1)), 5, "receive")
        last_id = got[0].id
    time.sleep(1.2)
    host = scenario.start()
    poison = scenario.queue(f"{scenario.jobs_queue}-poison")
    copies = wait_for(lambda: queue_exists(poison) and list(poison.peek_messages()), 10, "poison copy")
    assert copies[0].content == raw and copies[0].id != last_id
    wait_for(lambda: queue_is_empty(q), 5, "the original to be deleted")
    assert scenario.records("process_job") == []
    assert settled_counts(host, scenario.jobs_queue, "poison_moves", 1)["poison_moves"] == 1
    assert host.stop() == 0


def test_long_run_is_renewed_not_redelivered_then_deleted(scenario: Scenario) -> None:
    q = scenario.queue(scenario.jobs_queue)
    q.create_queue()
    host = scenario.start(env={"DEVHOST_MESSAGE_LEASE_SECONDS": "4"})
    q.send_message(b64({"action": "sleep", "seconds": 9}))
    wait_for(lambda: scenario.records("process_job", "end"), 20, "the long call to finish")
    wait_for(lambda: queue_is_empty(q), 5, "the message to be deleted")
    time.sleep(1.5)
    starts = scenario.records("process_job", "start")
    assert len(starts) == 1, starts  # a 4 s lease without renewal would have redelivered it
    counts = settled_counts(host, scenario.jobs_queue, "deletes", 1)
    assert counts["renewals"] >= 3 and counts["renewal_errors"] == 0
    assert counts["deletes"] == 1 and counts["deletes_ignored"] == 0
    assert host.stop() == 0


def test_delete_with_stale_pop_receipt_is_recognised_by_error_code(scenario: Scenario) -> None:
    q = scenario.queue(scenario.jobs_queue)
    q.create_queue()
    q.send_message(b64({"action": "ok"}))
    msg = next(iter(q.receive_messages(visibility_timeout=30)))
    updated = q.update_message(msg.id, msg.pop_receipt, visibility_timeout=30)  # receipt changes
    assert delete_message(q, msg.id, msg.pop_receipt) is False  # 400 PopReceiptMismatch: ignored
    assert delete_message(q, msg.id, updated.pop_receipt) is True
    assert delete_message(q, msg.id, updated.pop_receipt) is False  # 404 MessageNotFound: ignored
    missing = scenario.queue(f"{scenario.jobs_queue}-missing")
    assert delete_message(missing, msg.id, updated.pop_receipt) is False  # 404 QueueNotFound: ignored


def test_two_instances_process_each_message_once(scenario: Scenario) -> None:
    q = scenario.queue(scenario.jobs_queue)
    q.create_queue()
    a = scenario.start(instance="a")
    b = scenario.start(instance="b")
    for i in range(20):  # 1 s each: one host alone needs ~4 s, while the other polls at least every 1 s
        q.send_message(b64({"action": "sleep", "seconds": 1.0, "n": i}))
    wait_for(lambda: len(scenario.records("process_job", "end")) >= 20, 30, "20 calls")
    wait_for(lambda: queue_is_empty(q), 10, "all messages deleted")
    time.sleep(1.0)
    starts = scenario.records("process_job", "start")
    numbers = sorted(json.loads(s["body"])["n"] for s in starts)
    assert numbers == list(range(20))  # each exactly once
    assert all(s["dequeue_count"] == 1 for s in starts)
    by_pid = {s["pid"] for s in starts}  # the functions run in each host's worker process
    assert by_pid == {a.stats()["worker"]["pid"], b.stats()["worker"]["pid"]}, "both should have taken work"
    total_deletes = sum(h.stats()["queues"][scenario.jobs_queue]["deletes"] for h in (a, b))
    assert total_deletes == 20
    assert a.stop() == 0 and b.stop() == 0


def test_http_routes_output_binding_stats_and_timer(scenario: Scenario) -> None:
    scenario.settings["TICK_SCHEDULE"] = "*/1 * * * * *"
    host = scenario.start("--count-requests")
    assert host.functions == ["process_job", "handle_poison", "job_result", "submit_job", "boom", "tick"]
    status, body = host.get("/api/jobs/abc-1/result?x=1")
    assert status == 200
    assert json.loads(body) == {"id": "abc-1", "params": {"x": "1"}, "method": "GET"}
    assert host.get("/api/nothing/here")[0] == 404
    assert host.post("/api/jobs/abc-1/result", b"")[0] == 405
    status, body = host.get("/api/boom")
    assert status == 500 and b"ValueError" in body
    # POST /api/jobs writes to the jobs queue through a queue output binding; process_job runs it.
    q = scenario.queue(scenario.jobs_queue)
    q.create_queue()
    assert host.post("/api/jobs", json.dumps({"action": "ok", "via": "http"}).encode())[0] == 202
    done = wait_for(lambda: scenario.records("process_job", "start"), 10, "the HTTP-submitted job")
    assert json.loads(done[0]["body"]) == {"action": "ok", "via": "http"}
    ticks = wait_for(
        lambda: len(scenario.records("tick")) >= 2 and scenario.records("tick"), 6, "two timer ticks"
    )
    assert all(t["past_due"] is False for t in ticks)
    stats = host.stats()
    assert stats["instance_id"] == host.log_path.stem
    assert stats["http"]["job_result"]["requests"] == 1
    assert stats["http"]["boom"]["errors"] == 1
    assert stats["timers"]["tick"]["runs"] >= 2
    requests = stats["storage_requests"]
    assert requests["queue"]["GET"] > 0 and requests["queue"]["POST"] >= 1
    assert host.get("/_devhost/health")[0] == 200
    assert host.stop() == 0


def test_sigterm_waits_for_in_flight_invocation(scenario: Scenario) -> None:
    q = scenario.queue(scenario.jobs_queue)
    q.create_queue()
    host = scenario.start()
    q.send_message(b64({"action": "sleep", "seconds": 3}))
    wait_for(lambda: scenario.records("process_job", "start"), 10, "the call to start")
    host.proc.send_signal(signal.SIGTERM)
    assert host.proc.wait(20) == 0
    assert scenario.records("process_job", "end"), "the in-flight call finished before exit"
    assert queue_is_empty(q)


def test_function_timeout_counts_as_failure(scenario: Scenario) -> None:
    app = scenario.copy_app(functionTimeout="00:00:02", maxDequeueCount=1)
    q = scenario.queue(scenario.jobs_queue)
    q.create_queue()
    host = scenario.start(app_dir=app)
    raw = b64({"action": "sleep", "seconds": 4})
    q.send_message(raw)
    poison = scenario.queue(f"{scenario.jobs_queue}-poison")
    copies = wait_for(lambda: queue_exists(poison) and list(poison.peek_messages()), 10, "poison copy")
    assert copies[0].content == raw
    start = scenario.records("process_job", "start")
    assert len(start) == 1
    counts = settled_counts(host, scenario.jobs_queue, "poison_moves", 1)
    assert (counts["timeouts"], counts["failures"], counts["poison_moves"]) == (1, 1, 1)
    assert counts["in_flight"] == 0
    assert "Timeout value of 00:00:02 exceeded by function 'Functions.process_job'" in host.log()
    time.sleep(max(0.0, start[0]["time"] + 4 + 1.0 - time.time()))
    assert not scenario.records("process_job", "end"), "the timed-out call was killed with its worker"
    assert host.stop() == 0


def test_timeout_restarts_the_worker_and_fails_its_other_invocations(scenario: Scenario) -> None:
    """Like the real host: the worker process is restarted; every invocation in it fails."""
    app = scenario.copy_app(functionTimeout="00:00:02")
    q = scenario.queue(scenario.jobs_queue)
    q.create_queue()
    host = scenario.start(app_dir=app)
    first_pid = host.stats()["worker"]["pid"]
    # "slow" passes its 2 s timeout at t=2 and would write its end record at t=3. "other" is sent
    # at t=1 through the HTTP output binding (which wakes the listener) and runs t=1 to t=2.5: in
    # flight at the restart, within its own timeout. Both sleep on their first delivery only.
    q.send_message(b64({"action": "sleep", "seconds": 3, "first_delivery_only": True, "name": "slow"}))
    slow_start = wait_for(lambda: scenario.records("process_job", "start"), 10, "slow to start")[0]
    time.sleep(max(0.0, slow_start["time"] + 1.0 - time.time()))
    other = {"action": "sleep", "seconds": 1.5, "first_delivery_only": True, "name": "other"}
    assert host.post("/api/jobs", json.dumps(other).encode())[0] == 202
    ends = wait_for(
        lambda: len(e := scenario.records("process_job", "end")) >= 2 and e, 20, "both redelivered"
    )
    wait_for(lambda: queue_is_empty(q), 5, "both deleted")
    starts = scenario.records("process_job", "start")
    for name in ("slow", "other"):
        runs = [s for s in starts if json.loads(s["body"])["name"] == name]
        assert [r["dequeue_count"] for r in runs] == [1, 2]  # failed once, came back with + 1
        assert runs[0]["pid"] == first_pid and runs[1]["pid"] != first_pid  # a new worker process
    assert sorted(e["dequeue_count"] for e in ends) == [2, 2]
    # The slow call would have written its end record 3 s after it started: it never does.
    time.sleep(max(0.0, slow_start["time"] + 3 + 1.0 - time.time()))
    assert [e["dequeue_count"] for e in scenario.records("process_job", "end")] == [2, 2]
    counts = settled_counts(host, scenario.jobs_queue, "deletes", 2)
    stats = host.stats()
    assert (counts["timeouts"], counts["failures"], counts["releases"], counts["deletes"]) == (1, 2, 2, 2)
    worker = stats["worker"]
    assert (worker["restarts"], worker["timeouts"], worker["crashes"]) == (1, 1, 0)
    assert worker["pid"] != first_pid
    log = host.log()
    assert "Timeout value of 00:00:02 exceeded by function 'Functions.process_job'" in log
    assert "2 invocation(s) in flight in it fail (1 timed out)" in log
    assert "WorkerProcessRestarted" in log
    assert host.stop() == 0


def test_shared_thread_pool_limits_concurrency(scenario: Scenario) -> None:
    """PYTHON_THREADPOOL_THREAD_COUNT (from local.settings.json) sizes the worker's one pool."""
    app = scenario.copy_app()
    (app / "local.settings.json").write_text(json.dumps({"Values": {"PYTHON_THREADPOOL_THREAD_COUNT": "2"}}))
    q = scenario.queue(scenario.jobs_queue)
    q.create_queue()
    for i in range(6):
        q.send_message(b64({"action": "overlap", "n": i}))
    host = scenario.start(app_dir=app)
    wait_for(lambda: len(scenario.records("process_job", "end")) == 6, 30, "six calls")
    entries = scenario.records("process_job", "overlap")
    assert len(entries) == 6
    assert max(e["running"] for e in entries) == 2  # 6 fetched (batch 4 + 2), 2 threads
    assert {e["threads"] for e in entries} == {"2"}  # the setting reached the worker's environment
    assert host.stats()["worker"]["threads"] == 2
    assert host.stop() == 0


def test_worker_that_dies_is_restarted(scenario: Scenario) -> None:
    q = scenario.queue(scenario.jobs_queue)
    q.create_queue()
    host = scenario.start()
    first_pid = host.stats()["worker"]["pid"]
    dying = q.send_message(b64({"action": "exit", "first_delivery_only": True}))
    wait_for(lambda: scenario.records("process_job", "end"), 20, "the message to come back and succeed")
    runs = scenario.records("process_job", "start")
    assert [r["dequeue_count"] for r in runs] == [1, 2] and {r["id"] for r in runs} == {dying.id}
    assert runs[0]["pid"] == first_pid and runs[1]["pid"] != first_pid
    second_pid = runs[1]["pid"]
    later = q.send_message(b64({"action": "ok"}))
    done = wait_for(
        lambda: [e for e in scenario.records("process_job", "end") if e["id"] == later.id], 10, "later"
    )
    assert done[0]["pid"] == second_pid
    # An HTTP request whose worker dies gets a 500; the next worker serves the next request.
    status, body = host.get("/api/boom?exit=1")
    assert status == 500 and b"WorkerProcessRestarted" in body
    assert host.get("/api/jobs/x/result")[0] == 200
    worker = host.stats()["worker"]
    assert (worker["restarts"], worker["crashes"], worker["timeouts"]) == (2, 2, 0)
    assert worker["pid"] not in (first_pid, second_pid)
    counts = settled_counts(host, scenario.jobs_queue, "deletes", 2)
    assert (counts["failures"], counts["releases"], counts["deletes"]) == (1, 1, 2)
    log = host.log()
    assert f"The worker process (pid {first_pid}) exited unexpectedly (exit code 3)" in log
    assert "1 invocation(s) in flight in it fail (0 timed out)" in log
    assert "exited unexpectedly (exit code 4)" in log
    assert host.stop() == 0


def test_missing_setting_fails_clearly_and_no_http(scenario: Scenario) -> None:
    env = scenario.env()
    del env["JOBS_QUEUE"]
    args = [sys.executable, "-m", "devhost", "--app-dir", str(SAMPLE_APP), "--no-http"]
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "devhost: error: function process_job: app setting 'JOBS_QUEUE'" in result.stderr
    host = scenario.start("--no-http")
    assert host.url == "none"
    assert host.stop() == 0


def test_writes_by_the_host_wake_listeners(scenario: Scenario) -> None:
    """Output-binding writes and poison moves end the writer's own listeners' backoff early."""
    app = scenario.copy_app(maxPollingInterval="00:00:30", maxDequeueCount=1)
    scenario.settings["POISON_WATCH_QUEUE"] = f"{scenario.jobs_queue}-poison"
    q = scenario.queue(scenario.jobs_queue)
    q.create_queue()
    scenario.queue(f"{scenario.jobs_queue}-poison").create_queue()
    host = scenario.start(app_dir=app)

    def both_sleeping_long(min_wait: float = 2.5) -> bool:
        queues = host.stats()["queues"]
        return all(queues[name]["next_poll_in_s"] >= min_wait for name in queues)

    # Wait until both listeners have backed off into a delay that has >= 2.5 s left.
    wait_for(both_sleeping_long, 20, "the listeners to back off", interval=0.2)
    posted = time.time()
    assert host.post("/api/jobs", json.dumps({"action": "fail"}).encode())[0] == 202
    handled = wait_for(lambda: scenario.records("handle_poison"), 10, "the poison handler")
    started = scenario.records("process_job", "start")[0]
    assert started["time"] - posted < 1.5, "the output binding write should wake process_job"
    assert handled[0]["time"] - started["time"] < 1.5, "the poison move should wake handle_poison"
    assert host.stop() == 0
