"""A job over a Parquet blob end to end against Polars `scan_parquet("az://...")` (issue 37).

One Azurite, one local host (the repo's host.json), per input file, interleaved, best of --repeat:

- job: POST /api/jobs -> the ledger's `finished_at` (`bench.bench_read.job`, polled every 0.5 s:
  the figure is the worker's stamp, so fewer polls take less of Azurite from the run), and its
  duration_s;
- polars: `scan_parquet` over `az://` + group_by + `collect(engine="streaming")`, on the same Azurite;
- (each round runs every contender once, a different one first in turn);
- where the job's time goes, in this process: `reads` (every row group's needed column chunks
  read by the blob reader's `SpanReader`, as the job reads them, nothing decoded), `decode` (the
  same row groups decoded by pyarrow from a local copy, no storage), `reduce` (the decoded
  tables reduced by the engine's group-by), and `inproc` (the engine over the reader: all three
  overlapped, as the job runs them);
- CPU: the seconds of CPU each contender took (the job: its worker process; Polars and the engine
  over the reader: this process) and Azurite took serving it, medians of the rounds: on 2 cores
  shared with Azurite the fastest is the one that needs the least CPU in all;
- in memory: the engine over the file's bytes (`aggregate_stream(BytesSpans(...))`) against
  Polars `scan_parquet(local file)` with its streaming engine, in the same rounds;
- requests: what the engine over the reader and Polars ask of Azurite (GETs, their sizes, the
  most in flight), one untimed run each through a counting proxy (`bench.request_log`);
- memory: the engine over the reader in a child process, its peak RSS (VmHWM).

The files: the corpus (`devstack/parquet_corpus.py`): the same weather-station rows (16 typed
columns) written by each writer with its defaults (pyarrow: 1 Mi-row groups; Polars; DuckDB:
122,880-row groups; Spark: 128 MB row groups), made once under --data-dir. The query reads 4 of
the columns: group by `station` (a string), count, mean(temp), sum(precip), max(wind_speed).
The ratios are printed per writer, medians of the rounds' own ratios.

    python -m bench.bench_parquet                    # ~300 MB and 1 GB, every writer
    python -m bench.bench_parquet --mb 20 --repeat 1 # quick (bench.run --quick)
    python -m bench.bench_parquet --mb 300 --writers polars,duckdb --no-e2e   # in memory only

The machine is shared and noisy: the ratio is taken side by side. Writes bench/out/parquet.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.bench_aggregate import Case  # noqa: E402
from bench.bench_read import CONTAINER, account, job, process_cpu_s, with_cpu  # noqa: E402
from bench.request_log import RequestLog  # noqa: E402
from devstack import parquet_corpus  # noqa: E402
from devstack.azurite import Azurite, start_azurite  # noqa: E402
from devstack.hostproc import HostProcess, host_env, init_storage  # noqa: E402

OUT = REPO_ROOT / "bench" / "out" / "parquet.json"
QUERY = {"key": "station", "mean": "temp", "sum": "precip", "max": "wind_speed"}
POLL_S = 0.5
"""How often the job's ledger record is read to see it completed: end to end is its finished_at
stamp, not when it is seen, and every poll is Azurite CPU taken from the job's reads (2 cores)."""


def ensure(data_dir: Path, writer: str, mb: float) -> Path:
    """The corpus file of `writer`'s defaults, about `mb` MB (made once, from one pyarrow source)."""
    path = data_dir / f"{writer}-{mb:g}mb.parquet"
    if not path.exists():
        source = data_dir / f"source-{mb:g}mb.parquet"
        if not source.exists():
            print(f"generating {source} ...", file=sys.stderr, flush=True)
            data_dir.mkdir(parents=True, exist_ok=True)
            tmp = source.with_suffix(".tmp")
            parquet_corpus.write_source(tmp, parquet_corpus.source_rows_for(mb))
            tmp.replace(source)
        print(f"writing {path} with {writer} ...", file=sys.stderr, flush=True)
        parquet_corpus.write(parquet_corpus.defaults(writer), source, path)
    return path


def case_for(data_dir: Path, mb: float, writer: str = "pyarrow") -> Case:
    return Case(f"{writer} {mb:g} MB", ensure(data_dir, writer, mb), "parquet", **QUERY)


