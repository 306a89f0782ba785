"""PySpark job: run one `aggregate` payload on a Spark cluster and write its result document.

    aggregate_job.py JOB_ID PAYLOAD_B64 RESULTS_CONTAINER [--submission N]
                     [--input-url URL --results-url URL] [--blob-endpoint URL] [--split-mb MB]
                     [--scanner auto|off]

Semantics are the inline engine's, by construction: every task runs the very same
`shared.aggregation.aggregate_stream` over its share of the input (header + whole
lines), computing mergeable partials per group (rows, non-null count, sum, min, max); one
Spark job: the driver collects each task's partials, merges and finishes them (mean = sum /
count), and sorts the rows by the group columns, nulls first, as the inline engine sorts them.
The tasks parse with the C scanner where the engine zip holds a build that loads on the
executors (`aggregate_native.py`: shipped with `addFile`), else on the Python path.

Where the engine comes from: the cluster needs the `shared/aggregation/` package importable,
with the leaf modules of `shared` it and this job use, and this job's own modules
(`spark_jobs/aggregate_partials.py`: the partials a task computes and the driver merges;
`aggregate_text.py`: the CSV and JSON-lines tasks; `aggregate_splits.py`: byte-range splits;
`aggregate_native.py`: the C scanner on the executors; `aggregate_storage.py`: storage access and
the result writers), all listed by `engine_files`. `python -m spark_jobs.package out.zip` builds a small
zip of exactly those to pass as pyFiles (SPARK_PY_FILES). When this file runs from a checkout of
the repository (the local cluster), the driver builds that zip itself and ships it to the
executors with `addPyFile`. So this file imports them only once `ensure_engine` has run.

Input (`aggregate_text.py`):
- `--input-url abfss://...` / `wasbs://...` (Azure Spark services: the cluster's own identity):
  `sc.textFile`, whose splits follow Hadoop's line-record rules, in order; a CSV quoted value
  holding a line break across two splits fails the run with the reason.
- otherwise (local cluster + Azurite, which has no dfs endpoint): the blob is split into byte
  ranges and each task downloads its range through the Blob SDK (conditional on the ETag), skips
  the partial first record and reads past its end to finish its last one (Hadoop's rule: a
  record belongs to the split that holds the line break before it; for CSV, a line break outside
  quotes: splits whose start was guessed wrongly run again). Credentials come from
  AZURE_STORAGE_CONNECTION_STRING in the driver's environment (captured into the tasks, never an
  argument) or, with `--blob-endpoint`, from the cluster's identity (DefaultAzureCredential).
Parquet (`spark_jobs/aggregate_parquet.py`): `spark.read.parquet` with `--input-url`, otherwise
row-group splits, each task reading only its row groups' needed column chunks.

Output: `<results>/<job id>.json`, created only if absent (a second run of the same job id
changes nothing). With a data output (`output.format` parquet or csv) the rows are first written
to `<results>/<job id>.v<--version>.<format>` in batches (staged blocks, or one Hadoop stream),
replaced whole by a new run, and the document names it. On failure: `<results>/_spark/<job id>/error-s<N>.json` with the message and
its kind (input_data | payload | unexpected), then exit 1 so the run ends FAILED.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import logging
import os
import re
import sys
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_jobs.aggregate_native import ScannerChoice
    from spark_jobs.aggregate_partials import Partials, TaskResult

CONNECTION_ENV = "AZURE_STORAGE_CONNECTION_STRING"
ENGINE_PACKAGE = "shared/aggregation"
"""Shipped whole: the engine, and what this job uses of the inline app besides the modules below."""
ENGINE_LEAVES = (
    "shared/__init__.py",
    "shared/core/__init__.py",
    "shared/core/errors.py",
    "shared/core/containers.py",
    "shared/blobio/__init__.py",
    "shared/blobio/reader.py",
    "shared/blobio/spans.py",
    "shared/blobio/stream.py",
    "shared/blobio/buffers.py",
)
"""The modules of `shared` outside the package that it and this job import (none imports more)."""
JOB_MODULES = (
    "spark_jobs/__init__.py",
    "spark_jobs/aggregate_native.py",
    "spark_jobs/aggregate_parquet.py",
    "spark_jobs/aggregate_partials.py",
    "spark_jobs/aggregate_splits.py",
    "spark_jobs/aggregate_storage.py",
    "spark_jobs/aggregate_text.py",
)
"""This job's modules besides this file: the driver imports them once the zip is on its path, and
the tasks' functions and objects come from them (none imports this file)."""
DEFAULT_SPLIT_MB = 32
SCANNER_ENTRY = "spark_jobs/native/aggkernel.so"
SOURCE_ENTRY = "spark_jobs/native/aggkernel.txt"
"""Where the engine zip holds a build of the C scanner, and its original file name."""


