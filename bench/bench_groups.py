"""Peak memory of one inline `aggregate` job by number of groups: what `MAX_GROUPS` is chosen from.

The worst case is an input whose every row is a group of its own. Each measurement runs the real
handler (`HANDLER.run`: ranged blob reads from a local Azurite, the engine, the result document
written back) in a child process that imports what the function app imports, with every metric
a job can ask for: count, and count / sum / mean / min / max of one column, grouped by two
columns (a 32-character id and a 10-character day). The child reports its RSS after the imports
(the baseline any worker process has anyway) and its high-water mark (VmHWM) after the job.
With `--concurrent K`, K such jobs run at once on threads of one child process, as the Python
worker runs up to PYTHON_THREADPOOL_THREAD_COUNT invocations at once.

    python -m bench.bench_groups                           # 100k / 200k / 300k groups, csv + jsonl
    python -m bench.bench_groups --groups 250000 --formats csv
    python -m bench.bench_groups --over 3                  # also inputs of 3x the cap, refused
    python -m bench.bench_groups --groups 50000 --concurrent 1 8 16 24   # jobs at once, one process
    python -m bench.bench_groups --groups 1000000 --formats csv --outputs parquet json csv
                                                           # the result as data (output.format), side by side

Prints a table and writes bench/out/groups.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

OUT = REPO_ROOT / "bench" / "out" / "groups.json"
METRICS: list[dict[str, str]] = [
    {"op": "count"},
    {"op": "count", "column": "v"},
    {"op": "sum", "column": "v"},
    {"op": "mean", "column": "v"},
    {"op": "min", "column": "v"},
    {"op": "max", "column": "v"},
]
GROUP_BY = ["id", "day"]
_MIX = 0x9E3779B97F4A7C15  # odd: i -> i * _MIX mod 2**128 is one-to-one, so ids stay distinct


def write_input(path: Path, rows: int, fmt: str, groups: int | None = None) -> None:
    """`rows` rows, each a group of its own (or, with `groups`, row i in group i % groups, so each
    group comes back every `groups` rows): id (32 hex characters), day, v (a number)."""
    with path.open("w", encoding="utf-8", newline="") as fh:
        if fmt == "csv":
            fh.write("id,day,v\n")
        batch: list[str] = []
        for i in range(rows):
            g = i if groups is None else i % groups
            key = f"{(g * _MIX) % 2**128:032x}"
            day = f"2024-{1 + g % 12:02d}-{1 + g % 28:02d}"
            value = f"{(i % 10_000) / 100:.2f}"
            if fmt == "csv":
                batch.append(f"{key},{day},{value}\n")
            else:
                batch.append(f'{{"id":"{key}","day":"{day}","v":{value}}}\n')
            if len(batch) >= 50_000:
                fh.write("".join(batch))
                batch.clear()
        fh.write("".join(batch))


_CHILD = r"""
import json, logging, sys, time
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, {root!r})
import azure.functions  # noqa: F401  (what the worker has loaded anyway)
from shared.core.errors import PermanentError
from shared.jobs.aggregate import HANDLER
from shared.jobs.base import JobContext
from shared.config.settings import Settings
from shared.storage.accounts import account_for

def status(field):
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(field + ":"))

settings = Settings.from_env(json.loads({env!r}))
storage = account_for(settings.storage)
payload = json.loads({payload!r})
concurrent = {concurrent}

def job(n):
    ctx = JobContext(job_id=f"{job_id}-{{n}}", kind="aggregate", attempt=0, payload=payload,
                     settings=settings, storage=storage,
                     log=logging.LoggerAdapter(logging.getLogger("bench"), {{}}),
                     checkpoint=lambda progress: None)
    try:
        return HANDLER.run(ctx).summary.get("groups"), None
    except PermanentError as exc:
        return None, f"{{exc.reason_code}}: {{exc}}"

storage.blobs(settings.results_container).check()  # connect once
baseline_kb = status("VmRSS")
start = time.perf_counter()
with ThreadPoolExecutor(concurrent) as pool:
    outcomes = list(pool.map(job, range(concurrent)))
groups, error = outcomes[0]
elapsed = time.perf_counter() - start
print(json.dumps({{"baseline_kb": baseline_kb, "peak_kb": status("VmHWM"), "elapsed_s": elapsed,
                  "groups": groups, "error": error}}))
