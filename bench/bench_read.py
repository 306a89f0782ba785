"""A job over a blob end to end against Polars over `az://`, the SDK and the new reader (issue 22).

One Azurite, one local host (the repo's host.json), per input file, interleaved, best of --repeat
(the job's run and the reader's raw read, the two figures of the run / read target, twice a round:
best of 2 x --repeat each, the second pair at the end of the round):

- job: POST /api/jobs -> the ledger's `finished_at` (see `job`), and the ledger's duration_s;
- polars: `scan_csv` / `scan_ndjson` over `az://` + group_by + `collect(engine="streaming")`;
- sdk: `download_blob(max_concurrency=8).readall()`;
- reader: `shared.blobio.reader` alone, its buffers handed over and back (`next_chunk`, no copy:
  what the job does);
- obstore: `obstore.get(...).stream()` alone (when installed: requirements-bench.txt);
- inproc: the engine over the reader in this process (no host, ledger or result write), with the
  CPU seconds it took here and in Azurite, and the same for the reader's raw read: on a machine
  whose cores are all busy the run cannot beat the read by less than their CPU ratio;
- no mark: inproc and the raw read again with the reader's low-water mark off (SO_RCVLOWAT,
  `blob_reader.LOWAT_BYTES`): the reading threads woken at each packet;
- fresh: inproc and the raw read again with new buffers for every stream (`shared.blobio.buffers`
  off: each stream faults its 8 MiB buffers in anew);
- in memory: the engine over the same bytes already in this process's memory (`io.BytesIO`),
  no storage sharing the cores: what the run would take if the storage were elsewhere, as it is
  in Azure (memory / read below 1: the read, not the engine, would be the limit);
- memory: the engine over the reader in a child process, its peak RSS (VmHWM).

The job's run is compared with the fastest raw read (reader or obstore). The 1-minute load
average is recorded before each input.

Ratios are given twice: best against best, and the median of each round's own ratio (the two
contenders side by side in that round; who goes first alternates). `--writers` adds the public NYC
flights as the package ships them and as Polars and DuckDB write them (CSV, JSON lines:
`bench/writers.py`), at each size: the job, Polars and the raw read only, each job's answer
checked against Polars' (keys and counts exact, floats within 1e-9).

    python -m bench.bench_read                 # ~300 MB and 1 GB of wide CSV, narrow CSV, JSON lines
    python -m bench.bench_read --writers       # ... and the flights as other tools write them
    python -m bench.bench_read --mb 20 --repeat 1   # quick (bench.run --quick)
    python -m bench.bench_read --lean          # the job, Polars and the raw read only, every input
The machine is shared and noisy: read ratios taken side by side. Writes bench/out/read.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import writers  # noqa: E402
from bench.bench_aggregate import Case  # noqa: E402
from devstack import datagen  # noqa: E402
from devstack.azurite import Azurite, start_azurite  # noqa: E402
from devstack.hostproc import HostProcess, host_env, init_storage  # noqa: E402

OUT = REPO_ROOT / "bench" / "out" / "read.json"
CONTAINER = "bench"
KEYS = {
    "wide": {"key": "station", "mean": "temp", "sum": "precip", "max": "wind_speed"},
    "narrow": {"key": "region", "mean": "price", "sum": "qty", "max": "price"},
}


def ensure(path: Path, mb: float, fmt: str, wide: bool) -> Path:
    """The input file, made once (4 MB of rows repeated: seconds) and kept under its size/shape."""
    if not path.exists():
        print(f"generating {path} ...", file=sys.stderr, flush=True)
        datagen.write_repeated(path, mb, fmt=fmt, wide=wide)
    return path


def cases(data_dir: Path, mb: float) -> list[Case]:
    wide, narrow = KEYS["wide"], KEYS["narrow"]
    return [
        Case(f"wide CSV {mb:g} MB", ensure(data_dir / f"wide-{mb:g}mb.csv", mb, "csv", True), "csv", **wide),
        Case(
            f"narrow CSV {mb:g} MB",
            ensure(data_dir / f"sales-{mb:g}mb.csv", mb, "csv", False),
            "csv",
            **narrow,
        ),
        Case(
            f"JSON lines {mb:g} MB",
            ensure(data_dir / f"wide-{mb:g}mb.jsonl", mb, "jsonl", True),
            "jsonl",
            **wide,
        ),
    ]


def warm_up_cases(data_dir: Path, service: Any) -> list[Case]:
    """A 1 MB job of each shape, run once before timing: the worker's first job pays its imports."""
    warm = cases(data_dir, 1)
    for case in warm:
        service.get_blob_client(CONTAINER, case.path.name).upload_blob(case.path.read_bytes(), overwrite=True)
    return warm