class JobFailure(Exception):
    """A failure to report in the error document: `kind` says whether a new run could help."""

    def __init__(self, message: str, kind: str = "unexpected") -> None:
        super().__init__(message)
        self.kind = kind


# --- shipping the engine -----------------------------------------------------------------------


def engine_files(repo_root: Path) -> list[str]:
    """The files of the engine zip: `ENGINE_LEAVES`, `JOB_MODULES` and every module of `ENGINE_PACKAGE`."""
    package = sorted(p.relative_to(repo_root).as_posix() for p in (repo_root / ENGINE_PACKAGE).glob("*.py"))
    return [*ENGINE_LEAVES, *JOB_MODULES, *package]


def build_engine_zip(repo_root: Path, dest: Path, scanner: tuple[str, bytes] | None = None) -> Path:
    """A zip of `engine_files`, importable as `shared.aggregation` without the rest of `shared`,
    with `scanner` (file name, bytes: a build of the C scanner) for the executors
    (`aggregate_native.SCANNER_FILE` and `SOURCE_FILE` in the `spark_jobs` package)."""
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in engine_files(repo_root):
            zf.write(repo_root / name, name)
        if scanner is not None:
            zf.writestr(SCANNER_ENTRY, scanner[1])
            zf.writestr(SOURCE_ENTRY, scanner[0])
    return dest


def own_scanner() -> tuple[str, bytes] | None:
    """This Python's built C scanner (file name, bytes), None where it has none."""
    found = importlib.util.find_spec("aggkernel")
    if found is None or found.origin is None or not found.origin.endswith(".so"):
        return None
    path = Path(found.origin)
    return path.name, path.read_bytes()


def ensure_engine(add_py_file: Callable[[str], None] | None) -> None:
    """Make the engine and this job's modules importable here and, through `add_py_file`, on the
    executors. From a checkout (the local cluster), the zip built here holds this Python's C
    scanner: the executors run on the same machine."""
    try:
        import shared.aggregation  # noqa: F401
        import spark_jobs.aggregate_partials  # noqa: F401
    except ImportError:
        pass
    else:
        return
    repo_root = Path(__file__).resolve().parent.parent
    if not (repo_root / ENGINE_PACKAGE / "__init__.py").exists():
        raise JobFailure(
            "the aggregate engine is not importable: pass the zip from `python -m spark_jobs.package` "
            "as pyFiles (SPARK_PY_FILES)"
        )
    dest = Path(tempfile.mkdtemp(prefix="aggregate-engine-")) / "aggregate_engine.zip"
    build_engine_zip(repo_root, dest, own_scanner())
    sys.path.insert(0, str(dest))
    if add_py_file is not None:
        add_py_file(str(dest))


# --- the payload -------------------------------------------------------------------------------


