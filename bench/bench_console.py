"""The console at production volume on a real Azurite: storage requests and milliseconds of every
page and operator action, with the indexes seeded directly (not through the queue).

Seeding, in the shapes the app writes:
- the jobs index: `--records` entities (default 1,000,000) over `--days` per-day tables, in entity
  group transactions of 100 (one request per 100 jobs), 2% poisoned with a reason code;
- the ledger: one record blob per job, as the app writes it (`--ledger-blobs N`: the newest N
  only; the pages read the ledger by id, never by listing), and one per archive entry replayed;
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

`--only replay-purge` measures just the admin purge dry run, a console replay of 10 ids, and a
bulk replay and a bulk purge of the same `--bulk` entries (their rates side by side):

    python -m bench.bench_console --only replay-purge --records 25000 --entries 5000 --bulk 1000
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
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import requests

from bench import console_seed
from devstack.azurite import start_azurite
from shared.config.settings import Settings
from shared.core.envelope import isoformat, utcnow
from shared.interfaces.console import actions, queries
from shared.jobs import noop
from shared.pipeline import processing
from shared.poison import bulk, bulk_step
from shared.runtime.wiring import Runtime, build_runtime
from shared.storage.accounts import AzureAccount
from tests.integration.helpers import message

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


# -- seeding: bench/console_seed.py ----------------------------------------------------------

NAMES = {
    "JOBS_QUEUE": "benchjobs",
    "LEDGER_CONTAINER": "benchledger",
    "RESULTS_CONTAINER": "benchresults",
    "PAYLOADS_CONTAINER": "benchpayloads",
    "POISON_ARCHIVE_CONTAINER": "bencharchive",
}
"""Fixed names, so that a later run (`--phase rest`) finds what `--phase seed-jobs` wrote."""


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


def azure(rt: Runtime) -> AzureAccount:
    """The runtime's account as the Azure one (the benchmark runs on Azurite)."""
    assert isinstance(rt.account, AzureAccount)
    return rt.account


def run_bulk(
    rt: Runtime, names: list[str], rate: float, log: Callable[[str], None], kind: str = "replay"
) -> dict[str, Any]:
    """Start a `kind` operation over `names` and carry out its steps here as the trigger would."""
    queue = rt.account.raw_queue(bulk.ops_queue_name(rt.settings.jobs_queue))
    with counted() as start_found:
        op = bulk.start(rt, kind, "bench", names=names, rate_per_s=rate)
    started = time.monotonic()
    longest = 0.0
    steps = 0
    redone = 0
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
            for attempt in range(5):  # a step that failed (storage busy) is delivered again, as by the host
                try:
                    bulk_step.run_step(rt, base64.b64decode(batch[0].content))
                    break
                except Exception as exc:
                    redone += 1
                    log(f"  step failed ({exc.__class__.__name__}), run again")
                    if attempt == 4:
                        raise
            queue.delete_message(batch[0])
            longest = max(longest, time.monotonic() - t)
            steps += 1
            if steps % 20 == 0:
                data = bulk.read(rt, op["id"]) or {}
                log(f"  bulk {kind}: {data.get('done')} of {len(names)} ({time.monotonic() - started:.0f} s)")
    seconds = time.monotonic() - started
    data = bulk.read(rt, op["id"]) or {}
    return {
        "kind": kind,
        "items": len(names),
        "rate_asked": rate,
        "start_requests": sum(start_found.values()),
        "seconds": round(seconds, 1),
        "rate_reached": round(len(names) / seconds, 1) if seconds else None,
        "steps": steps,
        "longest_step_s": round(longest, 2),
        "steps_redone": redone,
        "requests_per_item": round(sum(found.values()) / max(1, len(names)), 2),
        "counts": data.get("counts"),
        "status": data.get("status"),
    }


