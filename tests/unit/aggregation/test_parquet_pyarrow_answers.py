"""Every Parquet answer is pyarrow's `read_table` (then a group-by), or bad input naming the row
group where pyarrow refuses the file: each file built here, by code, as the case needs it
(`tests.parquet_craft`), and answered by the C scanner and by the pyarrow path alike."""

from __future__ import annotations

import copy
import io
import math
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shared.aggregation import aggregate_stream, parse_aggregate_payload
from shared.aggregation.native import kernel
from shared.aggregation.options import EngineOptions
from shared.aggregation.parquet_path import BytesSpans
from shared.core.errors import InputDataError
from tests.parquet_craft import DATA_PAGE, DATA_PAGE_V2, DICTIONARY_PAGE, I32, I64, Crafted, written

METRICS = [{"op": "count"}, {"op": "sum", "column": "v"}, {"op": "max", "column": "v"}]
TABLE = pa.table({"k": ["a", None, "b", None, "a"], "v": [1.0, 2.0, 3.0, 4.0, 5.0]})
PATHS = [True, False] if kernel is not None else [False]
"""The C scanner (where it is built) and the pyarrow path."""


def engine(data: bytes, native: bool) -> tuple[int, list[tuple[Any, ...]]] | str:
    spec = parse_aggregate_payload(
        {"input": "data/x.parquet", "format": "parquet", "group_by": ["k"], "metrics": METRICS}
    )
    try:
        result = aggregate_stream(BytesSpans(data), spec, options=EngineOptions(native=native))
    except InputDataError as exc:
        return f"refused: {exc}"
    return result.input_rows, [(r["k"], r["count"], r["sum_v"], r["max_v"]) for r in result.rows]


def pyarrow_answer(data: bytes) -> tuple[int, list[tuple[Any, ...]]] | str:
    """pyarrow's read_table, grouped in one thread (one sum over the rows in order)."""
    try:
        table = pq.read_table(io.BytesIO(data))
    except (OSError, pa.ArrowException) as exc:
        return f"pyarrow refuses: {exc}"
    grouped = table.group_by("k", use_threads=False).aggregate(
        [([], "count_all"), ("v", "sum"), ("v", "max")]
    )
    rows = sorted(
        (
            (
                None if k is None else str(k),
                n,
                None if s is None else float(s),
                None if m is None else float(m),
            )
            for k, n, s, m in zip(
                *(grouped[c].to_pylist() for c in ("k", "count_all", "v_sum", "v_max")), strict=True
            )
        ),
        key=lambda row: (row[0] is not None, row[0] or ""),
    )
    return table.num_rows, rows


def same(got: Any, want: Any) -> bool:
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    if isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(same(a, b) for a, b in zip(got, want, strict=True))
    return bool(got == want)


def assert_pyarrows(data: bytes, native: bool) -> None:
    """The engine answers as pyarrow does, or refuses where pyarrow does, naming the row group."""
    want, got = pyarrow_answer(data), engine(data, native)
    if isinstance(want, str):
        assert isinstance(got, str) and "row group 0 of the Parquet input" in got, (want, got)
    else:
        assert same(got, want), (got, want)


def crafted(table: pa.Table, change: Callable[[Crafted], None], **options: Any) -> bytes:
    file = Crafted.of(written(table, **options))
    change(file)
    return file.build()


def pages_of(file: Crafted, column: int, kind: int) -> list[Any]:
    return [page for page in file.chunks[0][column] if page.kind == kind]


