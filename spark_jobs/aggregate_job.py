"""PySpark job: run one `aggregate` payload on a Spark cluster and write its result document.

    aggregate_job.py JOB_ID PAYLOAD_B64 RESULTS_CONTAINER [--submission N]
                     [--input-url URL --results-url URL] [--blob-endpoint URL] [--split-mb MB]

Semantics are the inline engine's, by construction: every task runs the very same
`shared.aggregation.aggregate_stream` over its share of the input (header + whole
lines), computing mergeable partials per group (rows, non-null count, sum, min, max); the
partials are merged with `reduceByKey` and finished (mean = sum / count) on the driver, and the
rows sorted by the group columns, nulls first, as the inline engine sorts them.

Where the engine comes from: the cluster needs the `shared/aggregation/` package importable,
with the leaf modules of `shared` it and this job use (`engine_files`). `python -m
spark_jobs.package out.zip` builds a small zip of exactly those to pass as pyFiles
(SPARK_PY_FILES). When this file runs from a checkout of the repository (the local cluster),
the driver builds that zip itself and ships it to the executors with `addPyFile`.

Input:
- `--input-url abfss://...` / `wasbs://...` (Azure Spark services: the cluster's own identity):
  `sc.textFile`, whose splits follow Hadoop's line-record rules, in order.
- otherwise (local cluster + Azurite, which has no dfs endpoint): the blob is split into byte
  ranges and each task downloads its range through the Blob SDK (conditional on the ETag), skips
  the partial first line and reads past its end to finish its last line (Hadoop's rule: a line
  belongs to the split that holds the line break before it). Credentials come from
  AZURE_STORAGE_CONNECTION_STRING in the driver's environment (captured into the tasks, never an
  argument) or, with `--blob-endpoint`, from the cluster's identity (DefaultAzureCredential).
Both split at line breaks, so a quoted CSV field must not contain a line break.

Output: `<results>/<job id>.json`, created only if absent (a second run of the same job id
changes nothing). On failure: `<results>/_spark/<job id>/error-s<N>.json` with the message and
its kind (input_data | payload | unexpected), then exit 1 so the run ends FAILED.
"""

from __future__ import annotations

import argparse
import ast
import base64
import json
import os
import re
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONNECTION_ENV = "AZURE_STORAGE_CONNECTION_STRING"
ENGINE_PACKAGE = "shared/aggregation"
"""Shipped whole: the engine, and what this job uses of the inline app besides the modules below."""
ENGINE_LEAVES = (
    "shared/__init__.py",
    "shared/errors.py",
    "shared/containers.py",
    "shared/blob_reader.py",
    "shared/blob_stream.py",
)
"""The modules of `shared` outside the package that it and this job import (none imports more)."""
DEFAULT_SPLIT_MB = 32
OVERHANG = 64 * 1024
"""Bytes read past a split's end at first to finish its last line (more if that is not enough)."""
PREFIX = "\x00"
"""Prefix of internal metric names (cannot collide with a real column)."""

Vector = tuple[Any, ...]
Key = tuple[str | None, ...]


class JobFailure(Exception):
    """A failure to report in the error document: `kind` says whether a new run could help."""

    def __init__(self, message: str, kind: str = "unexpected") -> None:
        super().__init__(message)
        self.kind = kind


# --- shipping the engine -----------------------------------------------------------------------


def engine_files(repo_root: Path) -> list[str]:
    """The files of the engine zip: `ENGINE_LEAVES` and every module of `ENGINE_PACKAGE`."""
    package = sorted(p.relative_to(repo_root).as_posix() for p in (repo_root / ENGINE_PACKAGE).glob("*.py"))
    return [*ENGINE_LEAVES, *package]


def build_engine_zip(repo_root: Path, dest: Path) -> Path:
    """A zip of `engine_files`, importable as `shared.aggregation` without the rest of `shared`."""
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in engine_files(repo_root):
            zf.write(repo_root / name, name)
    return dest


def ensure_engine(add_py_file: Callable[[str], None] | None) -> None:
    """Make the engine importable here and, through `add_py_file`, on the executors."""
    try:
        import shared.aggregation  # noqa: F401
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
    build_engine_zip(repo_root, dest)
    sys.path.insert(0, str(dest))
    if add_py_file is not None:
        add_py_file(str(dest))


