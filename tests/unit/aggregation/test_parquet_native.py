"""Parquet row groups decoded and folded by the C scanner (`parquet_native`) against pyarrow's
decode and Arrow's group-by: the same answers over files written every way pyarrow writes them,
the shapes it does not take left to pyarrow, and malformed pages never read past."""

from __future__ import annotations

import io
import math
import random
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shared.aggregation import aggregate_table, parse_aggregate_payload
from shared.aggregation import parquet_native as native_module
from shared.aggregation.native import kernel
from shared.aggregation.options import EngineOptions
from shared.aggregation.parquet_native import native_partial, native_plan
from shared.aggregation.parquet_path import BytesSpans, ParquetLayout, read_footer
from shared.aggregation.plan import Plan
from shared.core.errors import InputDataError

pytestmark = pytest.mark.skipif(kernel is None, reason="the C scanner is not built here")

METRICS = [
    {"op": "count"},
    {"op": "mean", "column": "t"},
    {"op": "sum", "column": "p"},
    {"op": "min", "column": "i"},
    {"op": "max", "column": "w"},
    {"op": "count", "column": "t"},
    {"op": "sum", "column": "s"},
    {"op": "max", "column": "s"},
]
TYPES = {"t": pa.float64(), "p": pa.float64(), "i": pa.int64(), "w": pa.float32(), "s": pa.int32()}


def spec_of(metrics: list[dict[str, Any]] = METRICS, key: str = "k") -> Any:
    payload = {"input": "data/x.parquet", "format": "parquet", "group_by": [key], "metrics": metrics}
    return parse_aggregate_payload(payload)


def table_of(rnd: random.Random, rows: int, texts: int, key_nulls: float, value_nulls: float) -> pa.Table:
    names = [f"station-{i:04d}" for i in range(texts)]
    keys = [None if rnd.random() < key_nulls else rnd.choice(names) for _ in range(rows)]
    columns: dict[str, Any] = {"k": pa.array(keys, pa.string())}
    for name, kind in TYPES.items():
        if pa.types.is_floating(kind):
            pool = [round(rnd.uniform(-50, 50), 1) for _ in range(rnd.choice([5, 300, 5000]))]
        else:
            pool = [rnd.randint(-1000, 1000) for _ in range(rnd.choice([5, 300]))]
        columns[name] = pa.array(
            [None if rnd.random() < value_nulls else rnd.choice(pool) for _ in range(rows)], kind
        )
    return pa.table(columns)


def written(table: pa.Table, **options: Any) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, **options)
    return sink.getvalue()


def answer(data: bytes, native: bool, metrics: list[dict[str, Any]] = METRICS) -> list[dict[str, Any]]:
    table, _rows = aggregate_table(BytesSpans(data), spec_of(metrics), options=EngineOptions(native=native))
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def assert_same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert [row["k"] for row in got] == [row["k"] for row in want]
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for name, value in b.items():
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(a[name]), (a["k"], name)
            elif isinstance(value, float):
                assert math.isclose(a[name], value, rel_tol=1e-12, abs_tol=1e-9), (a["k"], name)
            else:
                assert a[name] == value, (a["k"], name)


