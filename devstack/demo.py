"""`make run`: real jobs through a real Azurite queue into results, each applied exactly once.

Starts Azurite and the local Functions host, uploads generated CSV data, submits aggregate jobs
through the HTTP API, adds broken messages and duplicate deliveries straight onto the queue,
shows progress, checks results against an independent computation, prints a summary, and stops
everything it started.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import io
import json
import random
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from azure.storage.blob import BlobServiceClient
from azure.storage.queue import QueueServiceClient

from devstack.azurite import Azurite, start_azurite
from devstack.datagen import csv_lines
from devstack.hostproc import REPO_ROOT, HostProcess, count_decisions, host_env
from shared.queues import read_queues

DATA_CONTAINER = "data"
REDUCERS: dict[str, Callable[[list[float]], float]] = {
    "sum": sum,
    "min": min,
    "max": max,
    "mean": lambda v: sum(v) / len(v),
}
QUEUE = "jobs"
GROUPINGS: tuple[list[str], ...] = (["region"], ["product"], ["region", "product"], [])
METRICS = [
    {"op": "count"},
    {"op": "sum", "column": "qty"},
    {"op": "mean", "column": "price"},
    {"op": "min", "column": "price"},
    {"op": "max", "column": "qty"},
    {"op": "count", "column": "qty"},
]


@dataclass
class Demo:
    """State of one demo run."""

    azurite: Azurite
    host: HostProcess
    files: dict[str, str] = field(default_factory=dict)  # blob name -> CSV text
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # good job id -> payload
    broken: dict[str, str] = field(default_factory=dict)  # label -> job id (or "" when it has none)
    duplicates: int = 0
    watch: str | None = None  # a job whose state the progress line shows (the offloaded one)
    queue: str = QUEUE
    """The default job queue: `JOBS_QUEUE`, or the first of `JOBS_QUEUES` when the settings
    declare several (the host then listens on each)."""

    @property
    def blob(self) -> BlobServiceClient:
        return BlobServiceClient.from_connection_string(self.azurite.connection_string)

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.host.url}/api/{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")


def init_storage(env: dict[str, str]) -> None:
    """Create queues and containers, as the infrastructure template does in Azure."""
    import subprocess

    subprocess.run(
        [sys.executable, "-m", "shared.interfaces.cli", "init"], env=env, cwd=REPO_ROOT, check=True
    )


def upload_data(demo: Demo, files: int, rows: int) -> None:
    container = demo.blob.get_container_client(DATA_CONTAINER)
    container.create_container()
    for i in range(files):
        text = "".join(csv_lines(rows, seed=100 + i))
        name = f"sales/part-{i:02d}.csv"
        container.upload_blob(name, text.encode())
        demo.files[name] = text
    container.upload_blob(
        "sales/broken.csv", b"region,product,day,qty,price,note\nnorth,P1,2024-01-01,abc,1.0,\n"
    )


def submit_jobs(demo: Demo, count: int, rng: random.Random) -> None:
    names = sorted(demo.files)
    for i in range(count):
        payload = {
            "input": f"{DATA_CONTAINER}/{rng.choice(names)}",
            "format": "csv",
            "group_by": rng.choice(GROUPINGS),
            "metrics": rng.sample(METRICS, 3),
            "engine": "inline",
        }
        status, body = demo.api(
            "POST", "jobs", {"id": f"demo-{i:04d}", "kind": "aggregate", "payload": payload}
        )
        if status != 202:
            raise RuntimeError(f"POST /api/jobs answered {status}: {body}")
        demo.jobs[body["id"]] = payload


def submit_spark_pair(demo: Demo, rows: int) -> tuple[str, str]:
    """A larger input aggregated twice: by Spark (offloaded) and inline, to compare results."""
    container = demo.blob.get_container_client(DATA_CONTAINER)
    text = "".join(csv_lines(rows, seed=7))
    container.upload_blob("sales/large.csv", text.encode(), overwrite=True)
    demo.files["sales/large.csv"] = text
    payload = {
        "input": f"{DATA_CONTAINER}/sales/large.csv",
        "format": "csv",
        "group_by": ["region", "product"],
        "metrics": [
            {"op": "count"},
            {"op": "sum", "column": "qty"},
            {"op": "mean", "column": "price"},
            {"op": "max", "column": "price"},
        ],
    }
    ids = []
    for engine in ("spark", "inline"):
        status, body = demo.api(
            "POST",
            "jobs",
            {"id": f"large-{engine}", "kind": "aggregate", "payload": {**payload, "engine": engine}},
        )
        if status != 202:
            raise RuntimeError(f"POST /api/jobs answered {status}: {body}")
        ids.append(body["id"])
    return ids[0], ids[1]


def follow_spark(demo: Demo, spark_id: str, inline_id: str, timeout_s: float) -> float:
    """Show the offloaded job's state while Spark runs; then compare with the inline result."""
    started = time.monotonic()
    last = ""
    while time.monotonic() - started < timeout_s:
        _, record = demo.api("GET", f"jobs/{spark_id}")
        state = (record or {}).get("continuation", {}).get("state", {})
        line = f"  spark job {spark_id}: {record.get('status')}"
        if state.get("submission_id"):
            line += f" (submission {state['submission_id']}, submissions {state.get('submissions')}, polls {state.get('polls')})"
        if line != last:
            print(f"{line}  [{time.monotonic() - started:.0f} s]", flush=True)
            last = line
        if record.get("status") in ("completed", "poisoned"):
            break
        time.sleep(1.0)
    _, spark_doc = demo.api("GET", f"jobs/{spark_id}/result")
    _, inline_doc = demo.api("GET", f"jobs/{inline_id}/result")
    if not (
        spark_doc
        and inline_doc
        and spark_doc.get("engine") == "spark"
        and same(spark_doc["rows"], inline_doc["rows"])
    ):
        raise AssertionError(f"the Spark result of {spark_id} differs from the inline result of {inline_id}")
    return time.monotonic() - started