def account(az: Azurite) -> dict[str, str]:
    parts = dict(p.split("=", 1) for p in az.connection_string.split(";") if "=" in p)
    return {"name": parts["AccountName"], "key": parts["AccountKey"], "endpoint": parts["BlobEndpoint"]}


def polars_az(case: Case, acct: dict[str, str], answer: list[Any] | None = None) -> float:
    """Polars' query over `az://`, seconds; its rows appended to `answer` when given."""
    import polars as pl

    options = {
        "account_name": acct["name"],
        "account_key": acct["key"],
        "azure_storage_endpoint": acct["endpoint"],
        "azure_allow_http": "true",
    }
    url = f"az://{CONTAINER}/{case.path.name}"
    types = {case.key: pl.String, case.mean: pl.Float64, case.sum: pl.Float64, case.max: pl.Float64}
    start = time.perf_counter()
    if case.format == "csv":
        frame = pl.scan_csv(url, null_values=["", "NA"], schema_overrides=types, storage_options=options)
    else:
        frame = pl.scan_ndjson(url, schema_overrides=types, storage_options=options)
    rows = (
        frame.group_by(case.key)
        .agg(
            pl.len().alias("count"),
            pl.col(case.mean).mean().alias("mean"),
            pl.col(case.sum).sum().alias("sum"),
            pl.col(case.max).max().alias("max"),
        )
        .collect(engine="streaming")
    )
    elapsed = time.perf_counter() - start
    if answer is not None:
        answer.extend(rows.rows())
    return elapsed


def sdk_read(case: Case, az: Azurite) -> float:
    from azure.storage.blob import BlobServiceClient

    blob = BlobServiceClient.from_connection_string(az.connection_string).get_blob_client(
        CONTAINER, case.path.name
    )
    start = time.perf_counter()
    blob.download_blob(max_concurrency=8).readall()
    return time.perf_counter() - start


VARIANTS = ("", "nomark", "fresh")
"""The reader as shipped; with its low-water mark off (SO_RCVLOWAT, `blob_reader.LOWAT_BYTES`);
with fresh buffers for every stream (no `shared.blobio.buffers`)."""


def open_variant(case: Case, az: Azurite, variant: str = "") -> Any:
    """A stream over the case's blob, as the job opens it or as one of VARIANTS."""
    from azure.storage.blob import BlobServiceClient

    from shared.blobio.buffers import BufferPool
    from shared.blobio.reader import open_blob_stream, reader_for
    from shared.blobio.stream import CHUNK_BYTES, BlobStream

    service = BlobServiceClient.from_connection_string(az.connection_string)
    if variant == "":
        return open_blob_stream(service.get_blob_client(CONTAINER, case.path.name))
    if variant == "nomark":
        return BlobStream(reader_for(service, lowat=0).ranges(CONTAINER, case.path.name))
    if variant == "fresh":
        ranges = reader_for(service).ranges(CONTAINER, case.path.name)
        return BlobStream(ranges, pool=BufferPool(CHUNK_BYTES, keep=0))
    raise ValueError(f"unknown variant {variant!r}")


