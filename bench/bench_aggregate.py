"""Benchmark of the inline aggregate engine against a naive `csv.DictReader` loop.

Speed: both run on the same file in the same run (the machine is shared: only the ratio means
something); the engine streams from a local file object with the production block size.
Memory: the engine runs on a large input (~1 GB by default) in a child process that imports
what the function app imports; its peak RSS is its own high-water mark (VmHWM).

    python -m bench.bench_aggregate                 # 300k-row speed file + 1 GB memory file
    python -m bench.bench_aggregate --mb 300 --speed-rows 1000000
    python -m bench.bench_aggregate --azurite       # also time streaming from a local Azurite

Prints a table and writes bench/out/aggregate.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.csv as pacsv

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import datagen  # noqa: E402
from shared.jobs.aggregate import parse_aggregate_payload  # noqa: E402
from shared.jobs.aggregate_engine import (  # noqa: E402
    DEFAULT_BLOCK_SIZE,
    AggregateSpec,
    _Accumulator,
    _Plan,
    aggregate_stream,
    to_float,
)

OUT = REPO_ROOT / "bench" / "out" / "aggregate.json"
PAYLOAD: dict[str, Any] = {
    "input": "bench/sales.csv",
    "format": "csv",
    "group_by": ["region", "product"],
    "metrics": [
        {"op": "count"},
        {"op": "sum", "column": "qty"},
        {"op": "mean", "column": "price"},
    ],
}


def naive(path: Path, spec: AggregateSpec) -> tuple[int, dict[tuple[str, ...], list[float]]]:
    """The same group-by as a plain `csv.DictReader` loop: count, sum(qty), mean(price)."""
    nulls = set(spec.null_values)
    groups: dict[tuple[str, ...], list[float]] = {}
    rows = 0
    with path.open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            rows += 1
            key = tuple(row[c] for c in spec.group_by)
            acc = groups.get(key)
            if acc is None:
                acc = groups[key] = [0, 0.0, 0.0, 0]
            acc[0] += 1
            qty = row["qty"]
            if qty not in nulls:
                acc[1] += float(qty)
            price = row["price"]
            if price not in nulls:
                acc[2] += float(price)
                acc[3] += 1
    return rows, groups


def engine(path: Path, spec: AggregateSpec, block_size: int) -> int:
    with path.open("rb") as fh:
        return aggregate_stream(fh, spec, block_size=block_size).input_rows


def _convert_options(spec: AggregateSpec) -> pacsv.ConvertOptions:
    plan = _Plan.of(spec)
    return pacsv.ConvertOptions(
        include_columns=list(plan.columns),
        column_types={c: plan.csv_type(c) for c in plan.columns},
        null_values=list(spec.null_values),
        strings_can_be_null=True,
    )


def open_csv_streaming(path: Path, spec: AggregateSpec, block_size: int) -> int:
    """The alternative design: pyarrow's streaming reader (`open_csv`), same aggregation."""
    plan = _Plan.of(spec)
    acc = _Accumulator(plan)
    with path.open("rb") as fh:
        reader = pacsv.open_csv(
            fh, read_options=pacsv.ReadOptions(block_size=block_size), convert_options=_convert_options(spec)
        )
        for batch in reader:
            acc.add(plan.frame({c: batch.column(c) for c in plan.columns}, to_float))
    acc.result_rows(spec.metrics)
    return acc.input_rows


def whole_read(path: Path, spec: AggregateSpec, block_size: int) -> int:
    """Upper bound: pyarrow reading the whole file at once (not streaming, no aggregation)."""
    rows: int = pacsv.read_csv(path, convert_options=_convert_options(spec)).num_rows
    return rows


def whole_read_group_by(path: Path, spec: AggregateSpec, block_size: int) -> int:
    """Reference: pyarrow reading the whole file at once (multi-threaded), then one group-by."""
    plan = _Plan.of(spec)
    acc = _Accumulator(plan)
    table = pacsv.read_csv(path, convert_options=_convert_options(spec))
    acc.add(plan.frame({c: table[c] for c in plan.columns}, to_float))
    acc.result_rows(spec.metrics)
    return acc.input_rows


