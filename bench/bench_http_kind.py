"""Benchmark of the `http` kind (the Async Caller) on the local host and a real Azurite.

A local downstream (127.0.0.1, a free port, allowed through HTTP_ALLOWED_HOSTS) answers every call
after a set latency. N `http` jobs are put on the queue while the host is paused, then the host is
released: jobs/s from release to the last delete, and storage requests per job as the host
counts them (idle polling subtracted; measured after the first sweep and a few warm-up jobs, as
the first job of a day also creates the jobs index's day table; the happy path is claim, result,
complete and the jobs index's entry, plus the receive share and the delete). Every call's Idempotency-Key is checked
to be the job's own and to be sent once.

    python -m bench.bench_http_kind [--jobs N] [--latency-ms MS] [--quick]   # JSON on stdout
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.bench_host import (
    BENCH_QUEUES,
    Site,
    azurite_site,
    envelope,
    make_app_dir,
    paused,
    per_message,
    prefill,
    settle_housekeeping,
    snapshot,
    stop_hosts,
    usage,
    wait_for,
)
from devstack.hostproc import REPO_ROOT

HAPPY_STORAGE_REQUESTS = 4
WARM_UP = 5
"""Jobs run before the measurement: the first job of a day also creates the jobs index's day table."""
"""claim (a conditional create), result (a blob), complete (a conditional replace), index entry."""


class Downstream:
    """A loopback HTTP service answering 200 after `latency_s`; counts keys."""

    def __init__(self, latency_s: float) -> None:
        self.keys: Counter[str] = Counter()
        lock = threading.Lock()
        keys = self.keys

        class _Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                with lock:
                    keys[self.headers.get("Idempotency-Key") or ""] += 1
                time.sleep(latency_s)
                body = b'{"ok": true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        class _Server(ThreadingHTTPServer):
            request_queue_size = 256  # the host opens up to 24 connections at once

        self.server = _Server(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def downstream(latency_s: float) -> Iterator[Downstream]:
    server = Downstream(latency_s)
    try:
        yield server
    finally:
        server.stop()


def run(jobs: int, latency_s: float, log_dir: Path, timeout_s: float) -> dict[str, Any]:
    batch = BENCH_QUEUES["batchSize"]
    with azurite_site(log_dir, "http") as azurite, downstream(latency_s) as service:
        allowed = f"127.0.0.1:{service.server.server_address[1]}"  # that port only
        site = Site(azurite, "httpk", log_dir).init(HTTP_ALLOWED_HOSTS=allowed)
        app_dir = make_app_dir(Path(tempfile.mkdtemp(prefix="bench-http-")), BENCH_QUEUES)
        (host,) = site.start_hosts(1, app_dir)
        try:
            housekeeping = settle_housekeeping(site, host)
            warm = snapshot([host], site.queue)  # the day's index table is created by the first job
            prefill(
                site.conn,
                site.queue,
                [envelope(f"warm-{i}", "http", {"url": service.url}) for i in range(WARM_UP)],
            )
            wait_for([host], site.queue, "deletes", warm.get("q.deletes", 0) + WARM_UP, timeout_s)
            wait_for([host], site.queue, "in_flight", 0, timeout_s)
            warm_up = usage(warm, snapshot([host], site.queue)).work_requests
            service.keys.clear()  # the measured jobs' calls only
            texts = [
                envelope(f"http-{i:06d}", "http", {"url": service.url, "body": {"n": i}}) for i in range(jobs)
            ]
            before = snapshot([host], site.queue)
            with paused([host]):
                prefill(site.conn, site.queue, texts)
            released = time.monotonic()
            wait_for([host], site.queue, "deletes", before.get("q.deletes", 0) + jobs, timeout_s)
            while len(service.keys) < jobs and time.monotonic() - released < timeout_s:
                time.sleep(0.05)  # a retried job (connection refused) is not done at its first delete
            wait_for([host], site.queue, "in_flight", 0, timeout_s)
            seconds = time.monotonic() - released
            time.sleep(0.3)
            used = usage(before, snapshot([host], site.queue))
        finally:
            stop_hosts([host])
    row = per_message(used, jobs, batch, HAPPY_STORAGE_REQUESTS + 1 + 1 / batch, "http happy path")
    storage = {k: v for k, v in row["per_message"].items() if k not in ("receive", "delete")}
    return {
        "jobs": jobs,
        "downstream_latency_s": latency_s,
        "seconds": round(seconds, 3),
        "jobs_per_s": round(jobs / seconds, 1),
        "calls": sum(service.keys.values()),
        "jobs_called": len(service.keys),
        "keys_sent_more_than_once": sum(1 for n in service.keys.values() if n > 1),
        "storage_requests_per_job_besides_queue": round(sum(storage.values()), 3),
        "target_storage_requests_per_job": HAPPY_STORAGE_REQUESTS,
        "requests": row,
        "housekeeping_requests": housekeeping,
        "warm_up": {"jobs": WARM_UP, "requests": warm_up},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--quick", action="store_true", help="60 jobs (smoke test)")
    parser.add_argument("--logs", type=Path, default=REPO_ROOT / "bench" / "out" / "logs")
    args = parser.parse_args(argv)
    jobs = 60 if args.quick else args.jobs
    result = run(jobs, args.latency_ms / 1000, args.logs / time.strftime("http-%Y%m%d-%H%M%S"), 600.0)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