def reader_read(case: Case, az: Azurite, variant: str = "") -> float:
    """The reader's raw read: its buffers handed over and back, as the engine takes them."""
    start = time.perf_counter()
    with open_variant(case, az, variant) as stream:
        while (got := stream.next_chunk()) is not None:
            stream.give_back(got[0])
    return time.perf_counter() - start


def engine_over_reader(case: Case, az: Azurite, variant: str = "") -> float:
    """The job's work without the host: the stream + aggregate_table in this process."""
    from shared.aggregation import aggregate_table, parse_aggregate_payload

    spec = parse_aggregate_payload(case.payload())
    start = time.perf_counter()
    with open_variant(case, az, variant) as stream:
        aggregate_table(stream, spec)
    return time.perf_counter() - start


def engine_in_memory(case: Case, data: bytes) -> float:
    """The engine over bytes already in memory: no storage and no reading threads on the cores."""
    import io

    from shared.aggregation import aggregate_table, parse_aggregate_payload

    spec = parse_aggregate_payload(case.payload())
    start = time.perf_counter()
    aggregate_table(io.BytesIO(data), spec)
    return time.perf_counter() - start


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_idle() -> tuple[float, float]:
    """(idle, all) core-seconds of the whole machine since boot (Linux /proc/stat)."""
    with open("/proc/stat", encoding="ascii") as fh:
        ticks = [int(x) for x in fh.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    return (ticks[3] + ticks[4]) / hz, sum(ticks) / hz  # idle + iowait, every state


def with_cpu(fn: Callable[[], float], az: Azurite) -> tuple[float, float, float, float]:
    """(wall seconds, CPU seconds of this process, of Azurite, the share of every core's time
    busy, in any process) of one call."""
    assert az.process is not None
    own, azurite, (idle, every) = os.times(), process_cpu_s(az.process.pid), machine_idle()
    wall = fn()
    after, (idle_after, every_after) = os.times(), machine_idle()
    busy = 1 - (idle_after - idle) / (every_after - every) if every_after > every else math.nan
    return (
        wall,
        after.user + after.system - own.user - own.system,
        process_cpu_s(az.process.pid) - azurite,
        busy,
    )


def obstore_read(case: Case, acct: dict[str, str]) -> float:
    import obstore
    from obstore.store import AzureStore

    store = AzureStore(
        CONTAINER,
        account_name=acct["name"],
        account_key=acct["key"],
        endpoint=acct["endpoint"],
        allow_http=True,
    )
    start = time.perf_counter()
    for _chunk in obstore.get(store, case.path.name).stream(min_chunk_size=8 << 20):
        pass
    return time.perf_counter() - start


def job(
    case: Case, host: HostProcess, az: Azurite, poll_s: float = 0.1, ids: list[str] | None = None
) -> tuple[float, float]:
    """POST the job, wait for its ledger record to say completed: (end to end, its duration_s).

    End to end is the record's `finished_at` (stamped by the worker just before its completing
    write; the clock is this machine's) minus the moment of the POST, so the polls need not be
    frequent: one small GET from this process every `poll_s` (100 ms). Not through the API: an API poll runs
    in the worker that runs the job; and every GET takes a share of the one Azurite thread that
    also serves the job's read.
    """
    from azure.storage.blob import BlobServiceClient

    from shared.blobio.reader import reader_for

    ledger = reader_for(BlobServiceClient.from_connection_string(az.connection_string))
    container = host.env.get("LEDGER_CONTAINER", "ledger")
    job_id = f"bench-{uuid.uuid4().hex[:12]}"
    if ids is not None:
        ids.append(job_id)
    payload = case.payload() | {"input": f"{CONTAINER}/{case.path.name}", "engine": "inline"}
    body = json.dumps({"id": job_id, "kind": "aggregate", "payload": payload}).encode()
    req = urllib.request.Request(
        f"{host.url}/api/jobs", data=body, headers={"content-type": "application/json"}, method="POST"
    )
    posted = datetime.now(UTC)
    with urllib.request.urlopen(req, timeout=30) as resp:
        resp.read()
    while True:
        time.sleep(poll_s)
        record = json.loads(ledger.read_range(container, f"{job_id}.json", 0, 1 << 20))
        if record.get("status") == "completed":
            finished = datetime.fromisoformat(record["finished_at"].replace("Z", "+00:00"))
            return (finished - posted).total_seconds(), float(record["duration_s"])
        if record.get("status") in ("poisoned", "failed"):
            raise RuntimeError(f"job {job_id}: {record}")


_CHILD = """
import json, sys, time
sys.path.insert(0, {root!r})
from azure.storage.blob import BlobServiceClient
from shared.aggregation import aggregate_table, parse_aggregate_payload
from shared.blobio.reader import open_blob_stream
spec = parse_aggregate_payload(json.loads({payload!r}))
blob = BlobServiceClient.from_connection_string({conn!r}).get_blob_client(spec.container, spec.blob)
with open_blob_stream(blob) as stream:
    table, rows = aggregate_table(stream, spec)
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({{"rows": rows, "peak_rss_kb": int(hwm)}}))
"""


def memory(case: Case, az: Azurite) -> dict[str, Any]:
    payload = json.dumps(case.payload() | {"input": f"{CONTAINER}/{case.path.name}"})
    code = _CHILD.format(root=str(REPO_ROOT), payload=payload, conn=az.connection_string)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"rows": child["rows"], "peak_rss_mb": round(child["peak_rss_kb"] / 1024, 1)}