@pytest.mark.parametrize("native", PATHS)
def test_a_v2_page_saying_no_nulls_whose_levels_hold_nulls_is_read_by_its_levels(native: bool) -> None:
    def no_nulls(file: Crafted) -> None:
        for page in pages_of(file, 0, DATA_PAGE_V2):
            page.sub[2] = (I32, 0)

    data = crafted(TABLE, no_nulls, data_page_version="2.0", compression="none")
    assert engine(data, native) == (5, [(None, 2, 6.0, 4.0), ("a", 2, 6.0, 5.0), ("b", 1, 3.0, 3.0)])
    assert_pyarrows(data, native)


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize("dictionary", [False, True])
@pytest.mark.parametrize(("kind", "narrowed"), [(pa.int16(), 4464), (pa.int8(), 112)])
def test_an_int8_or_int16_value_out_of_its_range_is_narrowed_as_pyarrow_narrows_it(
    native: bool, dictionary: bool, kind: pa.DataType, narrowed: int
) -> None:
    table = pa.table({"k": ["a", "b", "a"], "v": pa.array([99, 2, 3], kind)})

    def out_of_range(file: Crafted) -> None:
        for page in file.chunks[0][1]:
            page.body = page.body.replace((99).to_bytes(4, "little"), (70000).to_bytes(4, "little"))

    data = crafted(table, out_of_range, use_dictionary=True if dictionary else ["k"], compression="none")
    assert engine(data, native) == (
        3,
        [("a", 2, narrowed + 3.0, float(max(narrowed, 3))), ("b", 1, 2.0, 2.0)],
    )
    assert_pyarrows(data, native)


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize("codec", ["snappy", "gzip", "brotli", "zstd", "lz4", "none"])
@pytest.mark.parametrize("kind", [DATA_PAGE, DICTIONARY_PAGE])
def test_a_page_claiming_more_bytes_than_it_decompresses_to_is_refused(
    native: bool, codec: str, kind: int
) -> None:
    for column in (0, 1):

        def larger(file: Crafted, column: int = column) -> None:
            for page in pages_of(file, column, kind):
                page.header[2] = (I32, page.header[2][1] + 16)

        data = crafted(TABLE, larger, compression=codec)
        if codec != "none":  # uncompressed, the size pyarrow reads is the compressed one
            assert "row group 0" in str(engine(data, native))
        assert_pyarrows(data, native)


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize("column", [0, 1])
def test_a_second_dictionary_page_is_refused(native: bool, column: int) -> None:
    def doubled(file: Crafted) -> None:
        file.chunks[0][column].insert(1, copy.deepcopy(file.chunks[0][column][0]))

    data = crafted(TABLE, doubled, compression="none")
    assert "more than one dictionary" in str(engine(data, native))
    assert_pyarrows(data, native)


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize(
    ("version", "field", "value"),
    [
        ("1.0", 2, lambda v: v + 2**32),  # uncompressed size past i32: its low 32 bits
        ("1.0", 3, lambda v: v + 2**32),  # compressed size
        ("1.0", 2, lambda v: -1),
        ("2.0", 2, lambda v: v + 2**32),
        ("2.0", -2, lambda v: 2**32 - 1),  # num_nulls
        ("2.0", -2, lambda v: -5),
        ("2.0", -5, lambda v: v + 2**32),  # definition levels' length
        ("2.0", -1, lambda v: v + 2**32),  # num_values
    ],
)
def test_i32_header_fields_are_read_as_pyarrow_reads_them(
    native: bool, version: str, field: int, value: Callable[[int], int]
) -> None:
    """A field past i32's range is its low 32 bits to pyarrow (Thrift's reader), a negative size
    is refused; the scanner takes them alike or leaves the row group to pyarrow."""
    kind = DATA_PAGE if version == "1.0" else DATA_PAGE_V2

    def changed(file: Crafted) -> None:
        for column in (0, 1):
            for page in pages_of(file, column, kind):
                fields = page.header if field > 0 else page.sub
                fields[abs(field)] = (I32, value(fields[abs(field)][1]))

    assert_pyarrows(crafted(TABLE, changed, data_page_version=version, compression="none"), native)


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize("physical", [1, 2, 4, 6])  # INT32, INT64, FLOAT, BYTE_ARRAY for a DOUBLE
def test_a_footer_column_type_other_than_the_schemas_is_refused(native: bool, physical: int) -> None:
    def retyped(file: Crafted) -> None:
        file.meta(0, 1)[1] = (I32, physical)

    data = crafted(TABLE, retyped, compression="none")
    assert "does not match" in str(engine(data, native))
    assert_pyarrows(data, native)


