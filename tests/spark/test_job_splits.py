"""The Spark job's pure parts without a cluster: byte-range splits, partial merge, parity with inline.

`simulate` runs the job's pipeline in-process (plan splits -> whole lines per split -> the engine
per split -> merge -> finish) exactly as the tasks and the driver do, minus Spark.
"""

from __future__ import annotations

import io
import itertools
import json
import random
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from devstack import datagen
from shared.aggregation import aggregate_stream, parse_aggregate_payload
from shared.core.errors import InputDataError
from spark_jobs import aggregate_job as job
from spark_jobs import aggregate_partials, aggregate_splits
from tests.conftest import FAST_TIER
from tests.spark.helpers import assert_rows_equal

REPO_ROOT = Path(__file__).resolve().parents[2]
SALES_METRICS = [
    {"op": "count"},
    {"op": "sum", "column": "qty"},
    {"op": "mean", "column": "price"},
    {"op": "min", "column": "price"},
    {"op": "max", "column": "qty", "as": "most"},
    {"op": "count", "column": "note"},
]


def simulate(
    data: bytes, payload: dict[str, Any], split_bytes: int, min_splits: int = 1
) -> tuple[list[Any], int]:
    spec = job.spec_from_payload(payload)
    partials = aggregate_partials.Partials.of(spec)

    def read(offset: int, length: int) -> bytes:
        return data[offset : offset + length]

    csv = spec.format == "csv"
    header = aggregate_splits.csv_header(read, len(data)) if csv else b""
    splits = aggregate_splits.plan_splits(len(header), len(data), split_bytes, min_splits)

    def task(i: int, inside: bool | None) -> aggregate_partials.TaskResult:
        s, e = splits[i]
        quotes, taken = 0, False
        if csv:
            part, quotes, taken = aggregate_splits.split_records(read, len(data), s, e, i == 0, inside)
        else:
            part = aggregate_splits.split_lines(read, len(data), s, e, i == 0)
        result = aggregate_partials.run_split(partials, i, part, header)
        result.quotes, result.inside = quotes, taken
        return result

    results = [task(i, None) for i in range(len(splits))]
    for i, inside in aggregate_splits.wrong_starts([(r.index, r.quotes, r.inside) for r in results]):
        results[i] = task(i, inside)
    metas = sorted(job.task_meta(r) for r in results)
    try:
        job.raise_first_error(metas, header.count(b"\n"), spec.format)
    except job.JobFailure as exc:
        raise InputDataError(str(exc)) from None
    merged = aggregate_partials.merge_results(results)
    return partials.finish(merged.items()), sum(m[4] for m in metas)


def inline(data: bytes, payload: dict[str, Any]) -> Any:
    return aggregate_stream(io.BytesIO(data), parse_aggregate_payload(payload))


_INLINE: dict[tuple[bytes, str], Any] = {}


def inline_once(data: bytes, payload: dict[str, Any]) -> Any:
    """`inline`, computed once per input and payload: the split sizes of one payload compare with
    the same answer."""
    key = (data, json.dumps(payload, sort_keys=True))
    if key not in _INLINE:
        _INLINE[key] = inline(data, payload)
    return _INLINE[key]


@pytest.fixture(scope="module")
def sales_csv() -> bytes:
    return "".join(datagen.csv_lines(20_000, seed=3)).encode()


@pytest.fixture(scope="module")
def sales_jsonl() -> bytes:
    return "".join(datagen.jsonl_lines(8_000, seed=5)).encode()


@pytest.mark.parametrize("split_bytes", [6007, 65_537, 10**8])
@pytest.mark.parametrize("group_by", [["region"], ["region", "product"], []])
def test_csv_equals_inline(sales_csv: bytes, split_bytes: int, group_by: list[str]) -> None:
    payload = {"input": "data/s.csv", "format": "csv", "group_by": group_by, "metrics": SALES_METRICS}
    rows, input_rows = simulate(sales_csv, payload, split_bytes)
    want = inline_once(sales_csv, payload)
    assert input_rows == want.input_rows
    assert_rows_equal(rows, want.rows)


