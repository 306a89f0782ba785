"""Benchmark of the inline aggregate engine against the tools a user would pick instead.

One query per file, as a user would write it: group by one string column; count rows, and
mean, sum and max of numeric columns that have missing values. Four contenders run on the same
file in the same run, interleaved, best of `--repeat` (7): a naive `csv.DictReader` / `json.loads`
loop, the inline engine (streaming from a local file object, production block size), DuckDB and
Polars streaming (`scan_csv` / `scan_ndjson` + `group_by` + `collect(engine="streaming")`).
The machine is shared: only ratios taken side by side mean something. Each peer's answer is
checked against the engine's (keys and counts exact, sums and means within 1e-9 relative, max
exact), so nobody is timing a different query.

Files (generated once under --data-dir by devstack/datagen.py): a WIDE table (20 mixed columns:
integers with NA, floats, strings, timestamps; ~340k rows, ~40 MB as CSV and ~105 MB as JSON
lines) and the NARROW sales file (14 columns, 300k rows, ~30 MB).

Memory: the engine runs on a large CSV and a large JSON-lines file (~1 GB each by default) in a
child process that imports what the function app imports; its peak RSS is its own high-water
mark (VmHWM).

    python -m bench.bench_aggregate                  # speed on the 3 files + the 1 GB memory files
    python -m bench.bench_aggregate --mb 200 --jsonl-mb 200 --repeat 3
    python -m bench.bench_aggregate --azurite        # also time streaming from a local Azurite

Needs requirements-bench.txt (DuckDB, Polars). Prints a table, writes bench/out/aggregate.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from devstack import datagen  # noqa: E402
from shared.aggregation import (  # noqa: E402
    DEFAULT_BLOCK_SIZE,
    EngineOptions,
    aggregate_stream,
    parse_aggregate_payload,
)

OUT = REPO_ROOT / "bench" / "out" / "aggregate.json"
NULLS = ("", "NA")
CONTENDERS = ("naive", "engine", "duckdb", "polars")
PEERS = ("duckdb", "polars")

Rows = dict[str | None, dict[str, Any]]
"""Result by group key: {"count": n, "mean": x, "sum": x, "max": x}."""


@dataclass(frozen=True)
class Case:
    """A file and the query run on it: group by `key`; count, mean, sum, max of three columns."""

    name: str
    path: Path
    format: str
    key: str
    mean: str
    sum: str
    max: str

    def payload(self) -> dict[str, Any]:
        return {
            "input": f"bench/{self.path.name}",
            "format": self.format,
            "group_by": [self.key],
            "metrics": [
                {"op": "count", "as": "count"},
                {"op": "mean", "column": self.mean, "as": "mean"},
                {"op": "sum", "column": self.sum, "as": "sum"},
                {"op": "max", "column": self.max, "as": "max"},
            ],
        }


# --- the contenders ----------------------------------------------------------------------------


def naive(case: Case) -> tuple[int, Rows]:
    """A plain loop: `csv.DictReader` or `json.loads` per line, dict accumulators."""
    groups: dict[str | None, list[float]] = {}
    rows = 0

    def number(value: Any) -> float | None:
        return None if value is None or value in NULLS else float(value)

    with case.path.open(newline="", encoding="utf-8") as fh:
        records = csv.DictReader(fh) if case.format == "csv" else (json.loads(line) for line in fh)
        for row in records:
            rows += 1
            key = row.get(case.key)
            acc = groups.get(key)
            if acc is None:
                acc = groups[key] = [0, 0.0, 0, 0.0, -math.inf, 0]
            acc[0] += 1
            mean, total, top = (
                number(row.get(case.mean)),
                number(row.get(case.sum)),
                number(row.get(case.max)),
            )
            if mean is not None:
                acc[1] += mean
                acc[2] += 1
            if total is not None:
                acc[3] += total
            if top is not None:
                acc[4] = max(acc[4], top)
                acc[5] += 1
    out: Rows = {}
    for key, acc in groups.items():
        out[None if key in NULLS else key] = {
            "count": acc[0],
            "mean": acc[1] / acc[2] if acc[2] else None,
            "sum": acc[3],
            "max": acc[4] if acc[5] else None,
        }
    return rows, out


def engine(case: Case, block_size: int = DEFAULT_BLOCK_SIZE) -> tuple[int, Rows]:
    spec = parse_aggregate_payload(case.payload())
    with case.path.open("rb") as fh:
        result = aggregate_stream(fh, spec, options=EngineOptions(block_size=block_size))
    out = {row[case.key]: {k: row[k] for k in ("count", "mean", "sum", "max")} for row in result.rows}
    return result.input_rows, out


def duckdb_run(case: Case) -> tuple[int, Rows]:
    """DuckDB on the file: `read_csv` (NA and empty as null) or `read_json` (newline-delimited)."""
    import duckdb

    if case.format == "csv":
        types = ", ".join(f"'{c}': 'DOUBLE'" for c in dict.fromkeys((case.mean, case.sum, case.max)))
        source = f"read_csv(?, nullstr = ['', 'NA'], types = {{{types}}})"
    else:
        source = "read_json(?, format = 'newline_delimited')"
    query = (
        f'SELECT "{case.key}", count(*), avg("{case.mean}"), sum("{case.sum}"), max("{case.max}") '
        f"FROM {source} GROUP BY ALL"
    )
    with duckdb.connect() as con:
        result = con.execute(query, [str(case.path)]).fetchall()
    out = {key: {"count": n, "mean": mean, "sum": total, "max": top} for key, n, mean, total, top in result}
    return sum(r["count"] for r in out.values()), out


def polars_run(case: Case) -> tuple[int, Rows]:
    """Polars streaming: `scan_csv` / `scan_ndjson`, group_by, `collect(engine="streaming")`."""
    import polars as pl

    types = {case.key: pl.String, case.mean: pl.Float64, case.sum: pl.Float64, case.max: pl.Float64}
    if case.format == "csv":
        frame = pl.scan_csv(case.path, null_values=list(NULLS), schema_overrides=types)
    else:
        frame = pl.scan_ndjson(case.path, schema_overrides=types)
    query = frame.group_by(case.key).agg(
        pl.len().alias("count"),
        pl.col(case.mean).mean().alias("mean"),
        pl.col(case.sum).sum().alias("sum"),
        pl.col(case.max).max().alias("max"),
    )
    result = query.collect(engine="streaming")
    out = {
        row[case.key]: {k: row[k] for k in ("count", "mean", "sum", "max")}
        for row in result.iter_rows(named=True)
    }
    return sum(r["count"] for r in out.values()), out


RUNNERS: dict[str, Callable[[Case], tuple[int, Rows]]] = {
    "naive": naive,
    "engine": engine,
    "duckdb": duckdb_run,
    "polars": polars_run,
}


def same_answer(expected: Rows, got: Rows) -> str | None:
    """None if `got` is the engine's answer (keys and counts exact, floats within 1e-9 relative)."""
    if set(expected) != set(got):
        return f"different keys: {sorted(map(str, set(expected) ^ set(got)))[:5]}"
    for key, row in expected.items():
        other = got[key]
        if row["count"] != other["count"]:
            return f"count of {key!r}: {row['count']} != {other['count']}"
        for name in ("mean", "sum", "max"):
            a, b = row[name], other[name]
            if (a is None) != (b is None) or (
                a is not None and not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
            ):
                return f"{name} of {key!r}: {a!r} != {b!r}"
    return None


