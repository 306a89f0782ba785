"""The inline aggregate engine (pure, over in-memory streams) against an independent computation.

The reference below uses only the `csv` / `json` modules and dict accumulators.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.aggregation import (
    AggregateResult,
    AggregateSpec,
    EngineOptions,
    aggregate_stream,
    csv_check,
    csv_path,
    jsonl_exact,
    jsonl_path,
    options,
    parse_aggregate_payload,
)
from shared.core.errors import InputDataError, PermanentError


@pytest.fixture(autouse=True, params=["scanner", "python"])
def scanner(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test twice: blocks to the C scanner first (as deployed), and the Python (pyarrow)
    path alone (as on Spark executors without the built scanner). Tests about the pyarrow JSON
    path's own choices (`pyarrow_path`) run on the Python path only."""
    if request.param == "scanner" and request.node.get_closest_marker("pyarrow_path"):
        pytest.skip("about the pyarrow path's own choices")
    global TUNING
    TUNING = EngineOptions(native=request.param == "scanner")
    yield
    TUNING = EngineOptions()


TUNING = EngineOptions()
"""The engine's options in the running test: the scanner on or off (the `scanner` fixture)."""


def tuned(**changes: Any) -> EngineOptions:
    """The running test's options, with `changes`."""
    return replace(TUNING, **changes)


# --- an independent computation ----------------------------------------------------------------


def reference(
    records: Iterable[dict[str, Any]],
    group_by: Sequence[str],
    metrics: Sequence[dict[str, str]],
    null_values: Sequence[str] = ("", "NA"),
) -> list[dict[str, Any]]:
    """Group-by with SQL semantics over records of strings (None = missing), plain Python."""
    nulls = set(null_values)

    def value(record: dict[str, Any], column: str) -> str | None:
        raw = record.get(column)
        return None if raw is None or raw in nulls else raw

    groups: dict[tuple[str | None, ...], dict[str, Any]] = {}
    for record in records:
        key = tuple(value(record, c) for c in group_by)
        acc = groups.setdefault(key, {"rows": 0, "values": {}})
        acc["rows"] += 1
        for m in metrics:
            if "column" in m:
                raw = value(record, m["column"])
                if raw is not None:
                    number = float(raw) if m["op"] != "count" else 1.0
                    acc["values"].setdefault((m["op"], m["column"]), []).append(number)
    if not groups and not group_by:
        groups[()] = {"rows": 0, "values": {}}
    out = []
    for key in sorted(groups, key=lambda k: tuple((v is not None, v or "") for v in k)):
        acc = groups[key]
        row: dict[str, Any] = dict(zip(group_by, key, strict=True))
        for m in metrics:
            name = m.get("as") or ("count" if "column" not in m else f"{m['op']}_{m['column']}")
            values = acc["values"].get((m["op"], m.get("column")), [])
            if m["op"] == "count":
                row[name] = acc["rows"] if "column" not in m else len(values)
            elif not values:
                row[name] = None
            elif m["op"] == "sum":
                row[name] = math.fsum(values)
            elif m["op"] == "mean":
                row[name] = math.fsum(values) / len(values)
            else:
                row[name] = min(values) if m["op"] == "min" else max(values)
        out.append(row)
    return out


def csv_records(text: str) -> list[dict[str, Any]]:
    return list(csv.DictReader(io.StringIO(text, newline="")))


def assert_same(actual: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert list(got) == list(want), (got, want)
        for name, w in want.items():
            g = got[name]
            if isinstance(w, float):
                assert isinstance(g, float), (name, got, want)
                assert math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-9), (name, got, want)
            else:
                assert g == w and type(g) is type(w), (name, got, want)


def run(
    data: bytes | str,
    group_by: Sequence[str] = (),
    metrics: Sequence[dict[str, str]] = ({"op": "count"},),
    fmt: str = "csv",
    block_size: int = options.DEFAULT_BLOCK_SIZE,
    tuning: dict[str, Any] | None = None,
    **extra: Any,
) -> AggregateResult:
    """The engine's result; `tuning`: options changed (`EngineOptions` fields), `extra`: payload keys."""
    raw = data.encode() if isinstance(data, str) else data
    spec = make_spec(group_by, metrics, fmt, **extra)
    return aggregate_stream(io.BytesIO(raw), spec, options=tuned(block_size=block_size, **(tuning or {})))


def make_spec(
    group_by: Sequence[str], metrics: Sequence[dict[str, str]], fmt: str = "csv", **extra: Any
) -> AggregateSpec:
    return parse_aggregate_payload(
        {"input": "data/in", "format": fmt, "group_by": list(group_by), "metrics": list(metrics), **extra}
    )


ALL_METRICS = [
    {"op": "count"},
    {"op": "count", "column": "qty"},
    {"op": "sum", "column": "qty"},
    {"op": "mean", "column": "price"},
    {"op": "min", "column": "price"},
    {"op": "max", "column": "price", "as": "top"},
]


# --- generated data ----------------------------------------------------------------------------


def generated_csv(rows: int, seed: int) -> str:
    """Sales-like CSV with nulls, NA, quoted fields (commas, quotes, line breaks) and CRLF."""
    rnd = random.Random(seed)
    out = io.StringIO(newline="")
    writer = csv.writer(out, lineterminator="\r\n" if seed % 2 else "\n")
    writer.writerow(["region", "product", "qty", "price", "note"])
    regions = ["north", "south", "east, central", 'the "west"', "", "NA", "7"]
    for _ in range(rows):
        qty = rnd.choice(["", "NA", str(rnd.randint(-5, 50)), f" {rnd.randint(0, 9)} "])
        price = rnd.choice(["", "NA", f"{rnd.uniform(0, 500):.2f}", f"{rnd.uniform(-1, 1):.3e}", "0"])
        note = rnd.choice(["", "plain", "with, comma", 'with "quotes"', "line\nbreak", "NA"])
        writer.writerow([rnd.choice(regions), f"P{rnd.randrange(12):02d}", qty, price, note])
    return out.getvalue()