def in_memory(case: Case, data: bytes) -> tuple[float, float]:
    """(the engine over the file's bytes, Polars over the local file): seconds, side by side."""
    import polars as pl

    from shared.aggregation import aggregate_table, parse_aggregate_payload
    from shared.aggregation.parquet_path import BytesSpans

    spec = parse_aggregate_payload(case.payload())
    start = time.perf_counter()
    aggregate_table(BytesSpans(data), spec)
    engine_s = time.perf_counter() - start
    start = time.perf_counter()
    pl.scan_parquet(case.path).group_by(case.key).agg(
        pl.len().alias("count"),
        pl.col(case.mean).mean().alias("mean"),
        pl.col(case.sum).sum().alias("sum"),
        pl.col(case.max).max().alias("max"),
    ).collect(engine="streaming")
    return engine_s, time.perf_counter() - start


def polars_az(case: Case, acct: dict[str, str]) -> float:
    import polars as pl

    options = {
        "account_name": acct["name"],
        "account_key": acct["key"],
        "azure_storage_endpoint": acct["endpoint"],
        "azure_allow_http": "true",
    }
    start = time.perf_counter()
    pl.scan_parquet(f"az://{CONTAINER}/{case.path.name}", storage_options=options).group_by(case.key).agg(
        pl.len().alias("count"),
        pl.col(case.mean).mean().alias("mean"),
        pl.col(case.sum).sum().alias("sum"),
        pl.col(case.max).max().alias("max"),
    ).collect(engine="streaming")
    return time.perf_counter() - start


def spans_reader(case: Case, az: Azurite, connection: str | None = None) -> Any:
    from azure.storage.blob import BlobServiceClient

    from shared.blobio.reader import reader_for
    from shared.blobio.spans import SpanReader

    service = BlobServiceClient.from_connection_string(connection or az.connection_string)
    return SpanReader(reader_for(service).ranges(CONTAINER, case.path.name))


def inproc(case: Case, az: Azurite, connection: str | None = None) -> tuple[float, int]:
    """The engine over the reader in this process: (seconds, GETs)."""
    from shared.aggregation import aggregate_table, parse_aggregate_payload

    spec = parse_aggregate_payload(case.payload())
    start = time.perf_counter()
    with spans_reader(case, az, connection) as source:
        aggregate_table(source, spec)
        requests = source.requests
    return time.perf_counter() - start, requests


def parts(case: Case, az: Azurite, data: bytes) -> dict[str, float]:
    """The job's three parts, one after the other: reads, decode, reduce (seconds)."""
    from shared.aggregation import parse_aggregate_payload
    from shared.aggregation.parquet_path import (
        BytesSpans,
        ParquetLayout,
        load_row_group,
        read_footer,
        reduce_table,
    )
    from shared.aggregation.plan import Accumulator, Plan

    plan = Plan.of(parse_aggregate_payload(case.payload()))
    start = time.perf_counter()
    with spans_reader(case, az) as source:
        layout = ParquetLayout.of(read_footer(source), plan, source.size)
        for index in range(layout.metadata.num_row_groups):
            source.read(layout.spans(index))
    reads = time.perf_counter() - start
    local = BytesSpans(data)
    start = time.perf_counter()
    tables = [t for i in range(layout.metadata.num_row_groups) for t in load_row_group(local, layout, i)]
    decode = time.perf_counter() - start
    acc = Accumulator(plan)
    start = time.perf_counter()
    for i, table in enumerate(tables):
        acc.add_partial(reduce_table(table, plan, acc, f"row group {i}"), table.num_rows)
    acc.result_table(parse_aggregate_payload(case.payload()).metrics)
    return {"reads_s": reads, "decode_s": decode, "reduce_s": time.perf_counter() - start}


_CHILD = """
import json, sys
sys.path.insert(0, {root!r})
from azure.storage.blob import BlobServiceClient
from shared.aggregation import aggregate_table, parse_aggregate_payload
from shared.blobio.reader import reader_for
from shared.blobio.spans import SpanReader
spec = parse_aggregate_payload(json.loads({payload!r}))
service = BlobServiceClient.from_connection_string({conn!r})
with SpanReader(reader_for(service).ranges(spec.container, spec.blob)) as source:
    table, rows = aggregate_table(source, spec)
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({{"rows": rows, "groups": table.num_rows, "peak_rss_kb": int(hwm)}}))
"""


