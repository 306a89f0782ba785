"""The engine's public functions: a streaming group-by over a CSV or JSON-lines byte stream, or
a Parquet file read by spans (`shared.aggregation.parquet_path`)."""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Sequence
from dataclasses import replace
from typing import Any, Protocol, cast

import pyarrow as pa

from shared.aggregation.csv_path import csv_partials
from shared.aggregation.jsonl_path import jsonl_partials
from shared.aggregation.native import NativeArgs
from shared.aggregation.options import DEFAULT_OPTIONS, JSONL_BLOCK_SIZE, EngineOptions
from shared.aggregation.parquet_path import SpanSource, as_source, parquet_partials
from shared.aggregation.plan import Accumulator, Plan
from shared.aggregation.spec import AggregateResult, AggregateSpec, ByteStream
from shared.aggregation.spill import DEFAULT_LIMITS, ResultRows, SpillingAccumulator, SpillLimits


def aggregate_stream(
    stream: ByteStream | SpanSource,
    spec: AggregateSpec,
    *,
    max_groups: int | None = None,
    options: EngineOptions = DEFAULT_OPTIONS,
) -> AggregateResult:
    """Group-by aggregate of a CSV / JSON-lines byte stream, in bounded memory.

    SQL semantics: `count` without a column counts rows, with one its non-null values; sum,
    mean, min and max skip nulls (null when a group has no value; mean = sum / count).
    Values in `spec.null_values` are null. Group keys are strings as written; a null key is
    its own group, sorted first. A non-number in a numeric metric's column, or a missing
    column, raises InputDataError naming the column (and the value and line).

    More than `max_groups` distinct groups (None: no limit) raises TooManyGroups as soon as the
    partial aggregates show it, so memory stays bounded by the limit, not by the input.
    `options`: the tuning (block size, parse threads, record limit, the C scanner or not).
    """
    table, input_rows = aggregate_table(stream, spec, max_groups=max_groups, options=options)
    rows: list[dict[str, Any]] = table.to_pylist()
    return AggregateResult(rows=rows, input_rows=input_rows)


def aggregate_table(
    stream: ByteStream | SpanSource,
    spec: AggregateSpec,
    *,
    max_groups: int | None = None,
    options: EngineOptions = DEFAULT_OPTIONS,
    row_groups: Sequence[int] | None = None,
) -> tuple[pa.Table, int]:
    """`aggregate_stream`'s result as an Arrow table (its rows' columns, in order), and the number
    of input rows: what the handler serialises a batch at a time (see `result_json`).

    Parquet (`spec.format`): `stream` is a `SpanSource` (the blob reader's `SpanReader`) or a
    seekable stream; only the footer and the needed column chunks are read (of `row_groups`
    only, when given: a Spark task's share)."""
    plan = Plan.of(spec)
    acc = Accumulator(plan, max_groups, options.combine_rows)
    _feed(acc, stream, spec, plan, options, row_groups)
    return acc.result_table(spec.metrics), acc.input_rows


def aggregate_rows(
    stream: ByteStream | SpanSource,
    spec: AggregateSpec,
    *,
    max_groups: int | None = None,
    options: EngineOptions = DEFAULT_OPTIONS,
    limits: SpillLimits = DEFAULT_LIMITS,
) -> ResultRows:
    """`aggregate_table`'s rows for a result written as data: past `limits.spill_rows` groups
    they go to sorted runs on local disk, merged a key range at a time, and are read back a
    batch at a time (`shared.aggregation.spill`), so memory stays bounded whatever the groups.
    Close the answer to remove its files."""
    plan = Plan.of(spec)
    acc = SpillingAccumulator(plan, max_groups, options.combine_rows, limits)
    try:
        _feed(acc, stream, spec, plan, replace(options, fit_blocks=True))
        return acc.finish(spec.metrics)
    finally:
        acc.close()


class _Partials(Protocol):
    def add_partial(self, partial: pa.Table, input_rows: int) -> None: ...


def _feed(
    acc: _Partials,
    stream: ByteStream | SpanSource,
    spec: AggregateSpec,
    plan: Plan,
    options: EngineOptions,
    row_groups: Sequence[int] | None = None,
) -> None:
    """Every block's partial aggregates (`plan`'s, of `spec`) handed to `acc`, in input order."""
    partials: Generator[tuple[pa.Table, int], None, None]
    if spec.format == "parquet":
        partials = parquet_partials(as_source(stream), plan, row_groups=row_groups, native=options.native)
    elif spec.format == "csv":
        partials = csv_partials(_stream(stream), plan, spec.null_values, options)
    else:
        block_size = options.block_size
        scanner = NativeArgs.jsonl(plan, spec.null_values, options.native)
        jsonl_block = block_size if scanner else min(block_size, JSONL_BLOCK_SIZE)
        partials = jsonl_partials(_stream(stream), plan, spec.null_values, options, jsonl_block)
    with contextlib.closing(partials):
        for partial, rows in partials:
            acc.add_partial(partial, rows)


def _stream(stream: ByteStream | SpanSource) -> ByteStream:
    """CSV and JSON lines are read from a byte stream (the handler opens one for them)."""
    return cast(ByteStream, stream)