def send_broken(demo: Demo) -> None:
    """Messages that must end in poison with a reason, never crash anything."""
    queue = QueueServiceClient.from_connection_string(demo.azurite.connection_string).get_queue_client(
        demo.queue
    )

    def send(label: str, job_id: str, raw: bytes | str) -> None:
        text = raw if isinstance(raw, str) else base64.b64encode(raw).decode()
        queue.send_message(text)
        demo.broken[label] = job_id

    agg = {"format": "csv", "group_by": ["region"], "metrics": [{"op": "sum", "column": "qty"}]}
    send("not base64", "", "this is not base64 !!")
    send("not JSON", "", b"{oops")
    send("unknown kind", "bad-kind", json.dumps({"id": "bad-kind", "kind": "median", "payload": {}}).encode())
    send(
        "bad CSV value",
        "bad-csv",
        json.dumps(
            {
                "id": "bad-csv",
                "kind": "aggregate",
                "payload": {**agg, "input": f"{DATA_CONTAINER}/sales/broken.csv"},
            }
        ).encode(),
    )
    send(
        "missing input blob",
        "no-input",
        json.dumps(
            {"id": "no-input", "kind": "aggregate", "payload": {**agg, "input": f"{DATA_CONTAINER}/nope.csv"}}
        ).encode(),
    )
    send(
        "path trick",
        "path-trick",
        json.dumps(
            {"id": "path-trick", "kind": "aggregate", "payload": {**agg, "input": f"{DATA_CONTAINER}/../x"}}
        ).encode(),
    )


def send_duplicates(demo: Demo, count: int) -> None:
    """Deliver some completed jobs again, as a producer retry or a lost delete would."""
    queue = QueueServiceClient.from_connection_string(demo.azurite.connection_string).get_queue_client(
        demo.queue
    )
    for job_id in list(demo.jobs)[:count]:
        envelope = {"id": job_id, "kind": "aggregate", "payload": demo.jobs[job_id]}
        queue.send_message(base64.b64encode(json.dumps(envelope).encode()).decode())
        demo.duplicates += 1


def statuses(demo: Demo, ids: list[str]) -> Counter[str]:
    container = demo.blob.get_container_client("ledger")
    found: Counter[str] = Counter()
    for job_id in ids:
        try:
            found[json.loads(container.download_blob(f"{job_id}.json").readall())["status"]] += 1
        except Exception:
            found["(none)"] += 1
    return found


def queue_empty(demo: Demo) -> bool:
    """Nothing left on the main queue, and nothing visible on the poison queue."""
    service = QueueServiceClient.from_connection_string(demo.azurite.connection_string)
    main = service.get_queue_client(demo.queue).get_queue_properties().approximate_message_count
    return main == 0 and not list(service.get_queue_client(f"{demo.queue}-poison").peek_messages())


def held_on_poison_queue(demo: Demo) -> int:
    """Messages the host keeps on the poison queue because no function can take them (not base64)."""
    service = QueueServiceClient.from_connection_string(demo.azurite.connection_string)
    return int(
        service.get_queue_client(f"{demo.queue}-poison").get_queue_properties().approximate_message_count or 0
    )


