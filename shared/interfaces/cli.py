"""Operator CLI: enqueue jobs, show them, tail results, and work the poison archive.

    python -m shared.interfaces.cli init        (create queues and containers)
    python -m shared.interfaces.cli enqueue --kind aggregate --payload '{"input": ...}'
    python -m shared.interfaces.cli show JOB_ID | result JOB_ID | tail
    python -m shared.interfaces.cli poison list | peek | replay --all --rate 5 [--dry-run] | purge --older-than-days 30
    python -m shared.interfaces.cli retention [--dry-run] [--now ISO] [--limit N]

Settings come from the environment, then from ./local.settings.json (Values), like `func start`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shared import poison
from shared.core.documents import Conflict
from shared.core.envelope import isoformat
from shared.core.errors import EnvelopeError, MessageTooLarge, SettingsError
from shared.ledger.view import RecordView
from shared.pipeline import retention_sweep as retention_apply
from shared.pipeline.cancel import request_cancel
from shared.pipeline.submit import SubmissionBusy, envelope_from_args, request_queue, submit, validate_request
from shared.poison import bulk
from shared.poison.audited import record_action
from shared.queues import UnknownQueue
from shared.runtime.wiring import Runtime, get_runtime


def load_local_settings(path: Path = Path("local.settings.json")) -> None:
    """Copy Values from local.settings.json into the environment (existing variables win)."""
    if not path.exists():
        return
    values = json.loads(path.read_text(encoding="utf-8")).get("Values", {})
    for key, value in values.items():
        os.environ.setdefault(key, str(value))


def _print(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def cmd_enqueue(rt: Runtime, args: argparse.Namespace) -> int:
    if args.file:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
        data = json.loads(text)
        items = data if isinstance(data, list) else [data]
    else:
        if not args.kind:
            print("enqueue: give --file, or --kind with --payload", file=sys.stderr)
            return 2
        items = [envelope_from_args(args.kind, json.loads(args.payload or "{}"), args.id)]
    status = 0
    for item in items:
        try:
            lane, item = request_queue(rt, item, getattr(args, "queue", None))
            result = submit(lane, validate_request(lane, item))
        except EnvelopeError as exc:
            print(f"rejected: {'; '.join(exc.problems)}", file=sys.stderr)
            status = 1
            continue
        except (MessageTooLarge, SubmissionBusy) as exc:
            print(f"rejected: {exc}", file=sys.stderr)
            status = 1
            continue
        verb = (
            "enqueued" if result.created else f"exists ({result.existing.status if result.existing else '?'})"
        )
        print(f"{result.envelope.id}\t{verb}{' (claim check)' if result.claim_checked else ''}")
    return status


def cmd_init(rt: Runtime, args: argparse.Namespace) -> int:
    """Create the queues and containers (get_runtime already did): for a fresh Azurite or account."""
    s = rt.settings
    queues = [  # every declared queue (one in another account: created by its owner)
        f"{name}{f' ({q.connection})' if q.connection else ''}"
        for q in s.queue_set
        for name in (q.name, q.poison)
    ]
    names = [
        *queues,
        s.ledger_container,
        s.results_container,
        s.payloads_container,
        s.poison_archive_container,
    ]
    print(f"ready: {', '.join(names)} ({s.storage.describe()})")
    return 0


def cmd_show(rt: Runtime, args: argparse.Namespace) -> int:
    record = rt.ledger.get(args.id)
    if record is None:
        print(f"job {args.id} is unknown", file=sys.stderr)
        return 1
    _print(record.data)
    return 0


def cmd_result(rt: Runtime, args: argparse.Namespace) -> int:
    record = rt.ledger.get(args.id)
    if record is None or record.status != "completed":
        print(f"job {args.id} is {record.status if record else 'unknown'}", file=sys.stderr)
        return 1
    view = RecordView.of(record)
    ref = view.result_ref
    if not ref:
        _print(dict(view.summary))
        return 0
    container, _, name = ref.partition("/")
    print(rt.account.blobs(container).read(name).decode("utf-8"))
    return 0


def cmd_cancel(rt: Runtime, args: argparse.Namespace) -> int:
    """Ask to cancel one job (poisoned at its next delivery; a Spark run is cancelled then)."""
    try:
        print(request_cancel(rt, args.id, by=args.by, reason=args.reason))
    except Conflict as exc:
        print(f"not cancelled: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_tail(rt: Runtime, args: argparse.Namespace) -> int:
    """Print each new result document's summary as it appears (Ctrl-C to stop)."""
    results = rt.account.blobs(rt.settings.results_container)
    seen = {b.name for page in results.pages() for b in page} if not args.from_start else set()
    try:
        while True:
            for blob in (b for page in results.pages() for b in page):
                if blob.name in seen or not blob.name.endswith(".json") or "/" in blob.name:
                    continue
                seen.add(blob.name)
                doc = json.loads(results.read(blob.name))
                rows = doc.get("rows", [])
                output = doc.get("output") if isinstance(doc.get("output"), dict) else None
                groups = output.get("rows") if output else len(rows)
                where = f"\t{output.get('format')}: {output.get('result_ref')}" if output else ""
                print(
                    f"{doc.get('id')}\t{doc.get('engine')}\t{doc.get('input_rows')} rows in\t{groups} groups out{where}"
                )
            if args.once:
                return 0
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def _queue_filter(rt: Runtime, args: argparse.Namespace) -> str:
    """The queue `--queue` names ("" without it: every queue's entries)."""
    return rt.queue.name if getattr(args, "queue", None) else ""