# --- the payload -------------------------------------------------------------------------------


def spec_from_payload(payload: Mapping[str, Any]) -> Any:
    """The engine's AggregateSpec for a payload, parsed as the function parsed it before it
    submitted the run (`shared.aggregation.parse_aggregate_payload`); JobFailure if invalid."""
    from shared.aggregation import parse_aggregate_payload
    from shared.errors import PayloadError

    try:
        return parse_aggregate_payload(payload)
    except PayloadError as exc:
        raise JobFailure(f"the payload is not a valid aggregate payload ({exc})", "payload") from None


@dataclass(frozen=True)
class Partials:
    """How each task's partial aggregates are computed, merged and finished."""

    spec: Any
    """The job's AggregateSpec."""
    derived: Any
    """The AggregateSpec each task runs: rows, and per value column count/sum/min/max as needed."""
    columns: tuple[str, ...]
    """Value columns, in order; slot i of a vector is 1 + 4 * i + (0 n, 1 sum, 2 min, 3 max)."""

    @classmethod
    def of(cls, spec: Any) -> Partials:
        """The derived spec: per value column its non-null count, and the sum, min and max the
        job's metrics need (`shared.aggregation.partials_by_column`, the inline engine's rule)."""
        from dataclasses import replace

        from shared.aggregation import MetricSpec, partials_by_column

        needs = partials_by_column(spec.metrics)
        columns = list(needs)
        derived = [MetricSpec("count", None, PREFIX + "rows")]
        for i, column in enumerate(columns):
            derived.append(MetricSpec("count", column, f"{PREFIX}n{i}"))
            derived += [
                MetricSpec(op, column, f"{PREFIX}{op}{i}")
                for op in ("sum", "min", "max")
                if op in needs[column]
            ]
        return cls(spec=spec, derived=replace(spec, metrics=tuple(derived)), columns=tuple(columns))

    def vectors(self, rows: Iterable[Mapping[str, Any]]) -> Iterator[tuple[Key, Vector]]:
        """(group key, partial vector) per row the engine returned for the derived spec."""
        for row in rows:
            key = tuple(row[c] for c in self.spec.group_by)
            vec: list[Any] = [row[PREFIX + "rows"]]
            for i in range(len(self.columns)):
                vec += [row[f"{PREFIX}n{i}"]] + [row.get(f"{PREFIX}{op}{i}") for op in ("sum", "min", "max")]
            yield key, tuple(vec)

    def finish(self, merged: Iterable[tuple[Key, Vector]]) -> list[dict[str, Any]]:
        """Final rows from merged vectors, as the inline engine shapes and sorts them."""
        items = list(merged)
        if not self.spec.group_by and not items:
            items = [((), (0, *([0, None, None, None] * len(self.columns))))]
        items.sort(key=lambda kv: tuple((v is not None, v or "") for v in kv[0]))
        rows = []
        for key, vec in items:
            row: dict[str, Any] = dict(zip(self.spec.group_by, key, strict=True))
            for metric in self.spec.metrics:
                row[metric.name] = self._metric(metric, vec)
            rows.append(row)
        return rows

    def _metric(self, metric: Any, vec: Vector) -> Any:
        if metric.column is None:
            return vec[0]
        base = 1 + 4 * self.columns.index(metric.column)
        n, total, low, high = vec[base : base + 4]
        if metric.op == "count":
            return n
        if metric.op == "sum":
            return total
        if metric.op == "mean":
            return None if not n or total is None else total / n
        return low if metric.op == "min" else high


def merge(a: Vector, b: Vector) -> Vector:
    """Combine two partial vectors: rows and counts add, sums add, min of mins, max of maxes."""
    out: list[Any] = [a[0] + b[0]]
    for base in range(1, len(a), 4):
        out.append(a[base] + b[base])
        out.append(_combine(a[base + 1], b[base + 1], lambda x, y: x + y))
        out.append(_combine(a[base + 2], b[base + 2], min))
        out.append(_combine(a[base + 3], b[base + 3], max))
    return tuple(out)


def _combine(x: Any, y: Any, op: Callable[[Any, Any], Any]) -> Any:
    if x is None:
        return y
    if y is None:
        return x
    return op(x, y)


# --- one task ----------------------------------------------------------------------------------