@pytest.mark.parametrize("block_size", [64, 1000, 4096, 1 << 20])
@pytest.mark.parametrize("group_by", [(), ("region",), ("region", "product"), ("product", "note")])
def test_csv_matches_independent_computation(group_by: tuple[str, ...], block_size: int) -> None:
    text = generated_csv(700, seed=len(group_by) + block_size)
    result = run(text, group_by, ALL_METRICS, block_size=block_size)
    records = csv_records(text)
    assert result.input_rows == len(records) == 700
    assert_same(result.rows, reference(records, group_by, ALL_METRICS))


def test_many_groups_are_combined_across_blocks() -> None:
    rnd = random.Random(3)
    lines = ["k,v"] + [f"k{rnd.randrange(300)},{rnd.randint(0, 9)}" for _ in range(5000)]
    text = "\n".join(lines) + "\n"
    metrics = [{"op": "count"}, {"op": "sum", "column": "v"}, {"op": "max", "column": "v"}]
    result = run(text, ["k"], metrics, block_size=512, tuning={"combine_rows": 10})
    assert_same(result.rows, reference(csv_records(text), ["k"], metrics))
    assert result.groups == 300


def test_jsonl_matches_independent_computation() -> None:
    rnd = random.Random(11)
    written: list[dict[str, Any]] = []
    lines = []
    for i in range(600):
        record: dict[str, Any] = {
            "region": rnd.choice(["north", "south", None, "NA", 3, 2.5, True]),
            "qty": rnd.choice([None, "NA", "", rnd.randint(0, 9), str(rnd.randint(0, 9)), 1.5]),
            "price": rnd.choice([None, round(rnd.uniform(0, 99), 2), "12.50", -0.0]),
        }
        if i % 50 == 0:
            del record["price"]
        lines.append(json.dumps(record))
        as_text = {
            k: (None if v is None else json.dumps(v) if not isinstance(v, str) else v)
            for k, v in record.items()
        }
        written.append(as_text)
    text = "\n".join(lines[:300]) + "\n\n" + "\n".join(lines[300:])  # a blank line is skipped
    for block_size in (100, 4096, 1 << 20):
        result = run(text, ["region"], ALL_METRICS, fmt="jsonl", block_size=block_size)
        assert result.input_rows == 600
        assert_same(result.rows, reference(written, ["region"], ALL_METRICS))


# --- semantics, one rule at a time -------------------------------------------------------------


def test_count_rows_versus_non_null_values() -> None:
    text = "k,v\na,1\na,\na,NA\nb,x\n"
    result = run(text, ["k"], [{"op": "count"}, {"op": "count", "column": "v"}])
    assert result.rows == [{"k": "a", "count": 3, "count_v": 1}, {"k": "b", "count": 1, "count_v": 1}]


def test_count_of_a_column_does_not_need_numbers() -> None:
    result = run("k,v\na,hello\na,\n", [], [{"op": "count", "column": "v"}])
    assert result.rows == [{"count_v": 1}]


def test_sum_mean_min_max_skip_nulls_and_are_floats() -> None:
    text = "k,v\na,1\na,\na,4\na,NA\n"
    metrics = [{"op": "sum", "column": "v"}, {"op": "mean", "column": "v"}]
    metrics += [{"op": "min", "column": "v"}, {"op": "max", "column": "v"}]
    result = run(text, ["k"], metrics)
    assert result.rows == [{"k": "a", "sum_v": 5.0, "mean_v": 2.5, "min_v": 1.0, "max_v": 4.0}]
    assert all(isinstance(v, float) for k, v in result.rows[0].items() if k != "k")


def test_a_group_with_no_values_gives_null_not_zero() -> None:
    metrics = [{"op": "count"}, {"op": "sum", "column": "v"}, {"op": "mean", "column": "v"}]
    metrics += [{"op": "min", "column": "v"}, {"op": "count", "column": "v"}]
    result = run("k,v\na,\na,NA\n", ["k"], metrics)
    assert result.rows == [{"k": "a", "count": 2, "sum_v": None, "mean_v": None, "min_v": None, "count_v": 0}]


def test_null_values_are_configurable() -> None:
    text = "k,v\nNA,1\n-,2\n,3\n"
    default = run(text, ["k"], [{"op": "sum", "column": "v"}])
    assert default.rows == [{"k": None, "sum_v": 4.0}, {"k": "-", "sum_v": 2.0}]
    custom = run(text, ["k"], [{"op": "sum", "column": "v"}], null_values=["-"])
    assert custom.rows == [{"k": None, "sum_v": 2.0}, {"k": "", "sum_v": 3.0}, {"k": "NA", "sum_v": 1.0}]
    with pytest.raises(InputDataError, match="'NA'"):
        run("k,v\na,NA\n", [], [{"op": "sum", "column": "v"}], null_values=[])


def test_quoted_empty_and_quoted_na_are_null_too() -> None:
    result = run('k,v\n"",1\n"NA",2\n"x",3\n', ["k"], [{"op": "sum", "column": "v"}])
    assert result.rows == [{"k": None, "sum_v": 3.0}, {"k": "x", "sum_v": 3.0}]


def test_group_keys_stay_strings_as_written() -> None:
    text = "k,v\n01,1\n1,2\n1.0,3\n 1,4\n"
    result = run(text, ["k"], [{"op": "sum", "column": "v"}])
    assert [r["k"] for r in result.rows] == [" 1", "01", "1", "1.0"]