def best(fn: Callable[[], float], repeat: int) -> float:
    return min(fn() for _ in range(repeat))


def measure(case: Case, az: Azurite, host: HostProcess, repeat: int, with_obstore: bool) -> dict[str, Any]:
    acct = account(az)
    load = round(os.getloadavg()[0], 2)
    runs: dict[str, list[float]] = {}
    cpu: dict[str, list[tuple[float, float, float, float]]] = {}
    durations: list[float] = []
    data = case.path.read_bytes()  # for the engine in memory: read once, untimed
    rounds: list[tuple[float, float]] = []  # each round's (e2e / Polars, run / read) pair
    for index in range(repeat):  # interleaved: each round runs every contender once
        if index % 2:  # who goes first alternates
            runs.setdefault("polars_az_s", []).append(polars_az(case, acct))
        e2e, duration = job(case, host, az)
        runs.setdefault("job_e2e_s", []).append(e2e)
        durations.append(duration)
        if not index % 2:
            runs.setdefault("polars_az_s", []).append(polars_az(case, acct))
        runs.setdefault("sdk_read_s", []).append(sdk_read(case, az))
        for variant in VARIANTS:
            suffix = f"_{variant}" if variant else ""
            for name, fn in (
                (f"reader{suffix}_read_s", reader_read),
                (f"inproc{suffix}_s", engine_over_reader),
            ):
                measured = with_cpu(lambda fn=fn, v=variant: fn(case, az, v), az)  # type: ignore[misc]
                runs.setdefault(name, []).append(measured[0])
                cpu.setdefault(name, []).append(measured)
        if with_obstore:
            runs.setdefault("obstore_read_s", []).append(obstore_read(case, acct))
        runs.setdefault("in_memory_s", []).append(engine_in_memory(case, data))
        # the run / read pair once more (the job's e2e is not kept: Polars has one sample a round)
        durations.append(job(case, host, az)[1])
        measured = with_cpu(lambda: reader_read(case, az), az)
        runs["reader_read_s"].append(measured[0])
        cpu["reader_read_s"].append(measured)
        read = min(runs["reader_read_s"][-2:] + runs.get("obstore_read_s", [])[-1:])
        rounds.append((runs["polars_az_s"][-1] / e2e, min(durations[-2:]) / read))
    del data
    out: dict[str, Any] = {"load_avg_1m": load}
    out |= {k: round(min(v), 3) for k, v in runs.items()}
    out["job_run_s"] = round(min(durations), 3)
    out["file_mb"] = round(case.path.stat().st_size / 1e6, 1)
    fastest = min(out["reader_read_s"], out.get("obstore_read_s", math.inf))
    out["fastest_read_s"] = fastest
    out["job_vs_polars"] = round(out["polars_az_s"] / out["job_e2e_s"], 2)
    out["run_vs_read"] = round(out["job_run_s"] / fastest, 2)
    out["job_vs_polars_rounds"] = [round(r[0], 2) for r in rounds]
    out["job_vs_polars_median"] = round(statistics.median(r[0] for r in rounds), 2)
    out["run_vs_read_median"] = round(statistics.median(r[1] for r in rounds), 2)
    out["inproc_vs_read"] = round(out["inproc_s"] / fastest, 2)
    out["memory_vs_read"] = round(out["in_memory_s"] / fastest, 2)
    out["sdk_vs_reader"] = round(out["sdk_read_s"] / out["reader_read_s"], 2)
    if with_obstore:
        out["obstore_vs_reader"] = round(out["obstore_read_s"] / out["reader_read_s"], 2)
    out["nomark_vs_mark"] = round(out["inproc_nomark_s"] / out["inproc_s"], 2)
    out["fresh_vs_pool"] = round(out["reader_fresh_read_s"] / out["reader_read_s"], 2)
    for name, key in (
        ("reader_read_s", "read"),
        ("inproc_s", "inproc"),
        ("reader_nomark_read_s", "read_nomark"),
        ("inproc_nomark_s", "inproc_nomark"),
        ("reader_fresh_read_s", "read_fresh"),
        ("inproc_fresh_s", "inproc_fresh"),
    ):
        best_run = min(cpu[name])  # the fastest round's CPU seconds (own, Azurite) and busy share
        out[f"{key}_cpu_s"] = round(best_run[1] + best_run[2], 2)
        out[f"{key}_azurite_cpu_s"] = round(best_run[2], 2)
        out[f"{key}_busy"] = round(best_run[3], 2)
    out["cpu_ratio"] = round(out["inproc_cpu_s"] / out["read_cpu_s"], 2) if out["read_cpu_s"] else None
    # the shortest wall time the engine over the reader can take here: its CPU (this process and
    # Azurite's) spread over every core; run/read cannot go below floor/read on this machine
    out["cpu_floor_s"] = round(out["inproc_cpu_s"] / (os.cpu_count() or 1), 3)
    out["floor_vs_read"] = round(out["cpu_floor_s"] / fastest, 2)
    out |= memory(case, az)
    return out


