"""Spark offload benchmark: submission overhead, and the inline-versus-Spark crossover on this machine.

Starts its own Azurite and standalone cluster (free loopback ports), then measures:
- overhead: REST create latency, time until the driver is RUNNING and until the application
  holds executors, status-call latency, and end to end (submit -> result verified) for a tiny job;
- crossover: the same aggregate over generated CSV inputs of growing size (prefixes of one
  generated file), timed inline (the inline engine streaming the blob from Azurite, as the
  function does) and on Spark (offload + polling every second until the result is verified),
  side by side in the same run. Speed figures are only comparable within one run.

    python -m bench.bench_spark                     # sizes 10, 50, 200, 500 MB
    python -m bench.bench_spark --sizes 10,50 --repeat 1
    python -m bench.bench_spark --versus-only [--sizes 200,500 --rounds 3 --python-path]
                                        # bench/spark_versus.py: the Spark path vs spark.read.csv

Prints a table and a recommendation for SPARK_OFFLOAD_THRESHOLD_BYTES; writes bench/out/spark.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests
from azure.core.exceptions import ResourceExistsError

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from devstack import datagen  # noqa: E402
from devstack.azurite import start_azurite  # noqa: E402
from devstack.spark_cluster import SparkCluster, start_cluster  # noqa: E402
from shared.aggregation import aggregate_stream, parse_aggregate_payload  # noqa: E402
from shared.blobio.reader import open_blob_stream  # noqa: E402
from shared.config.settings import Settings  # noqa: E402
from shared.jobs.base import Completed, Continue, JobContext  # noqa: E402
from shared.jobs.offload.aggregate_spark import build_request, offload, resume  # noqa: E402
from shared.spark.backends import make_backend  # noqa: E402
from shared.spark.model import SparkBackend  # noqa: E402
from shared.storage.accounts import AzureAccount  # noqa: E402
from shared.storage.clients import StorageClients, clients_for  # noqa: E402

OUT = REPO_ROOT / "bench" / "out" / "spark.json"
MB = 1_000_000
PAYLOAD: dict[str, Any] = {
    "format": "csv",
    "group_by": ["region", "product"],
    "metrics": [{"op": "count"}, {"op": "sum", "column": "qty"}, {"op": "mean", "column": "price"}],
    "engine": "spark",
}
LOG = logging.getLogger("bench.spark")


def context(settings: Settings, storage: StorageClients, payload: dict[str, Any], job_id: str) -> JobContext:
    return JobContext(
        job_id=job_id, kind="aggregate", attempt=0, payload=payload, settings=settings,
        storage=AzureAccount(storage, settings.storage),
        log=logging.LoggerAdapter(LOG, {}), checkpoint=lambda progress: None,
    )  # fmt: skip


def run_spark(ctx: JobContext, backend: SparkBackend, every_s: float = 1.0, timeout_s: float = 1800) -> float:
    """Seconds from offload to a verified result (polling every `every_s`, not the real delays)."""
    started = time.monotonic()
    outcome = offload(ctx, backend=backend)
    while isinstance(outcome, Continue):
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"Spark run not finished after {timeout_s:.0f}s")
        time.sleep(every_s)
        ctx.resume_state = outcome.state
        outcome = resume(ctx, backend=backend)
    assert isinstance(outcome, Completed)
    return time.monotonic() - started


def run_inline(storage: StorageClients, payload: dict[str, Any]) -> tuple[float, int]:
    spec = parse_aggregate_payload(payload)
    started = time.monotonic()
    with open_blob_stream(storage.blob.get_blob_client(spec.container, spec.blob)) as stream:
        result = aggregate_stream(stream, spec)
    return time.monotonic() - started, result.input_rows


def overhead(
    cluster: SparkCluster, settings: Settings, storage: StorageClients, backend: SparkBackend
) -> dict[str, Any]:
    """Create latency, time to RUNNING / to executors, status latency, tiny job end to end."""
    data = "".join(datagen.csv_lines(100, seed=1)).encode()
    storage.blob.get_blob_client("bench", "tiny.csv").upload_blob(data, overwrite=True)
    payload = {**PAYLOAD, "input": "bench/tiny.csv"}
    ctx = context(settings, storage, payload, f"bench-tiny-{int(time.time())}")
    request = build_request(ctx, 1)
    started = time.monotonic()
    sub = backend.submit(request)
    create_s = time.monotonic() - started
    assert sub.submission_id is not None
    running_s = executors_s = None
    status_times: list[float] = []
    while True:
        t = time.monotonic()
        status = backend.status(sub.submission_id)
        status_times.append(time.monotonic() - t)
        now = time.monotonic() - started
        if running_s is None and status.state in ("running", "succeeded"):
            running_s = now
        if executors_s is None and _app_has_executors(cluster, request.name):
            executors_s = now
        if status.terminal:
            break
        time.sleep(0.2)
    finished_s = time.monotonic() - started
    ctx2 = context(settings, storage, payload, f"bench-tiny2-{int(time.time())}")
    end_to_end_s = run_spark(ctx2, backend, every_s=0.5)
    return {
        "rest_create_s": round(create_s, 3),
        "time_to_driver_running_s": None if running_s is None else round(running_s, 2),
        "time_to_executors_s": None if executors_s is None else round(executors_s, 2),
        "driver_finished_s": round(finished_s, 2),
        "status_call_median_s": round(statistics.median(status_times), 4),
        "tiny_job_end_to_end_s": round(end_to_end_s, 2),
        "tiny_job_final_state": status.raw_state,
    }


def _app_has_executors(cluster: SparkCluster, name: str) -> bool:
    try:
        apps = requests.get(f"{cluster.ui_url}/json/", timeout=5).json().get("activeapps", [])
    except (requests.RequestException, ValueError):
        return False
    return any(
        a.get("name") == name and a.get("state") == "RUNNING" and int(a.get("cores", 0)) > 0 for a in apps
    )


def prefix(path: Path, size: int) -> bytes:
    """The first whole lines of `path` up to about `size` bytes (a valid CSV: header first)."""
    with path.open("rb") as fh:
        data = fh.read(size)
        rest = fh.readline()
    return data + rest


def crossover(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Where Spark becomes faster: measured, and from linear fits t = a + b * MB of both engines."""
    faster = [p["mb"] for p in points if p["spark_s"] < p["inline_s"]]
    fit: dict[str, Any] = {}
    if len(points) >= 2:
        xs = [p["mb"] for p in points]
        for engine in ("inline", "spark"):
            slope, intercept = statistics.linear_regression(xs, [p[f"{engine}_s"] for p in points])
            fit[engine] = {
                "fixed_s": round(intercept, 2),
                "s_per_mb": round(slope, 4),
                "mb_per_s": round(1 / slope, 1) if slope > 0 else None,
            }
        si, ss = fit["inline"]["s_per_mb"], fit["spark"]["s_per_mb"]
        gap = fit["spark"]["fixed_s"] - fit["inline"]["fixed_s"]
        fit["crossover_mb"] = round(gap / (si - ss)) if si > ss else None
    return {"first_size_where_spark_is_faster_mb": faster[0] if faster else None, "fit": fit}