def test_null_keys_form_their_own_group_sorted_first() -> None:
    text = "a,b,v\nx,,1\n,y,2\n,,3\nx,y,4\n,y,5\n"
    result = run(text, ["a", "b"], [{"op": "count"}])
    assert result.rows == [
        {"a": None, "b": None, "count": 1},
        {"a": None, "b": "y", "count": 2},
        {"a": "x", "b": None, "count": 1},
        {"a": "x", "b": "y", "count": 1},
    ]


def test_sorting_is_by_code_point() -> None:
    text = "k\nb\nB\nä\na\n"
    assert [r["k"] for r in run(text, ["k"]).rows] == ["B", "a", "b", "ä"]


def test_global_group_over_empty_input_is_one_row() -> None:
    metrics = [{"op": "count"}, {"op": "sum", "column": "v"}, {"op": "count", "column": "v"}]
    assert run("k,v\n", [], metrics).rows == [{"count": 0, "sum_v": None, "count_v": 0}]
    assert run("k,v\n", ["k"], metrics).rows == []
    assert run("", [], metrics, fmt="jsonl").rows == [{"count": 0, "sum_v": None, "count_v": 0}]
    assert run("", [], metrics, fmt="jsonl").input_rows == 0
    blank = run("\n \n\r\n\t\n", [], metrics, fmt="jsonl")  # lines, but no record
    assert (blank.input_rows, blank.rows) == (0, [{"count": 0, "sum_v": None, "count_v": 0}])
    blank = run("k,v\n\n\r\n", [], metrics)
    assert (blank.input_rows, blank.rows) == (0, [{"count": 0, "sum_v": None, "count_v": 0}])


def test_count_only_reads_no_column() -> None:
    result = run("a,b\n1,2\n3,4\n\n5,6", [], [{"op": "count"}])
    assert result.rows == [{"count": 3}] and result.input_rows == 3


def test_numbers_with_blanks_signs_and_exponents() -> None:
    text = "k,v\na, 2 \na,+1.5\na,-1e1\na,.5\n"
    assert run(text, [], [{"op": "sum", "column": "v"}]).rows == [{"sum_v": -6.0}]


def test_a_column_both_grouped_and_summed() -> None:
    text = "v\n1\n1\n2\n"
    result = run(text, ["v"], [{"op": "sum", "column": "v", "as": "total"}, {"op": "count"}])
    assert result.rows == [{"v": "1", "total": 2.0, "count": 2}, {"v": "2", "total": 2.0, "count": 1}]


def test_crlf_cr_bom_and_no_final_newline() -> None:
    for text in ("k,v\r\na,1\r\na,2", "k,v\ra,1\ra,2\r", "\ufeffk,v\na,1\na,2\n"):
        assert run(text, ["k"], [{"op": "sum", "column": "v"}]).rows == [{"k": "a", "sum_v": 3.0}]


def test_quoted_line_breaks_across_block_boundaries() -> None:
    text = "k,note,v\n" + "".join(f'a,"x\n{"y" * (i % 7)}\n""z""",{i}\n' for i in range(200))
    for block_size in (16, 50, 333, 1 << 20):
        result = run(text, ["k"], [{"op": "count"}, {"op": "sum", "column": "v"}], block_size=block_size)
        assert result.rows == [{"k": "a", "count": 200, "sum_v": float(sum(range(200)))}]


@pytest.mark.parametrize("newline", ["\n", "\r", "\r\n"])
def test_a_quoted_line_break_in_the_last_record_without_a_final_newline(newline: str) -> None:
    text = newline.join(["v,k", "1,a", f'2,"x{newline}y"'])
    for block_size in (16, 1 << 20):
        result = run(text, ["k"], [{"op": "count"}, {"op": "sum", "column": "v"}], block_size=block_size)
        assert result.rows == [
            {"k": "a", "count": 1, "sum_v": 1.0},
            {"k": f"x{newline}y", "count": 1, "sum_v": 2.0},
        ]


def test_inputs_read_at_the_same_time_do_not_share_buffers() -> None:
    """Block buffers are kept for the next input: inputs read at once each get their own."""
    from concurrent.futures import ThreadPoolExecutor

    texts = [generated_csv(20_000, seed=seed) for seed in range(4)]
    expected = [reference(csv_records(t), ["region", "product"], ALL_METRICS) for t in texts]

    def one(i: int) -> list[dict[str, Any]]:
        return run(texts[i % 4], ["region", "product"], ALL_METRICS).rows

    with ThreadPoolExecutor(4) as pool:
        for i, rows in enumerate(pool.map(one, range(12))):
            assert_same(rows, expected[i % 4])


def test_quote_counting_with_and_without_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    data = bytearray(generated_csv(20_000, seed=7).encode())  # over 256 KiB: several steps
    native = csv_path._quote_counter()
    with_numpy = csv_path._quote_counter(native=False)
    monkeypatch.setitem(sys.modules, "numpy", None)  # import fails, as on a cluster without it
    without = csv_path._quote_counter(native=False)
    for start, end in [(0, len(data)), (3, 300_001), (10, 10), (len(data) - 5, len(data)), (7, 22)]:
        expected = data.count(b'"', start, end)
        assert (
            native(data, start, end) == with_numpy(data, start, end) == without(data, start, end) == expected
        )


def test_a_record_larger_than_the_block_grows_the_buffer() -> None:
    text = "k,v\n" + "a" * 5000 + ",1\nb,2\n"
    result = run(text, ["k"], [{"op": "sum", "column": "v"}], block_size=100)
    assert [r["sum_v"] for r in result.rows] == [1.0, 2.0]


def test_a_record_larger_than_the_limit_is_refused() -> None:
    with pytest.raises(InputDataError, match="longer than"):
        run("k,v\n" + "a" * 5000 + ",1\n", ["k"], block_size=100, tuning={"max_record_bytes": 1024})