def requests_seen(case: Case, az: Azurite) -> dict[str, Any]:
    """What the engine and Polars ask of Azurite, one untimed run each through `RequestLog`."""
    acct = account(az)
    out: dict[str, Any] = {}
    for name in ("engine", "polars"):
        with RequestLog(az.blob_port) as log:
            endpoint = log.endpoint(acct["name"])
            try:
                if name == "engine":
                    inproc(case, az, az.connection_string.replace(acct["endpoint"], endpoint))
                else:
                    polars_az(case, acct | {"endpoint": endpoint})
            except Exception as exc:  # a figure, not the bench: said, then skipped
                out[name] = f"failed through the proxy: {exc.__class__.__name__}: {exc}"[:200]
                continue
            out[name] = log.summary()
    return out


def memory(case: Case, az: Azurite) -> dict[str, Any]:
    payload = json.dumps(case.payload() | {"input": f"{CONTAINER}/{case.path.name}"})
    code = _CHILD.format(root=str(REPO_ROOT), payload=payload, conn=az.connection_string)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        "rows": child["rows"],
        "groups": child["groups"],
        "peak_rss_mb": round(child["peak_rss_kb"] / 1024, 1),
    }


def measure_in_memory(case: Case, repeat: int) -> dict[str, Any]:
    """The engine over the file's bytes against Polars over the local file, `repeat` rounds."""
    load = round(os.getloadavg()[0], 2)
    data = case.path.read_bytes()
    rounds = [in_memory(case, data) for _ in range(repeat)]
    return {"load_avg_1m": load, **_case_facts(case), **_memory_figures(rounds)}


def _case_facts(case: Case) -> dict[str, Any]:
    from pyarrow.parquet import read_metadata

    meta = read_metadata(case.path)
    return {
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
        "file_mb": round(case.path.stat().st_size / 1e6, 1),
        "row_groups": meta.num_row_groups,
        "writer": meta.created_by,
    }


