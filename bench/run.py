"""`make bench`: every benchmark in one command; prints a table and saves JSON.

    python -m bench.run                    # default run (~5-8 minutes on 2 cores)
    python -m bench.run --quick            # small sizes, a smoke test (~1 minute)
    python -m bench.run --messages 5000    # jobs per drain (host vs bare loop, host scaling)
    python -m bench.run --aggregate-mb 200 # the aggregate memory tests on 200 MB, not 1 GB
    python -m bench.run --spark            # also bench/bench_spark.py (slow)
    python -m bench.run --skip-http        # no http-kind section (bench_http_kind.py)
    python -m bench.run --skip-spark-versus  # no Spark-path-vs-spark.read.csv section
    python -m bench.run --skip-limits      # no limits section (bench_limits.py)
    python -m bench.run --skip-fairness    # no several-queues section (bench_fairness.py)
    python -m bench.run --out DIR          # bench.json, the PNG plot and host logs go to DIR

Sections (each starts and stops its own Azurite and local hosts):
1. the local host's message and storage-request rates against a bare receive/delete loop on the
   same Azurite, alternately in the same run, medians;
2. storage requests per message: happy, duplicate and retry paths;
3. enqueue-to-completion latency p50 / p95 under a steady load;
4. throughput against the number of host processes (1, 2, 3), plotted to throughput_vs_hosts.png;
5. the inline aggregate engine against a naive loop, DuckDB and Polars streaming on wide and narrow
   CSV and wide JSON lines, and its peak memory on 1 GB inputs (bench_aggregate.py); a job over a
   CSV / JSON-lines blob end to end vs Polars over az:// (bench_read.py; also the NYC flights as
   the package ships them and as Polars and DuckDB write them: bench/writers.py); a job over a ~300 MB and
   a 1 GB Parquet blob, as each writer of the corpus writes it (pyarrow, Polars, DuckDB, Spark), vs
   Polars scan_parquet over az:// and in memory, with its peak memory (bench_parquet.py);
6. with --spark: bench_spark.py;
7. the `http` kind against a local downstream with a set latency (bench_http_kind.py): jobs/s and
   storage requests per job on the happy path (target 4 or fewer), each key sent once; skipped
   with --skip-http;
8. the app's Spark path against Spark's own reader (`spark.read.csv(...).groupBy(...).agg(...)`)
   on the same local cluster and input, ~200 and ~500 MB, interleaved rounds (bench/spark_versus.py;
   target 1.0x or better); skipped with --skip-spark-versus, or without Java 17+.
9. limits across instances (bench_limits.py): HTTP_MAX_CONCURRENT_PER_HOST=4, two host processes,
   one downstream: storage requests a job pays for its permit, 40 jobs of 1 s (most in flight,
   time against the ideal 10 s, start after an earlier call's end), kill -9 of one host and SIGSTOP
   of the other for 90 s (most in flight, seconds until 4 are in flight again, every job completed);
   skipped with --skip-limits (--quick: no fault run);
10. several queues, one flooded with 2,000 http jobs (bench/bench_fairness.py): the two small
    queues' p95 POST-to-completed alone and beside the flood (target: within max(1.5x, +2 s)), the
    flood's jobs/s alone and beside them; skipped with --skip-fairness.
The machine is shared and noisy: speed figures are ratios taken side by side, or counts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench.bench_host import HostBenchConfig, run_all
from devstack.hostproc import REPO_ROOT

DEFAULT_OUT = REPO_ROOT / "bench" / "out"
AGGREGATE_JSON = REPO_ROOT / "bench" / "out" / "aggregate.json"  # where bench_aggregate.py writes
SPARK_JSON = REPO_ROOT / "bench" / "out" / "spark.json"  # where bench_spark.py writes
SECTIONS = ("throughput", "requests", "latency", "scaling")


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# --- the machine --------------------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def machine_info() -> dict[str, Any]:
    """What the figures came from: CPUs, memory, Python, Node, the Azurite pin and the SDKs."""
    pinned = _read_json(REPO_ROOT / "package.json").get("devDependencies", {}).get("azurite", "?")
    installed = _read_json(REPO_ROOT / "node_modules" / "azurite" / "package.json").get("version", "?")
    node = shutil.which("node")
    node_version = (
        subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip() if node else "?"
    )
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gb": round(mem_gb, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "node": node_version,
        "azurite": installed,
        "azurite_pinned": pinned,
        "azure_storage_queue": _package_version("azure-storage-queue"),
        "azure_storage_blob": _package_version("azure-storage-blob"),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


# --- the other engineers' benchmarks (called, never edited) -------------------------------------


def _help_text(module: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    return proc.stdout + proc.stderr


def _supported(help_text: str, args: list[str]) -> list[str]:
    """Keep only the `--flag value` pairs that the other script's --help lists."""
    kept: list[str] = []
    i = 0
    while i < len(args):
        flag = args[i]
        takes_value = i + 1 < len(args) and not args[i + 1].startswith("--")
        if flag in help_text.split():
            kept.extend(args[i : i + (2 if takes_value else 1)])
        else:
            progress(f"  (skipping {flag}: not in its --help)")
        i += 2 if takes_value else 1
    return kept


