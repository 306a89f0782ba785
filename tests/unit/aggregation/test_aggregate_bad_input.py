"""The aggregate engine on bad input: each problem named with its column, value and line, the first
bad record in file order reported whatever finishes first."""

from __future__ import annotations

import io
from typing import Any

import pytest

from shared.aggregation import aggregate_stream, options
from shared.core.errors import InputDataError, PermanentError
from tests.unit.aggregation.aggregate_support import (
    ALL_METRICS,
    assert_same,
    csv_records,
    generated_csv,
    make_spec,
    reference,
    run,
    scanner,  # noqa: F401 (the autouse fixture: every test with and without the scanner)
    tuned,
)

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
