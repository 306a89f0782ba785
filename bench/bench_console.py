"""The console at production volume on a real Azurite: storage requests and milliseconds of every
page and operator action, with the indexes seeded directly (not through the queue).

Seeding, in the shapes the app writes:
- the jobs index: `--records` entities (default 1,000,000) over `--days` per-day tables, in entity
  group transactions of 100 (one request per 100 jobs), 2% poisoned with a reason code;
- the ledger: one record blob per job the pages open (the first page, the job page) and per
  archive entry replayed (the pages read the ledger by id only, never by listing);
- the poison archive index: `--entries` entities (default 100,000), listed; archive entry blobs
  and poisoned ledger records for the `--bulk` newest (replayed by the bulk operation) + 20.

Then, each counted by the requests this process sends (`counted`), timed on the wall clock:
overview, jobs page 1 and 50, each filter, a 24-hour creation window (and its next page), a job page,
poison page 1 (with the counts per reason code), a reason code's group, an error-text search (a rare
text: the scan's whole budget; a common one), replay 10 ids (an operation started: the app does the
work), a group's replay started, park / unpark / delete one, the audit page, and a bulk replay of `--bulk` entries
at `--rate`/s carried out by the op's steps here in-process, as the `run_op_step` trigger would.
Also the happy path: one message (claim, complete) with the jobs index on.

    python -m bench.bench_console [--records 1000000] [--entries 100000] [--bulk 10000] [--rate 200]
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests
from azure.core.exceptions import ServiceResponseError

from devstack.azurite import start_azurite
from shared import processing
from shared.console import actions, queries
from shared.entry_index import COUNT_PARTITION, shard_of
from shared.entry_index import entity_of as entry_entity
from shared.envelope import body_digest, isoformat, utcnow
from shared.job_index import entity_of as job_entity
from shared.jobs import noop
from shared.poison import bulk
from shared.poison.archive import entry_name, new_entry
from shared.runtime import Runtime
from tests.integration.helpers import message, runtime_for

_lock = threading.Lock()
_counts: Counter[str] = Counter()
_original_send = requests.Session.send
OUT = Path(__file__).resolve().parent / "out"


def _counting_send(
    self: requests.Session, request: requests.PreparedRequest, **kwargs: Any
) -> requests.Response:
    parts = urlsplit(str(request.url))
    kind = (
        "list"
        if "comp=list" in parts.query
        else ("table" if "/Tables" in parts.path or "(" in parts.path else "")
    )
    with _lock:
        _counts[f"{request.method} {kind}".strip()] += 1
    return _original_send(self, request, **kwargs)


@contextmanager
def counted() -> Iterator[Counter[str]]:
    """Count this process's storage requests (by method; listings and table calls apart) in the block."""
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


# -- seeding ----------------------------------------------------------------------------------