def cmd_poison(rt: Runtime, args: argparse.Namespace) -> int:
    queue = _queue_filter(rt, args)
    if args.action == "list" and not args.all:
        rows, reached = rt.entry_index.scan(
            "poisoned", args.after or "", args.limit, args.reason_code, args.text, queue=queue
        )
        print(f"{'job id':40} {'reason code':16} {'archived':26}  reason")
        for r in rows:
            print(f"{r.job_id or '(no id)':40} {r.reason_code:16} {r.archived_at[:26]:26}  {r.reason[:100]}")
        counts = rt.entry_index.counts(queue or None, rt.settings.queue_set.default.name)
        print(f"{len(rows)} shown; {sum(counts.values())} listed: {counts}")
        if reached:
            print(f"next page: --after {reached}")
        return 0
    if args.action == "list":
        entries = poison.list_poisoned(rt, include_done=args.all)
        now = rt.clock()
        print(f"{'job id':40} {'state':22} {'age':>8} {'tries':>5}  reason")
        for e in entries:
            print(
                f"{e.job_id or '(no id)':40} {e.state:22} {_age(e.age_s(now)):>8} {e.attempts:>5}  {e.reason[:100]}"
            )
        print(f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}")
        return 0
    if args.action == "recount":
        _print(rt.entry_index.recount())
        return 0
    if args.action == "peek":
        _print(poison.peek_poison_queue(rt))
        return 0
    if args.action == "purge":
        if args.older_than_days is None:
            print("purge: --older-than-days is required", file=sys.stderr)
            return 2
        op = poison.start_purge(rt, args.older_than_days, args.by, dry_run=args.dry_run)
        record_action(
            rt,
            "cli",
            args.by,
            "purge",
            op=op.get("id"),
            older_than_days=args.older_than_days,
            dry_run=args.dry_run,
        )
        what = "a dry run (counts, deletes nothing)" if args.dry_run else "a purge"
        print(f"started operation {op['id']}: {what}, carried out by the app in steps")
        print(f"follow it: python -m shared.interfaces.cli ops show {op['id']}")
        return 0
    ids = None if args.all else [i for i in (args.ids or "").split(",") if i]
    if ids is not None and not ids:
        print("replay: give --ids a,b,c or --all", file=sys.stderr)
        return 2
    if ids is None and not args.here:  # a bulk operation in the app
        return _replay_all(rt, args)
    report = poison.replay_jobs(
        rt, ids, args.by, rate_per_s=args.rate, dry_run=args.dry_run, progress=_progress_bar, queue=queue
    )
    print(file=sys.stderr)
    _print(report.as_dict())
    return 0


