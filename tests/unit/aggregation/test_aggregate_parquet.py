"""The Parquet path: typed columns as group keys and numbers, nulls, refusals by name, truncated
and corrupt files as bad input, and only the footer and the needed column chunks read."""

from __future__ import annotations

import datetime
import decimal
import io
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from shared.aggregation import aggregate_stream, parse_aggregate_payload
from shared.aggregation.options import EngineOptions
from shared.aggregation.parquet_path import BytesSpans
from shared.blobio.spans import SpanReader, coalesce
from shared.core.errors import InputDataError
from shared.jobs.aggregate import HANDLER
from shared.jobs.base import Completed
from tests.unit.jobs.test_aggregate_handler import FakeBlob, FakeService, make_ctx


def parquet(table: pa.Table, **options: Any) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, **options)
    return sink.getvalue()


def run(data: bytes | BytesSpans, group_by: Sequence[str], metrics: list[dict[str, Any]]) -> Any:
    return run_on(data if isinstance(data, BytesSpans) else BytesSpans(data), group_by, metrics)


def run_on(source: Any, group_by: Sequence[str], metrics: list[dict[str, Any]]) -> Any:
    spec = parse_aggregate_payload(
        {"input": "data/x.parquet", "format": "parquet", "group_by": list(group_by), "metrics": metrics}
    )
    return aggregate_stream(source, spec)