@pytest.mark.parametrize("split_bytes", [3001, 50_000])
def test_jsonl_equals_inline(sales_jsonl: bytes, split_bytes: int) -> None:
    payload = {"input": "data/s.jsonl", "format": "jsonl", "group_by": ["region", "qty"], "metrics": SALES_METRICS[:4],
               "null_values": ["NA"]}  # fmt: skip
    rows, input_rows = simulate(sales_jsonl, payload, split_bytes)
    want = inline_once(sales_jsonl, payload)
    assert input_rows == want.input_rows
    assert_rows_equal(rows, want.rows)


def test_bad_number_names_column_value_and_the_same_line_as_inline() -> None:
    lines = ["k,v"] + [f"g{i % 7},{i * 0.5}" for i in range(5000)]
    lines[3210] = "g1,12x"
    bad = ("\n".join(lines) + "\n").encode()
    payload = {
        "input": "data/s.csv",
        "format": "csv",
        "group_by": ["k"],
        "metrics": [{"op": "sum", "column": "v"}],
    }
    with pytest.raises(InputDataError) as want:
        inline(bad, payload)
    with pytest.raises(InputDataError) as got:
        simulate(bad, payload, 2000)
    assert str(got.value) == str(want.value)
    assert "'v'" in str(got.value) and "'12x'" in str(got.value) and "line 3211" in str(got.value)


def test_jsonl_column_missing_from_some_splits_is_fine_missing_everywhere_is_an_error() -> None:
    lines = [b'{"k":"a","v":1}'] + [b'{"k":"b"}'] * 100 + [b'{"k":"a","v":2.5}']
    data = b"\n".join(lines) + b"\n"
    payload = {"input": "data/x.jsonl", "format": "jsonl", "group_by": ["k"],
               "metrics": [{"op": "count"}, {"op": "sum", "column": "v"}]}  # fmt: skip
    rows, input_rows = simulate(data, payload, 300)
    assert input_rows == 102
    assert_rows_equal(rows, inline(data, payload).rows)
    payload["metrics"] = [{"op": "sum", "column": "w"}]
    with pytest.raises(InputDataError) as want:
        inline(data, payload)
    with pytest.raises(InputDataError) as got:
        simulate(data, payload, 300)
    assert str(got.value) == str(want.value)


def test_empty_inputs_match_inline() -> None:
    for data, fmt, group_by in [
        (b"a,b\n", "csv", []),
        (b"a,b\n", "csv", ["a"]),
        (b"", "jsonl", []),
        (b"\n\n", "jsonl", ["a"]),
    ]:
        payload = {
            "input": "data/x",
            "format": fmt,
            "group_by": group_by,
            "metrics": [{"op": "count"}, {"op": "mean", "column": "b"}],
        }
        if fmt == "jsonl" and not group_by:
            payload["metrics"] = [{"op": "count"}]
        rows, input_rows = simulate(data, payload, 1)
        want = inline(data, payload)
        assert (rows, input_rows) == (want.rows, want.input_rows)


def test_missing_csv_column_is_reported_like_inline(sales_csv: bytes) -> None:
    payload = {"input": "data/s.csv", "format": "csv", "metrics": [{"op": "sum", "column": "nope"}]}
    with pytest.raises(InputDataError) as want:
        inline(sales_csv, payload)
    with pytest.raises(InputDataError) as got:
        simulate(sales_csv, payload, 5000)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("seed", range(20))
def test_splits_partition_the_lines_exactly(seed: int) -> None:
    rnd = random.Random(seed)
    pieces = [rnd.choice([b"", b"x", b"yy" * rnd.randint(1, 40), b"\r"]) for _ in range(rnd.randint(0, 200))]
    data = b"\n".join(pieces) + rnd.choice([b"", b"\n", b"tail"])
    start = rnd.randint(0, min(5, len(data)))
    splits = aggregate_splits.plan_splits(start, len(data), rnd.randint(1, 64), rnd.randint(1, 8))

    def read(offset: int, length: int) -> bytes:
        return data[offset : offset + length]

    parts = [aggregate_splits.split_lines(read, len(data), s, e, i == 0) for i, (s, e) in enumerate(splits)]
    assert b"".join(parts) == data[start:]
    non_empty = [p for p in parts if p]
    assert all(p.endswith(b"\n") for p in non_empty[:-1])  # only the part at the end of the data may not


