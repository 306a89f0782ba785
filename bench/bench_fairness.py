"""Several queues, one flooded (issue 46): does a flood on one queue delay the others' jobs?

One local host with the shipped host.json and settings sample, three declared queues
(`JOBS_QUEUES`): two small ones (`a`, the default, and `b`) and `flood`. Every job is an `http`
job against a local downstream answering after `--latency-ms` (200). Runs side by side in one
Azurite (`--scenarios` picks some):

0. backlog: Azurite alone, no host: a small queue's send + receive + delete with another queue
   empty and `--flood` deep, alternately, twice (what a deep backlog costs everyone there);
1. alone: 20 jobs on `a` and 20 on `b`, POSTed over 10 s (alternating), nothing else;
2. unfair: `--flood` (2,000) jobs put on `flood` directly, released at once, then the same
   small jobs POSTed over 10 s while the flood drains, with `FAIR_SHARE=false` (as before it);
3. flooded: the same with the fair share (shared/pipeline/fair_share.py); with `--no-drain` the
   host stops once the small jobs are done (and what is left of the flood is cleared);
4. the flood alone, four times: `FAIR_SHARE=false` (no limit of any kind configured), with the
   fair share, with it, without it (alternating, so the machine's drift cancels); the fair
   share's jobs/s over all its runs against the unlimited's (work-conserving: target >= 90%);
   with `--window S`, each run's jobs/s over S seconds (after 5) with its backlog still deep.

Printed (and JSON on stdout): each small queue's POST-to-completed p50 / p95 (the host's
`completed` decisions: finished - created_at, the API stamping created_at) alone and flooded,
their ratio and difference, the target (flooded p95 within max(1.5x, +2 s) of alone), and the
flood's jobs/s alone and flooded.

    python -m bench.bench_fairness [--flood N] [--small N] [--over-s S] [--latency-ms MS] [--quick]
        [--scenarios alone,unfair,flooded,floodalone,backlog] [--no-drain] [--window S]

The machine's load average is printed with every run.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench.bench_host import (
    Site,
    azurite_site,
    completed_latencies,
    envelope,
    make_app_dir,
    paused,
    percentile,
    prefill,
    queue_client,
    shipped_queue_options,
    snapshot,
    stop_hosts,
    wait_for,
)
from bench.bench_http_kind import downstream
from devstack.hostproc import REPO_ROOT, HostProcess

TAG = "fair"
WARM_UP_S = 5.0
"""With `--window`, the flood alone runs this long before its jobs/s is measured."""
SCENARIOS = frozenset({"alone", "unfair", "flooded", "floodalone", "backlog"})
QUEUES = {"a": f"{TAG}-a", "b": f"{TAG}-b", "flood": f"{TAG}-flood"}


def post(host: HostProcess, body: dict[str, Any], tries: int = 5) -> tuple[int, float]:
    """POST a job as a producer does: a 503 is posted again after its Retry-After (the same
    request then finishes its send: 202, or 409 `same_request`). The status and its seconds."""
    start = time.monotonic()
    status = _post(host, body, tries)
    return status, time.monotonic() - start


def _post(host: HostProcess, body: dict[str, Any], tries: int) -> int:
    for _ in range(tries):
        req = urllib.request.Request(
            f"{host.url}/api/jobs",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            if exc.code != 503:
                return int(exc.code)
            time.sleep(float(exc.headers.get("Retry-After") or 1))
    return 503


def submit_small(host: HostProcess, url: str, run: str, small: int, over_s: float) -> list[tuple[int, float]]:
    """`small` jobs on each of `a` and `b`, POSTed evenly over `over_s` seconds, alternating:
    each POST's status and seconds."""
    count = 2 * small
    start = time.monotonic()
    statuses = []
    for i in range(count):
        due = start + i * over_s / count
        time.sleep(max(0.0, due - time.monotonic()))
        lane = "a" if i % 2 == 0 else "b"
        body = {"id": f"{run}-{lane}-{i // 2:03d}", "kind": "http", "payload": {"url": url}}
        if lane == "b":
            body["queue"] = QUEUES["b"]  # `a` is the default queue: no field needed
        statuses.append(post(host, body))
    return statuses


def drain(host: HostProcess, queue: str, target: int, timeout_s: float) -> None:
    wait_for([host], queue, "deletes", target, timeout_s, every=0.25)


