"""Benchmark of the limits across instances (issue 46) on the local stack: two host processes on
one Azurite, `http` jobs against one loopback downstream that records every call's start and end.

1. cost: storage requests of a permit's acquire + release against the same Azurite, counted at
   the client (20 jobs): one instance (its copy of the key's document current: the happy path)
   and two instances alternating (each finds the other's write: a read and a failed write more);
2. throughput: 40 jobs of 1 s put on the queue at once: the most calls in flight at the
   downstream, the time to the last call's end against the ideal 40 x 1 s / 4 = 10 s (target
   1.25x or less), and how soon a call starts after an earlier one ended (each start past the
   first 4 against the end that freed its permit: an upper bound of start-after-release, since the
   release follows the end);
3. faults: jobs of 2 s; kill -9 of one host (and its worker) while a call of its own is in
   flight, a fresh host started in its place; once 4 calls are in flight again and one of them is
   the other host's, SIGSTOP of that host (and its worker) for 90 s, then SIGCONT: the most in flight (target 4), the seconds until 4 are in flight again after
   each fault (every permit back: target 60 s or less), every job completed, calls per job.

    python -m bench.bench_limits [--quick] [--out bench/out/limits.json]   # JSON on stdout too
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from azure.storage.blob import ContainerClient
from azure.storage.queue import QueueClient

from bench.bench_host import (
    BENCH_QUEUES,
    Site,
    azurite_site,
    child_pids,
    envelope,
    make_app_dir,
    paused,
    percentile,
    prefill,
    snapshot,
    stop_hosts,
    wait_for,
)
from devstack.hostproc import REPO_ROOT, HostProcess
from shared.core.timers import system_clock
from shared.permits.decide import Ticket
from shared.permits.limit import Limit
from shared.permits.parked_messages import QueueParking
from shared.permits.service import Hold, Permits
from shared.permits.store import DocumentPermitStore
from shared.storage.azure_blobs import AzureBlobs
from shared.storage.azure_queues import AzureQueue
from shared.storage.blob_documents import BlobDocuments

LIMIT = 4
FREEZE_S = 90.0


class Downstream:
    """Answers 200 after `?ms=` milliseconds; notes each call's (start, end, key) and the most in flight."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float, str]] = []
        self.open: list[float] = []
        """Start times of the calls in flight."""
        self.open_jobs: dict[float, int] = {}
        """The `n` of each call in flight's body, by its start time."""
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                ms = float(parse_qs(urlsplit(self.path).query).get("ms", ["0"])[0])
                started = time.monotonic()
                with contextlib.suppress(ValueError, AttributeError, TypeError):
                    outer.open_jobs[started] = int(json.loads(raw or b"{}").get("n"))
                with outer.lock:
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                    outer.open.append(started)
                time.sleep(ms / 1000)
                with outer.lock:
                    outer.in_flight -= 1
                    outer.open.remove(started)
                    outer.open_jobs.pop(started, None)
                    outer.calls.append((started, time.monotonic(), self.headers.get("Idempotency-Key") or ""))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                return

        class Server(ThreadingHTTPServer):
            request_queue_size = 256
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, host: str, ms: int) -> str:
        return f"http://{host}:{self.port}/call?ms={ms}"

    def reset(self) -> None:
        with self.lock:
            self.calls.clear()
            self.max_in_flight = self.in_flight

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def downstream() -> Iterator[Downstream]:
    server = Downstream()
    try:
        yield server
    finally:
        server.stop()


def tree(host: HostProcess) -> list[int]:
    """The host process and its worker processes."""
    assert host.process is not None
    return [host.process.pid, *child_pids(host.process.pid)]