@dataclass
class TaskResult:
    """What one split produced: its partial vectors, or the error it met, and its line count."""

    index: int
    lines: int
    input_rows: int = 0
    vectors: list[tuple[Key, Vector]] = field(default_factory=list)
    error: str | None = None
    error_kind: str = "input_data"
    unseen: tuple[str, ...] = ()
    """JSON lines: needed columns absent from every line of this split."""


_UNSEEN = re.compile(r"column\(s\) (.+) occur in no line of the JSON-lines input")


def run_split(partials: Partials, index: int, data: bytes, header: bytes) -> TaskResult:
    """Aggregate one split's whole lines (`header` first for CSV) with the inline engine."""
    import io

    from shared.aggregation import aggregate_stream
    from shared.errors import InputDataError

    lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    result = TaskResult(index=index, lines=lines)
    if not data.strip() and partials.spec.format == "jsonl":
        return result
    try:
        out = aggregate_stream(io.BytesIO(header + data), partials.derived)
    except InputDataError as exc:
        match = _UNSEEN.search(str(exc))
        if match is None:
            result.error = str(exc)
            return result
        # Absent from this split only: aggregate with a null line; the driver decides about the whole input.
        unseen = tuple(ast.literal_eval("[" + match.group(1) + "]"))
        filler = json.dumps(dict.fromkeys(unseen)).encode() + b"\n"
        try:
            out = aggregate_stream(io.BytesIO(data + b"\n" + filler), partials.derived)
        except InputDataError as again:
            result.error = str(again)
            return result
        result.unseen = unseen
        out_rows = _drop_filler(partials, out.rows)
        result.input_rows = out.input_rows - 1
        result.vectors = list(partials.vectors(out_rows))
        return result
    result.input_rows = out.input_rows
    result.vectors = list(partials.vectors(out.rows))
    return result