def cmd_retention(rt: Runtime, args: argparse.Namespace) -> int:
    """Delete what the retention settings make due (Azurite has no lifecycle policy)."""
    now = args.now or rt.clock()
    rules = rt.settings.retention_rules()
    if not rules:
        print("retention: every *_RETENTION_DAYS setting is 0: nothing is ever deleted")
        return 0
    report = retention_apply.run(
        rt, now, dry_run=args.dry_run, limit=args.limit, progress=_retention_progress
    )
    sys.stderr.write("\r" + " " * 72 + "\r")
    print(f"retention as of {isoformat(now)}" + (" (dry run: nothing deleted)" if args.dry_run else ""))
    print(f"{'rule':17} {'where':34} {'days':>4} {'due':>7} {'deleted':>7} {'kept':>7} {'changed':>7}")
    for r in report.rules:
        where = f"{r.rule.container}/{r.rule.prefix}" + (f" [{'='.join(r.rule.tag)}]" if r.rule.tag else "")
        kept = "-" if r.kept is None else str(r.kept)
        print(
            f"{r.rule.name:17} {where:34} {r.rule.days:>4} {r.due:>7} {r.deleted:>7} {kept:>7} {r.changed:>7}"
        )
    changed = sum(r.changed for r in report.rules)
    done = (
        f"{report.due} would be deleted"
        if args.dry_run
        else f"{report.due} due, {report.deleted} deleted, {changed} kept (written since listed)"
    )
    print(
        f"{done}; {report.requests} requests"
        + ("; stopped at --limit, run again for the rest" if report.stopped_at_limit else "")
    )
    tables = report.tables
    if tables is not None:
        verb = "would be dropped" if args.dry_run else f"{tables.tables_dropped} dropped"
        if tables.last_due_day is not None:
            print(
                f"jobs index: {len(tables.tables_due)} day tables due (days up to "
                f"{tables.last_due_day.isoformat()}), {verb}"
            )
        if tables.rows_cutoff is not None:
            rows = tables.rows
            done = (
                "would be deleted"
                if args.dry_run
                else f"{rows.deleted} deleted, {rows.changed} written since"
            )
            print(f"entry index: {rows.due} rows written before {isoformat(tables.rows_cutoff)} due, {done}")
        print(
            f"index tables: {tables.requests} requests"
            + ("; stopped at --limit, run again for the rest" if tables.stopped_at_limit else "")
            + (f"; stopped by {tables.error}, run again" if tables.error else "")
        )
    print(
        "never deleted: unfinished or poisoned ledger records, the archive's edits/ and console/metrics/, "
        "the audit table; kept '-': the tag query returns due records only"
    )
    return 0


def _iso_time(raw: str) -> datetime:
    """An ISO-8601 time for --now (UTC when it names no zone)."""
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not an ISO-8601 date-time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _retention_progress(rule: str, seen: int, due: int) -> None:
    sys.stderr.write(f"\r{f'{rule}: {seen} seen, {due} due':72}")
    sys.stderr.flush()