def levels_page(file: Crafted, levels: bytes) -> None:
    """The key column's v2 page given these definition levels."""
    (page,) = pages_of(file, 0, DATA_PAGE_V2)
    old = page.sub[5][1]
    page.body = levels + page.body[old:]
    page.sub[5] = (I32, len(levels))
    page.header[2] = (I32, page.header[2][1] - old + len(levels))
    page.header[3] = (I32, len(page.body))


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize(
    "levels",
    [
        b"\x0a\x01",  # an RLE run of 5 ones: every key defined
        b"\x00\x01\x0a\x01",  # a run of no values first
        b"\x0a\x02",  # a level of 2 where the most is 1
        b"\x03\x0b",  # a bit-packed group: 1,1,0,1,0,0,0,0 (5 asked)
        b"\x05\x0b",  # two groups claimed, one there
        b"\x03",  # a bit-packed group without its byte
        b"\x02\x01\x04\x00",  # runs of 1 and 2: 3 levels of 5
        b"\x0a",  # an RLE run without its value
        b"\xff\xff\xff\xff\x0f\x01",  # a run of 2^31 values
    ],
)
def test_v2_levels_and_rle_runs_are_taken_or_refused_as_pyarrow_does(native: bool, levels: bytes) -> None:
    data = crafted(
        TABLE,
        lambda file: levels_page(file, levels),
        data_page_version="2.0",
        compression="none",
        use_dictionary=True,
    )
    assert_pyarrows(data, native)


@pytest.mark.parametrize("native", PATHS)
def test_a_file_of_no_rows_answers_no_rows(native: bool) -> None:
    empty = TABLE.slice(0, 0)
    assert engine(written(empty), native) == (0, [])
    assert pq.read_metadata(io.BytesIO(written(empty))).row_group(0).column(0).data_page_offset in (0, 4)
    assert engine(written(empty, data_page_version="2.0", compression="zstd"), native) == (0, [])
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, TABLE.schema) as writer:  # no row group at all
        pass
    assert engine(sink.getvalue(), native) == (0, [])
    with_empty = io.BytesIO()
    with pq.ParquetWriter(with_empty, TABLE.schema) as writer:  # an empty row group between two
        writer.write_table(TABLE)
        writer.write_table(empty)
        writer.write_table(TABLE)
    assert_pyarrows(with_empty.getvalue(), native)
    assert engine(with_empty.getvalue(), native) == (
        10,
        [(None, 4, 12.0, 4.0), ("a", 4, 12.0, 5.0), ("b", 2, 6.0, 3.0)],
    )


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize("encoding", ["DELTA_BYTE_ARRAY", "DELTA_LENGTH_BYTE_ARRAY"])
@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_string_keys_in_delta_encodings_are_read(native: bool, encoding: str, version: str) -> None:
    data = written(TABLE, use_dictionary=False, column_encoding={"k": encoding}, data_page_version=version)
    assert engine(data, native) == (5, [(None, 2, 6.0, 4.0), ("a", 2, 6.0, 5.0), ("b", 1, 3.0, 3.0)])
    assert_pyarrows(data, native)


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize("column", [0, 1])
def test_a_column_chunk_short_of_its_row_groups_rows_is_refused_never_rows_lost(
    native: bool, column: int
) -> None:
    def no_values(file: Crafted) -> None:
        file.meta(0, column)[5] = (I64, 0)

    data = crafted(TABLE, no_values, compression="none")
    assert "row group 0" in str(engine(data, native)) and "5 rows" in str(engine(data, native))
    assert_pyarrows(data, native)
    many = pa.table({"k": ["a", "b", "c"] * 1000, "v": [1.0] * 3000})

    def dropped(file: Crafted) -> None:
        del file.chunks[0][column][2]

    data = crafted(many, dropped, compression="none", data_page_size=512)
    assert str(engine(data, native)).startswith("refused: row group 0")
    assert_pyarrows(data, native)


@pytest.mark.parametrize("native", PATHS)
@pytest.mark.parametrize(
    ("values", "want"),
    [
        ([1e308, 1e308, -1e308, -1e308], math.inf),  # +inf in the first row group, -inf in the second
        ([-1e308, -1e308, 1e308, 1e308], -math.inf),
        ([1e308, 1e308, 1.0, math.nan], math.nan),
    ],
)
def test_float_sums_that_overflow_are_infinite_as_one_sum_not_nan(
    native: bool, values: list[float], want: float
) -> None:
    table = pa.table({"k": ["a"] * len(values), "v": values})
    got = engine(written(table, row_group_size=2), native)
    assert not isinstance(got, str)
    assert same(got[1][0][2], want)