def spec_from_payload(payload: Mapping[str, Any]) -> Any:
    """The engine's AggregateSpec for a payload, parsed as the function parsed it before it
    submitted the run (`shared.aggregation.parse_aggregate_payload`); JobFailure if invalid."""
    from shared.aggregation import parse_aggregate_payload
    from shared.core.errors import PayloadError

    try:
        return parse_aggregate_payload(payload)
    except PayloadError as exc:
        raise JobFailure(f"the payload is not a valid aggregate payload ({exc})", "payload") from None


# --- the driver --------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="aggregate_job.py", description="Run one aggregate job on Spark.")
    parser.add_argument("job_id")
    parser.add_argument("payload_b64", help="base64url of the payload's JSON (no secrets)")
    parser.add_argument("results", help="results container (Blob SDK mode)")
    parser.add_argument("--submission", type=int, default=1)
    parser.add_argument("--input-url", default="", help="Hadoop URL of the input (abfss:// or wasbs://)")
    parser.add_argument("--results-url", default="", help="Hadoop URL of the results container's root")
    parser.add_argument(
        "--blob-endpoint", default="", help="blob service URL, read with the cluster identity"
    )
    parser.add_argument("--split-mb", type=float, default=DEFAULT_SPLIT_MB)
    parser.add_argument(
        "--version", type=int, default=0, help="the payload's version (names a data output's blob)"
    )
    parser.add_argument(
        "--scanner",
        choices=("auto", "off"),
        default="auto",
        help="off: the executors parse on the Python path even where the engine zip holds the C scanner",
    )
    parser.add_argument(
        "--traceparent", default="", help="W3C trace context of the job (its log records carry it)"
    )
    return parser.parse_args(list(argv))


TRACEPARENT_RE = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s job_id=%(job_id)s trace_id=%(trace_id)s span_id=%(span_id)s %(message)s"


def trace_fields(job_id: str, traceparent: str) -> dict[str, str]:
    """What every driver log record carries: the job id, and the trace and parent span ids of the
    app's handler span that submitted the run ("-" without a valid traceparent)."""
    match = TRACEPARENT_RE.match(traceparent or "")
    trace_id, span_id = match.groups() if match else ("-", "-")
    return {"job_id": job_id, "trace_id": trace_id, "span_id": span_id}


def driver_log(job_id: str, traceparent: str) -> logging.LoggerAdapter[logging.Logger]:
    """The driver's logger (stderr, the driver log of every backend), its records carrying `trace_fields`."""
    logger = logging.getLogger("spark_jobs.aggregate_job")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logging.LoggerAdapter(logger, trace_fields(job_id, traceparent))


def decode_payload(text: str) -> dict[str, Any]:
    try:
        payload = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except ValueError as exc:
        raise JobFailure(f"the payload argument is not base64url JSON ({exc})", "payload") from None
    if not isinstance(payload, dict):
        raise JobFailure("the payload argument is not a JSON object", "payload")
    return payload


def result_bytes(job_id: str, rows: list[dict[str, Any]], input_rows: int, elapsed_s: float) -> bytes:
    """The document of `shared.aggregation.result`, engine 'spark'."""
    from shared.aggregation import result as aggregate_result

    return aggregate_result.dumps(
        aggregate_result.result_document(job_id, rows, input_rows, "spark", elapsed_s)
    )


def data_result_bytes(
    results: Any,
    args: argparse.Namespace,
    spec: Any,
    rows: list[dict[str, Any]],
    input_rows: int,
    started: float,
) -> bytes:
    """Write the rows as the payload's data output (parquet, csv) beside the result document, in
    batches, then the document naming it (`shared.aggregation.result.data_result_document`)."""
    from shared.aggregation import result as aggregate_result
    from shared.aggregation.output import CONTENT_TYPES, data_blob
    from shared.aggregation.result_data import result_schema, row_batches, write_batches

    fmt = spec.output.format
    name = data_blob(args.job_id, args.version, fmt)
    sink = results.open_data(name, CONTENT_TYPES[fmt])
    schema = result_schema(spec)
    written = write_batches(row_batches(rows, schema), schema, fmt, sink)
    size = sink.commit()
    output = {
        "format": fmt,
        "result_ref": f"{args.results}/{name}",
        "rows": written.rows,
        "bytes": size,
        "columns": written.column_list(),
    }
    elapsed = time.monotonic() - started
    return aggregate_result.dumps(
        aggregate_result.data_result_document(args.job_id, output, input_rows, "spark", elapsed)
    )