class CountingSpans(BytesSpans):
    """Records every span asked for."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.asked: list[list[tuple[int, int]]] = []

    def read(self, spans: Sequence[tuple[int, int]]) -> list[tuple[int, Any]]:
        self.asked.append(list(spans))
        return super().read(spans)


TABLE = pa.table(
    {
        "station": pa.array([3, 1, 3, None, 1, 3], pa.int64()),
        "name": ["c", "a", "c", None, "a", "c"],
        "temp": pa.array([1.5, None, 2.5, 4.0, 7.0, None]),
        "qty": pa.array([1, 2, None, 4, 5, 6], pa.int32()),
        "note": ["x", None, "y", "z", None, None],
    }
)
METRICS = [
    {"op": "count"},
    {"op": "count", "column": "temp"},
    {"op": "sum", "column": "qty"},
    {"op": "mean", "column": "temp"},
    {"op": "min", "column": "qty"},
    {"op": "max", "column": "temp"},
]


def test_an_integer_key_is_grouped_by_value_and_written_as_text() -> None:
    result = run(parquet(TABLE, row_group_size=2), ["station"], METRICS)
    assert result.input_rows == 6
    assert result.rows == [
        {
            "station": None,
            "count": 1,
            "count_temp": 1,
            "sum_qty": 4.0,
            "mean_temp": 4.0,
            "min_qty": 4.0,
            "max_temp": 4.0,
        },
        {
            "station": "1",
            "count": 2,
            "count_temp": 1,
            "sum_qty": 7.0,
            "mean_temp": 7.0,
            "min_qty": 2.0,
            "max_temp": 7.0,
        },
        {
            "station": "3",
            "count": 3,
            "count_temp": 2,
            "sum_qty": 7.0,
            "mean_temp": 2.0,
            "min_qty": 1.0,
            "max_temp": 2.5,
        },
    ]


def test_parquet_gives_what_csv_gives_for_the_same_data() -> None:
    """The same table as CSV (nulls as empty fields) and as Parquet: the same rows."""
    out = io.BytesIO()
    pacsv.write_csv(TABLE, out)
    spec = parse_aggregate_payload(
        {"input": "data/x.csv", "format": "csv", "group_by": ["name", "station"], "metrics": METRICS}
    )
    as_csv = aggregate_stream(io.BytesIO(out.getvalue()), spec)
    as_parquet = run(parquet(TABLE, row_group_size=4), ["name", "station"], METRICS)
    assert as_parquet.rows == as_csv.rows and as_parquet.input_rows == as_csv.input_rows


def test_keys_of_every_scalar_type_are_text() -> None:
    table = pa.table(
        {
            "flag": [True, False, None],
            "day": [datetime.date(2024, 1, 2), None, datetime.date(2024, 1, 2)],
            "price": pa.array([decimal.Decimal("1.50"), decimal.Decimal("2.00"), None], pa.decimal128(5, 2)),
            "ratio": [1.0, 1.5, None],
            "v": [1, 2, 3],
        }
    )
    data = parquet(table)
    for column, keys in (
        ("flag", [None, "false", "true"]),
        ("day", [None, "2024-01-02"]),
        ("price", [None, "1.50", "2.00"]),
        ("ratio", [None, "1", "1.5"]),
    ):
        rows = run(data, [column], [{"op": "sum", "column": "v"}]).rows
        assert [row[column] for row in rows] == keys, column


def test_a_decimal_column_is_summed_as_numbers() -> None:
    table = pa.table(
        {
            "k": ["a", "a"],
            "p": pa.array([decimal.Decimal("1.25"), decimal.Decimal("2.50")], pa.decimal128(6, 2)),
        }
    )
    assert run(parquet(table), ["k"], [{"op": "sum", "column": "p"}]).rows == [{"k": "a", "sum_p": 3.75}]


def test_a_non_numeric_column_in_a_numeric_metric_is_refused_by_name_before_any_row_is_read() -> None:
    source = CountingSpans(parquet(TABLE))
    with pytest.raises(InputDataError, match=r"column 'note' is of Parquet type string, not a number"):
        run(source, ["station"], [{"op": "sum", "column": "note"}])
    assert len(source.asked) == 1  # the footer only


def test_a_missing_column_is_named_with_the_schema() -> None:
    with pytest.raises(
        InputDataError, match=r"column\(s\) 'nope' not in the Parquet schema; the schema has: station, name"
    ):
        run(parquet(TABLE), ["nope"], [{"op": "count"}])


def test_a_nested_column_is_counted_but_not_a_group_key() -> None:
    table = pa.table({"k": ["a", "a", "b"], "tags": [[1, 2], None, []], "s": [{"x": 1}, {"x": 2}, None]})
    data = parquet(table)
    rows = run(data, ["k"], [{"op": "count", "column": "tags"}, {"op": "count", "column": "s"}]).rows
    assert rows == [{"k": "a", "count_tags": 1, "count_s": 2}, {"k": "b", "count_tags": 1, "count_s": 0}]
    with pytest.raises(InputDataError, match=r"group column 'tags' is of Parquet type list<element: int64>"):
        run(data, ["tags"], [{"op": "count"}])


def test_a_binary_key_that_is_not_utf8_is_bad_input_naming_the_column() -> None:
    table = pa.table({"k": pa.array([b"ok", b"\xff\xfe"], pa.binary()), "v": [1, 2]})
    with pytest.raises(
        InputDataError, match=r"row group 0 of the Parquet input: a group key \('k'\) is not valid UTF-8"
    ):
        run(parquet(table), ["k"], [{"op": "count"}])


@pytest.mark.parametrize("keep", [0, 5, 11, 100, -1, -9])
def test_a_truncated_file_is_bad_input_with_a_reason(keep: int) -> None:
    data = parquet(TABLE)
    cut = data[:keep]
    with pytest.raises(InputDataError, match=r"Parquet|truncated"):
        run(cut, ["station"], METRICS)


def test_a_file_cut_before_its_footer_says_it_is_truncated() -> None:
    data = parquet(TABLE)
    with pytest.raises(
        InputDataError, match=r"^the input does not end with Parquet's magic bytes 'PAR1': it is truncated"
    ):
        run(data[: len(data) // 2], ["station"], METRICS)


def test_a_corrupt_column_chunk_is_bad_input_naming_the_row_group() -> None:
    table = pa.table({"k": [f"key{i % 7}" for i in range(5000)], "v": [float(i) for i in range(5000)]})
    data = bytearray(parquet(table, row_group_size=2500, compression="snappy"))
    chunk = pq.read_metadata(io.BytesIO(bytes(data))).row_group(1).column(1)
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    data[start + 20 : start + chunk.total_compressed_size - 4] = b"\xa5" * (chunk.total_compressed_size - 24)
    with pytest.raises(
        InputDataError, match=r"^row group 1 of the Parquet input cannot be decoded \(the file is corrupt\)"
    ):
        run(bytes(data), ["k"], [{"op": "sum", "column": "v"}])


def test_a_corrupt_footer_is_bad_input() -> None:
    data = bytearray(parquet(TABLE))
    footer = int.from_bytes(data[-8:-4], "little")
    data[-8 - footer : -8] = b"\x17" * footer
    with pytest.raises(InputDataError, match=r"^the Parquet footer cannot be read \(the file is corrupt\)"):
        run(bytes(data), ["station"], METRICS)


def test_only_the_footer_and_the_needed_column_chunks_are_read_row_group_by_row_group() -> None:
    wide = TABLE.append_column("pad", pa.array(["x" * 200] * 6))
    data = parquet(pa.concat_tables([wide] * 50), row_group_size=60)
    meta = pq.read_metadata(io.BytesIO(data))
    source = CountingSpans(data)
    result = run(source, ["station"], [{"op": "sum", "column": "qty"}])
    assert result.input_rows == 300
    assert len(source.asked) == 1 + meta.num_row_groups  # the footer, then one read a row group
    needed = {0, 3}  # station, qty
    for group, spans in enumerate(source.asked[1:]):
        chunks = [meta.row_group(group).column(i) for i in range(meta.num_columns)]
        expected = sorted(
            (c.dictionary_page_offset or c.data_page_offset, c.total_compressed_size)
            for i, c in enumerate(chunks)
            if i in needed
        )
        assert sorted(spans) == expected


def test_row_groups_are_read_at_most_one_ahead_of_those_being_decoded() -> None:
    from shared.aggregation.parquet_path import parquet_partials
    from shared.aggregation.plan import Plan

    data = parquet(pa.concat_tables([TABLE] * 10), row_group_size=6)
    source = CountingSpans(data)
    spec = parse_aggregate_payload(
        {"input": "data/x", "format": "parquet", "group_by": ["station"], "metrics": [{"op": "count"}]}
    )
    partials = parquet_partials(source, Plan.of(spec), read_bytes=0)  # no more ahead for small ones
    next(partials)
    assert len(source.asked) <= 1 + 3  # the footer, the two row groups decoded, the next one
    partials.close()
    assert pq.read_metadata(io.BytesIO(data)).num_row_groups == 10


def test_rows_counted_only_read_no_column_chunk() -> None:
    source = CountingSpans(parquet(pa.concat_tables([TABLE] * 5), row_group_size=7))
    assert run(source, [], [{"op": "count"}]).rows == [{"count": 30}]
    assert all(spans == [] for spans in source.asked[1:])


def test_batches_within_a_row_group_give_the_row_groups_answer() -> None:
    from shared.aggregation.parquet_path import parquet_partials
    from shared.aggregation.plan import Accumulator, Plan

    data = parquet(pa.concat_tables([TABLE] * 100), row_group_size=250)
    spec = parse_aggregate_payload(
        {"input": "data/x", "format": "parquet", "group_by": ["station"], "metrics": METRICS}
    )
    answers = []
    for batch_rows in (7, 250, 10_000):
        acc = Accumulator(Plan.of(spec))
        for partial, rows in parquet_partials(
            BytesSpans(data), Plan.of(spec), batch_rows=batch_rows, workers=1 + batch_rows % 2
        ):
            acc.add_partial(partial, rows)
        answers.append((acc.result_table(spec.metrics).to_pylist(), acc.input_rows))
    assert answers[0] == answers[1] == answers[2]
    assert answers[0][1] == 600


# --- the blob edge: ranged reads --------------------------------------------------------------


def test_coalesce_merges_spans_closer_than_the_gap() -> None:
    assert coalesce([(100, 10), (0, 10), (15, 5), (300, 1)], gap=5) == [(0, 20), (100, 110), (300, 301)]
    assert coalesce([], gap=5) == []


def test_span_reader_cuts_ranges_into_even_pieces_under_the_first_etag() -> None:
    data = bytes(range(256)) * 100
    blob = FakeBlob("data", "x.parquet", {("data", "x.parquet"): data})
    with SpanReader(blob, piece=1000, gap=10, first_size=64) as reader:
        got = reader.read([(5000, 2500), (7505, 10), (20000, 100), (10, 20)])
        assert reader.size == len(data)
    assert (
        [(offset, bytes(view)) for offset, view in got]
        == [
            (10, data[10:30]),  # within the first GET's bytes: no GET
            (5000, data[5000:7515]),
            (20000, data[20000:20100]),
        ]
    )
    assert blob.calls[0] == (0, 64, None)
    assert sorted(blob.calls[1:]) == [
        (5000, 839, '"etag-1"'),
        (5839, 839, '"etag-1"'),
        (6678, 837, '"etag-1"'),
        (20000, 100, '"etag-1"'),
    ]


def test_a_span_reader_given_an_etag_reads_that_version_from_its_first_get() -> None:
    blob = FakeBlob("data", "x.parquet", {("data", "x.parquet"): b"x" * 1000})
    with SpanReader(blob, first_size=64, etag='"v7"') as reader:
        reader.read([(500, 10)])
    assert [etag for _, _, etag in blob.calls] == ['"v7"', '"etag-1"']


@pytest.mark.parametrize("options", [{"compression": "none", "use_dictionary": False}, {}])
def test_buffers_given_back_and_reused_leave_every_row_group_right(options: dict[str, Any]) -> None:
    """Row groups read into the buffers of the ones before (plain, uncompressed pages too: what
    pyarrow could have kept a reference to) give the answer of a file read from memory."""
    table = pa.concat_tables([TABLE.append_column("pad", pa.array([f"{i:0>300}" for i in range(6)]))] * 400)
    data = parquet(table, row_group_size=300, **options)
    blob = FakeBlob("data", "x.parquet", {("data", "x.parquet"): data})
    metrics = [{"op": "count"}, {"op": "sum", "column": "qty"}, {"op": "max", "column": "temp"}]
    with SpanReader(blob, first_size=64, gap=0) as reader:
        got = run_on(reader, ["name", "station"], metrics)
        assert reader.kept  # buffers were given back
    assert got.rows == run(data, ["name", "station"], metrics).rows
    assert got.input_rows == 2400


def test_the_handler_aggregates_a_parquet_blob() -> None:
    service = FakeService({("data", "t.parquet"): parquet(TABLE, row_group_size=4)})
    payload = {
        "input": "data/t.parquet",
        "format": "parquet",
        "group_by": ["station"],
        "metrics": [{"op": "count"}, {"op": "sum", "column": "qty"}],
    }
    outcome = HANDLER.run(make_ctx(payload, service))
    assert outcome == Completed(
        result_ref="results/job-1.json", summary={"input_rows": 6, "groups": 3, "engine": "inline"}
    )
    document = json.loads(service.store[("results", "job-1.json")])
    assert document["rows"] == [
        {"station": None, "count": 1, "sum_qty": 4.0},
        {"station": "1", "count": 2, "sum_qty": 7.0},
        {"station": "3", "count": 3, "sum_qty": 7.0},
    ]
    assert not any(math.isnan(row["sum_qty"]) for row in document["rows"])


def test_the_handler_refuses_a_truncated_parquet_blob_with_its_reason() -> None:
    data = parquet(TABLE)
    service = FakeService({("data", "t.parquet"): data[:-3]})
    payload = {
        "input": "data/t.parquet",
        "format": "parquet",
        "group_by": ["station"],
        "metrics": [{"op": "count"}],
    }
    with pytest.raises(InputDataError, match=r"magic bytes 'PAR1': it is truncated"):
        HANDLER.run(make_ctx(payload, service))


def test_more_groups_than_max_groups_stops_the_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row groups of ~5 KB: read ahead while those held need at most READ_BYTES (here two)."""
    from shared.aggregation import TooManyGroups, aggregate_table

    data = parquet(pa.table({"k": [str(i) for i in range(5000)], "v": list(range(5000))}), row_group_size=500)
    monkeypatch.setattr("shared.aggregation.parquet_path.READ_BYTES", 2 * 5000)
    source = CountingSpans(data)
    spec = parse_aggregate_payload(
        {"input": "data/x", "format": "parquet", "group_by": ["k"], "metrics": [{"op": "count"}]}
    )
    with pytest.raises(TooManyGroups):
        aggregate_table(source, spec, max_groups=600)
    assert len(source.asked) < 1 + 10  # stopped before the last row groups were read


