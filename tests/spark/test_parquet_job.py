"""The Spark job's Parquet input: row-group splits in-process (no cluster), `spark.read.parquet`
on a local Spark session, and the differential test on the real cluster reading Azurite: a
Parquet job on Spark gives the inline engine's rows, and a truncated file fails as bad input
with the same reason.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from devstack import parquetgen
from devstack.azurite import Azurite
from devstack.spark_cluster import SparkCluster
from shared.aggregation import aggregate_stream, parse_aggregate_payload
from shared.aggregation.parquet_path import BytesSpans
from shared.core.errors import InputDataError
from shared.jobs.base import Completed
from shared.jobs.offload.aggregate_spark import offload
from spark_jobs import aggregate_job as job
from spark_jobs import aggregate_parquet, aggregate_partials
from tests.spark.helpers import assert_rows_equal, follow, make_ctx, settings_for, storage_for, upload

METRICS = [
    {"op": "count"},
    {"op": "sum", "column": "precip"},
    {"op": "mean", "column": "temp"},
    {"op": "min", "column": "humidity"},
    {"op": "max", "column": "wind_speed"},
    {"op": "count", "column": "note"},
]


def weather(tmp: Path, rows: int = 30_000, row_group: int = 4_000) -> bytes:
    return parquetgen.write(
        tmp / f"w-{rows}-{row_group}.parquet", rows=rows, row_group=row_group
    ).read_bytes()


def payload(group_by: list[str], name: str = "data/w.parquet") -> dict[str, Any]:
    return {"input": name, "format": "parquet", "group_by": group_by, "metrics": METRICS, "engine": "spark"}


def inline(data: bytes, body: dict[str, Any]) -> Any:
    return aggregate_stream(io.BytesIO(data), parse_aggregate_payload(body))


def simulate(data: bytes, body: dict[str, Any], split_bytes: int, min_splits: int) -> tuple[list[Any], int]:
    """The job's Blob SDK pipeline minus Spark: plan row-group splits, run each, merge, finish."""
    spec = job.spec_from_payload(body)
    partials = aggregate_partials.Partials.of(spec)
    meta = pq.read_metadata(io.BytesIO(data))
    sizes = [meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)]
    splits = aggregate_parquet.plan_row_groups(sizes, split_bytes, min_splits)
    results = [
        aggregate_parquet.run_row_groups(partials, i, BytesSpans(data), g) for i, g in enumerate(splits)
    ]
    return driver(partials, results)


def driver(partials: aggregate_partials.Partials, results: list[Any]) -> tuple[list[Any], int]:
    """What the job's driver does with the tasks' results: the first error, or merged rows."""
    metas = sorted(job.task_meta(r) for r in results)
    try:
        job.raise_first_error(metas, 0, "parquet")
    except job.JobFailure as exc:
        raise InputDataError(str(exc)) from None
    merged: dict[Any, Any] = {}
    for r in results:
        for key, vec in r.vectors:
            merged[key] = aggregate_partials.merge(merged[key], vec) if key in merged else vec
    return partials.finish(merged.items()), sum(m[4] for m in metas)