def scenario(
    site: Site,
    app_dir: Path,
    url: str,
    run: str,
    flood: int,
    small: int,
    over_s: float,
    timeout_s: float,
    fair: bool = True,
    drain_flood: bool = True,
    window_s: float = 0.0,
) -> dict[str, Any]:
    """One run on a fresh host: the flood (if any) released, then the small jobs POSTed. Without
    `drain_flood` the host stops once the small jobs are done (no flood figures). With `window_s`
    (the flood alone) the flood's jobs/s is its deletes over `window_s` seconds after `WARM_UP_S`,
    its backlog still about `flood` deep, and the host stops then."""
    site.env["FAIR_SHARE"] = "true" if fair else "false"
    (host,) = site.start_hosts(1, app_dir)
    result: dict[str, Any] = {"run": run, "fair_share": fair, "load_before": _load()}
    try:
        base = {name: snapshot([host], queue).get("q.deletes", 0) for name, queue in QUEUES.items()}
        texts = [envelope(f"{run}-flood-{i:05d}", "http", {"url": url}) for i in range(flood)]
        if flood:
            with paused([host]):
                prefill(site.conn, QUEUES["flood"], texts)
        released = time.monotonic()
        flood_done: dict[str, float] = {}

        def watch_flood() -> None:
            drain(host, QUEUES["flood"], base["flood"] + flood, timeout_s)
            flood_done["s"] = time.monotonic() - released

        watcher = threading.Thread(target=watch_flood, daemon=True)
        if window_s:
            drain_flood = False
            time.sleep(WARM_UP_S)
            first = snapshot([host], QUEUES["flood"]).get("q.deletes", 0)
            time.sleep(window_s)
            done = snapshot([host], QUEUES["flood"]).get("q.deletes", 0) - first
            result.update(flood_jobs=done, flood_seconds=window_s, flood_jobs_per_s=round(done / window_s, 2))
        if flood and drain_flood:
            watcher.start()
        if small:
            time.sleep(1.0 if flood else 0.0)  # the flood under way: its listener's batches in flight
            posts = submit_small(host, url, run, small, over_s)
            seconds = sorted(t for _, t in posts)
            result["posts_not_202"] = sum(1 for s, _ in posts if s != 202)
            result["post_p50_s"] = round(percentile(seconds, 50), 3)
            result["post_p95_s"] = round(percentile(seconds, 95), 3)
            for lane in ("a", "b"):
                drain(host, QUEUES[lane], base[lane] + small, timeout_s)
        if flood and drain_flood:
            watcher.join(timeout_s)
            result["flood_jobs"] = flood
            result["flood_seconds"] = round(flood_done.get("s", float("nan")), 2)
            result["flood_jobs_per_s"] = round(flood / flood_done["s"], 1) if "s" in flood_done else None
        log = host.log_path
        result["load_after"] = _load()
    finally:
        stop_hosts([host])
    if flood and not drain_flood:  # what is left of the flood goes: the next run starts from its own
        queue_client(site.conn, QUEUES["flood"]).clear_messages()
    assert log is not None
    for lane in ("a", "b") if small else ():
        latencies = sorted(completed_latencies(log, f"{run}-{lane}-").values())
        result[lane] = {
            "jobs": len(latencies),
            "p50_s": round(percentile(latencies, 50), 3),
            "p95_s": round(percentile(latencies, 95), 3),
            "max_s": round(latencies[-1], 3) if latencies else None,
        }
    return result


