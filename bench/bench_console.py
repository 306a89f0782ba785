"""Storage requests of the console on a real Azurite: counts, not timings.

- jobs page: requests for one snapshot of a ledger of N records (listing with metadata, 5,000 a
  request), and for a page turn within the snapshot's life;
- overview refresh: requests with K instances' counter blobs in the last hour;
- one message on the happy path (claim + complete): the counters and the listing metadata add
  nothing to it.

    python -m bench.bench_console [--jobs 10001] [--instances 3]   # a table, JSON on stdout
"""

from __future__ import annotations

import argparse
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import requests

from devstack.azurite import start_azurite
from shared import metrics, processing
from shared.console import queries
from shared.envelope import utcnow
from shared.jobs import noop
from tests.integration.helpers import message, runtime_for

_lock = threading.Lock()
_counts: Counter[str] = Counter()
_original_send = requests.Session.send


def _counting_send(
    self: requests.Session, request: requests.PreparedRequest, **kwargs: Any
) -> requests.Response:
    parts = urlsplit(str(request.url))
    kind = "list" if "comp=list" in parts.query else ("queue-props" if "comp=metadata" in parts.query else "")
    with _lock:
        _counts[f"{request.method} {kind}".strip()] += 1
    return _original_send(self, request, **kwargs)


@contextmanager
def counted() -> Iterator[Counter[str]]:
    """Count this process's storage requests (by method, listing, queue properties) in the block."""
    requests.Session.send = _counting_send  # type: ignore[method-assign]
    with _lock:
        _counts.clear()
    found: Counter[str] = Counter()
    try:
        yield found
    finally:
        requests.Session.send = _original_send  # type: ignore[method-assign]
        with _lock:
            found.update(_counts)


def _fill(rt: Any, jobs: int) -> None:
    now = utcnow().isoformat()

    def one(i: int) -> None:
        data = {
            "id": f"job-{i:06d}",
            "status": "completed",
            "kind": "noop",
            "created_at": now,
            "updated_at": now,
        }
        rt.ledger.create(data["id"], data)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(jobs)))


def measure(jobs: int, instances: int, log: Callable[[str], None]) -> dict[str, Any]:
    azurite = start_azurite()
    try:
        rt = runtime_for(azurite, handlers={"noop": noop.HANDLER})
        log(f"writing {jobs} ledger records ...")
        _fill(rt, jobs)
        container = rt.storage.container(rt.settings.ledger_container)
        with counted() as snapshot:
            rows = queries.SNAPSHOTS.rows(container, fresh=True)
        with counted() as page_turn:
            queries.paginate(queries.filter_rows(queries.SNAPSHOTS.rows(container), status="completed"), 7)
        assert len(rows) == jobs
        now = utcnow()
        for i in range(instances):
            recorder = metrics.Recorder()
            recorder.on_decision("completed", {"latency_s": 0.5})
            recorder.flush(rt.archive, f"bench-instance-{i}")
        with counted() as refresh:
            figures = queries.overview(rt)
        body = json.dumps(
            {"id": "one", "kind": "noop", "payload": {}, "created_at": now.isoformat()}
        ).encode()
        with counted() as happy:
            processing.process_message(message(body), rt)
        return {
            "jobs": jobs,
            "jobs_snapshot_requests": dict(snapshot),
            "jobs_snapshot_total": sum(snapshot.values()),
            "expected_listing_requests": queries.listing_requests(jobs),
            "page_turn_requests": sum(page_turn.values()),
            "instances": instances,
            "overview_refresh_requests": dict(refresh),
            "overview_refresh_total": sum(refresh.values()),
            "overview_documents_merged": figures["documents_merged"],
            "happy_path_message_requests": dict(happy),
            "happy_path_message_total": sum(happy.values()),
        }
    finally:
        azurite.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_001)
    parser.add_argument("--instances", type=int, default=3)
    args = parser.parse_args(argv)
    result = measure(args.jobs, args.instances, lambda text: print(text, flush=True))
    print(
        f"jobs page, snapshot of {args.jobs} records: {result['jobs_snapshot_total']} requests {result['jobs_snapshot_requests']}"
    )
    print(f"jobs page, page turn within the snapshot:    {result['page_turn_requests']} requests")
    print(
        f"overview refresh, {args.instances} instance blobs:       {result['overview_refresh_total']} requests {result['overview_refresh_requests']}"
    )
    print(
        f"one message, happy path (claim, complete):   {result['happy_path_message_total']} requests {result['happy_path_message_requests']}"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