@pytest.mark.parametrize("limit", [1024, None])  # None: the shipped MAX_RECORD_BYTES (64 MiB)
def test_a_json_line_larger_than_the_limit_is_refused(limit: int | None) -> None:
    bound = limit or options.MAX_RECORD_BYTES
    size = bound * (4 if limit else 1) + 10  # the buffer doubles up to the limit
    text = b'{"k": "a"}\n{"k": "' + b"x" * size + b'"}\n'
    block_size = 100 if limit else options.DEFAULT_BLOCK_SIZE
    with pytest.raises(InputDataError, match=r"^a JSON line at byte 11 is longer than \d+ MiB"):
        run(text, ["k"], fmt="jsonl", block_size=block_size, tuning={"max_record_bytes": bound})


# --- bad input ---------------------------------------------------------------------------------


class OneWayStream(io.RawIOBase):
    """A stream that cannot seek (like a socket)."""

    def __init__(self, data: bytes) -> None:
        self.inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self.inner.readinto(buffer)


def bad_number_text() -> str:
    return (
        "k,note,v\n" + "a,,1\n" * 3000 + "\n" + 'b,"two\nlines",5\n' + "a,,2\n" * 500 + "b,,12x\n" + "a,,3\n"
    )


@pytest.mark.parametrize("block_size", [64, 1000, 1 << 20])
def test_non_number_names_column_value_and_line(block_size: int) -> None:
    spec = make_spec(["k"], [{"op": "sum", "column": "v"}])
    with pytest.raises(InputDataError) as info:
        aggregate_stream(io.BytesIO(bad_number_text().encode()), spec, options=tuned(block_size=block_size))
    assert str(info.value) == "column 'v' has a value that is not a number on line 3505: '12x'"
    assert isinstance(info.value, PermanentError) and info.value.reason_code == "bad_input_data"


def test_non_number_in_a_grouped_numeric_column() -> None:
    with pytest.raises(InputDataError, match=r"^column 'v' has a value that is not a number on line 3: 'x'$"):
        run("v\n1\nx\n", ["v"], [{"op": "max", "column": "v"}])


def test_line_numbers_without_seeking_are_those_with_seeking() -> None:
    spec = make_spec(["k"], [{"op": "sum", "column": "v"}])
    for block_size in (1 << 20, 1000, 64):
        for stream in (io.BytesIO(bad_number_text().encode()), OneWayStream(bad_number_text().encode())):
            with pytest.raises(InputDataError) as info:
                aggregate_stream(stream, spec, options=tuned(block_size=block_size))
            assert "on line 3505: '12x'" in str(info.value)  # blank lines and \r\n counted as read


@pytest.mark.parametrize("block_size", [64, 1000, 4096])
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_the_first_bad_record_is_reported_whatever_finishes_first(block_size: int, workers: int) -> None:
    """The two bad records are in different blocks, parsed at once: they may fail in any order."""
    text = "k,v\n" + "a,1\n" * 2000 + "b,x1\n" + "a,2\n" * 2000 + "c,3,4\n" + "a,3\n" * 100
    spec = make_spec(["k"], [{"op": "sum", "column": "v"}])
    for stream in (io.BytesIO(text.encode()), OneWayStream(text.encode())):
        with pytest.raises(InputDataError) as info:
            aggregate_stream(stream, spec, options=tuned(block_size=block_size, parse_workers=workers))
        assert str(info.value) == "column 'v' has a value that is not a number on line 2002: 'x1'"


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_the_record_bound_does_not_depend_on_the_block_size(fmt: str) -> None:
    bound = {"max_record_bytes": 1024}

    def record(size: int) -> str:
        if fmt == "csv":
            return "a" * (size - 3) + ",1\n"
        return '{"k": "' + "a" * (size - 18) + '", "v": 1}\n'

    head = "k,v\n" if fmt == "csv" else ""
    for block_size in (16, 37, 100, 1000):
        assert run(head + record(1024), ["k"], fmt=fmt, block_size=block_size, tuning=bound).input_rows == 1
        with pytest.raises(InputDataError, match="longer than"):
            run(head + record(1025), ["k"], fmt=fmt, block_size=block_size, tuning=bound)


def test_a_bad_record_before_an_oversized_one_is_reported_first() -> None:
    text = "k,v\n" + "a,1\n" * 50 + "b,x1\n" + "a,2\n" * 50 + "c" * 5000 + ",1\n"
    with pytest.raises(InputDataError, match="not a number on line 52: 'x1'"):
        run(text, ["k"], [{"op": "sum", "column": "v"}], block_size=100, tuning={"max_record_bytes": 1024})


@pytest.mark.parametrize("block_size", [64, 1000, 1 << 20])
def test_invalid_utf8_in_a_group_key_names_its_line(block_size: int) -> None:
    data = b"k,v\n" + b"a,1\n" * 3000 + b"\xff\xfe,2\n" + b"b,3\n" * 10
    with pytest.raises(InputDataError) as info:
        run(data, ["k"], [{"op": "sum", "column": "v"}], block_size=block_size)
    assert str(info.value) == (
        "CSV input is not valid on line 3002: column 'k' has a value that is not UTF-8: b'\\xff\\xfe'"
    )


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_results_do_not_depend_on_the_number_of_parsing_threads(
    workers: int,
) -> None:
    data = generated_csv(3000, seed=workers)
    expected = reference(csv_records(data), ["region", "product"], ALL_METRICS)
    threads = {"parse_workers": workers}
    for block_size in (300, 4096, 1 << 20):
        assert_same(
            run(data, ["region", "product"], ALL_METRICS, block_size=block_size, tuning=threads).rows,
            expected,
        )


def test_missing_columns_are_named() -> None:
    with pytest.raises(InputDataError) as info:
        run("k,v\na,1\n", ["region"], [{"op": "sum", "column": "qty"}, {"op": "count", "column": "v"}])
    assert str(info.value) == "column(s) 'region', 'qty' not in the CSV header (line 1); the header has: k, v"