def cmd_ops(rt: Runtime, args: argparse.Namespace) -> int:
    """Bulk operations the app carries out in steps (shared/poison/bulk.py): start, show, cancel, resume."""
    try:
        if args.action == "start":
            names = [n for n in (args.names or "").split(",") if n] or None
            op = bulk.start(
                rt,
                args.kind,
                args.by,
                names=names,
                states=None if names else [args.state],
                older_than_days=args.older_than_days,
                rate_per_s=args.rate,
                dry_run=args.dry_run,
            )
            record_action(
                rt,
                "cli",
                args.by,
                "op_start",
                op=op.get("id"),
                kind=args.kind,
                state=args.state,
                names=len(names or []),
            )
        elif not args.id:
            print(f"ops {args.action}: give the operation id", file=sys.stderr)
            return 2
        elif args.action == "show":
            op = bulk.read(rt, args.id) or {}
        elif args.action == "cancel":
            op = bulk.cancel(rt, args.id, args.by)
            record_action(rt, "cli", args.by, "op_cancel", op=op.get("id"))
        else:
            op = bulk.resume(rt, args.id, args.by)
            record_action(rt, "cli", args.by, "op_resume", op=op.get("id"))
    except bulk.OpRefused as exc:
        print(f"ops: {exc}", file=sys.stderr)
        return 2
    _print({k: v for k, v in op.items() if k != "names"})
    return 0


def cmd_audit(rt: Runtime, args: argparse.Namespace) -> int:
    """The audit of operator actions: a page (newest first), or index what was recorded before it."""
    if args.action == "backfill":
        print(f"indexed {rt.audit.backfill(rt.archive)} earlier edits and operations")
        return 0
    rows, after = rt.audit.page(args.after or "", args.limit)
    for r in rows:
        print(f"{r.at:26} {r.by[:24]:24} {r.action:14} {r.target[:40]:40} {json.dumps(r.details)[:120]}")
    if after:
        print(f"next page: --after {after}")
    return 0


def _replay_all(rt: Runtime, args: argparse.Namespace) -> int:
    """Start a replay of every listed entry (of a reason code, matching a text) as a bulk operation
    the app carries out in steps; with --dry-run, print the listed counts now and start a dry run
    that counts the listed rows the replay would visit (from the entry index, no read)."""
    queue = _queue_filter(rt, args)
    counts = rt.entry_index.counts(queue or None, rt.settings.queue_set.default.name)
    pairs = (("reason_code", args.reason_code), ("text", args.text), ("queue", queue))
    where = {k: v for k, v in pairs if v}
    listed = counts.get(args.reason_code, 0) if args.reason_code else sum(counts.values())
    print(f"listed now: {listed}" + ("" if args.reason_code else f" {counts}"))
    op = bulk.start(
        rt,
        "replay",
        args.by,
        states=["poisoned"],
        rate_per_s=args.rate,
        dry_run=args.dry_run,
        where=where or None,
    )
    record_action(
        rt,
        "cli",
        args.by,
        "op_start",
        op=op.get("id"),
        kind="replay",
        state="poisoned",
        where=where or None,
        rate=args.rate,
    )
    what = "a dry run (counts, changes nothing)" if args.dry_run else f"a replay at {args.rate:g}/s"
    print(f"started operation {op['id']}: {what}, carried out by the app in steps")
    print(f"follow it: python -m shared.interfaces.cli ops show {op['id']}")
    return 0