def recommend(
    result: dict[str, Any], largest_mb: int, inline_mb_per_s: float, function_timeout_s: float
) -> tuple[int, str]:
    """A threshold: Spark's crossover if there is one, else what inline finishes in half the function timeout."""
    measured = result["first_size_where_spark_is_faster_mb"]
    fitted = result["fit"].get("crossover_mb")
    budget_mb = int(inline_mb_per_s * function_timeout_s / 2)
    if measured is not None:
        mb, why = int(measured), f"Spark was faster from {measured} MB on in this run"
    elif fitted is not None and 0 < fitted < budget_mb:
        mb, why = (
            int(fitted),
            f"Spark was never faster up to {largest_mb} MB; the linear fits cross at ~{fitted} MB",
        )
    else:
        mb = budget_mb
        why = (
            f"Spark was never faster up to {largest_mb} MB and its marginal speed is lower, so speed never argues "
            f"for offloading here; offload only what inline could not finish in half of functionTimeout "
            f"({function_timeout_s:.0f}s) at the measured {inline_mb_per_s:.0f} MB/s"
        )
    mib = max(64, round(mb * MB / 2**20 / 64) * 64)
    return mib * 2**20, why


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--versus-only" in argv:
        from bench.spark_versus import main as versus

        return versus([a for a in argv if a != "--versus-only"])
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10,50,200,500", help="input sizes in MB (10^6 bytes)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per size and engine (the best is kept)")
    parser.add_argument(
        "--versus-only", action="store_true", help="only bench/spark_versus.py (its own flags follow)"
    )
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    logging.basicConfig(level=logging.WARNING)
    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    source = work / "sales.csv"
    print(f"generating {sizes[-1]} MB of CSV ...", flush=True)
    datagen.write(source, mb=sizes[-1], seed=17)
    azurite = start_azurite(location=work / "azurite")
    cluster = start_cluster(cores=4, memory="4g")
    try:
        env = {"AzureWebJobsStorage": azurite.connection_string, **cluster.env()}
        settings = Settings.from_env(env)
        storage = clients_for(settings.storage)
        for container in ("bench", settings.results_container):
            with contextlib.suppress(ResourceExistsError):
                storage.blob.create_container(container)
        backend = make_backend(settings.spark)
        print("measuring submission overhead ...", flush=True)
        over = overhead(cluster, settings, storage, backend)
        points = []
        for mb in sizes:
            data = prefix(source, mb * MB)
            name = f"sales-{mb}mb.csv"
            storage.blob.get_blob_client("bench", name).upload_blob(data, overwrite=True, max_concurrency=4)
            del data
            payload = {**PAYLOAD, "input": f"bench/{name}"}
            inline_s = min(run_inline(storage, payload)[0] for _ in range(args.repeat))
            spark_s = min(
                run_spark(context(settings, storage, payload, f"bench-{mb}-{i}-{int(time.time())}"), backend)
                for i in range(args.repeat)
            )
            points.append({"mb": mb, "inline_s": round(inline_s, 2), "spark_s": round(spark_s, 2),
                           "inline_mb_per_s": round(mb / inline_s, 1), "spark_mb_per_s": round(mb / spark_s, 1)})  # fmt: skip
            print(f"  {mb:>5} MB: inline {inline_s:7.1f}s   spark {spark_s:7.1f}s", flush=True)
        cross = crossover(points)
        inline_speed = max(p["inline_mb_per_s"] for p in points)
        threshold, why = recommend(cross, sizes[-1], inline_speed, settings.function_timeout_s)
    finally:
        cluster.cleanup()
        azurite.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "cluster": {
            "worker_cores_advertised": 4,
            "spark.cores.max": 2,
            "executor_memory": "1g",
            "split_mb": 32,
        },
        "overhead": over,
        "points": points,
        "crossover": cross,
        "recommended_threshold_bytes": threshold,
        "recommendation": f"SPARK_OFFLOAD_THRESHOLD_BYTES={threshold} ({threshold // 2**20} MiB): {why}",
    }
    print()
    print("submission overhead (standalone REST, local cluster):")
    for key, value in over.items():
        print(f"  {key:<28} {value}")
    print()
    print(f"{'size MB':>8} {'inline s':>9} {'spark s':>8} {'inline MB/s':>12} {'spark MB/s':>11}")
    for p in points:
        print(
            f"{p['mb']:>8} {p['inline_s']:>9} {p['spark_s']:>8} {p['inline_mb_per_s']:>12} {p['spark_mb_per_s']:>11}"
        )
    print()
    print(f"fits: {json.dumps(cross['fit'])}")
    print(report["recommendation"])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