def test_more_groups_than_max_groups_stops_the_read_with_the_shipped_read_ahead() -> None:
    """The twin with READ_BYTES as shipped (32 MiB): row groups of ~5 MB, stopped well before the
    last of 12 (the first one's partial is past the limit; at most READ_BYTES more read)."""
    import pyarrow.compute as pc

    from shared.aggregation import TooManyGroups, aggregate_table
    from shared.aggregation.parquet_path import READ_BYTES

    rows = 12 * 150_000
    keys = pc.binary_join_element_wise(pc.cast(pa.array(np.arange(rows)), pa.string()), "-" + "x" * 40, "")
    data = parquet(pa.table({"k": keys}), row_group_size=150_000, use_dictionary=False, compression="none")
    meta = pq.read_metadata(io.BytesIO(data))
    assert 4_000_000 < meta.row_group(0).total_byte_size < READ_BYTES / 2
    source = CountingSpans(data)
    spec = parse_aggregate_payload(
        {"input": "data/x", "format": "parquet", "group_by": ["k"], "metrics": [{"op": "count"}]}
    )
    with pytest.raises(TooManyGroups):
        aggregate_table(source, spec, max_groups=600)
    read = sum(length for spans in source.asked[1:] for _, length in spans)
    assert read <= meta.row_group(0).total_byte_size * 2 + READ_BYTES < len(data)