def _batches(items: list[dict[str, Any]], size: int = 100) -> Iterator[list[dict[str, Any]]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


SEED_THREADS = 2
"""Transactions in flight while seeding: Azurite (one Node thread) resets connections under more."""


def _submit(client: Any, chunk: list[dict[str, Any]], tries: int = 5) -> None:
    """One entity group transaction of upserts, sent again when the connection was reset (an
    upsert is idempotent)."""
    for attempt in range(tries):
        try:
            client.submit_transaction([("upsert", e) for e in chunk])
            return
        except ServiceResponseError:
            if attempt == tries - 1:
                raise
            time.sleep(1 + attempt)


def seed_jobs(rt: Runtime, records: int, days: int, log: Callable[[str], None]) -> dict[str, Any]:
    """`records` index entities, newest today; 2% poisoned (reason code bad_input_data)."""
    assert rt.job_index is not None
    now = utcnow()
    step = timedelta(seconds=days * 86400 / max(1, records))
    started = time.monotonic()
    by_table: dict[str, list[dict[str, Any]]] = {}
    for i in range(records):
        created = isoformat(now - step * i)
        poisoned = i % 50 == 7
        data = {
            "id": f"job-{i:07d}",
            "status": "poisoned" if poisoned else "completed",
            "kind": "noop" if i % 3 else "aggregate",
            "reason_code": "bad_input_data" if poisoned else "",
            "reason": "bad_input_data: a seeded failure" if poisoned else "",
            "created_at": created,
            "updated_at": created,
        }
        entity = job_entity(data)
        by_table.setdefault(rt.job_index.table_name(created[:10].replace("-", "")), []).append(entity)
    work: list[tuple[str, list[dict[str, Any]]]] = []
    for table, entities in by_table.items():
        rt.job_index.ensure_table(table)
        work.extend((table, chunk) for chunk in _batches(entities))

    def send(item: tuple[str, list[dict[str, Any]]]) -> None:
        table, chunk = item
        client = rt.job_index.service.get_table_client(table)  # type: ignore[union-attr]
        _submit(client, chunk)

    done = 0
    with ThreadPoolExecutor(SEED_THREADS) as pool:
        for _ in pool.map(send, work):
            done += 1
            if done % 200 == 0:
                log(f"  jobs index: {done * 100:,} of {records:,} ({time.monotonic() - started:.0f} s)")
    return {"seconds": round(time.monotonic() - started, 1), "tables": len(by_table), "requests": len(work)}


def seed_archive(rt: Runtime, entries: int, with_blobs: int, log: Callable[[str], None]) -> dict[str, Any]:
    """`entries` listed index rows; the newest `with_blobs` also get their entry blob and a poisoned
    ledger record (what a replay reads). Returns the names with blobs, newest first."""
    assert rt.entry_index is not None
    rt.entry_index.ensure()
    now = utcnow()
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    named: list[tuple[str, dict[str, Any]]] = []
    for i in range(entries):
        job_id = f"poison-{i:06d}"
        at = now - timedelta(seconds=i)
        body = json.dumps({"id": job_id, "kind": "noop", "payload": {}, "created_at": isoformat(at)}).encode()
        entry = new_entry(
            body, job_id, True, "poisoned", "bad_input_data: seeded", now=at,
            queue_message_id=None, dequeue_count=5, record=None,
        )  # fmt: skip
        name = entry_name(job_id, entry["digest"])
        entry["index_key"] = entry_entity(name, entry)["RowKey"]
        rows.append(entry_entity(name, entry))
        if i < with_blobs:
            named.append((name, entry))
    table = rt.entry_index.table
    with ThreadPoolExecutor(SEED_THREADS) as pool:
        list(pool.map(lambda c: _submit(table, c), _batches(rows)))
    shards = Counter(shard_of(str(r["name"])) for r in rows)  # the app's counters, shard by shard
    for shard, n in shards.items():
        table.upsert_entity(
            {"PartitionKey": COUNT_PARTITION, "RowKey": f"bad_input_data|{shard:02d}", "n": n}
        )
    index_s = time.monotonic() - started
    ledger_store = rt.ledger.store.inner  # type: ignore[attr-defined]  # the blobs alone, no index write

    def blobs(item: tuple[str, dict[str, Any]]) -> None:
        name, entry = item
        rt.archive.upsert(name, entry)
        body = base64.b64decode(entry["body_b64"])
        created = json.loads(body)["created_at"]
        ledger_store.upsert(
            f"{entry['job_id']}.json",
            {
                "id": entry["job_id"], "kind": "noop", "status": "poisoned", "attempt": 4,
                "reason": "bad_input_data: seeded", "created_at": created, "updated_at": created,
                "body_digest": body_digest(body), "history": [{"at": created, "event": "poisoned"}],
            },
        )  # fmt: skip

    done = 0
    with ThreadPoolExecutor(16) as pool:
        for _ in pool.map(blobs, named):
            done += 1
            if done % 2000 == 0:
                log(f"  archive blobs: {done:,} of {len(named):,} ({time.monotonic() - started:.0f} s)")
    return {
        "seconds": round(time.monotonic() - started, 1),
        "index_seconds": round(index_s, 1),
        "blobs": len(named),
        "names": [n for n, _ in named],
    }


def seed_job_pages(rt: Runtime) -> str:
    """Ledger blobs of the jobs the pages open: page 1's and the job page's. The job page's id."""
    assert rt.job_index is not None
    page = rt.job_index.page(size=50)
    store = rt.ledger.store.inner  # type: ignore[attr-defined]
    for row in page.rows:
        store.upsert(
            f"{row.id}.json",
            {"id": row.id, "kind": row.kind, "status": row.status, "created_at": row.created_at,
             "updated_at": row.updated_at, "history": [{"at": row.created_at, "event": "completed"}],
             "summary": {"rows": 1}},
        )  # fmt: skip
    return page.rows[0].id


# -- measuring --------------------------------------------------------------------------------


def timed(name: str, fn: Callable[[], Any], results: list[dict[str, Any]]) -> Any:
    with counted() as found:
        started = time.perf_counter()
        value = fn()
        ms = (time.perf_counter() - started) * 1000
    results.append(
        {"what": name, "requests": sum(found.values()), "ms": round(ms, 1), "by_kind": dict(found)}
    )
    return value


def run_bulk(rt: Runtime, names: list[str], rate: float, log: Callable[[str], None]) -> dict[str, Any]:
    """Start a replay of `names` and carry out its steps here as the trigger would."""
    queue = rt.storage.raw_queue(bulk.ops_queue_name(rt.settings.jobs_queue))
    with counted() as start_found:
        op = bulk.start(rt, "replay", "bench", names=names, rate_per_s=rate)
    started = time.monotonic()
    longest = 0.0
    steps = 0
    with counted() as found:
        while True:
            batch = list(queue.receive_messages(max_messages=1, visibility_timeout=120))
            if not batch:
                data = bulk.read(rt, op["id"]) or {}
                if data.get("status") != "running":
                    break
                time.sleep(0.1)
                continue
            t = time.monotonic()
            bulk.run_step(rt, base64.b64decode(batch[0].content))
            queue.delete_message(batch[0])
            longest = max(longest, time.monotonic() - t)
            steps += 1
            if steps % 20 == 0:
                data = bulk.read(rt, op["id"]) or {}
                log(f"  bulk replay: {data.get('done')} of {len(names)} ({time.monotonic() - started:.0f} s)")
    seconds = time.monotonic() - started
    data = bulk.read(rt, op["id"]) or {}
    return {
        "items": len(names),
        "rate_asked": rate,
        "start_requests": sum(start_found.values()),
        "seconds": round(seconds, 1),
        "rate_reached": round(len(names) / seconds, 1) if seconds else None,
        "steps": steps,
        "longest_step_s": round(longest, 2),
        "requests_per_item": round(sum(found.values()) / max(1, len(names)), 2),
        "counts": data.get("counts"),
        "status": data.get("status"),
    }


def measure(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    OUT.mkdir(exist_ok=True)
    azurite = start_azurite(in_memory=True, log_path=OUT / "console-azurite.log")  # nothing on disk
    try:
        rt = runtime_for(azurite, handlers={"noop": noop.HANDLER})
        log(f"seeding {args.records:,} jobs into the index over {args.days} days ...")
        jobs_seed = seed_jobs(rt, args.records, args.days, log)
        log(f"  done in {jobs_seed['seconds']} s; seeding {args.entries:,} archive entries ...")
        archive_seed = seed_archive(rt, args.entries, args.bulk + 20, log)
        log(f"  done in {archive_seed['seconds']} s")
        job_id = seed_job_pages(rt)
        names = archive_seed.pop("names")
        results: list[dict[str, Any]] = []
        timed("overview", lambda: queries.overview(rt), results)
        timed("jobs page 1", lambda: queries.jobs_page(rt), results)
        token = ""
        for _ in range(49):
            token = queries.jobs_page(rt, token=token).next_token
        timed("jobs page 50", lambda: queries.jobs_page(rt, page=50, token=token), results)
        timed("jobs: status completed", lambda: queries.jobs_page(rt, status="completed"), results)
        timed("jobs: status poisoned", lambda: queries.jobs_page(rt, status="poisoned"), results)
        timed("jobs: kind aggregate", lambda: queries.jobs_page(rt, kind="aggregate"), results)
        timed("jobs: reason code", lambda: queries.jobs_page(rt, reason_code="bad_input_data"), results)
        timed("jobs: status queued (none)", lambda: queries.jobs_page(rt, status="queued"), results)
        timed("jobs: find by id (one read)", lambda: rt.ledger.get(job_id), results)
        timed("jobs: id prefix", lambda: queries.jobs_page(rt, id_part="job-00001"), results)
        timed("job page", lambda: queries.job_view(rt, job_id), results)
        today = utcnow()
        since, until = isoformat(today - timedelta(hours=30)), isoformat(today - timedelta(hours=6))
        window = timed(
            "jobs: created in a 24 h window", lambda: queries.jobs_page(rt, since=since, until=until), results
        )
        timed(
            "jobs: that window, next page",
            lambda: queries.jobs_page(rt, token=window.next_token, since=since, until=until),
            results,
        )
        timed(
            "jobs: window + status poisoned",
            lambda: queries.jobs_page(rt, status="poisoned", since=since, until=until),
            results,
        )
        view = timed("poison page 1 (with counts)", lambda: queries.poison_view(rt), results)
        timed("poison page 2", lambda: queries.poison_view(rt, after=view.next_archived), results)
        timed(
            "poison: group bad_input_data",
            lambda: queries.poison_view(rt, reason_code="bad_input_data"),
            results,
        )
        timed(
            "poison: search a rare text (scan budget)",
            lambda: queries.poison_view(rt, text="poison-000042"),
            results,
        )
        timed("poison: search a common text", lambda: queries.poison_view(rt, text="seeded"), results)
        timed(
            "replay a group (operation started)",
            lambda: actions.start_op(
                rt,
                {"kind": "replay", "state": "poisoned", "rate": 200, "dry_run": True,
                 "where": {"reason_code": "bad_input_data"}},
                "bench",
            ),
            results,
        )  # fmt: skip
        extra = names[-20:]
        timed(
            "replay 10 ids (operation started)",
            lambda: actions.start_op(rt, {"kind": "replay", "names": extra[:10], "rate": 200}, "bench"),
            results,
        )
        timed(
            "replay 1 id now (action/replay)",
            lambda: actions.replay_batch(rt, [extra[10].split("/")[1]], 10, "b", [extra[10]]),
            results,
        )
        timed("park one", lambda: actions.park(rt, [extra[11]], "bench"), results)
        timed("unpark one", lambda: actions.unpark(rt, [extra[11]], "bench"), results)
        timed("delete one", lambda: actions.delete(rt, [extra[12]], "bench"), results)
        timed(
            "purge (operation started, dry run)",
            lambda: actions.purge(rt, 30, "bench", dry_run=True),
            results,
        )
        timed("audit page (after the actions above)", lambda: rt.audit.page() if rt.audit else None, results)
        rt.storage.raw_queue(bulk.ops_queue_name(rt.settings.jobs_queue)).clear_messages()
        log(f"bulk replay of {args.bulk:,} at {args.rate}/s ...")
        bulk_result = run_bulk(rt, names[: args.bulk], args.rate, log)
        body = json.dumps(
            {"id": "happy-one", "kind": "noop", "payload": {}, "created_at": isoformat(utcnow())}
        )
        with counted() as happy:
            processing.process_message(message(body.encode()), rt)
        return {
            "records": args.records,
            "entries": args.entries,
            "days": args.days,
            "seed_jobs": jobs_seed,
            "seed_archive": archive_seed,
            "pages": results,
            "bulk_replay": bulk_result,
            "happy_path_message_requests": dict(happy),
            "happy_path_message_total": sum(happy.values()),
        }
    finally:
        azurite.cleanup()


def table(result: dict[str, Any]) -> str:
    lines = [
        f"console at {result['records']:,} jobs (index) and {result['entries']:,} archive entries, Azurite",
        f"seeding: jobs index {result['seed_jobs']['seconds']} s ({result['seed_jobs']['requests']:,} batch requests, "
        f"{result['seed_jobs']['tables']} day tables); archive {result['seed_archive']['seconds']} s "
        f"(index {result['seed_archive']['index_seconds']} s, {result['seed_archive']['blobs']:,} entry blobs + ledger records)",
        f"{'page / action':<40}{'requests':>9}{'ms':>9}  target <= 10 and <= 1000 ms",
    ]
    for row in result["pages"]:
        ok = "ok" if row["requests"] <= 10 and row["ms"] <= 1000 else "OVER"
        lines.append(f"{row['what']:<40}{row['requests']:>9}{row['ms']:>9.0f}  {ok}")
    b = result["bulk_replay"]
    lines.append(
        f"bulk replay of {b['items']:,} at {b['rate_asked']}/s: started with {b['start_requests']} requests; "
        f"{b['seconds']} s in the app ({b['rate_reached']}/s reached), {b['steps']} steps, longest "
        f"{b['longest_step_s']} s, {b['requests_per_item']} requests per item; {b['counts']} {b['status']}"
    )
    lines.append(
        f"one message, happy path (claim, complete, index): {result['happy_path_message_total']} requests {result['happy_path_message_requests']}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="jobs in the index")
    parser.add_argument("--entries", type=int, default=100_000, help="poison archive entries")
    parser.add_argument("--days", type=int, default=10, help="days the jobs are spread over")
    parser.add_argument("--bulk", type=int, default=10_000, help="entries the bulk replay replays")
    parser.add_argument("--rate", type=float, default=200.0, help="the bulk replay's rate per second")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: Azurite is still cleaned up
    result = measure(args, lambda text: print(text, flush=True))
    print(table(result))
    OUT.mkdir(exist_ok=True)
    (OUT / "console.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