def _drop_filler(partials: Partials, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Remove the filler line's row count from the all-null group (and the group if it empties)."""
    kept = []
    for row in rows:
        if all(row[c] is None for c in partials.spec.group_by):
            row = {**row, PREFIX + "rows": row[PREFIX + "rows"] - 1}
            if row[PREFIX + "rows"] == 0 and partials.spec.group_by:
                continue
        kept.append(row)
    return kept


def global_line_message(message: str, lines_before: int, header_lines: int) -> str:
    """Turn the engine's per-split line numbers into line numbers of the whole input."""

    def fix(match: re.Match[str]) -> str:
        line = int(match.group(1))
        return f"line {line if line <= header_lines else line + lines_before}"

    return re.sub(r"\bline (\d+)", fix, message)


# --- byte-range splits (Blob SDK) --------------------------------------------------------------


def plan_splits(start: int, size: int, split_bytes: int, min_splits: int) -> list[tuple[int, int]]:
    """Byte ranges [s, e) covering [start, size): at least `min_splits`, at most split_bytes each."""
    total = max(0, size - start)
    if total == 0:
        return [(start, start)]
    count = max(min_splits, -(-total // split_bytes))
    count = min(count, total)
    step = -(-total // count)
    return [(s, min(s + step, size)) for s in range(start, size, step)]


def split_lines(read: Callable[[int, int], bytes], size: int, s: int, e: int, first: bool) -> bytes:
    """The whole lines of split [s, e): a line belongs to the split holding the break before it.

    `first`: the split starts at a line start (the data region's start) and keeps its first line.
    `read(offset, length)` reads bytes of the blob.
    """
    if s >= size:
        return b""
    end_goal = min(size, e + OVERHANG)
    data = read(s, end_goal - s)
    if first:
        begin = 0
    else:
        nl = data.find(b"\n")
        while nl < 0 and s + len(data) < size and s + len(data) < e:
            more = read(s + len(data), min(size, e + OVERHANG) - s - len(data))
            data += more
            nl = data.find(b"\n")
        if nl < 0 or s + nl >= e:
            return b""
        begin = nl + 1
    rel_e = e - s
    stop = data.find(b"\n", max(rel_e, begin))
    while stop < 0 and s + len(data) < size:
        chunk = max(OVERHANG, len(data) // 4)
        data += read(s + len(data), min(chunk, size - s - len(data)))
        stop = data.find(b"\n", max(rel_e, begin))
    return data[begin : stop + 1] if stop >= 0 else data[begin:]


def csv_header(read: Callable[[int, int], bytes], size: int) -> bytes:
    """The CSV header record (up to its line break outside quotes, inclusive)."""
    length = min(size, OVERHANG)
    while True:
        data = read(0, length) if length else b""
        pos = data.find(b"\n")
        while pos >= 0 and data.count(b'"', 0, pos) % 2:
            pos = data.find(b"\n", pos + 1)
        if pos >= 0:
            return data[: pos + 1]
        if length >= size:
            return data
        length = min(size, length * 4)


# --- storage -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlobAccess:
    """How the driver and the tasks reach the storage account through the Blob SDK (picklable)."""

    connection_string: str | None = field(default=None, repr=False)
    endpoint: str | None = None

    def service(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        kw: dict[str, Any] = {"retry_total": 5, "connection_timeout": 20, "read_timeout": 120}
        if self.connection_string:
            return BlobServiceClient.from_connection_string(self.connection_string, **kw)
        from azure.identity import DefaultAzureCredential

        return BlobServiceClient(str(self.endpoint), credential=DefaultAzureCredential(), **kw)

    def ranges(self) -> Any:
        """The app's lean ranged reader (`shared.blob_reader`) with the same account and credential."""
        from shared.blob_reader import reader_for

        return reader_for(self.service())


class BlobResults:
    """Writes result and error documents with the Blob SDK."""

    def __init__(self, access: BlobAccess, container: str) -> None:
        self.container = access.service().get_container_client(container)

    def create(self, name: str, data: bytes) -> bool:
        """Create `name` unless it exists; False if it did."""
        from azure.core.exceptions import ResourceExistsError

        try:
            self.container.upload_blob(name, data, overwrite=False, content_settings=_json_settings())
        except ResourceExistsError:
            return False
        return True

    def put(self, name: str, data: bytes) -> None:
        self.container.upload_blob(name, data, overwrite=True, content_settings=_json_settings())

    def read(self, name: str) -> bytes | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return bytes(self.container.download_blob(name).readall())
        except ResourceNotFoundError:
            return None


def _json_settings() -> Any:
    from azure.storage.blob import ContentSettings

    return ContentSettings(content_type="application/json; charset=utf-8")


class HadoopResults:
    """Writes result and error documents through Hadoop's FileSystem (abfss://, wasbs://)."""

    def __init__(self, spark: Any, base_url: str) -> None:
        self.jvm = spark.sparkContext._jvm
        self.conf = spark.sparkContext._jsc.hadoopConfiguration()
        self.base = base_url.rstrip("/") + "/"

    def _path(self, name: str) -> Any:
        return self.jvm.org.apache.hadoop.fs.Path(self.base + name)

    def _write(self, path: Any, data: bytes, overwrite: bool) -> None:
        fs = path.getFileSystem(self.conf)
        out = fs.create(path, overwrite)
        try:
            out.write(bytearray(data))
        finally:
            out.close()

    def create(self, name: str, data: bytes) -> bool:
        final = self._path(name)
        fs = final.getFileSystem(self.conf)
        if fs.exists(final):
            return False
        tmp = self._path(f"_spark/tmp/{name}.{os.getpid()}.{time.time_ns()}")
        self._write(tmp, data, True)
        if fs.rename(tmp, final):  # atomic; fails if the target exists
            return True
        fs.delete(tmp, False)
        return False

    def put(self, name: str, data: bytes) -> None:
        self._write(self._path(name), data, True)

    def read(self, name: str) -> bytes | None:
        path = self._path(name)
        fs = path.getFileSystem(self.conf)
        if not fs.exists(path):
            return None
        stream = fs.open(path)
        try:
            return bytes(self.jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()


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
    return parser.parse_args(list(argv))


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


def run(spark: Any, args: argparse.Namespace, started: float, results: Any) -> None:
    """Aggregate the input and create the result document (unless a run already did)."""
    payload = decode_payload(args.payload_b64)
    spec = spec_from_payload(payload)
    partials = Partials.of(spec)
    from shared.aggregation.result import result_blob

    name = result_blob(args.job_id)
    if results.read(name) is not None:
        print(f"result {name} already exists: nothing to do", flush=True)
        return
    sc = spark.sparkContext
    if args.input_url:
        task_results = _hadoop_tasks(sc, args.input_url, partials)
        header_lines = 1 if spec.format == "csv" else 0
    else:
        task_results, header_lines = _blob_tasks(sc, args, partials)
    task_results.persist()
    metas = sorted(task_results.map(_meta).collect())
    _raise_first_error(metas, header_lines, spec.format)
    merged = task_results.flatMap(lambda r: r.vectors).reduceByKey(merge).collect()
    rows = partials.finish(merged)
    input_rows = sum(m[4] for m in metas)
    data = result_bytes(args.job_id, rows, input_rows, time.monotonic() - started)
    created = results.create(name, data)
    print(
        f"{'wrote' if created else 'kept the existing'} {name}: {len(rows)} groups, {input_rows} rows",
        flush=True,
    )


def _meta(r: TaskResult) -> tuple[int, int, str | None, str, int, tuple[str, ...]]:
    return (r.index, r.lines, r.error, r.error_kind, r.input_rows, r.unseen)


def _raise_first_error(
    metas: list[tuple[int, int, str | None, str, int, tuple[str, ...]]], header_lines: int, fmt: str
) -> None:
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


def _blob_tasks(sc: Any, args: argparse.Namespace, partials: Partials) -> tuple[Any, int]:
    from azure.core.exceptions import ResourceNotFoundError

    conn = os.environ.get(CONNECTION_ENV)
    access = BlobAccess(connection_string=conn) if conn else BlobAccess(endpoint=args.blob_endpoint or None)
    if not conn and not args.blob_endpoint:
        raise JobFailure(f"no storage access: set {CONNECTION_ENV} or pass --blob-endpoint")
    spec = partials.spec
    blob = access.service().get_blob_client(spec.container, spec.blob)
    try:
        props = blob.get_blob_properties()
    except ResourceNotFoundError:
        raise JobFailure(f"input {spec.container}/{spec.blob} does not exist", "input_data") from None
    size, etag = int(props.size), props.etag

    container, blob_name = spec.container, spec.blob

    def reader(ranges: Any) -> Callable[[int, int], bytes]:
        def read(offset: int, length: int) -> bytes:
            data: bytes = ranges.read_range(container, blob_name, offset, length, etag)
            return data

        return read

    header = b""
    if spec.format == "csv":
        if size == 0:
            raise JobFailure("the input is empty: a CSV input needs a header line", "input_data")
        header = csv_header(reader(access.ranges()), size)
    splits = plan_splits(len(header), size, int(args.split_mb * 1024 * 1024), sc.defaultParallelism)

    def task(item: tuple[int, tuple[int, int]]) -> TaskResult:
        index, (s, e) = item
        data = split_lines(reader(access.ranges()), size, s, e, first=index == 0)
        return run_split(partials, index, data, header)

    rdd = sc.parallelize(list(enumerate(splits)), len(splits)).map(task)
    return rdd, header.count(b"\n") or (1 if header else 0)


def _hadoop_tasks(sc: Any, url: str, partials: Partials) -> Any:
    lines_rdd = sc.textFile(url, minPartitions=sc.defaultParallelism)
    csv = partials.spec.format == "csv"
    header = (lines_rdd.first() + "\n").encode("utf-8") if csv else b""

    def task(index: int, lines: Iterator[str]) -> Iterator[TaskResult]:
        items = list(lines)
        if csv and index == 0:
            items = items[1:]
        data = ("\n".join(items) + "\n").encode("utf-8") if items else b""
        yield run_split(partials, index, data, header)

    return lines_rdd.mapPartitionsWithIndex(task)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: exit 0 when the result exists (written now or before), 1 on failure."""
    started = time.monotonic()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()
    results: Any = None
    try:
        ensure_engine(spark.sparkContext.addPyFile)
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
        run(spark, args, started, results)
        return 0
    except Exception as exc:
        failure = exc if isinstance(exc, JobFailure) else JobFailure(_describe(exc), _kind(exc))
        print(f"aggregate job {args.job_id} failed: {failure}", file=sys.stderr, flush=True)
        _report(results, args, failure)
        return 1
    finally:
        spark.stop()


def _kind(exc: BaseException) -> str:
    try:
        from shared.errors import InputDataError
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