def timed(fn: Any, *args: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def speed(path: Path, spec: AggregateSpec, block_size: int, repeat: int) -> dict[str, Any]:
    """Best-of-`repeat` times of the naive loop and the engine, interleaved on the same file."""
    naive_s: list[float] = []
    engine_s: list[float] = []
    others: dict[str, list[float]] = {
        "open_csv_streaming": [],
        "whole_read_no_aggregation": [],
        "whole_read_group_by": [],
    }
    rows = 0
    for _ in range(repeat):
        elapsed, (rows, _groups) = timed(naive, path, spec)
        naive_s.append(elapsed)
        elapsed, engine_rows = timed(engine, path, spec, block_size)
        engine_s.append(elapsed)
        assert engine_rows == rows, (engine_rows, rows)
        others["open_csv_streaming"].append(timed(open_csv_streaming, path, spec, block_size)[0])
        others["whole_read_no_aggregation"].append(timed(whole_read, path, spec, block_size)[0])
        others["whole_read_group_by"].append(timed(whole_read_group_by, path, spec, block_size)[0])
    best_naive, best_engine = min(naive_s), min(engine_s)
    return {
        "others": {
            name: {
                "s": round(min(times), 3),
                "rows_per_s": round(rows / min(times)),
                "ratio": round(best_naive / min(times), 1),
            }
            for name, times in others.items()
        },
        "file": str(path),
        "file_mb": round(path.stat().st_size / 1e6, 1),
        "rows": rows,
        "block_size": block_size,
        "naive_s": round(best_naive, 3),
        "engine_s": round(best_engine, 3),
        "naive_rows_per_s": round(rows / best_naive),
        "engine_rows_per_s": round(rows / best_engine),
        "ratio": round(best_naive / best_engine, 1),
        "naive_all_s": [round(x, 3) for x in naive_s],
        "engine_all_s": [round(x, 3) for x in engine_s],
    }


_CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from shared.jobs.aggregate import parse_aggregate_payload
from shared.jobs.aggregate_engine import aggregate_stream
spec = parse_aggregate_payload(json.loads({payload!r}))
start = time.perf_counter()
with open({path!r}, "rb") as fh:
    result = aggregate_stream(fh, spec, block_size={block_size})
elapsed = time.perf_counter() - start
try:  # this process's own high-water mark (ru_maxrss may include the parent's, from before exec)
    with open("/proc/self/status") as status:
        hwm_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
except OSError:
    hwm_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"rows": result.input_rows, "groups": result.groups, "elapsed_s": elapsed,
                  "peak_rss_kb": hwm_kb}}))