def test_duplicate_header_column() -> None:
    with pytest.raises(InputDataError, match="'k' appears more than once"):
        run("k,k\na,b\n", ["k"])


def test_empty_csv_has_no_header() -> None:
    with pytest.raises(InputDataError, match="the input is empty"):
        run("", ["k"])


def test_ragged_row_names_its_line() -> None:
    with pytest.raises(InputDataError) as info:
        run("k,v\na,1\n\nb,2,3\n", ["k"])
    assert str(info.value) == "CSV input is not valid on line 4: Expected 2 columns, got 3: b,2,3"


def test_invalid_utf8_is_a_data_error() -> None:
    with pytest.raises(InputDataError, match="on line 2: column 'k' has a value that is not UTF-8"):
        run(b"k,v\n\xff\xfe,1\n", ["k"])


BLOCK_SIZES = (16, 37, 64, 256, 1 << 20)


def csv_error(data: bytes, group_by: list[str], metrics: list[dict[str, Any]] | None = None) -> str:
    """The one error message of `data` at every block size (asserted)."""
    messages = set()
    for block_size in BLOCK_SIZES:
        with pytest.raises(InputDataError) as info:
            run(data, group_by, metrics or [{"op": "count"}], block_size=block_size)
        messages.add(str(info.value))
    assert len(messages) == 1, messages
    return messages.pop()


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b'k,v\na,1\nb,5" screen\nc,2\n', "a quote inside an unquoted field or after a closing quote"),
        (b'k,v\na,1\n"b"x,1\nc,2\n', "a quote inside an unquoted field or after a closing quote"),
        (b'k,v\na,1\n"b,1\nc,2\n', "a quoted field is not closed"),
    ],
)
def test_a_quote_out_of_place_is_refused_at_every_block_size(data: bytes, problem: str) -> None:
    assert csv_error(data, ["k"]) == f"CSV input is not valid on line 3: {problem}"


def test_a_ragged_record_with_bytes_that_are_not_utf8_names_its_line() -> None:
    data = b"k,v\na,1\nb\xff,2,3\nc,x\n"
    message = csv_error(data, ["k"], [{"op": "sum", "column": "v"}])
    assert message == "CSV input is not valid on line 3: Expected 2 columns, got 3: b\ufffd,2,3"


def test_the_first_bad_record_in_file_order_wins_whatever_the_problem() -> None:
    numbers = [{"op": "sum", "column": "v"}, {"op": "sum", "column": "w"}]
    later_column_first = b'k,v,w\na,1,1\n\n"x\ny",1,bad\nb,\xff,1\nc,1,2,3\n'
    assert csv_error(later_column_first, ["k"], numbers) == (
        "column 'w' has a value that is not a number on line 4: 'bad'"
    )
    assert csv_error(b"k,v,w\na,1,1\nb,\xff,x\n", ["k"], numbers) == (
        "CSV input is not valid on line 3: column 'v' has a value that is not UTF-8: b'\\xff'"
    )
    assert csv_error(b"k,v,w\na,1,1\r\n\xc3,1,1\n", ["k"], numbers) == (
        "CSV input is not valid on line 3: column 'k' has a value that is not UTF-8: b'\\xc3'"
    )


def test_a_column_only_counted_is_counted_whatever_its_bytes() -> None:
    for block_size in BLOCK_SIZES:
        result = run(b"k,v\na,\xff\nb,\xc3\n", [], [{"op": "count", "column": "v"}], block_size=block_size)
        assert result.rows == [{"count_v": 2}]


def test_jsonl_errors_name_the_line() -> None:
    cases = {
        '{"k": "a", "v": 1}\n{"k": "a", "v": "x1"}\n': "column 'v' has a value that is not a number on line 2: 'x1'",
        '{"k": "a", "v": 1}\n\n{"k": "a", "v": true}\n': "column 'v' has a value that is not a number on line 3: 'true'",
        '{"k": "a", "v": 1}\n{"k": [1], "v": 1}\n': "column 'k' holds a JSON array on line 2, not a single value",
        '{"k": {"a": 1}}\n': "column 'k' holds a JSON object on line 1, not a single value",
        '{"k": "a"}\n[1, 2]\n': "line 2 is not a JSON object",
        '{"k": "a"}\n{"k": \n': "line 2 is not valid JSON: Expecting value",
        '{"x": 1}\n{"y": 2}\n': "column(s) 'k', 'v' occur in no line of the JSON-lines input",
    }
    for text, expected in cases.items():
        with pytest.raises(InputDataError) as info:
            run(text, ["k"], [{"op": "sum", "column": "v"}], fmt="jsonl", block_size=8)
        assert str(info.value) == expected


@pytest.mark.parametrize(
    "text, line",
    [
        ('null\n{"k": "a"}\n', 1),  # a block's first line `null` crashed pyarrow's reader (SIGSEGV)
        (' null\n{"k": "a"}\n', 1),
        ('{"k": "a"}\nnull\n', 2),  # pyarrow took it for a row of nulls: one row too many
        ('{"k": "a"}\n\nnull', 3),
        ('{"k": "a"}\ntrue\n', 2),
        ('{"k": "a"}\n"x"\n', 2),
        ('{"k": "a"}\n1\n', 2),
    ],
)
@pytest.mark.parametrize("native, pyarrow_reader", [(True, True), (False, True), (False, False)])
def test_a_jsonl_line_that_is_not_an_object_is_named_on_every_path(
    text: str, line: int, native: bool, pyarrow_reader: bool
) -> None:
    """The scanner, pyarrow's reader and the exact path give the same error, at every block size."""
    for block_size in (8, 64, options.DEFAULT_BLOCK_SIZE):
        with pytest.raises(InputDataError) as info:
            run(
                text,
                ["k"],
                fmt="jsonl",
                block_size=block_size,
                tuning={"native": native, "jsonl_pyarrow": pyarrow_reader},
            )
        assert str(info.value) == f"line {line} is not a JSON object"