# --- speed -------------------------------------------------------------------------------------


def speed(case: Case, repeat: int) -> dict[str, Any]:
    """Best-of-`repeat` seconds of each contender, interleaved; answers checked against the engine's."""
    times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    answers: dict[str, tuple[int, Rows]] = {}
    for _ in range(repeat):
        for name in CONTENDERS:
            start = time.perf_counter()
            answers[name] = RUNNERS[name](case)
            times[name].append(time.perf_counter() - start)
    rows, expected = answers["engine"]
    checks = {name: same_answer(expected, answers[name][1]) for name in CONTENDERS if name != "engine"}
    for name in checks:
        if answers[name][0] != rows:
            checks[name] = f"{answers[name][0]} rows, the engine read {rows}"
        if checks[name] is not None:
            raise SystemExit(f"{case.name}: {name} computed a different answer: {checks[name]}")
    best = {name: min(t) for name, t in times.items()}
    return {
        "file": str(case.path),
        "file_mb": round(case.path.stat().st_size / 1e6, 1),
        "rows": rows,
        "groups": len(expected),
        "payload": case.payload(),
        "seconds": {name: round(s, 4) for name, s in best.items()},
        "all_seconds": {name: [round(x, 4) for x in t] for name, t in times.items()},
        "rows_per_s": {name: round(rows / s) for name, s in best.items()},
        "engine_over": {
            name: round(best[name] / best["engine"], 2) for name in CONTENDERS if name != "engine"
        },
        "answers_checked": True,
    }