def run_script(module: str, args: list[str], timeout_s: float) -> dict[str, Any]:
    """Run `python -m module args`, echoing nothing; returns its output and exit code."""
    path = REPO_ROOT / Path(*module.split(".")).with_suffix(".py")
    if not path.exists():
        return {"skipped": f"{path.relative_to(REPO_ROOT)} is not there"}
    wanted = _supported(_help_text(module), args)
    command = [sys.executable, "-m", module, *wanted]
    progress(f"[{module}] {' '.join(command[1:])} ...")
    started = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"command": command[1:], "error": f"timed out after {timeout_s:.0f}s"}
    result: dict[str, Any] = {
        "command": ["python", *command[1:]],
        "exit_code": proc.returncode,
        "elapsed_s": round(time.perf_counter() - started, 1),
        "stdout": proc.stdout,
    }
    if proc.returncode != 0:
        result["error"] = proc.stderr.strip().splitlines()[-20:]
    return result


def run_section(module: str, flags: list[str], timeout_s: float, out: Path | None = None) -> dict[str, Any]:
    """`run_script`, then, when it exits 0, its report (`report`): the JSON it saved at `out`
    (passed as `--out`), or without `out` the JSON it printed."""
    result = run_script(module, flags if out is None else [*flags, "--out", str(out)], timeout_s)
    if result.get("exit_code") != 0:
        return result
    if out is not None:
        result["report"] = _read_json(out)
        return result
    try:
        result["report"] = json.loads(result["stdout"])
    except ValueError:
        result["error"] = "its output is not JSON"
    return result


def section_head(title: str, result: dict[str, Any]) -> tuple[list[str], dict[str, Any] | None]:
    """A section's first lines (a blank line and its title; FAILED and why when it has no report)
    and its report."""
    lines = ["", title]
    report = result.get("report")
    if not report:
        why = result.get("error") or result.get("skipped") or f"exit code {result.get('exit_code')}"
        lines.append(f"   FAILED ({why})")
    return lines, report or None