"""


def memory(path: Path, spec_payload: dict[str, Any], block_size: int) -> dict[str, Any]:
    """Run the engine over `path` in a child process (which imports what the app imports).

    Peak RSS is the child's VmHWM: `getrusage(RUSAGE_CHILDREN).ru_maxrss` would also count the
    parent's memory at fork time, which the exec'd child never used.
    """
    code = _CHILD.format(
        root=str(REPO_ROOT), payload=json.dumps(spec_payload), path=str(path), block_size=block_size
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "file": str(path),
        "file_mb": round(path.stat().st_size / 1e6, 1),
        "rows": child["rows"],
        "groups": child["groups"],
        "block_size": block_size,
        "elapsed_s": round(child["elapsed_s"], 2),
        "rows_per_s": round(child["rows"] / child["elapsed_s"]),
        "peak_rss_mb": round(child["peak_rss_kb"] / 1024, 1),
    }


def azurite_stream(path: Path, spec_payload: dict[str, Any]) -> dict[str, Any]:
    """Time the engine streaming the speed file from a local Azurite (optional)."""
    from azure.storage.blob import BlobServiceClient

    from devstack.azurite import start_azurite
    from shared.jobs.aggregate import open_blob_stream

    az = start_azurite()
    try:
        service = BlobServiceClient.from_connection_string(az.connection_string)
        service.create_container("bench")
        blob = service.get_blob_client("bench", path.name)
        with path.open("rb") as fh:
            blob.upload_blob(fh, overwrite=True, max_concurrency=4)
        spec = parse_aggregate_payload({**spec_payload, "input": f"bench/{path.name}"})
        start = time.perf_counter()
        with open_blob_stream(blob) as stream:
            rows = aggregate_stream(stream, spec).input_rows
        elapsed = time.perf_counter() - start
    finally:
        az.cleanup()
    return {"rows": rows, "elapsed_s": round(elapsed, 3), "rows_per_s": round(rows / elapsed)}


def ensure_file(path: Path | None, default: Path, **size: Any) -> Path:
    if path is not None:
        return path
    if not default.exists():
        print(f"generating {default} ...", file=sys.stderr, flush=True)
        datagen.write(default, **size)
    return default


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--speed-rows", type=int, default=300_000, help="rows of the speed-comparison file")
    parser.add_argument("--speed-file", type=Path, help="use this CSV for the speed comparison")
    parser.add_argument("--mb", type=float, default=1000, help="size of the memory-test input (MB)")
    parser.add_argument("--memory-file", type=Path, help="use this CSV for the memory test")
    parser.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    parser.add_argument("--repeat", type=int, default=5, help="runs of each; the best counts")
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "aggregate-bench")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--azurite", action="store_true", help="also stream the speed file from Azurite")
    args = parser.parse_args(argv)

    spec = parse_aggregate_payload(PAYLOAD)
    speed_file = ensure_file(
        args.speed_file, args.data_dir / f"sales-{args.speed_rows}.csv", rows=args.speed_rows
    )
    report: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_1m_before": round(os.getloadavg()[0], 2),
        },
        "payload": PAYLOAD,
    }
    report["speed"] = speed(speed_file, spec, args.block_size, args.repeat)
    if not args.skip_memory:
        mem_file = ensure_file(args.memory_file, args.data_dir / f"sales-{args.mb:g}mb.csv", mb=args.mb)
        report["memory"] = memory(mem_file, PAYLOAD, args.block_size)
    if args.azurite:
        report["azurite"] = azurite_stream(speed_file, PAYLOAD)
    report["machine"]["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    print_table(report)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {OUT.relative_to(REPO_ROOT)}")
    return 0


def print_table(report: dict[str, Any]) -> None:
    s = report["speed"]
    m = report["machine"]
    print(
        f"\nmachine: {m['cpus']} cpus, load average (1 min) {m['load_avg_1m_before']} before, "
        f"{m['load_avg_1m_after']} after (other work on the machine slows the 2-thread engine most)"
    )
    print(
        f"\naggregate: {s['rows']:,} rows, {s['file_mb']} MB CSV, block size {s['block_size'] / 2**20:g} MiB"
    )
    print(f"{'':28}{'seconds':>10}{'rows/s':>14}")
    print(f"{'naive csv.DictReader loop':28}{s['naive_s']:>10.3f}{s['naive_rows_per_s']:>14,}")
    print(f"{'inline engine (streaming)':28}{s['engine_s']:>10.3f}{s['engine_rows_per_s']:>14,}")
    print(f"{'ratio engine / naive':28}{s['ratio']:>10}x   (target >= 30x)")
    for name, other in s["others"].items():
        print(
            f"  for reference, {name}: {other['s']:.3f} s, {other['rows_per_s']:,} rows/s, {other['ratio']}x naive"
        )
    if "memory" in report:
        m = report["memory"]
        print(
            f"memory: {m['file_mb']} MB, {m['rows']:,} rows in {m['elapsed_s']} s "
            f"({m['rows_per_s']:,} rows/s): peak RSS {m['peak_rss_mb']} MB (target < 300 MB)"
        )
    if "azurite" in report:
        a = report["azurite"]
        print(f"azurite stream: {a['rows']:,} rows in {a['elapsed_s']} s ({a['rows_per_s']:,} rows/s)")


if __name__ == "__main__":
    raise SystemExit(main())