def run(spark: Any, args: argparse.Namespace, started: float, results: Any, choice: ScannerChoice) -> None:
    """Aggregate the input and create the result document (unless a run already did)."""
    from spark_jobs.aggregate_partials import Partials

    payload = decode_payload(args.payload_b64)
    spec = spec_from_payload(payload)
    partials = Partials.of(spec)
    from shared.aggregation.result import result_blob

    name = result_blob(args.job_id)
    if results.read(name) is not None:
        print(f"result {name} already exists: nothing to do", flush=True)
        return
    rows, input_rows, scanners = aggregate(spark, args, partials, choice)
    for status, tasks in sorted(Counter(scanners).items()):
        print(f"{tasks} task(s): {status}", flush=True)
    if spec.output.is_data:
        data = data_result_bytes(results, args, spec, rows, input_rows, started)
    else:
        data = result_bytes(args.job_id, rows, input_rows, time.monotonic() - started)
    created = results.create(name, data)
    print(
        f"{'wrote' if created else 'kept the existing'} {name}: {len(rows)} groups, {input_rows} rows",
        flush=True,
    )


def aggregate(
    spark: Any, args: argparse.Namespace, partials: Partials, choice: ScannerChoice
) -> tuple[list[dict[str, Any]], int, list[str]]:
    """(the result's rows, the input's rows, each task's scanner): one Spark job whose tasks'
    partials the driver merges (CSV splits guessed wrongly about a quoted value run again)."""
    from shared.core.errors import InputDataError, InputMissing
    from spark_jobs.aggregate_partials import merge_results
    from spark_jobs.aggregate_text import blob_tasks, hadoop_tasks

    spec = partials.spec
    try:
        if spec.format == "parquet":
            tasks, header_lines = sorted(_parquet_tasks(spark, args, partials).collect(), key=_index), 0
        elif args.input_url:
            tasks = hadoop_tasks(spark.sparkContext, args.input_url, partials, choice)
            header_lines = 1 if spec.format == "csv" else 0
        else:
            split_bytes = int(args.split_mb * 1024 * 1024)
            tasks, header_lines = blob_tasks(spark.sparkContext, _access(args), partials, split_bytes, choice)
    except (InputDataError, InputMissing) as exc:
        raise JobFailure(str(exc), "input_data") from None
    raise_first_error([task_meta(r) for r in tasks], header_lines, spec.format)
    rows = partials.finish(merge_results(tasks).items())
    return rows, sum(r.input_rows for r in tasks), [r.scanner for r in tasks]


def _index(result: TaskResult) -> int:
    return result.index


def task_meta(r: TaskResult) -> tuple[int, int, str | None, str, int, tuple[str, ...]]:
    """What the driver checks of a task's result before merging its partials."""
    return (r.index, r.lines, r.error, r.error_kind, r.input_rows, r.unseen)


def raise_first_error(
    metas: list[tuple[int, int, str | None, str, int, tuple[str, ...]]], header_lines: int, fmt: str
) -> None:
    """JobFailure for the first task's error (its line numbered in the whole input), or for
    JSON-lines columns no line holds."""
    from spark_jobs.aggregate_partials import global_line_message

    before = 0
    for _index, lines, error, kind, _rows, _unseen in metas:
        if error is not None:
            raise JobFailure(global_line_message(error, before, header_lines), kind)
        before += lines
    if fmt == "jsonl":
        with_rows = [set(m[5]) for m in metas if m[4] > 0]
        if with_rows:
            missing = set.intersection(*with_rows)
            if missing:
                listed = ", ".join(repr(c) for c in sorted(missing))
                raise JobFailure(f"column(s) {listed} occur in no line of the JSON-lines input", "input_data")