# --- memory ------------------------------------------------------------------------------------

_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from shared.aggregation import EngineOptions, aggregate_stream, parse_aggregate_payload
spec = parse_aggregate_payload(json.loads({payload!r}))
start = time.perf_counter()
with open({path!r}, "rb") as fh:
    result = aggregate_stream(fh, spec, options=EngineOptions(block_size={block_size}))
elapsed = time.perf_counter() - start
try:  # this process's own high-water mark (ru_maxrss may include the parent's, from before exec)
    with open("/proc/self/status") as status:
        hwm_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
except OSError:
    hwm_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"rows": result.input_rows, "groups": result.groups, "elapsed_s": elapsed,
                  "peak_rss_kb": hwm_kb}}))
"""


def memory(case: Case, block_size: int) -> dict[str, Any]:
    """Run the engine over the case's file in a child process (which imports what the app imports).

    Peak RSS is the child's VmHWM: `getrusage(RUSAGE_CHILDREN).ru_maxrss` would also count the
    parent's memory at fork time, which the exec'd child never used.
    """
    code = _CHILD.format(
        root=str(REPO_ROOT), payload=json.dumps(case.payload()), path=str(case.path), block_size=block_size
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "file": str(case.path),
        "format": case.format,
        "file_mb": round(case.path.stat().st_size / 1e6, 1),
        "rows": child["rows"],
        "groups": child["groups"],
        "block_size": block_size,
        "elapsed_s": round(child["elapsed_s"], 2),
        "rows_per_s": round(child["rows"] / child["elapsed_s"]),
        "peak_rss_mb": round(child["peak_rss_kb"] / 1024, 1),
    }


def azurite_stream(case: Case) -> dict[str, Any]:
    """Time the engine streaming the case's file from a local Azurite (optional)."""
    from azure.storage.blob import BlobServiceClient

    from devstack.azurite import start_azurite
    from shared.blobio.reader import open_blob_stream

    az = start_azurite()
    try:
        service = BlobServiceClient.from_connection_string(az.connection_string)
        service.create_container("bench")
        blob = service.get_blob_client("bench", case.path.name)
        with case.path.open("rb") as fh:
            blob.upload_blob(fh, overwrite=True, max_concurrency=4)
        spec = parse_aggregate_payload(case.payload())
        start = time.perf_counter()
        with open_blob_stream(blob) as stream:
            rows = aggregate_stream(stream, spec).input_rows
        elapsed = time.perf_counter() - start
    finally:
        az.cleanup()
    return {"rows": rows, "elapsed_s": round(elapsed, 3), "rows_per_s": round(rows / elapsed)}


# --- files -------------------------------------------------------------------------------------


def ensure(path: Path, **size: Any) -> Path:
    if not path.exists():
        print(f"generating {path} ...", file=sys.stderr, flush=True)
        datagen.write(path, **size)
    return path