def quoted_csv(rows: int, seed: int) -> bytes:
    """CSV whose quoted values hold line breaks (\\n and \\r\\n), separators and escaped quotes."""
    rnd = random.Random(seed)
    texts = ["plain", "a,b", 'say ""hi""', "two\nlines", "three\r\nlines\nhere", "", ",\n,", '""']
    out = ["k,note,v\n"]
    for i in range(rows):
        key = f'"g{i % 5}\n{i % 3}"' if rnd.random() < 0.3 else f"g{i % 5}"
        out.append(f'{key},"{rnd.choice(texts)}",{rnd.randint(-50, 50) * 0.25}\n')
    return "".join(out).encode()


@pytest.mark.parametrize("seed", range(2 if FAST_TIER else 6))  # the fast tier: two seeds
def test_quoted_line_breaks_across_split_starts_equal_inline(seed: int) -> None:
    data = quoted_csv(400, seed)
    payload = {"input": "data/q.csv", "format": "csv", "group_by": ["k"],
               "metrics": [{"op": "count"}, {"op": "sum", "column": "v"}, {"op": "count", "column": "note"}]}  # fmt: skip
    want = inline(data, payload)
    for split_bytes in (7, 31, 97, 1000):
        rows, input_rows = simulate(data, payload, split_bytes)
        assert input_rows == want.input_rows
        assert_rows_equal(rows, want.rows)


@pytest.mark.parametrize("seed", range(10))
def test_split_records_with_the_true_starts_partition_the_records(seed: int) -> None:
    data = quoted_csv(60, seed)

    def read(offset: int, length: int) -> bytes:
        return data[offset : offset + length]

    header = aggregate_splits.csv_header(read, len(data))
    splits = aggregate_splits.plan_splits(len(header), len(data), random.Random(seed).randint(3, 80), 2)
    taken = [aggregate_splits.split_records(read, len(data), s, e, i == 0) for i, (s, e) in enumerate(splits)]
    parts = [t[0] for t in taken]
    for i, inside in aggregate_splits.wrong_starts([(i, t[1], t[2]) for i, t in enumerate(taken)]):
        s, e = splits[i]
        parts[i] = aggregate_splits.split_records(read, len(data), s, e, False, inside)[0]
    assert b"".join(parts) == data[len(header) :]
    assert all(p.count(b'"') % 2 == 0 for p in parts)  # whole records: no quoted value cut


@pytest.mark.parametrize(
    ("start", "inside"),
    [(b"abc,def\n", False), (b'x",1\n', True), (b'a,"b\nc",1', False), (b'\nc",1\n"', True), (b"", False)],
)
def test_a_split_start_inside_a_quoted_value_is_told_by_its_first_quotes(start: bytes, inside: bool) -> None:
    assert aggregate_splits.starts_inside(start) is inside


class FakeLines:
    """`sc.textFile`'s RDD over set partitions (lists of lines), enough for `hadoop_tasks`."""

    def __init__(self, parts: list[list[str]]) -> None:
        self.parts = parts
        self.defaultParallelism = len(parts)

    def textFile(self, url: str, minPartitions: int) -> FakeLines:
        return self

    def first(self) -> str:
        return self.parts[0][0]

    def mapPartitionsWithIndex(self, f: Any) -> FakeLines:
        self.results = [r for i, part in enumerate(self.parts) for r in f(i, iter(part))]
        return self

    def collect(self) -> list[Any]:
        return self.results


def test_hadoop_mode_reads_a_quoted_line_break_inside_a_split_and_refuses_one_across_splits() -> None:
    from spark_jobs.aggregate_native import ScannerChoice
    from spark_jobs.aggregate_text import HADOOP_QUOTED_BREAK, hadoop_tasks

    payload = {"input": "data/q.csv", "format": "csv", "group_by": ["k"], "metrics": [{"op": "count"}]}
    partials = aggregate_partials.Partials.of(job.spec_from_payload(payload))
    inside = FakeLines([["k,v", 'a,"x', 'y"', "b,1"], ["a,2"]])
    tasks = hadoop_tasks(inside, "file:///q.csv", partials, ScannerChoice())
    rows = partials.finish(aggregate_partials.merge_results(tasks).items())
    assert rows == [{"k": "a", "count": 2}, {"k": "b", "count": 1}]
    across = FakeLines([["k,v", 'a,"x'], ['y"', "b,1"]])
    with pytest.raises(InputDataError, match="quoted line breaks are read on Spark in Blob SDK mode only"):
        hadoop_tasks(across, "file:///q.csv", partials, ScannerChoice())
    assert "across a split of the Hadoop connector" in HADOOP_QUOTED_BREAK