def _progress_bar(done: int, total: int, job_id: str) -> None:
    width = 30
    filled = int(width * done / max(total, 1))
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {job_id[:40]:40}")
    sys.stderr.flush()


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m shared.interfaces.cli", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--queue",
        help="the declared queue (JOBS_QUEUES) to enqueue to, whose jobs to show (default: the first), "
        "or whose poisoned jobs to list and replay (default: every queue's; each goes back to its own)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("init", help="create the queues and containers if missing")
    enqueue = sub.add_parser("enqueue", help="enqueue jobs from a file (object or list) or from arguments")
    enqueue.add_argument("--file", help="JSON envelope file, or - for stdin")
    enqueue.add_argument("--kind")
    enqueue.add_argument("--payload", help="payload as JSON")
    enqueue.add_argument("--id", help="job id (default: a new UUID)")
    for name in ("show", "result"):
        p = sub.add_parser(name, help=f"{name} a job")
        p.add_argument("id")
    cancel = sub.add_parser("cancel", help="cancel a job: poisoned at its next delivery, Spark run stopped")
    cancel.add_argument("id")
    cancel.add_argument("--by", default="operator", help="who asks (kept in the ledger)")
    cancel.add_argument("--reason", default="", help="why (kept in the ledger and the poison reason)")
    tail = sub.add_parser("tail", help="print results as they appear")
    tail.add_argument("--interval", type=float, default=2.0)
    tail.add_argument("--once", action="store_true")
    tail.add_argument("--from-start", action="store_true")
    pois = sub.add_parser("poison", help="list, peek, replay or purge poisoned jobs")
    pois.add_argument("action", choices=["list", "peek", "replay", "purge", "recount"])
    pois.add_argument("--ids", help="comma-separated job ids (replay)")
    pois.add_argument("--all", action="store_true", help="replay all / list replayed ones too")
    pois.add_argument("--rate", type=float, default=10.0, help="replay: messages per second")
    pois.add_argument("--dry-run", action="store_true")
    pois.add_argument("--older-than-days", type=float)
    pois.add_argument("--after", help="list: the page after this key (printed by the previous page)")
    pois.add_argument("--limit", type=int, default=50, help="list: entries a page (index)")
    pois.add_argument("--reason-code", default="", help="list / replay --all: only this reason code")
    pois.add_argument("--text", default="", help="list / replay --all: only entries whose reason holds it")
    pois.add_argument(
        "--by",
        default="cli",
        help="replay, purge: who asks (kept in the ledger, the operation and the audit)",
    )
    pois.add_argument(
        "--here",
        action="store_true",
        help="replay --all in this process (the entry index's listed entries, at --rate)",
    )
    audit = sub.add_parser("audit", help="operator actions, newest first; backfill indexes earlier ones")
    audit.add_argument("action", choices=["list", "backfill"])
    audit.add_argument("--after", help="the page after this key (printed by the previous page)")
    audit.add_argument("--limit", type=int, default=50)
    keep = sub.add_parser("retention", help="delete what the *_RETENTION_DAYS settings make due (local)")
    keep.add_argument("--dry-run", action="store_true", help="count only: nothing is deleted")
    keep.add_argument("--now", type=_iso_time, help="judge ages as of this ISO time (default: now)")
    keep.add_argument("--limit", type=int, help="stop after this many due blobs (run again for the rest)")
    ops = sub.add_parser("ops", help="bulk operations on poison entries, carried out by the app in steps")
    ops.add_argument("action", choices=["start", "show", "cancel", "resume"])
    ops.add_argument("id", nargs="?", help="the operation (show, cancel, resume)")
    ops.add_argument("--kind", choices=list(bulk.KINDS), default="replay")
    ops.add_argument("--state", default="poisoned", help="select every entry in this state")
    ops.add_argument("--names", help="comma-separated entry names instead of a state")
    ops.add_argument("--older-than-days", type=float)
    ops.add_argument("--rate", type=float, default=50.0, help="entries per second")
    ops.add_argument("--dry-run", action="store_true", help="count what it would touch; change nothing")
    ops.add_argument("--by", default="cli", help="who asks (kept in the operation)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    load_local_settings()
    try:
        rt = get_runtime()
        if args.command != "enqueue":  # enqueue: each item may name its own queue
            rt = rt.for_queue(args.queue)
    except (SettingsError, UnknownQueue) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    commands = {
        "init": cmd_init,
        "enqueue": cmd_enqueue,
        "show": cmd_show,
        "result": cmd_result,
        "tail": cmd_tail,
        "cancel": cmd_cancel,
        "poison": cmd_poison,
        "retention": cmd_retention,
        "ops": cmd_ops,
        "audit": cmd_audit,
    }
    return commands[args.command](rt, args)


if __name__ == "__main__":
    sys.exit(main())