def _load() -> str:
    """The machine's load average (1, 5, 15 min), printed with every figure."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def backlog_cost(conn: str, flood: int, cycles: int = 60) -> list[dict[str, Any]]:
    """Azurite alone, no host: one small queue's send + receive + delete, its median and p95 ms,
    with another queue empty and holding `flood` messages, alternately, twice."""
    small, big = queue_client(conn, f"{TAG}-bl-small"), queue_client(conn, f"{TAG}-bl-flood")
    small.create_queue()
    big.create_queue()

    def cycle() -> tuple[float, float]:
        seconds = []
        for _ in range(cycles):
            start = time.perf_counter()
            small.send_message("x")
            for message in small.receive_messages(messages_per_page=16, max_messages=16):
                small.delete_message(message)
            seconds.append(time.perf_counter() - start)
        seconds.sort()
        return round(percentile(seconds, 50) * 1000, 1), round(percentile(seconds, 95) * 1000, 1)

    out = []
    for _ in range(2):
        for depth in (0, flood):
            if depth:
                prefill(conn, big.queue_name, [envelope(f"bl-{i:05d}", "noop") for i in range(depth)])
            p50, p95 = cycle()
            out.append({"other_queue_depth": depth, "p50_ms": p50, "p95_ms": p95, "load": _load()})
            big.clear_messages()
    return out


def judge(alone: dict[str, Any], flooded: dict[str, Any]) -> dict[str, Any]:
    """Each small queue's flooded p95 against max(1.5x, +2 s) of its p95 alone."""
    out: dict[str, Any] = {}
    for lane in ("a", "b"):
        before, after = alone[lane]["p95_s"], flooded[lane]["p95_s"]
        allowed = max(1.5 * before, before + 2.0)
        out[lane] = {
            "p95_alone_s": before,
            "p95_flooded_s": after,
            "ratio": round(after / before, 2) if before else None,
            "difference_s": round(after - before, 3),
            "allowed_s": round(allowed, 3),
            "met": after <= allowed,
        }
    return out


def run(
    flood: int,
    small: int,
    over_s: float,
    latency_s: float,
    log_dir: Path,
    timeout_s: float,
    scenarios: frozenset[str] = SCENARIOS,
    drain: bool = True,
    window_s: float = 0.0,
) -> dict[str, Any]:
    with azurite_site(log_dir, "fairness") as azurite, downstream(latency_s) as service:
        site = Site(azurite, TAG, log_dir).init(
            JOBS_QUEUES=",".join((QUEUES["a"], QUEUES["b"], QUEUES["flood"])),
            JOBS_QUEUE=QUEUES["a"],
            HTTP_ALLOWED_HOSTS=f"127.0.0.1:{service.server.server_address[1]}",  # that port only
        )
        app_dir = make_app_dir(Path(tempfile.mkdtemp(prefix="bench-fair-")), {})  # host.json as shipped
        url = service.url

        def small_runs(name: str, fair: bool) -> dict[str, Any] | None:
            if name not in scenarios:
                return None
            size = 0 if name == "alone" else flood
            return scenario(site, app_dir, url, name, size, small, over_s, timeout_s, fair, drain)

        backlog = backlog_cost(site.conn, flood) if "backlog" in scenarios else []
        alone = small_runs("alone", True)
        unfair = small_runs("unfair", False)
        flooded = small_runs("flooded", True)
        # the flood alone, without and with the fair share, alternately (ABBA: the machine's drift cancels)
        alone_runs = [
            scenario(
                site, app_dir, url, f"floodonly{i}", flood, 0, over_s, timeout_s, fair, window_s=window_s
            )
            for i, fair in enumerate((False, True, True, False) if "floodalone" in scenarios else ())
        ]
    verdict = judge(alone, flooded) if alone and flooded else {}
    unlimited, flood_alone = (
        _pooled([r for r in alone_runs if r["fair_share"] is fair]) for fair in (False, True)
    )
    share = _ratio(flood_alone.get("flood_jobs_per_s"), unlimited.get("flood_jobs_per_s"))
    return {
        "host_json_queues": shipped_queue_options(),
        "downstream_latency_s": latency_s,
        "flood_jobs": flood,
        "small_jobs_per_queue": small,
        "small_over_s": over_s,
        "alone": alone,
        "flooded": flooded,
        "flood_alone": flood_alone,
        "unfair": unfair,
        "unlimited": unlimited,
        "small_queues": verdict,
        "small_queues_without_fair_share": judge(alone, unfair) if alone and unfair else {},
        "small_queues_met": bool(verdict) and all(v["met"] for v in verdict.values()),
        "flood_jobs_per_s_alone": flood_alone.get("flood_jobs_per_s"),
        "flood_jobs_per_s_alone_unlimited": unlimited.get("flood_jobs_per_s"),
        "flood_jobs_per_s_flooded": (flooded or {}).get("flood_jobs_per_s"),
        "flood_alone_over_unlimited": share,
        "flood_alone_met": share is not None and share >= 0.9,
        "backlog": backlog,
    }


def _pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The flood's jobs/s over several runs (their total jobs over their total seconds)."""
    seconds = [r.get("flood_seconds") for r in runs]
    if not runs or any(not isinstance(s, int | float) or s != s for s in seconds):
        return {"runs": runs, "flood_jobs_per_s": None}
    total = sum(float(s) for s in seconds if s is not None)
    return {"runs": runs, "flood_jobs_per_s": round(sum(r["flood_jobs"] for r in runs) / total, 2)}


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return round(top / bottom, 3) if top and bottom else None