def test_plan_splits_covers_the_range() -> None:
    splits = aggregate_splits.plan_splits(10, 1000, 100, 4)
    assert splits[0][0] == 10 and splits[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in itertools.pairwise(splits))
    assert aggregate_splits.plan_splits(5, 5, 100, 4) == [(5, 5)]


def test_global_line_numbers_keep_header_lines() -> None:
    msg = "bad on line 7: 'x' (see line 1)"
    assert aggregate_partials.global_line_message(msg, 100, 1) == "bad on line 107: 'x' (see line 1)"


@pytest.mark.parametrize(
    "payload",
    [
        {"input": "c1c/a/b.csv", "format": "csv", "metrics": [{"op": "count"}]},
        {"input": "c1c/x.jsonl", "format": "jsonl", "group_by": ["a", "b"], "engine": "spark",
         "metrics": [{"op": "sum", "column": "v", "as": "total"}, {"op": "count", "column": "v"}],
         "null_values": ["-"]},
    ],
)  # fmt: skip
def test_spec_from_payload_matches_the_inline_parser(payload: dict[str, Any]) -> None:
    assert job.spec_from_payload(payload) == parse_aggregate_payload(payload)


def test_an_invalid_payload_fails_the_run_naming_its_problems() -> None:
    with pytest.raises(job.JobFailure) as info:
        job.spec_from_payload({"input": "c1c/x.csv", "format": "xml", "metrics": [{"op": "count"}]})
    assert info.value.kind == "payload"
    assert "payload.format: 'xml' is not one of csv, jsonl, parquet" in str(info.value)


def test_the_partials_each_metric_needs_are_the_engines() -> None:
    spec = parse_aggregate_payload(
        {"input": "c1c/x.csv", "format": "csv",
         "metrics": [{"op": "mean", "column": "a"}, {"op": "max", "column": "b"}, {"op": "count", "column": "c"}]}
    )  # fmt: skip
    names = [metric.name for metric in aggregate_partials.Partials.of(spec).derived.metrics]
    assert names == ["\x00rows", "\x00n0", "\x00sum0", "\x00n1", "\x00max1", "\x00n2"]


def test_engine_zip_is_importable_on_its_own(tmp_path: Path) -> None:
    dest = job.build_engine_zip(REPO_ROOT, tmp_path / "engine.zip")
    files = job.engine_files(REPO_ROOT)
    assert "shared/aggregation/engine.py" in files
    assert sorted(zipfile.ZipFile(dest).namelist()) == sorted(files)
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import shared.aggregation.engine as e; "
        "import shared.aggregation.result as r; assert r.__file__.startswith(sys.argv[1]); "
        "import shared.blobio.reader as b; assert b.__file__.startswith(sys.argv[1]); "
        "import spark_jobs.aggregate_partials as p; assert p.__file__.startswith(sys.argv[1]); "
        "import spark_jobs.aggregate_splits, spark_jobs.aggregate_storage, spark_jobs.aggregate_parquet; "
        "import shared.blobio.spans, shared.aggregation.parquet_path; "
        "assert e.__file__.startswith(sys.argv[1]); assert 'shared.storage.clients' not in sys.modules; print('ok')"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code, str(dest)], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.stdout.strip() == "ok", out.stderr