def test_jsonl_numbers_keep_their_text_and_missing_keys_are_null() -> None:
    text = '{"k": 3, "v": 1.50}\n{"k": 3.10, "v": "2"}\n{"k": "3", "v": null}\n{"k": null}\n{"v": 1e1}\n'
    result = run(text, ["k"], [{"op": "count"}, {"op": "sum", "column": "v"}], fmt="jsonl")
    assert result.rows == [
        {"k": None, "count": 2, "sum_v": 10.0},
        {"k": "3", "count": 2, "sum_v": 1.5},
        {"k": "3.10", "count": 1, "sum_v": 2.0},
    ]


def test_jsonl_null_values_apply_to_strings() -> None:
    text = '{"k": "NA", "v": ""}\n{"k": "", "v": "NA"}\n{"k": "a", "v": 1}\n'
    result = run(text, ["k"], [{"op": "count"}, {"op": "count", "column": "v"}], fmt="jsonl")
    assert result.rows == [{"k": None, "count": 2, "count_v": 0}, {"k": "a", "count": 1, "count_v": 1}]


def test_jsonl_crlf_and_no_final_newline() -> None:
    text = '{"k": "a", "v": 1}\r\n{"k": "a", "v": 2}'
    assert run(text, ["k"], [{"op": "sum", "column": "v"}], fmt="jsonl").rows == [{"k": "a", "sum_v": 3.0}]


# --- JSON lines: the fast path (pyarrow) against the exact path (json per line) ---------------


@pytest.fixture
def exact_only() -> None:
    """Every JSON-lines block the scanner does not answer parsed by the exact path."""
    global TUNING
    TUNING = replace(TUNING, jsonl_pyarrow=False)


def count_exact_blocks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the first line of every block the exact path parses."""
    calls: list[int] = []
    exact = jsonl_exact.exact_frame  # what `jsonl_path` calls until patched

    def spy(plan: Any, block: bytes, first_line: int, nulls: frozenset[str]) -> Any:
        calls.append(first_line)
        return exact(plan, block, first_line, nulls)

    monkeypatch.setattr(jsonl_path, "exact_frame", spy)
    return calls


def generated_jsonl(rows: int, seed: int) -> tuple[str, list[dict[str, Any]]]:
    """Flat JSON lines as a typical export writes them, and each record's values as text."""
    rnd = random.Random(seed)
    lines, written = [], []
    for i in range(rows):
        record: dict[str, Any] = {
            "id": i,
            "station": rnd.choice(["ST1", "ST2", "é", "NA", "", None, 'q"x', "a,b"]),
            "level": rnd.choice([1, 2, 30, -4, None]),
            "flag": rnd.choice([True, False, None]),
            "temp": rnd.choice([None, round(rnd.gauss(10, 9), 2), rnd.randint(-5, 5), 1e-3, 2.5e10]),
            "note": rnd.choice(["x", "NA", None, ""]),
        }
        if i % 17 == 0:
            del record["temp"]
        lines.append(json.dumps(record, separators=(",", ":") if i % 2 else (", ", ": ")))
        written.append(
            {k: None if v is None else v if isinstance(v, str) else json.dumps(v) for k, v in record.items()}
        )
    return "\n".join(lines) + "\n", written


JSON_METRICS = [
    {"op": "count"},
    {"op": "count", "column": "note"},
    {"op": "count", "column": "flag"},
    {"op": "sum", "column": "temp"},
    {"op": "mean", "column": "temp"},
    {"op": "min", "column": "temp"},
    {"op": "max", "column": "level"},
]


@pytest.mark.pyarrow_path
@pytest.mark.parametrize("group_by", [("station",), ("level",), ("flag", "station"), ()])
def test_jsonl_fast_path_equals_exact_path_and_reference(
    monkeypatch: pytest.MonkeyPatch, group_by: tuple[str, ...]
) -> None:
    text, written = generated_jsonl(3000, seed=len(group_by))
    exact_blocks = count_exact_blocks(monkeypatch)
    fast = run(text, group_by, JSON_METRICS, fmt="jsonl", block_size=8192)
    assert exact_blocks == []  # every block went the fast way
    exact = run(text, group_by, JSON_METRICS, fmt="jsonl", block_size=8192, tuning={"jsonl_pyarrow": False})
    assert len(exact_blocks) > 10
    assert fast.input_rows == exact.input_rows == 3000
    assert fast.rows == exact.rows
    assert_same(fast.rows, reference(written, group_by, JSON_METRICS))


SUM_V = [{"op": "sum", "column": "v"}]


@pytest.mark.parametrize(
    ("text", "metrics", "expected"),
    [
        (  # a float key: its text as written
            '{"k": 3.10, "v": 1}\n{"k": 3.1, "v": 2}\n',
            SUM_V,
            [{"k": "3.1", "sum_v": 2.0}, {"k": "3.10", "sum_v": 1.0}],
        ),
        (
            '{"k": -0, "v": 1}\n{"k": 0, "v": 2}\n',
            SUM_V,
            [{"k": "-0", "sum_v": 1.0}, {"k": "0", "sum_v": 2.0}],
        ),
        ('{"k": 1e2}\n{"k": 100}\n', [{"op": "count"}], [{"k": "100", "count": 1}, {"k": "1e2", "count": 1}]),
        ('{"k": true}\n{"k": "true"}\n', [{"op": "count"}], [{"k": "true", "count": 2}]),
        (  # strings in a numeric column, mixed with numbers
            '{"k": "a", "v": 1}\n{"k": "a", "v": "NA"}\n{"k": "a", "v": " 2 "}\n',
            SUM_V,
            [{"k": "a", "sum_v": 3.0}],
        ),
        ('{"k": "a"}\n{"k": 2}\n', [{"op": "count"}], [{"k": "2", "count": 1}, {"k": "a", "count": 1}]),
        ('{"k": "a", "v": 1, "v": 5}\n', SUM_V, [{"k": "a", "sum_v": 5.0}]),  # the last one wins
        (  # indented, blank and CRLF lines
            '  {"k": "a", "v": 1}\n\n\t\n{"k": "b", "v": 2}\r\n',
            SUM_V,
            [{"k": "a", "sum_v": 1.0}, {"k": "b", "sum_v": 2.0}],
        ),
        (
            '{"k": "a", "v": null}\n{"k": "b"}\n{"k": "b", "v": {}}\n',
            [{"op": "count"}],
            [{"k": "a", "count": 1}, {"k": "b", "count": 2}],
        ),
    ],
)
@pytest.mark.parametrize("fast", [True, False])
def test_jsonl_what_the_fast_path_cannot_answer_is_parsed_exactly(
    text: str, metrics: list[dict[str, str]], expected: list[Any], fast: bool
) -> None:
    assert run(text, ["k"], metrics, fmt="jsonl", tuning={"jsonl_pyarrow": fast}).rows == expected