def summary(result: dict[str, Any]) -> str:
    lines = [
        f"fairness: {result['flood_jobs']} flood jobs, {result['small_jobs_per_queue']} x 2 small over "
        f"{result['small_over_s']:g} s, downstream {result['downstream_latency_s'] * 1000:.0f} ms",
    ]
    for label, run_key, key in (
        ("fair share", "flooded", "small_queues"),
        ("FAIR_SHARE=false", "unfair", "small_queues_without_fair_share"),
    ):
        run = result.get(run_key) or {}
        if run:
            lines.append(
                f"  {label}: POST p50 {run.get('post_p50_s')} s, p95 {run.get('post_p95_s')} s, "
                f"{run.get('posts_not_202')} not 202; load {run['load_before']} -> {run['load_after']}"
            )
        for lane, v in result[key].items():
            lines.append(
                f"  {label}, queue {lane}: p95 alone {v['p95_alone_s']:.2f} s, flooded {v['p95_flooded_s']:.2f} s "
                f"({v['ratio']}x, +{v['difference_s']:.2f} s; allowed {v['allowed_s']:.2f} s) "
                f"{'met' if v['met'] else 'NOT met'}"
            )
    for b in result.get("backlog") or []:
        lines.append(
            f"  Azurite, no host: a small queue's send+receive+delete with another queue "
            f"{b['other_queue_depth']} deep: p50 {b['p50_ms']} ms, p95 {b['p95_ms']} ms; load {b['load']}"
        )
    alone = result.get("alone") or {}
    if alone:
        lines.append(
            f"  alone: POST p50 {alone.get('post_p50_s')} s, p95 {alone.get('post_p95_s')} s; "
            f"load {alone['load_before']} -> {alone['load_after']}"
        )
    for r in (result.get("unlimited") or {}).get("runs", []) + (result.get("flood_alone") or {}).get(
        "runs", []
    ):
        lines.append(
            f"  {r['run']} (fair share {r['fair_share']}): {r.get('flood_jobs_per_s')} jobs/s; "
            f"load {r['load_before']} -> {r['load_after']}"
        )
    lines.append(
        f"  flood alone: {result['flood_jobs_per_s_alone']} jobs/s with the fair share, "
        f"{result['flood_jobs_per_s_alone_unlimited']} with FAIR_SHARE=false ({result['flood_alone_over_unlimited']}, "
        f"target >= 0.9: {'met' if result['flood_alone_met'] else 'NOT met'}); beside the small queues "
        f"{result['flood_jobs_per_s_flooded']} jobs/s"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--flood", type=int, default=2000)
    parser.add_argument("--small", type=int, default=20)
    parser.add_argument("--over-s", type=float, default=10.0)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--quick", action="store_true", help="300 flood jobs, 10 small (smoke test)")
    parser.add_argument(
        "--scenarios",
        default=",".join(sorted(SCENARIOS)),
        help="which runs (comma-separated): alone, unfair, flooded, floodalone (the four flood-alone "
        "runs), backlog (Azurite alone: a small queue's requests beside a deep one)",
    )
    parser.add_argument(
        "--window",
        type=float,
        default=0.0,
        help="the flood alone: its jobs/s over this many seconds (after 5 s) instead of draining it",
    )
    parser.add_argument(
        "--no-drain",
        action="store_true",
        help="stop a flooded run once the small jobs are done (no flood jobs/s beside them)",
    )
    parser.add_argument("--logs", type=Path, default=REPO_ROOT / "bench" / "out" / "logs")
    args = parser.parse_args(argv)
    flood, small = (300, 10) if args.quick else (args.flood, args.small)
    log_dir = args.logs / time.strftime("fairness-%Y%m%d-%H%M%S")
    scenarios = frozenset(x.strip() for x in args.scenarios.split(",") if x.strip())
    if not scenarios <= SCENARIOS:
        parser.error(f"--scenarios: unknown {', '.join(sorted(scenarios - SCENARIOS))}")
    result = run(
        flood,
        small,
        args.over_s,
        args.latency_ms / 1000,
        log_dir,
        1800.0,
        scenarios,
        not args.no_drain,
        args.window,
    )
    print(summary(result), file=__import__("sys").stderr)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