def test_the_scanner_in_the_engine_zip_is_found_by_the_driver(tmp_path: Path) -> None:
    dest = job.build_engine_zip(
        REPO_ROOT, tmp_path / "engine.zip", ("aggkernel.cpython-311-x.so", b"\x7fELF")
    )
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from spark_jobs.aggregate_native import in_engine; "
        "print(in_engine())"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code, str(dest)], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.stdout.strip() == "('aggkernel.cpython-311-x.so', b'\\x7fELF')", out.stderr
    bare = job.build_engine_zip(REPO_ROOT, tmp_path / "bare.zip")
    out = subprocess.run(
        [sys.executable, "-I", "-c", code, str(bare)], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.stdout.strip() == "None", out.stderr


def test_tiny_splits_equal_inline() -> None:
    data = "".join(datagen.csv_lines(300, seed=11)).encode()
    payload = {"input": "data/s.csv", "format": "csv", "group_by": ["region"], "metrics": SALES_METRICS}
    rows, input_rows = simulate(data, payload, 97)
    want = inline(data, payload)
    assert input_rows == want.input_rows
    assert_rows_equal(rows, want.rows)


def test_the_job_and_the_function_write_the_same_document() -> None:
    """One definition (shared.aggregation.result) for the PySpark job and the inline engine."""
    import pyarrow as pa

    from shared.aggregation.result import TAIL, result_blob, result_json
    from shared.jobs.offload.aggregate_spark import completed

    rows: list[dict[str, Any]] = [
        {"k": "é", "count": 2, "sum_v": 1.5},
        {"k": None, "count": 1, "sum_v": None},
    ]
    from_job = job.result_bytes("job-1", rows, 3, 0.1234)
    from_function = result_json("job-1", pa.Table.from_pylist(rows), 3, "spark", 0.1234)
    assert from_job == from_function and TAIL.search(from_job) is not None
    assert completed("results", "job-1", json.loads(from_job)).result_ref == "results/" + result_blob("job-1")


class MemoryResults:
    """The driver's results writer (`BlobResults` / `HadoopResults`) in memory, data streams too."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.writes: dict[str, list[int]] = {}

    def open_data(self, name: str, content_type: str) -> Any:
        results = self

        class Sink(io.BytesIO):
            def write(self, data: Any) -> int:
                results.writes.setdefault(name, []).append(memoryview(data).nbytes)
                return super().write(data)

            def close(self) -> None:  # pyarrow's CSV writer closes its sink: the commit keeps it
                pass

            def commit(self) -> int:
                results.blobs[name] = self.getvalue()
                return len(results.blobs[name])

        return Sink()


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_the_driver_writes_a_data_output_as_the_function_does(fmt: str) -> None:
    """The rows the driver finishes, written in batches, are the inline engine's table, and the
    document names the blob as the function's does (engine 'spark')."""
    import argparse

    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from shared.aggregation import aggregate_table
    from shared.aggregation.result import is_result_of
    from shared.jobs.offload.aggregate_spark import completed

    data = "".join(datagen.csv_lines(5_000, seed=13)).encode()
    payload = {
        "input": "data/s.csv",
        "format": "csv",
        "group_by": ["region", "product"],
        "metrics": SALES_METRICS,
        "output": {"format": fmt},
    }
    rows, input_rows = simulate(data, payload, 4001)
    results = MemoryResults()
    args = argparse.Namespace(job_id="job-9", version=2, results="results")
    doc = json.loads(
        job.data_result_bytes(results, args, job.spec_from_payload(payload), rows, input_rows, 0.0)
    )
    raw = results.blobs[f"job-9.v2.{fmt}"]
    assert is_result_of(doc, "job-9") and doc["engine"] == "spark" and doc["input_rows"] == input_rows
    assert doc["output"]["result_ref"] == f"results/job-9.v2.{fmt}" and doc["output"]["bytes"] == len(raw)
    table, _ = aggregate_table(io.BytesIO(data), parse_aggregate_payload(payload))
    assert doc["output"]["rows"] == table.num_rows
    if fmt == "parquet":
        got = pq.read_table(io.BytesIO(raw))
    else:
        types = {f.name: f.type for f in table.schema}
        options = pacsv.ConvertOptions(column_types=types, strings_can_be_null=True)
        got = pacsv.read_csv(io.BytesIO(raw), convert_options=options)
    assert got.schema == table.schema
    assert_rows_equal(got.to_pylist(), table.to_pylist())
    assert isinstance(got, pa.Table)
    summary = completed("results", "job-9", doc).summary
    assert summary["groups"] == table.num_rows
    assert summary["output"] == {"format": fmt, "result_ref": f"results/job-9.v2.{fmt}", "bytes": len(raw)}