def same_answer(case: Case, job_rows: list[dict[str, Any]], polars_rows: list[Any]) -> None:
    """The job's rows equal Polars' (keys and counts exact, floats within 1e-9), or AssertionError."""
    ours = {row[case.key]: (row["count"], row["mean"], row["sum"], row["max"]) for row in job_rows}
    theirs = {row[0]: tuple(row[1:]) for row in polars_rows}
    assert ours.keys() == theirs.keys(), f"{case.name}: keys differ"
    for key, (count, *floats) in theirs.items():
        mine = ours[key]
        assert mine[0] == count, f"{case.name}: count of {key!r} {mine[0]} != {count}"
        for a, b in zip(mine[1:], floats, strict=True):
            assert (a is None and b is None) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), (
                f"{case.name}: {key!r} {mine} != {count, *floats}"
            )


def job_rows(az: Azurite, host: HostProcess, job_id: str) -> list[dict[str, Any]]:
    from azure.storage.blob import BlobServiceClient

    from shared.blobio.reader import reader_for

    ledger = reader_for(BlobServiceClient.from_connection_string(az.connection_string))
    container = host.env.get("RESULTS_CONTAINER", "results")
    rows: list[dict[str, Any]] = json.loads(ledger.read_range(container, f"{job_id}.json", 0, 1 << 24))[
        "rows"
    ]
    return rows