def _dictionary_page(data: bytes, column: int) -> int:
    chunk = pq.read_metadata(io.BytesIO(data)).row_group(0).column(column)
    assert chunk.has_dictionary_page
    return int(chunk.dictionary_page_offset)


SUM_V = parse_aggregate_payload(
    {
        "input": "data/x.parquet",
        "format": "parquet",
        "group_by": ["k"],
        "metrics": [{"op": "sum", "column": "v"}],
    }
)


def test_a_dictionary_index_past_its_dictionary_is_bad_input_not_an_error() -> None:
    """A page header saying the dictionary holds 2 texts where indices name 3 (pyarrow reads the
    indices unchecked): bad input naming the row group, by either decode."""
    table = pa.table({"k": ["a", "b", "c"] * 20, "v": [1.0] * 60})
    data = bytearray(parquet(table, compression="none"))
    at = data.index(b"\x4c\x15\x06", _dictionary_page(bytes(data), 0))  # num_values 3 (zigzag 6)
    data[at + 2] = 0x04  # ... now 2
    for native in (True, False):
        with pytest.raises(InputDataError, match=r"^row group 0 of the Parquet input"):
            aggregate_stream(BytesSpans(bytes(data)), SUM_V, options=EngineOptions(native=native))


def test_a_dictionary_text_that_is_not_utf8_is_bad_input_not_an_error() -> None:
    table = pa.table({"k": ["alpha", "beta"] * 20, "v": [1.0] * 40})
    data = bytearray(parquet(table, compression="none"))
    at = data.index(b"beta", _dictionary_page(bytes(data), 0))
    data[at] = 0xFF
    for native in (True, False):
        with pytest.raises(InputDataError, match=r"not valid UTF-8"):
            aggregate_stream(BytesSpans(bytes(data)), SUM_V, options=EngineOptions(native=native))
