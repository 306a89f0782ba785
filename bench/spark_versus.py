"""The app's Spark path against Spark's own reader, on the same local cluster and the same input.

Starts its own Azurite and standalone cluster (free loopback ports), generates sales CSV (one file,
its prefixes for the smaller sizes) on local disk and uploads it to Azurite, then runs one
SparkSession on the cluster (2 cores, 1 GB executors: what a job gets from `standalone`) and times,
in interleaved rounds (who goes first alternates), the same aggregate two ways:
- app: the job's own `aggregate` (spark_jobs/aggregate_job.py) as its driver runs it: byte-range
  tasks reading the blob from Azurite, the inline engine in each (the C scanner shipped to the
  executors in the engine zip), the driver merging the partials;
- spark: `spark.read.csv(<the same file on local disk>, header, explicit schema).groupBy(...).agg(...)`,
  Spark's best case (no schema inference; the file on local disk, not behind HTTP).
Both results are compared (keys and counts exact, sums and means within 1e-9) and each round's
ratio (spark seconds / app seconds) printed, with the median and the best. Times run from the
action to the rows on the driver: the submission and executor start-up, the same for both, are
left out (bench_spark.py measures them). With `--python-path`, a second session runs the same
rounds with the scanner turned off (the executors' Python path).

    python -m bench.spark_versus                       # 200 and 500 MB, 3 rounds
    python -m bench.spark_versus --sizes 50 --rounds 1 # a smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from azure.core.exceptions import ResourceExistsError

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from devstack import datagen  # noqa: E402
from devstack.azurite import start_azurite  # noqa: E402
from devstack.spark_cluster import SparkCluster, java_ok, start_cluster  # noqa: E402
from shared.config.settings import Settings  # noqa: E402
from shared.storage.clients import clients_for  # noqa: E402
from spark_jobs.aggregate_job import CONNECTION_ENV, aggregate, build_engine_zip, own_scanner  # noqa: E402
from spark_jobs.aggregate_native import ScannerChoice, ship  # noqa: E402
from spark_jobs.aggregate_partials import Partials  # noqa: E402

OUT = REPO_ROOT / "bench" / "out" / "spark_versus.json"
MB = 1_000_000
GROUP_BY = ("region", "product")
PAYLOAD: dict[str, Any] = {
    "format": "csv",
    "group_by": list(GROUP_BY),
    "metrics": [{"op": "count"}, {"op": "sum", "column": "qty"}, {"op": "mean", "column": "price"}],
}
NUMERIC = {"qty": "INT", "price": "DOUBLE", "discount": "DOUBLE", "order_id": "BIGINT"}
Answer = dict[tuple[Any, ...], tuple[Any, ...]]


def schema() -> str:
    """The sales CSV's schema as Spark DDL (numbers typed, the rest strings)."""
    return ", ".join(f"`{name}` {NUMERIC.get(name, 'STRING')}" for name in datagen.HEADER)


def session(cluster: SparkCluster, name: str) -> Any:
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = cluster.python  # the executors' Python: the venv's
    return (
        SparkSession.builder.master(cluster.master_url)
        .appName(name)
        .config("spark.cores.max", "2")
        .config("spark.executor.memory", "1g")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.pyspark.python", cluster.python)
        .getOrCreate()
    )


def app_answer(spark: Any, blob: str, choice: ScannerChoice) -> Answer:
    """The job's own aggregate over the blob (Blob SDK mode), keyed by group."""
    from shared.aggregation import parse_aggregate_payload

    partials = Partials.of(parse_aggregate_payload({**PAYLOAD, "input": blob}))
    args = argparse.Namespace(input_url="", split_mb=32, blob_endpoint="")
    rows, _, scanners = aggregate(spark, args, partials, choice)
    names = [m.name for m in partials.spec.metrics]
    app_answer.scanners = sorted(set(scanners))  # type: ignore[attr-defined]
    return {tuple(r[c] for c in GROUP_BY): tuple(r[n] for n in names) for r in rows}


def spark_answer(spark: Any, path: Path) -> Answer:
    """spark.read.csv(...).groupBy(...).agg(...) over the same data on local disk."""
    from pyspark.sql import functions as f

    frame = spark.read.csv(
        path.as_uri(), header=True, schema=schema(), escape='"', nullValue="", mode="PERMISSIVE"
    )
    out = frame.groupBy(*GROUP_BY).agg(f.count(f.lit(1)), f.sum("qty"), f.avg("price")).collect()
    return {(r[0], r[1]): (r[2], None if r[3] is None else float(r[3]), r[4]) for r in out}


def same(app: Answer, spark: Answer) -> bool:
    """Keys and counts exact, sums and means within 1e-9 (relative)."""
    if app.keys() != spark.keys():
        return False
    for key, mine in app.items():
        for a, b in zip(mine, spark[key], strict=True):
            if (a is None) != (b is None) or (a is not None and abs(a - b) > 1e-9 * max(abs(b), 1e-300)):
                return False
    return True