def measure_lean(case: Case, az: Azurite, host: HostProcess, repeat: int) -> dict[str, Any]:
    """The job, Polars over az:// and the reader's raw read, interleaved (who goes first
    alternates); the job's answer checked against Polars'."""
    acct = account(az)
    out: dict[str, Any] = {"load_avg_1m": round(os.getloadavg()[0], 2)}
    e2e: list[float] = []
    runs: list[float] = []
    polars: list[float] = []
    reads: list[float] = []
    ids: list[str] = []
    answer: list[Any] = []
    for index in range(repeat):
        if index % 2:
            polars.append(polars_az(case, acct))
        took, duration = job(case, host, az, poll_s=0.5, ids=ids)
        e2e.append(took)
        runs.append(duration)
        if not index % 2:
            polars.append(polars_az(case, acct, answer if index == 0 else None))
        reads.append(reader_read(case, az))
    same_answer(case, job_rows(az, host, ids[0]), answer)
    out |= {
        "file_mb": round(case.path.stat().st_size / 1e6, 1),
        "job_e2e_s": round(min(e2e), 3),
        "job_run_s": round(min(runs), 3),
        "polars_az_s": round(min(polars), 3),
        "reader_read_s": round(min(reads), 3),
        "job_vs_polars": round(min(polars) / min(e2e), 2),
        "run_vs_read": round(min(runs) / min(reads), 2),
        "job_vs_polars_rounds": [round(p / e, 2) for p, e in zip(polars, e2e, strict=True)],
        "job_vs_polars_median": round(statistics.median(p / e for p, e in zip(polars, e2e, strict=True)), 2),
        "run_vs_read_median": round(statistics.median(r / d for r, d in zip(runs, reads, strict=True)), 2),
        "answer": "equal to Polars'",
    }
    if out["file_mb"] >= 900:
        out |= memory(case, az)
    return out


