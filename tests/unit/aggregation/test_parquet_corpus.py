"""The Parquet corpus (`tests/data/parquet_corpus/`: the same rows written by pyarrow, Polars,
DuckDB and Spark with their defaults and common options, by `python -m devstack.parquet_corpus
--tests`): every file's answers, by the C scanner and by the pyarrow path, are pyarrow's and
Polars' (keys and counts exact, floats within 1e-9)."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from devstack.parquet_corpus import TEST_ROWS, TESTS_DIR, VARIANTS
from shared.aggregation import aggregate_stream, parse_aggregate_payload
from shared.aggregation.native import kernel
from shared.aggregation.options import EngineOptions
from shared.aggregation.parquet_path import BytesSpans

FILES = sorted(TESTS_DIR.glob("*.parquet"))
QUERIES: dict[str, tuple[list[str], list[tuple[str, str | None]]]] = {
    "station": (
        ["station"],
        [
            ("count", None),
            ("mean", "temp"),
            ("sum", "precip"),
            ("max", "wind_speed"),
            ("sum", "humidity"),
            ("min", "level"),
            ("sum", "code"),
            ("count", "precip"),
        ],
    ),
    "decimal": (["station"], [("sum", "amount"), ("mean", "amount"), ("max", "level")]),
    "date": (["day"], [("count", None), ("sum", "temp"), ("min", "humidity")]),
    "two keys": (["kind", "code"], [("count", None), ("max", "precip"), ("mean", "level")]),
}
Answer = dict[tuple[Any, ...], tuple[Any, ...]]


def payload(query: str) -> dict[str, Any]:
    keys, metrics = QUERIES[query]
    return {
        "input": "data/x.parquet",
        "format": "parquet",
        "group_by": keys,
        "metrics": [{"op": op} if column is None else {"op": op, "column": column} for op, column in metrics],
    }


def engine(data: bytes, query: str, native: bool) -> tuple[int, Answer]:
    spec = parse_aggregate_payload(payload(query))
    result = aggregate_stream(BytesSpans(data), spec, options=EngineOptions(native=native))
    keys = QUERIES[query][0]
    return result.input_rows, {
        tuple(row[k] for k in keys): tuple(v for name, v in row.items() if name not in keys)
        for row in result.rows
    }


def from_table(table: pa.Table, query: str) -> Answer:
    """A peer's grouped table (keys, then one column per metric in order) as text keys -> figures."""
    keys, metrics = QUERIES[query]
    texts = [pc.cast(table[k], pa.string()).to_pylist() for k in keys]
    figures = [table[f"m{i}"].to_pylist() for i in range(len(metrics))]
    return {tuple(t[i] for t in texts): tuple(f[i] for f in figures) for i in range(table.num_rows)}


def pyarrow_answer(data: bytes, query: str) -> tuple[int, Answer]:
    table = pq.read_table(io.BytesIO(data))
    keys, metrics = QUERIES[query]
    columns = {k: table[k] for k in keys}
    aggs: list[Any] = []
    for i, (op, column) in enumerate(metrics):
        if column is None:
            aggs.append(([], "count_all"))
            continue
        columns[f"c{i}"] = table[column] if op == "count" else pc.cast(table[column], pa.float64())
        aggs.append((f"c{i}", op))
    grouped = pa.table(columns).group_by(keys, use_threads=False).aggregate(aggs)
    names = [f"c{i}_{op}" if column is not None else "count_all" for i, (op, column) in enumerate(metrics)]
    grouped = grouped.select(keys + names).rename_columns(keys + [f"m{i}" for i in range(len(metrics))])
    return table.num_rows, from_table(grouped, query)


def polars_answer(path: Path, query: str) -> Answer:
    pl = pytest.importorskip("polars")
    keys, metrics = QUERIES[query]
    exprs = []
    for i, (op, column) in enumerate(metrics):
        if column is None:
            exprs.append(pl.len().alias(f"m{i}"))
        elif op == "count":
            exprs.append(pl.col(column).count().alias(f"m{i}"))
        else:
            value = getattr(pl.col(column).cast(pl.Float64), op)()
            if op == "sum":  # Polars' sum of no value is 0, SQL's (the engine's) null
                value = pl.when(pl.col(column).count() > 0).then(value)
            exprs.append(value.alias(f"m{i}"))
    grouped = pl.scan_parquet(path).group_by(keys).agg(exprs).collect().to_arrow()
    for k in keys:  # Polars' strings are large and views: as pyarrow's
        grouped = grouped.set_column(grouped.schema.get_field_index(k), k, pc.cast(grouped[k], pa.string()))
    return from_table(grouped, query)


def assert_same(got: Answer, want: Answer, where: str) -> None:
    assert got.keys() == want.keys(), where
    for key, figures in want.items():
        for a, b in zip(got[key], figures, strict=True):
            if isinstance(b, float) and isinstance(a, float):
                assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), (where, key, a, b)
            elif isinstance(b, (int, float)) and a is not None:
                assert math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9), (where, key, a, b)
            else:
                assert a == b, (where, key, a, b)


def test_the_corpus_holds_every_variant_of_every_writer() -> None:
    assert {path.stem for path in FILES} == {variant.stem for variant in VARIANTS}
    writers = {pq.read_metadata(path).created_by.split()[0] for path in FILES}
    assert writers == {"parquet-cpp-arrow", "Polars", "DuckDB", "parquet-mr"}
    assert sum(path.stat().st_size for path in FILES) < 1_000_000  # tiny: the tests stay fast


@pytest.mark.parametrize("native", [True, False] if kernel is not None else [False])
@pytest.mark.parametrize("path", FILES, ids=[path.stem for path in FILES])
def test_every_corpus_file_answers_as_pyarrow_does(path: Path, native: bool) -> None:
    data = path.read_bytes()
    for query in QUERIES:
        rows, got = engine(data, query, native)
        want_rows, want = pyarrow_answer(data, query)
        assert rows == want_rows == TEST_ROWS
        assert_same(got, want, f"{path.stem} {query}")


@pytest.mark.parametrize("path", FILES, ids=[path.stem for path in FILES])
def test_every_corpus_file_answers_as_polars_does(path: Path) -> None:
    data = path.read_bytes()
    for query in QUERIES:
        _rows, got = engine(data, query, native=kernel is not None)
        assert_same(got, polars_answer(path, query), f"{path.stem} {query}")
