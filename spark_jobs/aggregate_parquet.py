"""The aggregate job's Parquet input (spark_jobs/aggregate_job.py): the same partial aggregates
as the inline engine's, from the same code (`shared.aggregation.parquet_path`).

- Blob SDK mode (the local cluster, Azurite): the driver reads the footer once and plans
  row-group splits (consecutive row groups, about `split_bytes` of needed column chunks each, at
  least one a core); each task reads its row groups' needed column chunks through the app's
  ranged reader (`SpanReader`, under the driver's ETag) and aggregates them with the inline engine.
- Hadoop mode (`--input-url`: a cluster with the storage connector): `spark.read.parquet`, only
  the needed columns, each partition's rows put back into Arrow tables and reduced by the
  engine's own `reduce_table`: keys and numbers typed as inline.

Either way each task gives a `TaskResult`, merged and finished as for CSV (`aggregate_partials`).
Shipped to the cluster in the engine zip (`JOB_MODULES`); imports the engine inside its functions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from spark_jobs.aggregate_partials import PREFIX, Partials, TaskResult


def plan_row_groups(sizes: Sequence[int], split_bytes: int, min_splits: int) -> list[list[int]]:
    """Consecutive row groups in splits of about `split_bytes` (their needed bytes, `sizes`), at
    least `min_splits` of them where there are that many row groups; [[]] when there are none."""
    if not sizes:
        return [[]]
    total = sum(sizes)
    count = min(len(sizes), max(min_splits, -(-total // max(1, split_bytes))))
    target = total / count
    splits: list[list[int]] = [[]]
    done = 0
    for index, size in enumerate(sizes):
        left = len(sizes) - index
        if splits[-1] and (done >= target * len(splits) or left <= count - len(splits)):
            splits.append([])
        splits[-1].append(index)
        done += size
    return splits


def run_row_groups(partials: Partials, index: int, source: Any, row_groups: Sequence[int]) -> TaskResult:
    """Aggregate some row groups of a Parquet input (`source`: a `SpanSource`) with the engine."""
    from shared.aggregation import aggregate_table
    from shared.core.errors import InputDataError

    result = TaskResult(index=index, lines=0)
    try:
        table, rows = aggregate_table(source, partials.derived, row_groups=row_groups)
    except InputDataError as exc:
        result.error = str(exc)
        return result
    result.input_rows = rows
    result.vectors = list(partials.vectors(table.to_pylist()))
    return result


def blob_tasks(sc: Any, access: Any, partials: Partials, split_bytes: int) -> Any:
    """An RDD of each row-group split's `TaskResult` (Blob SDK mode)."""
    from shared.aggregation.parquet_path import ParquetLayout, read_footer
    from shared.aggregation.plan import Plan
    from shared.blobio.spans import SpanReader

    spec = partials.spec
    container, blob = spec.container, spec.blob
    with SpanReader(access.ranges().ranges(container, blob)) as source:
        etag = source.etag
        metadata = read_footer(source)
        layout = ParquetLayout.of(metadata, Plan.of(partials.derived), source.size)
        sizes = [sum(length for _, length in layout.spans(i)) for i in range(metadata.num_row_groups)]
    splits = plan_row_groups(sizes, split_bytes, sc.defaultParallelism)

    def task(item: tuple[int, list[int]]) -> TaskResult:
        index, groups = item
        with SpanReader(access.ranges().ranges(container, blob), etag=etag) as reader:
            return run_row_groups(partials, index, reader, groups)

    return sc.parallelize(list(enumerate(splits)), len(splits)).map(task)


ROWS_PER_BATCH = 65_536
"""Spark rows turned into one Arrow table at a time (Hadoop mode)."""


def hadoop_tasks(spark: Any, url: str, partials: Partials) -> Any:
    """An RDD of each partition's `TaskResult` from `spark.read.parquet` (Hadoop mode).

    Each partition's rows are put back into Arrow tables typed by the frame's schema (pyspark's
    own mapping; timestamps in UTC) and reduced by the engine's `reduce_table`: the inline
    engine's keys and numbers. (`mapInArrow` would skip the Python rows, but needs pandas on the
    cluster.)"""
    from pyspark.sql.pandas.types import to_arrow_schema

    from shared.core.errors import InputDataError

    spec = partials.derived
    plan_columns = list(dict.fromkeys([*spec.group_by, *partials.columns]))
    frame = spark.read.parquet(url)
    missing = [c for c in plan_columns if c not in frame.columns]
    if missing:
        shown = ", ".join(frame.columns[:30]) + (", ..." if len(frame.columns) > 30 else "")
        listed = ", ".join(repr(c) for c in missing)
        raise InputDataError(f"column(s) {listed} not in the Parquet schema; the schema has: {shown}")
    quoted = [f"`{c.replace('`', '``')}`" for c in plan_columns or frame.columns[:1]]
    frame = frame.select(*quoted)
    schema = to_arrow_schema(frame.schema, timezone="UTC")

    def reduce(index: int, rows: Iterator[Any]) -> Iterator[TaskResult]:
        import itertools

        import pyarrow as pa

        from shared.aggregation.parquet_path import check_columns, reduce_table
        from shared.aggregation.plan import Accumulator, Plan

        result = TaskResult(index=index, lines=0)
        plan = Plan.of(spec)
        acc = Accumulator(plan)
        try:
            check_columns(schema, plan)
            while batch := list(itertools.islice(rows, ROWS_PER_BATCH)):
                columns = [pa.array([row[i] for row in batch], field.type) for i, field in enumerate(schema)]
                table = pa.Table.from_arrays(columns, schema=schema)
                acc.add_partial(reduce_table(table, plan, acc, "a Parquet batch"), table.num_rows)
        except InputDataError as exc:
            result.error = str(exc)
            yield result
            return
        out = acc.result_table(spec.metrics)
        result.input_rows = acc.input_rows
        result.vectors = list(partials.vectors(out.to_pylist()))
        yield result

    return frame.rdd.mapPartitionsWithIndex(reduce)


__all__ = ["PREFIX", "blob_tasks", "hadoop_tasks", "plan_row_groups", "run_row_groups"]
