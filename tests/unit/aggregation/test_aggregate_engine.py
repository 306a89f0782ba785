"""The inline aggregate engine (pure, over in-memory streams) against an independent computation
(`aggregate_support.reference`): generated inputs, the rules one at a time, random small tables,
the bounds. Bad input: test_aggregate_bad_input.py; the JSON-lines paths: test_aggregate_jsonl_paths.py."""

from __future__ import annotations

import csv
import io
import json
import random
import sys
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.aggregation import csv_check, csv_path, jsonl_path, options
from shared.core.errors import InputDataError
from tests.unit.aggregation.aggregate_support import (
    ALL_METRICS,
    assert_same,
    csv_records,
    generated_csv,
    reference,
    run,
    scanner,  # noqa: F401 (the autouse fixture: every test with and without the scanner)
)


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
    native = csv_path.quote_counter()
    with_numpy = csv_path.quote_counter(native=False)
    monkeypatch.setitem(sys.modules, "numpy", None)  # import fails, as on a cluster without it
    without = csv_path.quote_counter(native=False)
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
    prefix = jsonl_path.guess_prefix(pa.py_buffer(data))
    assert prefix is not None and prefix.to_pybytes().count(b"\n") == options.GUESS_LINES
    result = run(data, ["k"], [{"op": "sum", "column": "v"}], fmt="jsonl")
    assert result.rows == [{"k": "a", "sum_v": 3.0 * options.GUESS_LINES}]


def test_a_json_block_whose_first_line_is_longer_than_the_guess_is_read_exactly() -> None:
    wide = {f"key{i}": i for i in range(options.GUESS_BYTES // 8)}
    data = json.dumps({**wide, "k": "a", "v": 2}).encode() + b'\n{"k": "b", "v": 3}\n'
    assert jsonl_path.guess_prefix(pa.py_buffer(data)) is None
    result = run(data, ["k"], [{"op": "sum", "column": "v"}], fmt="jsonl")
    assert result.rows == [{"k": "a", "sum_v": 2.0}, {"k": "b", "sum_v": 3.0}]


def test_the_vectorised_quote_check_is_the_grammar_s() -> None:
    rng = random.Random(19)
    pieces = [b'"', b",", b"\n", b"\r", b"a", b'""', b'"a"', b"\r\n"]
    for _ in range(3000):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 12)))
        match = csv_check._CSV_QUOTES.match(data)
        by_grammar = match is not None and match.end() == len(data)
        assert csv_check.quotes_in_place_np(np.frombuffer(data, np.uint8)) == by_grammar, data