def timed(run: Callable[[], Answer]) -> tuple[float, Answer]:
    started = time.perf_counter()
    answer = run()
    return time.perf_counter() - started, answer


def rounds(spark: Any, blob: str, path: Path, choice: ScannerChoice, count: int) -> dict[str, Any]:
    """`count` interleaved rounds of both contenders over one input; per-round ratios."""
    app_s: list[float] = []
    spark_s: list[float] = []
    for i in range(count):
        order = ("app", "spark") if i % 2 == 0 else ("spark", "app")
        got: dict[str, Answer] = {}
        for who in order:
            if who == "app":
                t, got[who] = timed(lambda: app_answer(spark, blob, choice))
                app_s.append(t)
            else:
                t, got[who] = timed(lambda: spark_answer(spark, path))
                spark_s.append(t)
        if not same(got["app"], got["spark"]):
            raise AssertionError(f"the answers differ over {blob}")
    ratios = [s / a for a, s in zip(app_s, spark_s, strict=True)]
    return {
        "app_s": [round(t, 2) for t in app_s],
        "spark_s": [round(t, 2) for t in spark_s],
        "ratios": [round(r, 2) for r in ratios],
        "median": round(statistics.median(ratios), 2),
        "best": round(max(ratios), 2),
        "scanner": getattr(app_answer, "scanners", []),
    }


def measure(
    cluster: SparkCluster,
    inputs: list[tuple[int, str, Path]],
    engine_zip: Path,
    python_path: bool,
    count: int,
) -> dict[str, Any]:
    """One session; each input's rounds."""
    spark = session(cluster, "versus-python" if python_path else "versus-scanner")
    try:
        spark.sparkContext.addPyFile(str(engine_zip))
        choice = ship(spark.sparkContext.addFile, own_scanner(), use=not python_path)
        spark_answer(spark, inputs[0][2])  # the first read of each (JVM, Python workers): not a round
        app_answer(spark, inputs[0][1], choice)
        out = {}
        for mb, blob, path in inputs:
            out[str(mb)] = result = rounds(spark, blob, path, choice, count)
            ratios = "  ".join(f"{r:.2f}x" for r in result["ratios"])
            print(
                f"  {mb:>4} MB ({'python path' if python_path else 'scanner'}): app {result['app_s']} s, "
                f"spark.read.csv {result['spark_s']} s; ratios {ratios}; median {result['median']:.2f}x, "
                f"best {result['best']:.2f}x  [{'; '.join(result['scanner'])}]",
                flush=True,
            )
        return out
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="200,500", help="input sizes in MB (10^6 bytes)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per size")
    parser.add_argument(
        "--python-path", action="store_true", help="also with the scanner off (a second session)"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if not java_ok():
        print("skipped: Spark 4 needs Java 17+ on PATH")
        return 0
    sizes = sorted(int(s) for s in args.sizes.split(","))
    work = Path(tempfile.mkdtemp(prefix="bench-versus-"))
    source = work / "sales.csv"
    print(f"generating {sizes[-1]} MB of CSV ...", flush=True)
    datagen.write(source, mb=sizes[-1], seed=17)
    azurite = start_azurite(location=work / "azurite")
    cluster = start_cluster(cores=4, memory="4g")
    report: dict[str, Any] = {"sizes_mb": sizes, "rounds": args.rounds}
    try:
        os.environ[CONNECTION_ENV] = azurite.connection_string
        storage = clients_for(Settings.from_env({"AzureWebJobsStorage": azurite.connection_string}).storage)
        with contextlib.suppress(ResourceExistsError):
            storage.blob.create_container("bench")
        inputs = []
        for mb in sizes:
            path = work / f"sales-{mb}mb.csv"
            with source.open("rb") as src, path.open("wb") as dst:
                dst.write(src.read(mb * MB) + src.readline())
            with path.open("rb") as fh:
                storage.blob.get_blob_client("bench", path.name).upload_blob(
                    fh, overwrite=True, max_concurrency=4
                )
            inputs.append((mb, f"bench/{path.name}", path))
        engine_zip = build_engine_zip(REPO_ROOT, work / "aggregate_engine.zip", own_scanner())
        print("the app's Spark path vs spark.read.csv(...).groupBy(...).agg(...) (ratio: spark s / app s):")
        report["scanner"] = measure(cluster, inputs, engine_zip, False, args.rounds)
        if args.python_path:
            report["python_path"] = measure(cluster, inputs, engine_zip, True, args.rounds)
    finally:
        os.environ.pop(CONNECTION_ENV, None)
        cluster.cleanup()
        azurite.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