"""


def measure(env: dict[str, str], payload: dict[str, Any], job_id: str, concurrent: int = 1) -> dict[str, Any]:
    code = _CHILD.format(
        root=str(REPO_ROOT),
        env=json.dumps(env),
        payload=json.dumps(payload),
        job_id=job_id,
        concurrent=concurrent,
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    child: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return child


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--groups", type=int, nargs="+", default=[100_000, 200_000, 300_000])
    parser.add_argument("--formats", nargs="+", default=["csv", "jsonl"], choices=["csv", "jsonl"])
    parser.add_argument("--over", type=float, default=0, help="also refuse inputs of this many times the cap")
    parser.add_argument("--concurrent", type=int, nargs="+", default=[1], help="jobs at once in one process")
    parser.add_argument(
        "--outputs",
        nargs="+",
        default=["json"],
        choices=["json", "parquet", "csv"],
        help="output.format of each job: the result document (json) or a data blob beside it",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each; the highest peak counts")
    parser.add_argument(
        "--rows-per-group",
        type=int,
        default=1,
        help="input rows per group (each group recurring every `groups` rows): 20 makes 1M groups a 1 GB CSV",
    )
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "groups-bench")
    args = parser.parse_args(argv)

    from azure.storage.blob import BlobServiceClient

    from devstack.azurite import start_azurite

    args.data_dir.mkdir(parents=True, exist_ok=True)
    az = start_azurite()
    runs: list[dict[str, Any]] = []
    try:
        service = BlobServiceClient.from_connection_string(az.connection_string)
        for name in ("data", "results"):
            service.create_container(name)
        per = args.rows_per_group
        sizes = [(fmt, cap, cap * per) for fmt in args.formats for cap in args.groups]
        if args.over:
            sizes += [(fmt, cap, int(cap * args.over)) for fmt in args.formats for cap in args.groups]
        cases = [(fmt, cap, rows, k) for fmt, cap, rows in sizes for k in args.concurrent]
        uploaded: set[str] = set()
        for (fmt, cap, rows, concurrent), output in [(c, o) for c in cases for o in args.outputs]:
            recurring = per > 1 and rows == cap * per
            name = f"groups-{cap}-x{per}.{fmt}" if recurring else f"distinct-{rows}.{fmt}"
            path = args.data_dir / name
            if not path.exists():
                write_input(path, rows, fmt, cap if recurring else None)
            if path.name not in uploaded:
                with path.open("rb") as fh:
                    service.get_blob_client("data", path.name).upload_blob(
                        fh, overwrite=True, max_concurrency=4
                    )
                uploaded.add(path.name)
            env = {"AzureWebJobsStorage": az.connection_string, "MAX_GROUPS": str(cap)}
            payload = {
                "input": f"data/{path.name}",
                "format": fmt,
                "group_by": GROUP_BY,
                "metrics": METRICS,
                "engine": "inline",
                "output": {"format": output},
            }
            job_id = f"bench-{fmt}-{cap}-{rows}-{concurrent}-{output}"
            children = [measure(env, payload, job_id, concurrent) for _ in range(args.repeat)]
            child = max(children, key=lambda c: int(c["peak_kb"]))
            result_bytes = None
            if child["error"] is None:
                name = f"{job_id}-0.json" if output == "json" else f"{job_id}-0.v0.{output}"
                result_bytes = service.get_blob_client("results", name).get_blob_properties().size
            run = {
                "format": fmt,
                "output": output,
                "max_groups": cap,
                "input_rows": rows,
                "input_mb": round(path.stat().st_size / 1e6, 1),
                "concurrent": concurrent,
                "groups": child["groups"],
                "refused": child["error"],
                "baseline_rss_mb": round(child["baseline_kb"] / 1024, 1),
                "peak_rss_mb": round(child["peak_kb"] / 1024, 1),
                "peak_rss_mb_runs": [round(c["peak_kb"] / 1024, 1) for c in children],
                "job_mb": round((child["peak_kb"] - child["baseline_kb"]) / 1024, 1),
                "elapsed_s": round(child["elapsed_s"], 2),
                "result_bytes": result_bytes,
            }
            runs.append(run)
            print(json.dumps(run), flush=True)
    finally:
        az.cleanup()
    report = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "group_by": GROUP_BY,
        "metrics": METRICS,
        "runs": runs,
    }
    print_table(runs)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {OUT.relative_to(REPO_ROOT)}")
    return 0


def print_table(runs: list[dict[str, Any]]) -> None:
    print(
        f"\n{'format':<6} {'output':<7} {'cap':>8} {'rows':>9} {'jobs':>4} {'outcome':<9} "
        f"{'base MB':>8} {'peak MB':>8} {'jobs MB':>8} {'s':>6} {'result MB':>9}"
    )
    for r in runs:
        outcome = "refused" if r["refused"] else f"{r['groups']}"
        size = "-" if r["result_bytes"] is None else f"{r['result_bytes'] / 1e6:.1f}"
        print(
            f"{r['format']:<6} {r['output']:<7} {r['max_groups']:>8} {r['input_rows']:>9} {r['concurrent']:>4} "
            f"{outcome:<9} {r['baseline_rss_mb']:>8} {r['peak_rss_mb']:>8} {r['job_mb']:>8} {r['elapsed_s']:>6} "
            f"{size:>9}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