def _memory_figures(rounds: list[tuple[float, float]]) -> dict[str, Any]:
    ratios = sorted(polars / engine for engine, polars in rounds)
    return {
        "memory_s": round(sorted(e for e, _ in rounds)[len(rounds) // 2], 3),
        "memory_polars_s": round(sorted(p for _, p in rounds)[len(rounds) // 2], 3),
        "memory_vs_polars_median": round(ratios[len(ratios) // 2], 2),
        "memory_vs_polars_rounds": [round(x, 2) for x in ratios],
    }


def measure(case: Case, az: Azurite, host: HostProcess, repeat: int, split: bool = False) -> dict[str, Any]:
    acct = account(az)
    load = round(os.getloadavg()[0], 2)
    runs: dict[str, list[float]] = {}
    data = case.path.read_bytes()  # for the decode figure: read once, untimed
    gets: list[int] = []
    worker = int(host.stats()["worker"]["pid"])
    assert az.process is not None
    azurite_pid = az.process.pid

    def the_job() -> None:
        before, azurite = process_cpu_s(worker), process_cpu_s(azurite_pid)
        e2e, duration = job(case, host, az, poll_s=POLL_S)
        runs.setdefault("job_e2e_s", []).append(e2e)
        runs.setdefault("job_run_s", []).append(duration)
        runs.setdefault("job_cpu_s", []).append(process_cpu_s(worker) - before)
        runs.setdefault("job_azurite_cpu_s", []).append(process_cpu_s(azurite_pid) - azurite)

    def the_polars() -> None:
        wall, own, azurite, _busy = with_cpu(lambda: polars_az(case, acct), az)
        runs.setdefault("polars_az_s", []).append(wall)
        runs.setdefault("polars_cpu_s", []).append(own)
        runs.setdefault("polars_azurite_cpu_s", []).append(azurite)

    def in_process() -> None:
        requests: list[int] = []

        def timed() -> float:
            seconds, count = inproc(case, az)
            requests.append(count)
            return seconds

        seconds, own, azurite, _busy = with_cpu(timed, az)
        gets.append(requests[0])
        runs.setdefault("inproc_s", []).append(seconds)
        runs.setdefault("inproc_cpu_s", []).append(own)
        runs.setdefault("inproc_azurite_cpu_s", []).append(azurite)
        if split:
            for name, value in parts(case, az, data).items():
                runs.setdefault(name, []).append(value)

    memory_rounds: list[tuple[float, float]] = []

    def the_memory() -> None:
        memory_rounds.append(in_memory(case, data))

    steps = [the_job, the_polars, in_process, the_memory]
    for round_ in range(repeat):  # interleaved: each round runs every contender once, in turn first
        for step in steps[round_ % len(steps) :] + steps[: round_ % len(steps)]:
            step()
    out: dict[str, Any] = {"load_avg_1m": load, **_case_facts(case), **_memory_figures(memory_rounds)}
    cpu = {k: v for k, v in runs.items() if k.endswith("cpu_s")}
    out |= {k: round(min(v), 3) for k, v in runs.items() if k not in cpu}
    out |= {k: round(sorted(v)[len(v) // 2], 3) for k, v in cpu.items()}  # medians
    for name in ("job", "polars", "inproc"):
        out[f"{name}_all_cpu_s"] = round(out[f"{name}_cpu_s"] + out[f"{name}_azurite_cpu_s"], 3)
    out["all_job_e2e_s"] = [round(x, 3) for x in runs["job_e2e_s"]]
    out["all_polars_az_s"] = [round(x, 3) for x in runs["polars_az_s"]]
    out["job_vs_polars"] = round(out["polars_az_s"] / out["job_e2e_s"], 2)
    per_round = sorted(p / j for p, j in zip(runs["polars_az_s"], runs["job_e2e_s"], strict=True))
    out["job_vs_polars_rounds"] = [round(x, 2) for x in per_round]
    out["job_vs_polars_median"] = round(per_round[len(per_round) // 2], 2)
    out["inproc_vs_polars"] = round(out["polars_az_s"] / out["inproc_s"], 2)
    out["gets"] = gets[-1]
    out["requests_seen"] = requests_seen(case, az)
    out |= memory(case, az)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", default="300,1000", help="input sizes (MB), comma-separated")
    parser.add_argument("--repeat", type=int, default=5, help="rounds; the best of each counts")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "aggregate-bench-parquet"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--writers", default=",".join(parquet_corpus.WRITERS), help="corpus writers, comma-separated"
    )
    parser.add_argument("--no-e2e", action="store_true", help="in memory only (no Azurite, no host)")
    parser.add_argument(
        "--parts", action="store_true", help="also time the job's parts (reads, decode, reduce)"
    )
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "load_avg_1m_before": round(os.getloadavg()[0], 2),
        "repeat": args.repeat,
        "cases": {},
        "writers_missing": {},
    }
    writers = []
    for writer in args.writers.split(","):
        missing = writer_missing(writer)
        if missing:
            report["writers_missing"][writer] = missing
            print(f"writer {writer} skipped: {missing}", file=sys.stderr, flush=True)
        else:
            writers.append(writer)
    cases = [case_for(args.data_dir, float(mb), writer) for mb in args.mb.split(",") for writer in writers]
    if args.no_e2e:
        for case in cases:
            print(f"timing {case.name} in memory ...", file=sys.stderr, flush=True)
            report["cases"][case.name] = measure_in_memory(case, args.repeat)
        return finish(report, args.out)
    warm = case_for(args.data_dir, 2)
    az = start_azurite()
    host: HostProcess | None = None
    try:
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient.from_connection_string(az.connection_string)
        service.create_container(CONTAINER)
        for case in [warm, *cases]:
            print(f"uploading {case.path.name} ...", file=sys.stderr, flush=True)
            with case.path.open("rb") as fh:
                service.get_blob_client(CONTAINER, case.path.name).upload_blob(
                    fh, overwrite=True, max_concurrency=4
                )
        env = host_env(az.connection_string)
        init_storage(env)
        host = HostProcess(env, instance_id="bench-parquet").start()
        job(warm, host, az)  # the worker's imports and connections, untimed
        for case in cases:
            print(f"timing {case.name} ...", file=sys.stderr, flush=True)
            report["cases"][case.name] = measure(case, az, host, args.repeat, split=args.parts)
    finally:
        if host is not None:
            host.stop()
        az.cleanup()
    return finish(report, args.out)


def finish(report: dict[str, Any], out: Path) -> int:
    report["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    print_table(report)
    print_requests(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


def writer_missing(writer: str) -> str | None:
    """Why a corpus writer cannot run here (its package, or Spark's Java), or None."""
    import importlib.util

    package = {"pyarrow": "pyarrow", "polars": "polars", "duckdb": "duckdb", "spark": "pyspark"}.get(writer)
    if package is None:
        return f"not a corpus writer (one of {', '.join(parquet_corpus.WRITERS)})"
    if importlib.util.find_spec(package) is None:
        return f"{package} is not installed"
    if writer == "spark":
        from devstack.spark_cluster import java_ok

        if not java_ok():
            return "Spark needs Java 17+"
    return None


COLUMNS = (
    ("load", "load_avg_1m"),
    ("MB", "file_mb"),
    ("groups", "row_groups"),
    ("job e2e", "job_e2e_s"),
    ("job run", "job_run_s"),
    ("polars az", "polars_az_s"),
    ("inproc", "inproc_s"),
    ("reads", "reads_s"),
    ("decode", "decode_s"),
    ("reduce", "reduce_s"),
    ("GETs", "gets"),
    ("job CPU", "job_all_cpu_s"),
    ("pl CPU", "polars_all_cpu_s"),
    ("e2e/polars", "job_vs_polars"),
    ("e2e median", "job_vs_polars_median"),
    ("inproc/pl", "inproc_vs_polars"),
    ("mem", "memory_s"),
    ("mem polars", "memory_polars_s"),
    ("mem median", "memory_vs_polars_median"),
    ("peak MB", "peak_rss_mb"),
)


def print_requests(report: dict[str, Any]) -> None:
    for name, row in report["cases"].items():
        for who, seen in row.get("requests_seen", {}).items():
            if isinstance(seen, dict):
                print(
                    f"{name}, {who}: {seen['gets']} GETs of {seen['mb']} MB in all (median "
                    f"{seen['get_mb_median']} MB, largest {seen['get_mb_max']} MB), at most "
                    f"{seen['max_in_flight']} in flight, {seen['requests']} requests"
                )
            else:
                print(f"{name}, {who}: {seen}")


def print_table(report: dict[str, Any]) -> None:
    print(
        f"\nParquet: a job over a blob vs Polars scan_parquet(az://), seconds, best of {report['repeat']} "
        f"interleaved rounds (load avg {report['load_avg_1m_before']} -> {report['load_avg_1m_after']}; 2 shared cores)"
    )
    print(f"{'writer, input':<18}" + "".join(f"{title:>11}" for title, _ in COLUMNS))
    for name, row in report["cases"].items():
        print(f"{name:<18}" + "".join(f"{row.get(key, '-')!s:>11}" for _, key in COLUMNS))
    for writer, why in report.get("writers_missing", {}).items():
        print(f"{writer:<18} skipped: {why}")
    print(
        "writer = the corpus file of that writer's defaults (devstack/parquet_corpus.py); load = the "
        "1-minute load average when the case started; "
        "e2e/polars = Polars over az:// / the job POST -> completed, best of each (>= 1.5 wanted); "
        "e2e median = the median of the rounds' own ratios (each round runs both); mem = the engine "
        "over the file's bytes, mem polars = Polars scan_parquet(local file), streaming, medians; "
        "mem median = the median of the rounds' own ratios (>= 1.0 wanted); "
        "inproc = the engine over the blob reader in this process (inproc/pl: Polars / it); "
        "reads / decode / reduce = the job's three parts one after the other (the needed column "
        "chunks read from Azurite; decoded from memory; grouped): inproc overlaps them; "
        "job / pl / inproc CPU = CPU seconds of the worker, Polars, the engine here, each plus "
        "Azurite's serving it, medians (on 2 shared cores the least CPU in all wins); "
        "peak MB = the engine over the reader in a child process (< 300 MB wanted on 1 GB)"
    )


if __name__ == "__main__":
    raise SystemExit(main())