def test_jsonl_two_objects_on_a_line_are_refused_even_beside_a_blank_line(exact_only: None) -> None:
    text = '{"k": "a"}\n{"k": "b"}{"k": "c"}\n\n{"k": "d"}\n'
    with pytest.raises(InputDataError, match=r"^line 2 is not valid JSON: Extra data$"):
        run(text, ["k"], fmt="jsonl")


def test_jsonl_two_objects_on_a_line_are_refused_by_the_fast_path_too() -> None:
    text = '{"k": "a"}\n{"k": "b"} {"k": "c"}\n\n{"k": "d"}\n'
    with pytest.raises(InputDataError, match=r"^line 2 is not valid JSON: Extra data$"):
        run(text, ["k"], fmt="jsonl")


@pytest.mark.pyarrow_path
def test_jsonl_a_number_that_looks_like_a_null_value_keeps_the_exact_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exact_blocks = count_exact_blocks(monkeypatch)
    text = '{"k": 0, "v": 0}\n{"k": 1, "v": 2}\n'
    result = run(text, ["k"], [{"op": "count", "column": "v"}], fmt="jsonl", null_values=["0"])
    assert result.rows == [{"k": None, "count_v": 0}, {"k": "1", "count_v": 1}]
    assert exact_blocks == [1]


@pytest.mark.parametrize("fast", [True, False])
def test_jsonl_bad_value_deep_in_a_large_input_names_its_line_on_both_paths(fast: bool) -> None:
    good = [json.dumps({"k": f"g{i % 7}", "v": i * 0.5}) for i in range(5000)]
    for bad, message in [
        ('{"k": "g1", "v": "x1"}', "column 'v' has a value that is not a number on line 3778: 'x1'"),
        ('{"k": "g1", "v": true}', "column 'v' has a value that is not a number on line 3778: 'true'"),
        ('{"k": ["g1"], "v": 1}', "column 'k' holds a JSON array on line 3778, not a single value"),
        ('{"k": "g1", "v": 1', "line 3778 is not valid JSON: Expecting ',' delimiter"),
    ]:
        lines = [*good[:3000], "", *good[3000:3776], bad, *good[3776:]]
        with pytest.raises(InputDataError) as info:
            text = "\n".join(lines) + "\n"
            sums = [{"op": "sum", "column": "v"}]
            run(text, ["k"], sums, fmt="jsonl", block_size=4096, tuning={"jsonl_pyarrow": fast})
        assert str(info.value) == message


@pytest.mark.pyarrow_path
def test_jsonl_a_column_present_only_as_null_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    exact_blocks = count_exact_blocks(monkeypatch)
    text = "".join(json.dumps({"k": "a", "v": None, "w": i}) + "\n" for i in range(2000))
    result = run(text, ["k"], [{"op": "sum", "column": "v"}], fmt="jsonl", block_size=4096)
    assert result.rows == [{"k": "a", "sum_v": None}]
    assert exact_blocks == []
    missing = "".join(json.dumps({"k": "a", "w": i}) + "\n" for i in range(2000))
    with pytest.raises(InputDataError, match=r"column\(s\) 'v' occur in no line of the JSON-lines input"):
        run(missing, ["k"], [{"op": "sum", "column": "v"}], fmt="jsonl", block_size=4096)


@pytest.mark.parametrize("block_size", [16, 4096])
def test_jsonl_a_key_written_with_an_escape_is_seen_when_its_values_are_null(block_size: int) -> None:
    """`"k\\u00e9": null` is the key `ké` (differential fuzz, seed 4242): every path and block
    size counts it as present, none says the column occurs in no line."""
    text = b'{"k\\u00e9": null, "w": 1}\n{"k": "b", "w": 2}\n'
    for tuning in ({"native": True}, {"native": False}, {"native": False, "jsonl_pyarrow": False}):
        result = run(text, ["k\u00e9"], fmt="jsonl", block_size=block_size, tuning=tuning)
        assert result.rows == [{"k\u00e9": None, "count": 2}], tuning
    quoted = b'{"a\\"b": null}\n{"k": "b"}\n'  # an escaped quote in the key
    assert run(quoted, ['a"b'], fmt="jsonl", block_size=block_size).rows == [{'a"b': None, "count": 2}]


@pytest.mark.parametrize("fast", [True, False])
def test_jsonl_invalid_utf8_in_an_unused_field_is_an_error_on_both_paths(fast: bool) -> None:
    text = b'{"k": "a", "x": "ok"}\n{"k": "a", "x": "\xff"}\n'
    with pytest.raises(InputDataError, match=r"^line 2 is not valid JSON: 'utf-8' codec can't decode"):
        run(text, ["k"], fmt="jsonl", tuning={"jsonl_pyarrow": fast})