def cases(data_dir: Path, wide_rows: int, narrow_rows: int) -> list[Case]:
    wide = {"key": "station", "mean": "temp", "sum": "precip", "max": "wind_speed"}
    narrow = {"key": "region", "mean": "price", "sum": "qty", "max": "price"}
    return [
        Case(
            "wide CSV", ensure(data_dir / f"wide-{wide_rows}.csv", rows=wide_rows, wide=True), "csv", **wide
        ),
        Case("narrow CSV", ensure(data_dir / f"sales-{narrow_rows}.csv", rows=narrow_rows), "csv", **narrow),
        Case(
            "wide JSON lines",
            ensure(data_dir / f"wide-{wide_rows}.jsonl", rows=wide_rows, wide=True, fmt="jsonl"),
            "jsonl",
            **wide,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--wide-rows", type=int, default=340_000, help="rows of the wide files")
    parser.add_argument("--narrow-rows", type=int, default=300_000, help="rows of the narrow CSV file")
    parser.add_argument("--mb", type=float, default=1000, help="size of the memory-test CSV input (MB)")
    parser.add_argument(
        "--jsonl-mb", type=float, default=1000, help="JSON-lines memory-test input (MB; 0: none)"
    )
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    parser.add_argument("--repeat", type=int, default=7, help="runs of each; the best counts")
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "aggregate-bench")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--azurite", action="store_true", help="also stream the wide CSV from Azurite")
    args = parser.parse_args(argv)

    report: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_1m_before": round(os.getloadavg()[0], 2),
        },
        "versions": versions(),
        "speed": {},
    }
    all_cases = cases(args.data_dir, args.wide_rows, args.narrow_rows)
    for case in all_cases:
        print(f"timing {case.name} ...", file=sys.stderr, flush=True)
        report["speed"][case.name] = speed(case, args.repeat)
    if not args.skip_memory:
        memory_cases = [
            replace_path(all_cases[1], ensure(args.data_dir / f"sales-{args.mb:g}mb.csv", mb=args.mb))
        ]
        if args.jsonl_mb:
            path = args.data_dir / f"wide-{args.jsonl_mb:g}mb.jsonl"
            memory_cases.append(
                replace_path(all_cases[2], ensure(path, mb=args.jsonl_mb, wide=True, fmt="jsonl"))
            )
        report["memory"] = [memory(case, args.block_size) for case in memory_cases]
    if args.azurite:
        report["azurite"] = azurite_stream(all_cases[0])
    report["machine"]["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    print_table(report)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {OUT.relative_to(REPO_ROOT)}")
    return 0


def replace_path(case: Case, path: Path) -> Case:
    return Case(case.name, path, case.format, case.key, case.mean, case.sum, case.max)


def versions() -> dict[str, str]:
    import duckdb
    import polars
    import pyarrow

    return {"pyarrow": pyarrow.__version__, "duckdb": duckdb.__version__, "polars": polars.__version__}


def print_table(report: dict[str, Any]) -> None:
    m = report["machine"]
    v = report["versions"]
    print(
        f"\nmachine: {m['cpus']} cpus, load average (1 min) {m['load_avg_1m_before']} before, "
        f"{m['load_avg_1m_after']} after; pyarrow {v['pyarrow']}, DuckDB {v['duckdb']}, Polars {v['polars']}"
    )
    print("query: group by one string column; count, mean, sum, max of numeric columns with NA")
    print("(best of the interleaved runs; every peer's answer checked equal to the engine's)\n")
    header = f"{'input':18}{'MB':>6}{'rows':>9}" + "".join(f"{name + ' rows/s':>15}" for name in CONTENDERS)
    print(header + f"{'engine/naive':>14}{'engine/DuckDB':>15}{'engine/Polars':>15}")
    for name, s in report["speed"].items():
        rates = "".join(f"{s['rows_per_s'][c]:>15,}" for c in CONTENDERS)
        ratios = "".join(f"{s['engine_over'][c]:>14.2f}x" for c in ("naive", "duckdb", "polars"))
        print(f"{name:18}{s['file_mb']:>6}{s['rows']:>9,}{rates}{ratios}")
    print("(target: engine/Polars >= 1.0 for CSV, wide and narrow, and for JSON lines)")
    for mem in report.get("memory", []):
        print(
            f"memory ({mem['format']}): {mem['file_mb']} MB, {mem['rows']:,} rows in {mem['elapsed_s']} s "
            f"({mem['rows_per_s']:,} rows/s): engine peak RSS {mem['peak_rss_mb']} MB (target < 300 MB)"
        )
    if "azurite" in report:
        a = report["azurite"]
        print(
            f"azurite stream (wide CSV): {a['rows']:,} rows in {a['elapsed_s']} s ({a['rows_per_s']:,} rows/s)"
        )


if __name__ == "__main__":
    raise SystemExit(main())