def measure(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    OUT.mkdir(exist_ok=True)
    azurite: Any = None
    if args.azurite:
        conn = args.azurite
    elif console_seed.split_available():  # nothing on disk; blob, queue and table on their own cores
        azurite = console_seed.SplitAzurite()
        azurite.start(log_path=OUT / "console-azurite.log")
        conn = azurite.connection_string
    else:
        azurite = start_azurite(in_memory=True, log_path=OUT / "console-azurite.log")
        conn = azurite.connection_string
    try:
        rt = build_runtime(
            Settings.from_env({"AzureWebJobsStorage": conn, **NAMES}), handlers={"noop": noop.HANDLER}
        )
        seeded = OUT / "console-seed-jobs.json"
        if args.phase in ("all", "seed-jobs"):
            log(f"seeding {args.records:,} ledger records and their index entities over {args.days} days ...")
            jobs_seed = console_seed.seed_jobs(
                rt,
                conn,
                args.records,
                args.days,
                log,
                blobs_from=args.blobs_from,
                ledger_blobs=args.ledger_blobs,
                now=datetime.fromisoformat(args.now.replace("Z", "+00:00")) if args.now else None,
                processes=args.processes,
            )
            log(f"  done in {jobs_seed['seconds']} s")
            seeded.write_text(json.dumps(jobs_seed))
            if args.phase == "seed-jobs":
                return {"seed_jobs": jobs_seed}
        else:
            jobs_seed = json.loads(seeded.read_text())
        log(f"seeding {args.entries:,} archive entries ...")
        archive_seed = console_seed.seed_archive(
            rt, conn, args.entries, args.bulk + 20, log, processes=args.processes
        )
        log(f"  done in {archive_seed['seconds']} s")
        job_id = "job-0000000"
        names = archive_seed.pop("names")
        results: list[dict[str, Any]] = []
        if args.only == "replay-purge":
            return {
                "records": args.records,
                "entries": args.entries,
                "seed_jobs": jobs_seed,
                "seed_archive": archive_seed,
                **replay_purge_rows(rt, names, args, log),
            }
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
        poisoned_id = names[0].split("/")[1]
        timed("job page: a poisoned job (its entry)", lambda: queries.job_view(rt, poisoned_id), results)
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
        timed("audit page (after the actions above)", lambda: rt.audit.page(), results)
        for row in results:  # printed now: the bulk replay below takes minutes
            log(f"  {row['what']:<40}{row['requests']:>9}{row['ms']:>9.0f}")
        azure(rt).clients.raw_queue(bulk.ops_queue_name(rt.settings.jobs_queue)).clear_messages()
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
        if azurite is not None:
            azurite.cleanup()


def admin_purge_dry_run(rt: Runtime, days: float) -> dict[str, Any]:
    """`POST /api/poison/purge {"older_than_days": days, "dry_run": true}` through the app's handler."""
    from azure import functions as func

    from shared.interfaces import api
    from shared.runtime import wiring as runtime_module

    runtime_module._runtime = rt  # the handler's `get_runtime()`: this runtime
    body = json.dumps({"older_than_days": days, "dry_run": True}).encode()
    answer = api.purge_poison(func.HttpRequest("POST", "http://bench/api/poison/purge", body=body))
    assert answer.status_code == 202, answer.get_body()
    found: dict[str, Any] = json.loads(answer.get_body())
    return found


def replay_purge_rows(
    rt: Runtime, names: list[str], args: argparse.Namespace, log: Callable[[str], None]
) -> dict[str, Any]:
    """The rows of issue 35: the admin purge dry run and a console replay of 10 ids (targets: <= 20
    and <= 60 requests, < 2 s each), the dry run carried out, then a bulk replay and a bulk purge
    of the same `--bulk` entries (their rates side by side)."""
    results: list[dict[str, Any]] = []
    queries.poison_view(rt)  # the page the operator replays from (its counts warm the counters' ETags)
    started = timed(
        "admin purge dry run (POST /api/poison/purge)", lambda: admin_purge_dry_run(rt, 0), results
    )
    ten = names[-10:]
    timed(
        "console replay of 10 ids (action/replay)",
        lambda: actions.replay_batch(rt, [n.split("/")[1] for n in ten], 20, "bench", ten),
        results,
    )
    for row in results:
        log(f"  {row['what']:<46}{row['requests']:>9}{row['ms']:>9.0f}")
    with counted() as found:
        t = time.monotonic()
        queue = rt.account.raw_queue(bulk.ops_queue_name(rt.settings.jobs_queue))
        while True:  # the dry run's steps, as the trigger runs them
            batch = list(queue.receive_messages(max_messages=1, visibility_timeout=120))
            if not batch:
                break
            bulk_step.run_step(rt, base64.b64decode(batch[0].content))
            queue.delete_message(batch[0])
        dry_seconds = time.monotonic() - t
    dry = bulk.read(rt, started["op"]) or {}
    dry_run = {
        "seconds": round(dry_seconds, 2),
        "requests": sum(found.values()),
        "counts": dry.get("counts"),
        "steps": int(dry.get("step") or 1) - 1,
    }
    log(f"  the dry run carried out: {dry_run}")
    chosen = names[: args.bulk]
    log(f"bulk replay of {len(chosen):,} at {args.rate}/s ...")
    replayed = run_bulk(rt, chosen, args.rate, log)
    log(f"  {replayed}")
    delete_ms = blob_delete_ms(rt)
    log(f"  one blob delete on this Azurite: {delete_ms} ms (Azurite's grows with the blobs it holds)")
    log(f"bulk purge of the same {len(chosen):,} (no rate, as every purge) ...")
    purged = run_bulk(rt, chosen, 0, log, kind="purge")
    log(f"  {purged}")
    return {
        "pages": results,
        "purge_dry_run": dry_run,
        "bulk_replay": replayed,
        "blob_delete_ms": delete_ms,
        "bulk_purge": purged,
    }


def blob_delete_ms(rt: Runtime, samples: int = 10) -> float:
    """The median time of one blob delete on this account (a purge deletes one blob an entry)."""
    blobs = rt.account.blobs(rt.settings.poison_archive_container)
    spent = []
    for i in range(samples):
        blobs.write(f"bench-delete/{i}.json", b"{}")
        t = time.perf_counter()
        blobs.delete(f"bench-delete/{i}.json")
        spent.append((time.perf_counter() - t) * 1000)
    return round(sorted(spent)[samples // 2], 1)


def replay_purge_table(result: dict[str, Any]) -> str:
    lines = [
        f"replay and purge at {result['records']:,} jobs and {result['entries']:,} archive entries, Azurite",
        f"{'action':<46}{'requests':>9}{'ms':>9}  target",
    ]
    for row, limit in zip(result["pages"], (20, 60), strict=True):
        ok = "ok" if row["requests"] <= limit and row["ms"] < 2000 else "OVER"
        lines.append(f"{row['what']:<46}{row['requests']:>9}{row['ms']:>9.0f}  <= {limit}, < 2 s: {ok}")
    lines.append(f"the purge dry run carried out by the app: {result['purge_dry_run']}")
    lines.append(f"one blob delete on this Azurite (median): {result['blob_delete_ms']} ms")
    for key in ("bulk_replay", "bulk_purge"):
        b = result[key]
        lines.append(
            f"bulk {b['kind']} of {b['items']:,}: {b['seconds']} s ({b['rate_reached']}/s), {b['steps']} steps, "
            f"longest {b['longest_step_s']} s, {b['requests_per_item']} requests per item; {b['counts']}"
        )
    return "\n".join(lines)


def table(result: dict[str, Any]) -> str:
    lines = [
        f"console at {result['records']:,} jobs (index) and {result['entries']:,} archive entries, Azurite",
        f"seeding: {result['records']:,} jobs index entities + {result['seed_jobs']['blobs']:,} ledger records "
        f"{result['seed_jobs']['seconds']} s (index {result['seed_jobs']['index_seconds']} s, "
        f"blobs {result['seed_jobs']['blob_seconds']} s) "
        f"({result['seed_jobs']['requests']:,} transactions, "
        f"{result['seed_jobs']['tables']} day tables); archive {result['seed_archive']['seconds']} s "
        f"({result['seed_archive']['blobs']:,} entry blobs + poisoned ledger records)",
        f"{'page / action':<40}{'requests':>9}{'listings':>9}{'ms':>9}  target <= 10 and <= 1000 ms",
    ]
    for row in result["pages"]:
        ok = "ok" if row["requests"] <= 10 and row["ms"] <= 1000 else "OVER"
        listings = row.get("by_kind", {}).get("GET list", 0)
        lines.append(f"{row['what']:<40}{row['requests']:>9}{listings:>9}{row['ms']:>9.0f}  {ok}")
    b = result["bulk_replay"]
    lines.append(
        f"bulk replay of {b['items']:,} at {b['rate_asked']}/s: started with {b['start_requests']} requests; "
        f"{b['seconds']} s in the app ({b['rate_reached']}/s reached), {b['steps']} steps, longest "
        f"{b['longest_step_s']} s, {b['steps_redone']} redone, {b['requests_per_item']} requests per item; {b['counts']} {b['status']}"
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
    parser.add_argument(
        "--azurite", default="", help="a running Azurite's connection string (default: start one)"
    )
    parser.add_argument(
        "--phase",
        choices=("all", "seed-jobs", "rest"),
        default="all",
        help="seed-jobs: only the ledger and jobs index (into --azurite); rest: the archive and the measurements",
    )
    parser.add_argument("--now", default="", help="the newest job's created_at (to continue an earlier seed)")
    parser.add_argument(
        "--ledger-blobs",
        type=int,
        default=None,
        help="write the ledger blobs of the newest N jobs only (default: all)",
    )
    parser.add_argument(
        "--blobs-from", type=int, default=0, help="skip the ledger blobs of the newest N jobs"
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=console_seed.BLOB_PROCESSES,
        help="processes PUTting the seeded blobs",
    )
    parser.add_argument(
        "--only",
        choices=("all", "replay-purge"),
        default="all",
        help="replay-purge: only the admin purge dry run, a console replay of 10 ids, a bulk replay "
        "and a bulk purge (e.g. --records 25000 --entries 5000 --bulk 1000)",
    )
    parser.add_argument(
        "--serve",
        action="store_true",
        help="start Azurite as the bench does, print its connection string, wait",
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: Azurite is still cleaned up
    if args.serve:  # for --azurite: seed once, measure (again) later
        served = console_seed.SplitAzurite()
        served.start(log_path=OUT / "console-azurite.log")
        print(served.connection_string, flush=True)
        try:
            signal.pause()
        finally:
            served.cleanup()
        return 0
    result = measure(args, lambda text: print(text, flush=True))
    if args.phase == "seed-jobs":
        print(json.dumps(result))
        return 0
    OUT.mkdir(exist_ok=True)
    if args.only == "replay-purge":
        print(replay_purge_table(result))
        (OUT / "console-replay-purge.json").write_text(json.dumps(result, indent=2))
        return 0
    print(table(result))
    (OUT / "console.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