def wait_until_done(demo: Demo, timeout_s: float) -> Counter[str]:
    ids = list(demo.jobs)
    started = time.monotonic()
    last = ""
    tty = sys.stdout.isatty()
    while True:
        counts = statuses(demo, ids)
        done = counts["completed"]
        bar = "#" * int(30 * done / len(ids))
        others = " ".join(f"{k}={v}" for k, v in sorted(counts.items()) if k != "completed")
        line = f"  [{bar:30}] {done}/{len(ids)} completed  {others}"
        if demo.watch:
            line += f"  | {demo.watch}: {next(iter(statuses(demo, [demo.watch])))}"
        if line != last:
            sys.stdout.write(("\r" if tty else "") + line + (" " * 10 if tty else "\n"))
            sys.stdout.flush()
            last = line
        if done == len(ids) and queue_empty(demo):
            print()
            return counts
        if time.monotonic() - started > timeout_s:
            print()
            raise TimeoutError(f"jobs not done after {timeout_s:.0f}s: {dict(counts)}")
        time.sleep(1.0)


def independent(text: str, payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The same aggregation with the csv module and dicts, nothing shared with the engine."""
    groups: dict[tuple[str | None, ...], dict[str, list[float]]] = {}
    counts: dict[tuple[str | None, ...], int] = {}
    for row in csv.DictReader(io.StringIO(text)):
        key = tuple(row[c] if row[c] not in ("", "NA") else None for c in payload["group_by"])
        counts[key] = counts.get(key, 0) + 1
        bucket = groups.setdefault(key, {})
        for col in {m["column"] for m in payload["metrics"] if "column" in m}:
            values = bucket.setdefault(col, [])
            if row[col] not in ("", "NA"):
                values.append(float(row[col]))
    out = []
    for key in sorted(counts, key=lambda k: tuple((v is not None, v or "") for v in k)):
        row_out: dict[str, Any] = dict(zip(payload["group_by"], key, strict=True))
        for m in payload["metrics"]:
            col = m.get("column")
            vals = groups[key].get(col, []) if col else []
            name = m.get("as") or ("count" if m["op"] == "count" and not col else f"{m['op']}_{col}")
            if m["op"] == "count":
                row_out[name] = len(vals) if col else counts[key]
            elif not vals:
                row_out[name] = None
            else:
                row_out[name] = REDUCERS[m["op"]](vals)
        out.append(row_out)
    return out


def same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    if len(a) != len(b):
        return False
    for ra, rb in zip(a, b, strict=True):
        if ra.keys() != rb.keys():
            return False
        for k in ra:
            x, y = ra[k], rb[k]
            if isinstance(x, float) or isinstance(y, float):
                if x is None or y is None or abs(x - y) > 1e-9 * max(1.0, abs(x), abs(y)):
                    return False
            elif x != y:
                return False
    return True


def verify(demo: Demo, sample: int, rng: random.Random) -> int:
    checked = 0
    for job_id in rng.sample(list(demo.jobs), min(sample, len(demo.jobs))):
        status, doc = demo.api("GET", f"jobs/{job_id}/result")
        payload = demo.jobs[job_id]
        expected = independent(demo.files[payload["input"].split("/", 1)[1]], payload)
        if status != 200 or not same(doc["rows"], expected):
            raise AssertionError(f"job {job_id}: result differs from the independent computation")
        checked += 1
    return checked


def poison_reasons(demo: Demo) -> list[tuple[str, str]]:
    container = demo.blob.get_container_client("poison-archive")
    out = []
    for blob in container.list_blobs():
        if blob.name.startswith(("jobs/", "unparsed/")):
            entry = json.loads(container.download_blob(blob.name).readall())
            out.append((entry.get("job_id") or "(no id)", entry["reason"]))
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=150)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--duplicates", type=int, default=15)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument(
        "--no-spark", action="store_true", help="skip the local Spark cluster and the offloaded job"
    )
    parser.add_argument(
        "--spark-rows", type=int, default=300_000, help="rows of the input that goes to Spark"
    )
    args = parser.parse_args(argv)
    rng = random.Random(42)
    logs = REPO_ROOT / ".devstack" / time.strftime("demo-%Y%m%d-%H%M%S")
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print("starting Azurite ...")
    azurite = start_azurite(location=logs / "azurite", log_path=logs / "azurite.log")
    host: HostProcess | None = None
    cluster = None
    try:
        settings = {"JOBS_QUEUE": QUEUE, "MAX_ATTEMPTS": "3"}
        if not args.no_spark:
            from devstack.spark_cluster import start_cluster

            print("starting a local Spark cluster (standalone master + worker) ...")
            cluster = start_cluster(base_dir=logs / "spark")
            settings.update(cluster.env(), SPARK_POLL_INITIAL_SECONDS="3", SPARK_POLL_MAX_SECONDS="5")
            print(f"  Spark REST API at {cluster.rest_url}")
        env = host_env(azurite.connection_string, settings)
        init_storage(env)
        print("starting the local Functions host ...")
        host = HostProcess(env, log_path=logs / "host.log").start()
        demo = Demo(azurite, host, queue=read_queues(env).default.name)
        print(f"  host at {host.url}; logs in {logs.relative_to(REPO_ROOT)}")
        print(f"uploading {args.files} CSV files x {args.rows} rows ...")
        upload_data(demo, args.files, args.rows)
        print(f"submitting {args.jobs} aggregate jobs through POST /api/jobs, and 6 broken messages ...")
        t0 = time.monotonic()
        send_broken(demo)
        spark_ids = submit_spark_pair(demo, args.spark_rows) if cluster else None
        demo.watch = spark_ids[0] if spark_ids else None
        submit_jobs(demo, args.jobs, rng)
        counts = wait_until_done(demo, args.timeout)
        spark_s = follow_spark(demo, *spark_ids, timeout_s=args.timeout) if spark_ids else None
        print(f"delivering {args.duplicates} completed jobs again (duplicates) ...")
        send_duplicates(demo, args.duplicates)
        counts = wait_until_done(demo, args.timeout)
        elapsed = time.monotonic() - t0
        checked = verify(demo, 10, rng)
        stats = host.stats()
        reasons = poison_reasons(demo)
        held = held_on_poison_queue(demo)
        print_summary(demo, counts, stats, reasons, held, checked, elapsed, time.monotonic() - started, logs)
        if spark_s is not None:
            print(
                f"\n  large job on Spark: completed, result equal to the inline engine's ({args.spark_rows} rows)"
            )
        offer_console(host)
        duplicates_seen = count_decisions(logs / "host.log").get("duplicate", 0)
        if (
            counts["completed"] != len(demo.jobs)
            or len(reasons) + held < len(demo.broken)
            or duplicates_seen < demo.duplicates
        ):
            print("FAILED: not every job ended where it should", file=sys.stderr)
            return 1
        return 0
    finally:
        if host:
            host.stop()
        if cluster:
            cluster.stop()
        azurite.cleanup()
        print("stopped the host, Spark and Azurite.")


def offer_console(host: HostProcess) -> None:
    """End with the console's URL; at a terminal, keep the stack up until Enter or Ctrl-C."""
    print(f"\n  operator console: {host.url}/api/console  (jobs, timelines, poison: replay, park, edit)")
    if not sys.stdin.isatty():
        return
    print("  the stack stays up for the console; press Enter (or Ctrl-C) to stop it", flush=True)
    with contextlib.suppress(EOFError, KeyboardInterrupt):
        input()


def print_summary(
    demo: Demo,
    counts: Counter[str],
    stats: dict[str, Any],
    reasons: list[tuple[str, str]],
    held: int,
    checked: int,
    elapsed: float,
    total: float,
    logs: Path,
) -> None:
    decisions = count_decisions(logs / "host.log")
    queues = stats.get("queues", {})
    messages = sum(q.get("invocations", 0) for q in queues.values())
    requests = stats.get("storage_requests", {})
    total_requests = requests.get("total", 0) if isinstance(requests, dict) else 0
    total_requests -= sum(q.get("empty_polls", 0) for q in queues.values())  # idle polling is not per message
    print()
    print("summary")
    print("-------")
    rows = [
        ("jobs completed", f"{counts['completed']} / {len(demo.jobs)}"),
        ("results checked against an independent computation", f"{checked} / {checked} equal"),
        ("duplicate deliveries suppressed", f"{decisions.get('duplicate', 0)} (sent {demo.duplicates})"),
        ("retries scheduled", str(decisions.get("retry_scheduled", 0))),
        ("poisoned (archived with a reason)", str(len(reasons))),
        ("held on the poison queue (not base64: no function can take it)", str(held)),
        ("queue messages handled by the host", str(messages)),
        (
            "storage requests per message (API, host and job I/O; idle polls excluded)",
            f"{total_requests / max(messages, 1):.2f}",
        ),
        ("elapsed, submit to last result", f"{elapsed:.1f} s"),
        ("elapsed, whole demo", f"{total:.1f} s"),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    print()
    print("  poisoned jobs and their reasons:")
    for job_id, reason in reasons:
        print(f"    {job_id:12} {reason[:110]}")


if __name__ == "__main__":
    sys.exit(main())