def test_row_group_splits_cover_every_row_group_once_in_order() -> None:
    assert aggregate_parquet.plan_row_groups([], 10, 4) == [[]]
    assert aggregate_parquet.plan_row_groups([5], 10, 4) == [[0]]
    assert aggregate_parquet.plan_row_groups([10] * 8, 25, 1) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert aggregate_parquet.plan_row_groups([10] * 8, 1000, 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    for sizes, split, least in (([1, 100, 1, 1, 50], 40, 2), ([7] * 13, 20, 4), ([3, 3], 1, 8)):
        splits = aggregate_parquet.plan_row_groups(sizes, split, least)
        assert [i for s in splits for i in s] == list(range(len(sizes)))
        assert all(splits) and len(splits) >= min(least, len(sizes))


@pytest.mark.parametrize(
    ("group_by", "split_bytes", "least"), [(["station"], 1, 1), (["kind", "humidity"], 10**6, 3)]
)
def test_row_group_splits_equal_inline(
    tmp_path: Path, group_by: list[str], split_bytes: int, least: int
) -> None:
    data = weather(tmp_path)
    rows, input_rows = simulate(data, payload(group_by), split_bytes, least)
    want = inline(data, payload(group_by))
    assert input_rows == want.input_rows == 30_000
    assert_rows_equal(rows, want.rows)


def test_a_corrupt_row_group_fails_the_run_with_the_inline_reason(tmp_path: Path) -> None:
    data = bytearray(weather(tmp_path, rows=12_000))
    chunk = pq.read_metadata(io.BytesIO(bytes(data))).row_group(2).column(7)  # wind_speed
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    data[start + 8 : start + chunk.total_compressed_size] = b"\x5a" * (chunk.total_compressed_size - 8)
    body = payload(["station"])
    with pytest.raises(InputDataError) as want:
        inline(bytes(data), body)
    with pytest.raises(InputDataError) as got:
        simulate(bytes(data), body, 1, 2)
    assert str(got.value) == str(want.value)
    assert str(got.value).startswith("row group 2 of the Parquet input cannot be decoded")


@pytest.mark.spark
@pytest.mark.integration
def test_spark_read_parquet_equals_inline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hadoop mode (`--input-url`, a cluster with the storage connector): `spark.read.parquet`
    on a local session, the engine's reduction on each partition's Arrow batches."""
    from pyspark.sql import SparkSession

    repo = str(Path(job.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", repo)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    data = weather(tmp_path, rows=20_000, row_group=3_000)
    path = tmp_path / "input.parquet"
    path.write_bytes(data)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.files.maxPartitionBytes", "64k")  # a partition a row group or so
        .getOrCreate()
    )
    try:
        for group_by in (["station_id"], []):
            body = payload(group_by)
            partials = aggregate_partials.Partials.of(job.spec_from_payload(body))
            tasks = aggregate_parquet.hadoop_tasks(spark, path.as_uri(), partials).collect()
            assert len(tasks) > 1
            rows, input_rows = driver(partials, tasks)
            want = inline(data, body)
            assert input_rows == want.input_rows == 20_000
            assert_rows_equal(rows, want.rows)
        for metrics, error in (
            ([{"op": "sum", "column": "nope"}], r"column\(s\) 'nope' not in the Parquet schema"),
            ([{"op": "sum", "column": "note"}], r"column 'note' is of Parquet type string, not a number"),
        ):
            bad = payload(["station"]) | {"metrics": metrics}
            with pytest.raises(InputDataError, match=error):
                inline(data, bad)
            partials = aggregate_partials.Partials.of(job.spec_from_payload(bad))
            with pytest.raises(InputDataError, match=error):
                driver(partials, aggregate_parquet.hadoop_tasks(spark, path.as_uri(), partials).collect())
    finally:
        spark.stop()


@pytest.mark.spark
@pytest.mark.integration
def test_parquet_on_the_cluster_equals_inline_and_a_truncated_file_is_bad_input(
    azurite: Azurite, spark_cluster: SparkCluster, tmp_path: Path
) -> None:
    settings = settings_for(azurite, spark_cluster.env(), SPARK_SPLIT_MB="0.05", SPARK_MAX_SUBMISSIONS="2")
    storage = storage_for(settings)
    data = weather(tmp_path, rows=40_000, row_group=5_000)
    body = payload(["station_id", "kind"], upload(storage, "inputs", "weather.parquet", data))
    ctx = make_ctx(settings, storage, body)
    done, _ = follow(ctx, offload(ctx), ctx_backend(settings))
    assert isinstance(done, Completed) and done.summary["engine"] == "spark"
    blob = storage.blob.get_blob_client(settings.results_container, f"{ctx.job_id}.json")
    doc = json.loads(blob.download_blob().readall())
    want = inline(data, body)
    assert doc["input_rows"] == 40_000
    assert_rows_equal(doc["rows"], want.rows)

    cut = data[: len(data) - 100]
    bad = payload(["station"], upload(storage, "inputs", "cut.parquet", cut))
    ctx = make_ctx(settings, storage, bad)
    with pytest.raises(InputDataError) as info:
        follow(ctx, offload(ctx), ctx_backend(settings))
    assert "magic bytes 'PAR1': it is truncated" in str(info.value)
    with pytest.raises(InputDataError, match="magic bytes 'PAR1'"):
        inline(cut, bad)


def ctx_backend(settings: Any) -> Any:
    from shared.spark.backends import make_backend

    return make_backend(settings.spark)


def test_parquetgen_is_deterministic(tmp_path: Path) -> None:
    a = parquetgen.write(tmp_path / "a.parquet", rows=3000, row_group=1000)
    b = parquetgen.write(tmp_path / "b.parquet", rows=3000, row_group=1000)
    assert pq.read_table(a).equals(pq.read_table(b))
    assert pq.read_metadata(a).num_row_groups == 3
    assert pa.types.is_string(pq.read_schema(a).field("station").type)