def run_aggregate(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """bench/bench_aggregate.py: rows/s and ratios to the peers, and peak memory."""
    if args.quick:
        flags = [
            "--mb",
            "20",
            "--jsonl-mb",
            "20",
            "--wide-rows",
            "50000",
            "--narrow-rows",
            "50000",
            "--repeat",
            "1",
        ]
    else:
        mb = "1000" if args.full else str(args.aggregate_mb)
        flags = ["--mb", mb, "--jsonl-mb", mb]
    result = run_script("bench.bench_aggregate", flags, timeout_s=3600)
    if result.get("exit_code") == 0 and AGGREGATE_JSON.exists():
        result["report"] = _read_json(AGGREGATE_JSON)
        if out_dir.resolve() != AGGREGATE_JSON.parent.resolve():
            shutil.copy2(AGGREGATE_JSON, out_dir / AGGREGATE_JSON.name)
    return result


def run_read(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """bench/bench_read.py: a job over a blob end to end vs Polars over az://, the SDK, the reader."""
    flags = ["--mb", "20", "--repeat", "1"] if args.quick else ["--mb", "300,1000", "--writers"]
    return run_section("bench.bench_read", flags, 5400, out_dir / "read.json")


def run_parquet(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """bench/bench_parquet.py: a job over a Parquet blob end to end vs Polars scan_parquet(az://)."""
    flags = ["--mb", "20", "--repeat", "1"] if args.quick else ["--mb", "300,1000"]
    return run_section("bench.bench_parquet", flags, 3 * 3600, out_dir / "parquet.json")  # 4 writers


def run_http(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """bench/bench_http_kind.py: http jobs against a local downstream (its JSON on stdout)."""
    flags = ["--quick"] if args.quick else ["--jobs", str(args.http_jobs)]
    return run_section("bench.bench_http_kind", [*flags, "--logs", str(out_dir / "logs")], 1800)


def run_fairness(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """bench/bench_fairness.py: three queues, one flooded (its JSON on stdout)."""
    flags = ["--quick"] if args.quick else []
    bounded = ["--no-drain", "--window", "60"]  # minutes, not an hour, with a backlog of 2,000
    return run_section("bench.bench_fairness", [*flags, *bounded, "--logs", str(out_dir / "logs")], 3600)


def format_fairness(fair: dict[str, Any]) -> list[str]:
    """Section 10's lines."""
    lines, report = section_head("10. Several queues, one flooded (bench/bench_fairness.py)", fair)
    if report is None:
        return lines
    for lane, v in report["small_queues"].items():
        lines.append(
            f"   small queue {lane}: p95 POST-to-completed alone {v['p95_alone_s']:.2f} s, with the flood "
            f"{v['p95_flooded_s']:.2f} s ({v['ratio']}x; target <= max(1.5x, +2 s) = {v['allowed_s']:.2f} s: "
            f"{_ok(v['met'])})"
        )
    for lane, v in report["small_queues_without_fair_share"].items():
        lines.append(f"   (FAIR_SHARE=false, queue {lane}: {v['p95_flooded_s']:.2f} s, {v['ratio']}x)")
    lines.append(
        f"   flood of {report['flood_jobs']} alone: {report['flood_jobs_per_s_alone']} jobs/s, "
        f"{report['flood_jobs_per_s_alone_unlimited']} with FAIR_SHARE=false ({report['flood_alone_over_unlimited']}; "
        f"target >= 0.9: {_ok(report['flood_alone_met'])})"
    )
    return lines


def format_http(http: dict[str, Any]) -> list[str]:
    """Section 7's lines."""
    lines, report = section_head(
        "7. The http kind against a local downstream (bench/bench_http_kind.py)", http
    )
    if report is None:
        return lines
    per_job, target = (
        report["storage_requests_per_job_besides_queue"],
        report["target_storage_requests_per_job"],
    )
    row = report["requests"]
    lines += [
        f"   {report['jobs']} jobs, downstream latency {report['downstream_latency_s'] * 1000:.0f} ms, 1 host: "
        f"{report['jobs_per_s']} jobs/s ({report['seconds']} s), {report['calls']} calls, "
        f"keys sent more than once: {report['keys_sent_more_than_once']}",
        # a request or two in the whole window (a once-a-process table or sweep read) is not the path's
        f"   storage requests per job besides the queue's: {per_job} (target <= {target}, to 2 decimals: "
        f"{_ok(round(per_job, 2) <= target)}); "
        f"with the receive share and the delete: {row['requests_per_message']}",
    ]
    return lines


def run_limits(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """bench/bench_limits.py: permits across two hosts (its JSON saved beside bench.json)."""
    flags = ["--quick"] if args.quick else []
    return run_section(
        "bench.bench_limits", [*flags, "--logs", str(out_dir / "logs")], 1800, out_dir / "limits.json"
    )


def format_limits(limits: dict[str, Any]) -> list[str]:
    """Section 9's lines."""
    lines, report = section_head("9. Limits across instances (bench/bench_limits.py)", limits)
    if report is None:
        return lines
    cost, tp = report["cost"], report["throughput"]
    lines += [
        f"   storage requests of a permit's acquire + release: {cost['permit_requests_per_job']} "
        f"(target <= {cost['target_permit_requests_per_job']}: {_ok(cost['permit_requests_per_job'] <= 2.005)}); "
        f"two instances alternating: {cost['requests_per_job_two_instances_alternating']}",
        f"   {tp['jobs']} jobs of {tp['call_s']:g} s, limit {report['limit']}, {report['hosts']} hosts: most in flight "
        f"{tp['max_in_flight']} ({_ok(tp['max_in_flight'] <= report['limit'])}), {tp['seconds_to_last_call_end']} s "
        f"= {tp['ratio_to_ideal']}x the ideal {tp['ideal_s']:g} s (target <= {tp['target_ratio']}: "
        f"{_ok(tp['ratio_to_ideal'] <= tp['target_ratio'])}); start after an earlier end p50 "
        f"{tp['start_after_end_p50_s']} s, p95 {tp['start_after_end_p95_s']} s (target <= 1: "
        f"{_ok(tp['start_after_end_p95_s'] <= 1.0)})",
    ]
    faults = report.get("faults")
    if faults:
        back = [faults["seconds_to_4_in_flight_after_kill"], faults["seconds_to_4_in_flight_after_sigstop"]]
        lines.append(
            f"   kill -9 then SIGSTOP {faults['freeze_s']:g} s: most in flight {faults['max_in_flight']} "
            f"({_ok(faults['max_in_flight'] <= report['limit'])}), 4 in flight again after {back[0]} s and "
            f"{back[1]} s (target <= {faults['target_s']}: {_ok(all(b is not None and b <= 60 for b in back))}), "
            f"completed {faults['completed']} of {faults['jobs']}, jobs called twice {faults['jobs_called_more_than_once']}"
        )
    return lines


def run_spark(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """bench/bench_spark.py, when asked for (slow): it starts its own Azurite and Spark cluster."""
    flags = ["--sizes", "10,50", "--repeat", "1"] if args.quick else []
    result = run_script("bench.bench_spark", flags, timeout_s=3600)
    if result.get("exit_code") == 0 and SPARK_JSON.exists():
        result["report"] = _read_json(SPARK_JSON)
        if out_dir.resolve() != SPARK_JSON.parent.resolve():
            shutil.copy2(SPARK_JSON, out_dir / SPARK_JSON.name)
    return result


def run_spark_versus(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """bench/spark_versus.py: the Spark path vs spark.read.csv on one local cluster (its own stack)."""
    flags = ["--sizes", "20", "--rounds", "1"] if args.quick else ["--sizes", "200,500", "--rounds", "3"]
    return run_section("bench.spark_versus", flags, 3600, out_dir / "spark_versus.json")


def format_versus(versus: dict[str, Any]) -> list[str]:
    """Section 8's lines."""
    title = "8. The Spark path vs spark.read.csv(...).groupBy(...).agg(...) (bench/spark_versus.py)"
    lines, report = section_head(title, versus)
    if report is None:  # what it printed says how far it got
        return [*lines, *("   " + line for line in versus.get("stdout", "").strip().splitlines())]
    for name, got in report.get("scanner", {}).items():
        lines.append(
            f"   {name} MB: median {got['median']:.2f}x, best {got['best']:.2f}x (target >= 1.0: "
            f"{_ok(got['median'] >= 1.0)}); rounds {got['ratios']}: app {got['app_s']} s, "
            f"spark.read.csv {got['spark_s']} s [{'; '.join(got['scanner'])}]"
        )
    return lines


# --- the table ----------------------------------------------------------------------------------


def _ok(good: bool) -> str:
    return "ok" if good else "MISSED"


def format_report(report: dict[str, Any]) -> str:
    """The printed table (plain text, fixed width)."""
    lines: list[str] = []
    add = lines.append
    m = report["machine"]
    add("Benchmarks: " + report["mode"] + f", {report['started_at']}, {report['elapsed_s']:.0f} s in all")
    add(
        f"machine: {m['cpus']} CPUs ({m['cpu_model']}), {m['memory_gb']} GB, {m['os']}; Python {m['python']}, "
        f"Node {m['node']}, Azurite {m['azurite']} (pinned {m['azurite_pinned']}), "
        f"azure-storage-queue {m['azure_storage_queue']}, azure-storage-blob {m['azure_storage_blob']}; "
        f"load average at start {m['load_average_at_start']}"
    )
    host = report.get("host", {})

    t = host.get("throughput")
    if t:
        c = t["concurrency"]
        cpus = report["machine"]["cpus"]
        add("")
        add(
            f"1. Local host vs bare receive/delete loop: same Azurite, same run, noop jobs pre-filled per drain, "
            f"{t['rounds']} alternating round(s) (bare, host, bare, host, ...), medians"
        )
        add(
            f"   both: receive({c['batch']}), a new receive when in flight <= {c['new_batch_threshold']}, "
            f"up to {c['max_in_flight']} in flight; host: claim + complete on the ledger, then delete"
        )
        add(
            f"   {'jobs':>6} {'consumer':<9}{'msg/s':>8}{'req/s':>8}{'req/msg':>8}{'CPU cons.':>10}"
            f"{'CPU Azurite':>12}{'machine':>8}{'Azurite ms/req':>15}   runs (msg/s)"
        )
        for series in t.get("by_depth", [t]):
            for name in ("bare", "host"):
                med = series["median"][name]
                runs = ", ".join(
                    f"{r['messages_per_s']:.0f}" for r in series["runs"] if r["consumer"] == name
                )
                add(
                    f"   {series['messages']:>6} {name:<9}{med['messages_per_s']:>8.1f}{med['requests_per_s']:>8.1f}"
                    f"{med['requests_per_message']:>8.3f}{med['consumer_cores']:>10.2f}{med['azurite_cores']:>12.2f}"
                    f"{med['machine_busy_cores']:>8.2f}{med['azurite_cpu_ms_per_request']:>15.2f}   {runs}"
                )
            target = t["request_rate_ratio_target"]
            add(
                f"   {series['messages']:>6} host / bare: storage requests/s {series['request_rate_ratio']:.3f}x "
                f"(target >= {target}x: {_ok(series['request_rate_ratio'] >= target)}); "
                f"messages/s {series['message_rate_ratio']:.3f}x"
            )
            if "request_rate_ratio_by_round" in series:
                by_round = ", ".join(f"{x:.2f}" for x in series["request_rate_ratio_by_round"])
                add(
                    f"   {'':>6} requests/s ratio round by round: {by_round} "
                    f"(median {series['request_rate_ratio_paired_median']:.3f}x)"
                )
        add(
            f"   (CPU columns: cores busy during the drain = CPU seconds / wall seconds, of {cpus}; machine = all "
            "processes, other people's work included; Azurite ms/req = Azurite CPU per storage request)"
        )

    r = host.get("requests")
    if r:
        add("")
        add("2. Storage requests per message (the host's own count; empty polls and sweep peeks subtracted)")
        add(
            f"   {'path':<40}{'batch':>6}{'jobs':>6}{'msg/rcv':>8}{'receive':>9}{'delete':>8}"
            f"{'ledger W':>9}{'ledger R':>9}{'q send':>8}{'index W':>8}{'total':>8}{'expected':>9}"
        )
        for row in r["rows"]:
            p = row["per_message"]
            add(
                f"   {row['path']:<40}{row['batch_size']:>6}{row['jobs']:>6}{row['messages_per_receive']:>8}"
                f"{p['receive']:>9.3f}{p['delete']:>8.2f}{p['ledger write']:>9.2f}{p['ledger read']:>9.2f}"
                f"{p['queue send']:>8.2f}{p.get('index write', 0):>8.2f}{row['requests_per_message']:>8.3f}"
                f"{row['expected']:>9.3f}" + (f"  other {p['other']}" if "other" in p else "")
            )
        happy = r["rows"][0]["requests_per_message"]
        add(
            f"   happy path {happy:.3f} (target <= {r['target_happy']}: 3.1 + {r.get('index_writes_per_message', 0)} "
            f"index write per message: {_ok(happy <= r['target_happy'])})"
        )
        add(f"   {r['note']}")
        if r.get("housekeeping_requests"):
            add(
                "   measured after each host's first poison sweep, whose retention run (index tables "
                "hourly, blob rules every 5 minutes on the local stack) made "
                f"{' and '.join(str(n) for n in r['housekeeping_requests'])} requests: once per process "
                "and hour, not per message"
            )

    lat = host.get("latency")
    if lat:
        add("")
        q = lat["host_json"]
        add(
            f"3. Enqueue-to-completion latency: {lat['rate_per_s']:g} noop jobs/s for {lat['seconds']:g} s "
            f"({lat['jobs']} jobs, achieved {lat['achieved_rate_per_s']}/s), 1 host, shipped host.json "
            f"(batchSize {q.get('batchSize')}, maxPollingInterval {q.get('maxPollingInterval')})"
        )
        add(
            f"   p50 {lat['p50_s'] * 1000:.0f} ms   p95 {lat['p95_s'] * 1000:.0f} ms   "
            f"p99 {lat['p99_s'] * 1000:.0f} ms   max {lat['max_s'] * 1000:.0f} ms   mean {lat['mean_s'] * 1000:.0f} ms"
        )

    s = host.get("scaling")
    if s:
        add("")
        add(
            f"4. Throughput vs host processes: {s['messages']:,} noop jobs pre-filled, k hosts compete; "
            f"{s['rounds']} alternating round(s), medians"
        )
        add(
            f"   {'hosts':<8}{'seconds':>9}{'msg/s':>9}{'req/s':>9}{'CPU hosts':>11}{'CPU Azurite':>13}"
            f"{'machine':>9}   runs (msg/s)"
        )
        for row in s["rows"]:
            runs = ", ".join(f"{r['messages_per_s']:.0f}" for r in row.get("runs", []))
            add(
                f"   {row['hosts']:<8}{row['seconds']:>9.2f}{row['messages_per_s']:>9.1f}"
                f"{row['requests_per_s']:>9.1f}{row['consumer_cores']:>11.2f}{row['azurite_cores']:>13.2f}"
                f"{row['machine_busy_cores']:>9.2f}   {runs}"
            )
        if report.get("plot"):
            add(f"   plot: {report['plot']}")

    agg = report.get("aggregate")
    if agg:
        add("")
        add("5. Inline aggregate engine (bench/bench_aggregate.py)")
        if "skipped" in agg:
            add(f"   skipped: {agg['skipped']}")
        elif agg.get("exit_code") != 0:
            add(f"   FAILED ({agg.get('error')})")
        else:
            add(f"   $ {' '.join(agg['command'])}")
            for line in agg["stdout"].strip().splitlines():
                if line.strip() and not line.startswith("wrote "):
                    add("   " + line)

    read = report.get("read")
    if read:
        add("")
        add("5b. A job over a blob end to end vs Polars over az:// (bench/bench_read.py)")
        if read.get("exit_code") != 0:
            add(f"   FAILED ({read.get('error')})")
        else:
            for line in read["stdout"].strip().splitlines():
                if line.strip() and not line.startswith("wrote "):
                    add("   " + line)

    parquet = report.get("parquet")
    if parquet:
        add("")
        add("5c. A job over a Parquet blob end to end vs Polars scan_parquet(az://) (bench/bench_parquet.py)")
        if parquet.get("exit_code") != 0:
            add(f"   FAILED ({parquet.get('error')})")
        else:
            for line in parquet["stdout"].strip().splitlines():
                if line.strip() and not line.startswith("wrote "):
                    add("   " + line)
    if report.get("http"):
        lines.extend(format_http(report["http"]))
    if report.get("spark_versus"):
        lines.extend(format_versus(report["spark_versus"]))
    if report.get("limits"):
        lines.extend(format_limits(report["limits"]))
    if report.get("fairness"):
        lines.extend(format_fairness(report["fairness"]))

    spark = report.get("spark")
    if spark:
        add("")
        add("6. Spark (bench/bench_spark.py)")
        if "skipped" in spark:
            add(f"   skipped: {spark['skipped']}")
        else:
            if spark.get("exit_code") != 0:
                add(f"   FAILED ({spark.get('error')})")
            for line in spark.get("stdout", "").strip().splitlines():
                add("   " + line)
    return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=None, help="jobs per drain (default 2000)")
    parser.add_argument("--rounds", type=int, default=None, help="alternating bare/host rounds (default 5)")
    parser.add_argument(
        "--shallow",
        type=int,
        default=None,
        help="host vs bare loop again at this queue depth (default 500; 0: no)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default bench/out)")
    parser.add_argument(
        "--full", action="store_true", help="aggregate memory tests on 1 GB inputs (the default)"
    )
    parser.add_argument("--aggregate-mb", type=int, default=1000, help="aggregate memory-test inputs (MB)")
    parser.add_argument("--skip-aggregate", action="store_true")
    parser.add_argument("--skip-read", action="store_true", help="no job-over-a-blob section (bench_read)")
    parser.add_argument("--skip-parquet", action="store_true", help="no Parquet section (bench_parquet)")
    parser.add_argument("--spark", action="store_true", help="also run bench/bench_spark.py (slow)")
    parser.add_argument("--skip-http", action="store_true", help="no http-kind section (bench_http_kind)")
    parser.add_argument(
        "--skip-spark-versus", action="store_true", help="no Spark path vs spark.read.csv section"
    )
    parser.add_argument("--http-jobs", type=int, default=300, help="http jobs (default 300)")
    parser.add_argument("--skip-limits", action="store_true", help="no limits section (bench_limits)")
    parser.add_argument(
        "--skip-fairness", action="store_true", help="no several-queues section (bench_fairness)"
    )
    parser.add_argument("--only", nargs="+", choices=SECTIONS, help="host sections to run (default: all)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir: Path = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    config = HostBenchConfig.quick() if args.quick else HostBenchConfig()
    if args.messages:
        config = replace(config, messages=args.messages, scaling_messages=args.messages)
    if args.rounds:
        config = replace(config, rounds=args.rounds)
    if args.shallow is not None:
        config = replace(config, shallow_messages=args.shallow)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    started = time.perf_counter()
    report: dict[str, Any] = {
        "mode": "quick" if args.quick else ("full" if args.full else "default"),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": ["python", "-m", "bench.run", *(argv if argv is not None else sys.argv[1:])],
        "machine": machine_info(),
        "config": asdict(config),
        "logs": str(out_dir / "logs" / stamp),
    }
    report["host"] = run_all(config, out_dir / "logs" / stamp, args.only or SECTIONS, progress)
    # matplotlib is loaded here, when plotting, not by every import of this module's formatters
    from bench.plot import plot_from_report

    plot = plot_from_report(report, out_dir / "throughput_vs_hosts.png")
    if plot:
        report["plot"] = str(plot)
    if not args.skip_aggregate:
        report["aggregate"] = run_aggregate(args, out_dir)
    if not args.skip_read:
        report["read"] = run_read(args, out_dir)
    if not args.skip_parquet:
        report["parquet"] = run_parquet(args, out_dir)
    if not args.skip_http:
        report["http"] = run_http(args, out_dir)
    if not args.skip_spark_versus:
        report["spark_versus"] = run_spark_versus(args, out_dir)
    if not args.skip_limits:
        report["limits"] = run_limits(args, out_dir)
    if not args.skip_fairness:
        report["fairness"] = run_fairness(args, out_dir)
    if args.spark:
        report["spark"] = run_spark(args, out_dir)
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    path = out_dir / "bench.json"
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print()
    print(format_report(report))
    print()
    print(f"JSON: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