@pytest.mark.pyarrow_path
def test_jsonl_count_only_and_non_ascii_names_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    exact_blocks = count_exact_blocks(monkeypatch)
    text = "".join(json.dumps({"é": None, "n": i}, ensure_ascii=False) + "\n" for i in range(3000))
    assert run(text, [], fmt="jsonl", block_size=4096).rows == [{"count": 3000}]
    result = run(text, [], [{"op": "max", "column": "é"}], fmt="jsonl", block_size=4096)
    assert result.rows == [{"max_é": None}]
    assert exact_blocks == []


# --- property: random small tables -------------------------------------------------------------

KEYS = st.sampled_from(["a", "b", "a,b", 'q"x', "", "NA", "7", " a", "é", "line\nbreak"])
NUMBERS = st.one_of(
    st.sampled_from(["", "NA"]),
    st.integers(-1000, 1000).map(str),
    st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False).map(repr),
    st.decimals(-1000, 1000, places=3, allow_nan=False, allow_infinity=False).map(str),
)
ROWS = st.lists(st.tuples(KEYS, KEYS, NUMBERS, NUMBERS), max_size=60)
METRIC = st.sampled_from(
    [
        {"op": "count"},
        {"op": "count", "column": "x"},
        {"op": "count", "column": "g1"},
        {"op": "sum", "column": "x"},
        {"op": "mean", "column": "y"},
        {"op": "min", "column": "x"},
        {"op": "max", "column": "y"},
    ]
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    rows=ROWS,
    group_by=st.sampled_from([[], ["g1"], ["g2", "g1"]]),
    metrics=st.lists(METRIC, min_size=1, max_size=4, unique_by=lambda m: (m["op"], m.get("column"))),
    block_size=st.sampled_from([16, 100, 1 << 20]),
    fmt=st.sampled_from(["csv", "jsonl"]),
    json_numbers=st.booleans(),
)
def test_property_engine_equals_independent_computation(
    rows: list[tuple[str, str, str, str]],
    group_by: list[str],
    metrics: list[dict[str, str]],
    block_size: int,
    fmt: str,
    json_numbers: bool,
) -> None:
    records = [{"g1": g1, "g2": g2, "x": x, "y": y} for g1, g2, x, y in rows]
    if fmt == "csv":
        out = io.StringIO(newline="")
        writer = csv.DictWriter(out, ["g1", "g2", "x", "y"])
        writer.writeheader()
        writer.writerows(records)
        data = out.getvalue()
        expected_records = csv_records(data)
    else:

        def as_json(text: str) -> Any:
            # integers written as JSON numbers keep their text: 7 -> "7"
            is_int = json_numbers and text.lstrip("-").isdigit() and str(int(text)) == text
            return int(text) if is_int else text

        data = "".join(json.dumps({k: as_json(v) for k, v in r.items()}) + "\n" for r in records)
        expected_records = records
    result = run(data, group_by, metrics, fmt=fmt, block_size=block_size)
    assert result.input_rows == len(expected_records)
    assert_same(result.rows, reference(expected_records, group_by, metrics))


# --- bounds ------------------------------------------------------------------------------------


def test_a_csv_header_of_too_many_columns_is_refused() -> None:
    names = ",".join(f"c{i}" for i in range(options.MAX_CSV_COLUMNS + 1))
    with pytest.raises(InputDataError) as info:
        run(f"{names}\n" + "1," * options.MAX_CSV_COLUMNS + "1\n", ["c0"])
    assert str(info.value) == (
        f"the CSV header (line 1) has {options.MAX_CSV_COLUMNS + 1} columns: "
        f"more than {options.MAX_CSV_COLUMNS} are refused"
    )


def test_a_csv_header_at_the_column_bound_is_read() -> None:
    names = ",".join(f"c{i}" for i in range(options.MAX_CSV_COLUMNS))
    result = run(f"{names}\n" + ",".join(["a"] * options.MAX_CSV_COLUMNS) + "\n", ["c0"])
    assert result.rows == [{"c0": "a", "count": 1}]


def test_json_types_are_guessed_from_the_first_lines_only() -> None:
    lines = [json.dumps({f"key{i}": 1, "k": "a", "v": 1}).encode() for i in range(3 * options.GUESS_LINES)]
    data = b"\n".join(lines) + b"\n"
    prefix = jsonl_path._guess_prefix(pa.py_buffer(data))
    assert prefix is not None and prefix.to_pybytes().count(b"\n") == options.GUESS_LINES
    result = run(data, ["k"], [{"op": "sum", "column": "v"}], fmt="jsonl")
    assert result.rows == [{"k": "a", "sum_v": 3.0 * options.GUESS_LINES}]


def test_a_json_block_whose_first_line_is_longer_than_the_guess_is_read_exactly() -> None:
    wide = {f"key{i}": i for i in range(options.GUESS_BYTES // 8)}
    data = json.dumps({**wide, "k": "a", "v": 2}).encode() + b'\n{"k": "b", "v": 3}\n'
    assert jsonl_path._guess_prefix(pa.py_buffer(data)) is None
    result = run(data, ["k"], [{"op": "sum", "column": "v"}], fmt="jsonl")
    assert result.rows == [{"k": "a", "sum_v": 2.0}, {"k": "b", "sum_v": 3.0}]


def test_the_vectorised_quote_check_is_the_grammar_s() -> None:
    rng = random.Random(19)
    pieces = [b'"', b",", b"\n", b"\r", b"a", b'""', b'"a"', b"\r\n"]
    for _ in range(3000):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 12)))
        match = csv_check._CSV_QUOTES.match(data)
        by_grammar = match is not None and match.end() == len(data)
        assert csv_check._quotes_in_place_np(np.frombuffer(data, np.uint8)) == by_grammar, data