def has_obstore() -> bool:
    try:
        import obstore  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", default="300,1000", help="input sizes (MB), comma-separated")
    parser.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="rounds; the best of each counts (5: one disturbed round on this shared machine does not decide)",
    )
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "aggregate-bench-read")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--writers",
        action="store_true",
        help="also the NYC flights as other tools write them (bench/writers.py)",
    )
    parser.add_argument(
        "--lean",
        action="store_true",
        help="every input as the writers' are: the job, Polars and the raw read only",
    )
    args = parser.parse_args(argv)
    with_obstore = has_obstore()
    report: dict[str, Any] = {
        "load_avg_1m_before": round(os.getloadavg()[0], 2),
        "repeat": args.repeat,
        "cases": {},
    }
    sizes = [float(x) for x in args.mb.split(",")]
    all_cases = [case for mb in sizes for case in cases(args.data_dir, mb)]
    writer_cases = (
        [case for mb in sizes for case in writers.cases(args.data_dir / "writers", mb)]
        if args.writers
        else []
    )
    az = start_azurite()
    host: HostProcess | None = None
    try:
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient.from_connection_string(az.connection_string)
        service.create_container(CONTAINER)
        for case in all_cases + writer_cases:
            print(f"uploading {case.path.name} ...", file=sys.stderr, flush=True)
            with case.path.open("rb") as fh:
                service.get_blob_client(CONTAINER, case.path.name).upload_blob(
                    fh, overwrite=True, max_concurrency=4
                )
        env = host_env(az.connection_string)
        init_storage(env)
        host = HostProcess(env, instance_id="bench-read").start()
        for case in warm_up_cases(args.data_dir, service):  # imports and connections, untimed
            job(case, host, az)
        for case in all_cases:
            print(f"timing {case.name} ...", file=sys.stderr, flush=True)
            report["cases"][case.name] = (
                measure_lean(case, az, host, args.repeat)
                if args.lean
                else measure(case, az, host, args.repeat, with_obstore)
            )
        for case in writer_cases:
            print(f"timing {case.name} ...", file=sys.stderr, flush=True)
            report.setdefault("writers", {})[case.name] = measure_lean(case, az, host, args.repeat)
    finally:
        if host is not None:
            host.stop()
        az.cleanup()
    report["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    print_table(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


COLUMNS = (
    ("load", "load_avg_1m"),
    ("MB", "file_mb"),
    ("job e2e", "job_e2e_s"),
    ("job run", "job_run_s"),
    ("polars az", "polars_az_s"),
    ("sdk", "sdk_read_s"),
    ("reader", "reader_read_s"),
    ("obstore", "obstore_read_s"),
    ("inproc", "inproc_s"),
    ("no mark", "inproc_nomark_s"),
    ("fresh read", "reader_fresh_read_s"),
    ("fresh", "inproc_fresh_s"),
    ("in memory", "in_memory_s"),
    ("e2e/polars", "job_vs_polars"),
    ("... median", "job_vs_polars_median"),
    ("run/read", "run_vs_read"),
    ("... median", "run_vs_read_median"),
    ("inproc/read", "inproc_vs_read"),
    ("memory/read", "memory_vs_read"),
    ("cpu ratio", "cpu_ratio"),
    ("floor/read", "floor_vs_read"),
    ("read busy", "read_busy"),
    ("inproc busy", "inproc_busy"),
    ("peak MB", "peak_rss_mb"),
)


WRITER_COLUMNS = (
    ("load", "load_avg_1m"),
    ("MB", "file_mb"),
    ("job e2e", "job_e2e_s"),
    ("job run", "job_run_s"),
    ("polars az", "polars_az_s"),
    ("reader", "reader_read_s"),
    ("e2e/polars", "job_vs_polars"),
    ("... median", "job_vs_polars_median"),
    ("run/read", "run_vs_read"),
    ("... median", "run_vs_read_median"),
    ("peak MB", "peak_rss_mb"),
)


def print_table(report: dict[str, Any]) -> None:
    print(
        f"\nblob reads, seconds, best of {report.get('repeat', '?')} interleaved rounds (job run, reader: 2 a round) "
        f"(load avg {report['load_avg_1m_before']} -> {report['load_avg_1m_after']}; 2 shared cores)"
    )
    print(f"{'input':<20}" + "".join(f"{title:>12}" for title, _ in COLUMNS))
    for name, row in report["cases"].items():
        print(f"{name:<20}" + "".join(f"{row.get(key, '-')!s:>12}" for _, key in COLUMNS))
    print(
        "e2e/polars = Polars over az:// / the job POST -> completed (>= 1.0 wanted); run/read = the "
        "job's duration_s / the fastest raw read, reader or obstore (<= 1.3 wanted); inproc = the "
        "engine over the reader in the bench process; no mark = the same with the reader's "
        "SO_RCVLOWAT off; fresh read / fresh = the raw read / inproc with new buffers for every "
        "stream (no buffer pool); in memory = the engine over the same bytes from this process's "
        "memory (no storage on the cores); memory/read = it / the fastest read: below 1, the engine "
        "outruns the read when it has the cores; cpu ratio = CPU seconds (this process + "
        "Azurite) of inproc / of the reader's read; floor/read = inproc's CPU seconds spread over "
        f"the {os.cpu_count()} cores / the fastest read: where Azurite shares the cores, run/read "
        "cannot go below it; read busy / inproc busy = the share of every core's time busy (in "
        "any process) during the fastest round of the raw read / of inproc: near 1, the cores are "
        "the limit, not the storage or the pipeline; ... median = the median of the rounds' own "
        "ratios (the two side by side in each round)"
    )
    if report.get("writers"):
        print("\nthe NYC flights as other tools write them (bench/writers.py; the job's answer = Polars')")
        print(f"{'input':<28}" + "".join(f"{title:>12}" for title, _ in WRITER_COLUMNS))
        for name, row in report["writers"].items():
            print(f"{name:<28}" + "".join(f"{row.get(key, '-')!s:>12}" for _, key in WRITER_COLUMNS))


if __name__ == "__main__":
    raise SystemExit(main())