def signal_tree(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def job_status(host: HostProcess, job_id: str) -> str:
    try:
        with urllib.request.urlopen(f"{host.url}/api/jobs/{job_id}", timeout=30) as resp:
            return str(json.loads(resp.read())["status"])
    except urllib.error.HTTPError as exc:
        return f"http {exc.code}"


def wait_calls(ds: Downstream, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with ds.lock:
            if len({key for _, _, key in ds.calls}) >= count and ds.in_flight == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"{len(ds.calls)} calls of {count} after {timeout_s:.0f}s")


class _Requests:
    """Counts the responses of one client (the SDK's raw response hook)."""

    def __init__(self) -> None:
        self.count = 0

    def hook(self, response: Any) -> None:
        self.count += 1


class _NoTimers:
    def call_later(self, delay_s: float, fn: Callable[[], None]) -> _NoTimers:
        return self

    def cancel(self) -> None:
        return None


def cost(conn: str, jobs: int) -> dict[str, Any]:
    """Requests per acquire + release against the same Azurite, counted at the client: one
    instance (its copy of the key's document current) and two alternating (each finds it stale)."""
    counted = _Requests()
    container = ContainerClient.from_connection_string(conn, "bench-permits", raw_response_hook=counted.hook)
    queue = QueueClient.from_connection_string(conn, "bench-permits-parking")
    queue.create_queue()

    def instance() -> Permits:
        store = DocumentPermitStore(BlobDocuments(container), ensure=AzureBlobs(container).create)
        return Permits(store, QueueParking(AzureQueue(queue)), system_clock, _NoTimers())

    a, b = instance(), instance()
    limit = Limit("http:bench.example", LIMIT)
    figures: dict[str, Any] = {"jobs_each": jobs}
    for label, order in (("one_instance", (a, a)), ("two_instances_alternating", (a, b))):
        for warm in order:  # the container and each instance's copy exist
            hold = warm.acquire([limit], Ticket("warm", datetime.now(UTC), "warm"))
            assert isinstance(hold, Hold)
            hold.release()
        counted.count = 0
        for n in range(jobs):
            job = f"{label}-{n}"
            hold = order[n % 2].acquire([limit], Ticket(job, datetime.now(UTC), f"owner-{job}"))
            assert isinstance(hold, Hold)
            hold.release()
        figures[f"requests_per_job_{label}"] = round(counted.count / jobs, 2)
    figures["permit_requests_per_job"] = figures["requests_per_job_one_instance"]
    figures["target_permit_requests_per_job"] = 2
    return figures


def throughput(
    site: Site, hosts: list[HostProcess], ds: Downstream, jobs: int, timeout_s: float
) -> dict[str, Any]:
    ds.reset()
    texts = [
        envelope(f"tp-{i:04d}", "http", {"url": ds.url("127.0.0.1", 1000), "body": {"n": i}})
        for i in range(jobs)
    ]
    with paused(hosts):
        prefill(site.conn, site.queue, texts)
        released = time.monotonic()
    wait_calls(ds, jobs, timeout_s)
    calls = sorted(ds.calls)
    last_end = max(end for _, end, _ in calls)
    seconds = last_end - released
    ideal = jobs * 1.0 / LIMIT
    starts = [s for s, _, _ in calls]
    ends = sorted(e for _, e, _ in calls)
    gaps = [starts[k + LIMIT] - ends[k] for k in range(len(starts) - LIMIT)]
    statuses = Counter(job_status(hosts[0], f"tp-{i:04d}") for i in range(jobs))
    return {
        "jobs": jobs,
        "call_s": 1.0,
        "max_in_flight": ds.max_in_flight,
        "seconds_to_last_call_end": round(seconds, 2),
        "ideal_s": ideal,
        "ratio_to_ideal": round(seconds / ideal, 3),
        "target_ratio": 1.25,
        "start_after_end_p50_s": round(percentile(gaps, 50), 3),
        "start_after_end_p95_s": round(percentile(gaps, 95), 3),
        "start_after_end_max_s": round(max(gaps), 3) if gaps else 0.0,
        "calls": len(calls),
        "jobs_called_more_than_once": sum(1 for n in Counter(k for _, _, k in calls).values() if n > 1),
        "statuses": dict(statuses),
    }


def back_to_limit(ds: Downstream, since: float, timeout_s: float) -> float | None:
    """Seconds after `since` until the downstream serves LIMIT calls at once that all started
    after `since` (a killed or frozen host's calls end at the downstream, and are not counted)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = time.monotonic()
        with ds.lock:
            fresh = sum(1 for s in ds.open if s >= since)
        if fresh >= LIMIT:
            return round(now - since, 2)
        time.sleep(0.05)
    return None


def wait_for_a_call_of(host: HostProcess, site: Site, ds: Downstream, timeout_s: float) -> None:
    """Until a call in flight at the downstream belongs to a job claimed by `host`'s worker (the
    claim's owner, in the job's ledger record, names the worker's pid)."""
    ledger = ContainerClient.from_connection_string(site.conn, site.env["LEDGER_CONTAINER"])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = {str(pid) for pid in tree(host)}
        with ds.lock:
            jobs = list(ds.open_jobs.values())
        for n in jobs:
            with contextlib.suppress(Exception):
                record = json.loads(ledger.download_blob(f"ft-{n:04d}.json").readall())
                if str(record.get("owner", "")).split("/")[0].rsplit(":", 1)[-1] in pids:
                    return
        time.sleep(0.05)
    raise TimeoutError(f"no call of {host.instance_id} in flight after {timeout_s:.0f}s")


def duplicates(
    calls: Sequence[tuple[float, float, str]], per_key: Counter[str], killed_at: float, frozen_at: float
) -> dict[str, list[str]]:
    """The jobs the downstream saw more than once (the same Idempotency-Key), by why: their first
    call was in flight when a host was killed (its job is taken over and calls again: allowed, the
    same key) or frozen past its claim, or neither (a job called twice by a live host: a bug)."""
    out: dict[str, list[str]] = {"kill": [], "freeze": [], "other": []}
    for key in sorted(k for k, n in per_key.items() if n > 1):
        start, end, _ = min(c for c in calls if c[2] == key)
        why = "kill" if start <= killed_at < end else "freeze" if start <= frozen_at < end else "other"
        out[why].append(key)
    return out


def faults(
    site: Site, hosts: list[HostProcess], app_dir: Path, ds: Downstream, jobs: int, timeout_s: float
) -> tuple[dict[str, Any], list[HostProcess]]:
    ds.reset()
    first, second = hosts
    texts = [
        envelope(f"ft-{i:04d}", "http", {"url": ds.url("127.0.0.1", 2000), "body": {"n": i}})
        for i in range(jobs)
    ]
    prefill(site.conn, site.queue, texts)
    if back_to_limit(ds, time.monotonic(), 60) is None:
        raise TimeoutError("the downstream never saw 4 calls at once")
    wait_for_a_call_of(first, site, ds, 60)  # kill -9 mid-call: a call of its own is in flight
    killed_at = time.monotonic()
    signal_tree(tree(first), signal.SIGKILL)
    first.process = None
    if first.log_path is not None and first.log_path.exists():  # the replacement logs under its name
        first.log_path.rename(first.log_path.with_suffix(".killed.log"))
    (replacement,) = site.start_hosts(1, app_dir)
    kill_back = back_to_limit(ds, killed_at, 120)
    wait_for_a_call_of(second, site, ds, 60)  # SIGSTOP of a holder: a call of its own in flight
    frozen = tree(second)
    frozen_at = time.monotonic()
    signal_tree(frozen, signal.SIGSTOP)
    try:
        freeze_back = back_to_limit(ds, frozen_at, 120)
        time.sleep(max(0.0, frozen_at + FREEZE_S - time.monotonic()))
    finally:
        signal_tree(frozen, signal.SIGCONT)
    live = [second, replacement]
    deadline = time.monotonic() + timeout_s
    statuses: Counter[str] = Counter()
    while time.monotonic() < deadline:
        statuses = Counter(job_status(replacement, f"ft-{i:04d}") for i in range(jobs))
        if statuses.get("completed", 0) == jobs:
            break
        time.sleep(2)
    per_key = Counter(k for _, _, k in ds.calls)
    twice = duplicates(ds.calls, per_key, killed_at, frozen_at)
    return {
        "jobs": jobs,
        "call_s": 2.0,
        "max_in_flight": ds.max_in_flight,
        "seconds_to_4_in_flight_after_kill": kill_back,
        "seconds_to_4_in_flight_after_sigstop": freeze_back,
        "target_s": 60,
        "freeze_s": FREEZE_S,
        "statuses": dict(statuses),
        "completed": statuses.get("completed", 0),
        "jobs_called": len(per_key),
        "jobs_called_more_than_once": sum(1 for n in per_key.values() if n > 1),
        "called_again_after_a_call_in_flight_at_the_kill": twice["kill"],
        "called_again_after_a_call_in_flight_at_the_freeze": twice["freeze"],
        "called_twice_otherwise": twice["other"],
    }, live


def run(quick: bool, log_dir: Path, timeout_s: float) -> dict[str, Any]:
    limits = json.dumps({"localhost": None})
    with azurite_site(log_dir, "limits") as azurite, downstream() as ds:
        site = Site(azurite, "limits", log_dir).init(
            HTTP_ALLOWED_HOSTS=f"127.0.0.1:{ds.port},localhost:{ds.port}",
            HTTP_MAX_CONCURRENT_PER_HOST=str(LIMIT),
            HTTP_LIMITS_PER_HOST=limits,
        )
        app_dir = make_app_dir(Path(tempfile.mkdtemp(prefix="bench-limits-")), BENCH_QUEUES)
        hosts = site.start_hosts(2, app_dir)
        try:
            warm = [
                envelope(f"warm-{i}", "http", {"url": ds.url(h, 10)})
                for i, h in enumerate(["localhost", "127.0.0.1"] * 3)
            ]
            before = snapshot(hosts, site.queue)
            prefill(site.conn, site.queue, warm)
            wait_for(hosts, site.queue, "deletes", before.get("q.deletes", 0) + len(warm), timeout_s)
            report: dict[str, Any] = {"limit": LIMIT, "hosts": 2}
            report["cost"] = cost(site.conn, 20)
            report["throughput"] = throughput(site, hosts, ds, 40, timeout_s)
            if not quick:
                report["faults"], hosts = faults(site, hosts, app_dir, ds, 120, timeout_s)
        finally:
            stop_hosts([h for h in hosts if h.process is not None])
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="cost and throughput only (no faults)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "out" / "limits.json")
    parser.add_argument("--logs", type=Path, default=REPO_ROOT / "bench" / "out" / "logs")
    args = parser.parse_args(argv)
    report = run(args.quick, args.logs / time.strftime("limits-%Y%m%d-%H%M%S"), 600.0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