def _parquet_tasks(spark: Any, args: argparse.Namespace, partials: Partials) -> Any:
    """`spark.read.parquet` of the input URL, or row-group splits of the blob read through the
    app's ranged reader (Blob SDK mode)."""
    from shared.core.errors import InputMissing
    from spark_jobs.aggregate_parquet import blob_tasks, hadoop_tasks

    if args.input_url:
        return hadoop_tasks(spark, args.input_url, partials)
    try:
        return blob_tasks(spark.sparkContext, _access(args), partials, int(args.split_mb * 1024 * 1024))
    except InputMissing:
        spec = partials.spec
        raise JobFailure(f"input {spec.container}/{spec.blob} does not exist", "input_data") from None


def _access(args: argparse.Namespace) -> Any:
    from spark_jobs.aggregate_storage import BlobAccess

    conn = os.environ.get(CONNECTION_ENV)
    if not conn and not args.blob_endpoint:
        raise JobFailure(f"no storage access: set {CONNECTION_ENV} or pass --blob-endpoint")
    return BlobAccess(connection_string=conn) if conn else BlobAccess(endpoint=args.blob_endpoint or None)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: exit 0 when the result exists (written now or before), 1 on failure."""
    started = time.monotonic()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    log = driver_log(args.job_id, args.traceparent)
    log.info("started (submission %s)", args.submission)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()
    results: Any = None
    try:
        ensure_engine(spark.sparkContext.addPyFile)
        from spark_jobs.aggregate_native import in_engine, ship
        from spark_jobs.aggregate_storage import BlobAccess, BlobResults, HadoopResults

        build = in_engine()
        choice = ship(spark.sparkContext.addFile, build, use=args.scanner == "auto")
        log.info("C scanner for the executors: %s", build[0] if build and choice.use else "none")

        if args.results_url:
            results = HadoopResults(spark, args.results_url)
        else:
            conn = os.environ.get(CONNECTION_ENV)
            access = (
                BlobAccess(connection_string=conn)
                if conn
                else BlobAccess(endpoint=args.blob_endpoint or None)
            )
            results = BlobResults(access, args.results)
        run(spark, args, started, results, choice)
        log.info("finished in %.1f s", time.monotonic() - started)
        return 0
    except Exception as exc:
        failure = exc if isinstance(exc, JobFailure) else JobFailure(_describe(exc), _kind(exc))
        print(f"aggregate job {args.job_id} failed: {failure}", file=sys.stderr, flush=True)
        log.error("failed (%s)", failure.kind)
        _report(results, args, failure)
        return 1
    finally:
        spark.stop()


def _kind(exc: BaseException) -> str:
    try:
        from shared.core.errors import InputDataError
    except ImportError:
        return "unexpected"
    return "input_data" if isinstance(exc, InputDataError) else "unexpected"


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    # A Python exception raised in a task reaches the driver wrapped in a Py4J/Spark error.
    for line in reversed(text):
        match = re.search(r"(?:InputDataError|JobFailure): (.+)", line)
        if match:
            return match.group(1)
    return f"{exc.__class__.__name__}: {text[-1] if text else ''}"[:1000]


def _report(results: Any, args: argparse.Namespace, failure: JobFailure) -> None:
    if results is None:
        return
    try:
        from shared.aggregation.result import error_blob, error_document

        doc = error_document(args.job_id, args.submission, failure.kind, str(failure))
        results.put(error_blob(args.job_id, args.submission), json.dumps(doc).encode())
    except Exception as exc:  # the exit code still tells the backend
        print(f"could not write the error document: {exc.__class__.__name__}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