class Taken:
    """Counts the row groups the scanner answered and those it left to pyarrow."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.native = self.left = 0
        real = native_module.native_partial

        def counted(*args: Any) -> Any:
            out = real(*args)
            if out is None:
                self.left += 1
            else:
                self.native += 1
            return out

        monkeypatch.setattr("shared.aggregation.parquet_path.native_partial", counted)


def options_of(rnd: random.Random) -> dict[str, Any]:
    return {
        "compression": rnd.choice(["snappy", "zstd", "gzip", "none", "brotli", "lz4"]),
        "data_page_version": rnd.choice(["1.0", "2.0"]),
        "data_page_size": rnd.choice([256, 4096, 1 << 20]),
        "row_group_size": rnd.choice([100, 1000, 100_000]),
        "write_statistics": rnd.choice([True, False]),
        "use_dictionary": rnd.choice([True, True, ["k"], ["k", "t", "i"]]),
        "dictionary_pagesize_limit": rnd.choice([1 << 20, 1 << 20, 200]),  # small: values fall back to PLAIN
    }


@pytest.mark.parametrize("seed", range(24))
def test_the_scanners_answers_are_pyarrows_and_arrows(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rnd = random.Random(seed)
    table = table_of(
        rnd,
        rnd.choice([1, 9, 700, 6000]),
        rnd.choice([1, 3, 40, 900]),
        rnd.choice([0, 0, 0.1, 1]),
        rnd.choice([0, 0.05, 0.6, 1]),
    )
    options = options_of(rnd)
    data = written(table, **options)
    want = answer(data, native=False)
    taken = Taken(monkeypatch)
    assert_same(answer(data, native=True), want)
    if options["compression"] != "lz4" and options["dictionary_pagesize_limit"] > 1000:
        assert taken.native > 0 and taken.left == 0, (options, taken.native, taken.left)


def test_required_columns_and_every_number_type(monkeypatch: pytest.MonkeyPatch) -> None:
    rnd = random.Random(7)
    kinds = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.float32(), pa.float64()]
    fields = [pa.field("k", pa.string(), nullable=False)] + [
        pa.field(f"c{j}", kind, nullable=False) for j, kind in enumerate(kinds)
    ]
    rows = 3000
    columns = [pa.array([f"g{rnd.randint(0, 30)}" for _ in range(rows)], pa.string())]
    for kind in kinds:
        columns.append(pa.array([rnd.randint(-100, 100) for _ in range(rows)], kind))
    data = written(pa.Table.from_arrays(columns, schema=pa.schema(fields)), row_group_size=1000)
    metrics = [
        {"op": op, "column": f"c{j}"} for j in range(len(kinds)) for op in ("sum", "min", "max", "mean")
    ]
    taken = Taken(monkeypatch)
    assert_same(answer(data, True, metrics), answer(data, False, metrics))
    assert (taken.native, taken.left) == (3, 0)


def plan_and_layout(
    data: bytes, metrics: list[dict[str, Any]] = METRICS, key: str = "k"
) -> tuple[Plan, ParquetLayout, BytesSpans]:
    source = BytesSpans(data)
    plan = Plan.of(spec_of(metrics, key))
    return plan, ParquetLayout.of(read_footer(source), plan, source.size), source


def test_shapes_it_does_not_take_are_left_to_pyarrow() -> None:
    table = pa.table(
        {
            "k": ["a", "b", "a"],
            "n": pa.array([1, 2, 3], pa.int64()),
            "u": pa.array([1, 2, 3], pa.uint32()),
            "d": pa.array([1, 2, 3], pa.decimal128(5, 2)),
            "note": ["x", None, "y"],
        }
    )
    data = written(table)

    def planned(metrics: list[dict[str, Any]], key: str = "k") -> Any:
        plan, layout, _ = plan_and_layout(data, metrics, key)
        return native_plan(layout.metadata, layout.schema, layout.leaves, plan)

    assert planned([{"op": "sum", "column": "n"}]) is not None
    assert planned([{"op": "sum", "column": "n"}], key="n") is None  # an integer key
    assert planned([{"op": "sum", "column": "u"}]) is None  # unsigned
    assert planned([{"op": "sum", "column": "d"}]) is None  # decimal
    assert planned([{"op": "count", "column": "note"}]) is None  # a column only counted
    assert planned([{"op": "count"}]) is None  # no value column: the footer counts


def test_a_large_string_key_as_polars_writes_it_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    rnd = random.Random(3)
    table = table_of(rnd, 5000, 40, 0.1, 0.1)
    table = table.set_column(0, "k", table["k"].cast(pa.large_string()))
    data = written(table, row_group_size=1000)
    taken = Taken(monkeypatch)
    assert_same(answer(data, True), answer(data, False))
    assert (taken.native, taken.left) == (5, 0)


def test_a_nan_a_key_page_in_plain_and_an_unknown_codec_go_to_pyarrow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = 2000
    plain = pa.table(
        {
            "k": [f"key-{i}" for i in range(rows)],
            "t": [float(i) for i in range(rows)],
            "p": [1.0] * rows,
            "i": [1] * rows,
            "w": pa.array([1.0] * rows, pa.float32()),
            "s": pa.array([1] * rows, pa.int32()),
        }
    )
    nan = plain.set_column(1, "t", pa.array([math.nan] + [1.0] * (rows - 1)))
    for data in (
        written(nan),
        written(plain, dictionary_pagesize_limit=64),  # the key falls back to PLAIN
        written(plain, compression="lz4"),  # Hadoop's LZ4 framing
    ):
        taken = Taken(monkeypatch)
        assert_same(answer(data, True), answer(data, False))
        assert taken.native == 0 and taken.left == 1


def pages(data: bytes, column: int = 0) -> Iterator[tuple[int, int]]:
    meta = pq.read_metadata(io.BytesIO(data)).row_group(0).column(column)
    start = meta.dictionary_page_offset if meta.has_dictionary_page else meta.data_page_offset
    yield start, meta.total_compressed_size


@pytest.mark.parametrize("seed", range(40))
def test_malformed_pages_are_never_read_past(seed: int) -> None:
    """Bytes of the column chunks changed at random: the scanner answers or leaves the row group
    to pyarrow, which answers or says the file is corrupt (under ASan in `make fuzz`)."""
    rnd = random.Random(seed)
    table = table_of(rnd, 3000, 50, 0.1, 0.1)
    data = bytearray(
        written(table, compression=rnd.choice(["none", "snappy"]), data_page_size=2048, row_group_size=3000)
    )
    meta = pq.read_metadata(io.BytesIO(bytes(data))).row_group(0)
    for _ in range(rnd.choice([1, 4, 30])):
        column = meta.column(rnd.randrange(meta.num_columns))
        start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
        at = start + rnd.randrange(column.total_compressed_size)
        data[at] = rnd.randrange(256)
    plan, layout, source = plan_and_layout(bytes(data))
    fast = native_plan(layout.metadata, layout.schema, layout.leaves, plan)
    assert fast is not None
    partial = native_partial(source.read(layout.spans(0)), layout.metadata, 0, plan, fast)
    assert partial is None or partial.num_rows <= 51
    try:
        answer(bytes(data), True)
    except InputDataError as exc:
        assert "Parquet" in str(exc)


def test_a_truncated_chunk_buffer_is_refused_not_read() -> None:
    assert kernel is not None
    assert kernel.pq_pages(b"\x15\x00", 1) is None  # a header cut short
    assert kernel.pq_byte_arrays(b"\x05\x00\x00\x00ab", 1) is None  # a length past the page
    ids = bytearray(4 * 8)
    counts = bytearray(8 * 3)
    assert kernel.pq_key_page(None, b"\x02\x03", 8, 2, ids, 0, counts) == -1  # 8 values asked, none there
    slots = bytearray(32 * 3)
    assert (
        kernel.pq_fold_page(None, b"\x00" * 12, 2, 0, 0, None, ids, 0, slots, 1) == -1
    )  # 2 doubles in 12 bytes
    with pytest.raises(ValueError):
        kernel.pq_fold_page(None, b"", 9, 0, 0, None, ids, 0, slots, 1)  # past the ids
