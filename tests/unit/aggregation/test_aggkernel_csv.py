"""The C scanner (native/, `aggkernel`) on CSV against the Python (pyarrow) path it stands in for.

Every answer the scanner gives must be the Python path's; where it is not sure it must say so
(None), and the engine then gives the Python path's answer or error. The scanner is part of the
build (`make install`), so it is imported, not skipped: a broken build fails here.
"""

from __future__ import annotations

import csv
import io
import math
import struct
from typing import Any

import aggkernel
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devstack.datagen import wide_csv_lines, wide_jsonl_lines
from shared.aggregation import EngineOptions, aggregate_stream, csv_path, jsonl_path, parse_aggregate_payload
from shared.core.errors import InputDataError

METRICS = [
    {"op": "count"},
    {"op": "count", "column": "x"},
    {"op": "sum", "column": "x"},
    {"op": "mean", "column": "y"},
    {"op": "min", "column": "y"},
    {"op": "max", "column": "x"},
]
METRICS_X = [m for m in METRICS if m.get("column") != "y"]


def outcome(
    data: bytes,
    group_by: list[str],
    native: bool,
    block_size: int = 1 << 20,
    metrics: Any = None,
    **extra: Any,
) -> Any:
    """The engine's rows and input rows, or the error it raises, with the scanner on or off."""
    spec = parse_aggregate_payload(
        {"input": "data/in", "format": "csv", "group_by": group_by, "metrics": metrics or METRICS, **extra}
    )
    try:
        result = aggregate_stream(
            io.BytesIO(data), spec, options=EngineOptions(block_size=block_size, native=native)
        )
    except InputDataError as exc:
        return ("error", str(exc))
    return (result.input_rows, result.rows)


def assert_same_outcome(data: bytes, group_by: list[str], **extra: Any) -> Any:
    python = outcome(data, group_by, native=False, **extra)
    native = outcome(data, group_by, native=True, **extra)
    assert native[0] == python[0], (native, python)
    if python[0] == "error":
        assert native == python
        return python
    assert len(native[1]) == len(python[1])
    for got, want in zip(native[1], python[1], strict=True):
        assert list(got) == list(want)
        for name, w in want.items():
            g = got[name]
            if isinstance(w, float) and isinstance(g, float) and math.isnan(w):
                assert math.isnan(g), (name, got, want)
            elif isinstance(w, float) and isinstance(g, float):
                assert math.isclose(g, w, rel_tol=1e-12, abs_tol=1e-12), (name, got, want)
            else:
                assert g == w and type(g) is type(w), (name, got, want)
    return python


def scan(
    data: bytes,
    names: list[str],
    keys: list[str],
    numeric: list[str],
    nulls: tuple[bytes, ...] = (b"", b"NA"),
) -> Any:
    """aggkernel.csv_reduce on header-less records, needed columns = keys + numeric."""
    needed = list(dict.fromkeys(keys + numeric))
    cols = tuple(needed.index(n) if n in needed else -1 for n in names)
    return aggkernel.csv_reduce(
        data,
        cols,
        tuple(needed.index(k) for k in keys),
        tuple(needed.index(n) for n in numeric),
        tuple(1 for _ in numeric),
        nulls,
    )


# --- numbers: the scanner's grammar is a subset of what pyarrow reads, and equal on it ----------

NUMBER_TEXTS = [
    "0",
    "-0",
    "007",
    "1.5",
    "-2.25",
    "1e3",
    "1E-3",
    "2.5e+10",
    "1.",
    ".5",
    "+1",
    "1e",
    "e3",
    "--1",
    "inf",
    "-inf",
    "nan",
    "NaN",
    "Infinity",
    "0x10",
    "1_000",
    "1,5",
    " 12 ",
    "\t3\t",
    "1e400",
    "-1e400",
    "1e-400",
    "4.9e-324",
    "2.2250738585072014e-308",
    "1.7976931348623157e308",
    "9007199254740993",
    "123456789012345678901234567890",
    "0.1000000000000000055511151231257827",
    "3.14159265358979323846",
    "1e22",
    "1e23",
    "12345678901234567e-5",
    "",
    "NA",
    "abc",
    "1.5x",
    "\u0661",  # an Arabic-Indic digit one
]


@pytest.mark.parametrize("text", NUMBER_TEXTS)
def test_each_number_text_gives_what_the_python_path_gives(text: str) -> None:
    rows = "".join(f"g{i % 2},{text},{text}\n" for i in range(4))
    assert_same_outcome(f"k,x,y\n{rows}".encode(), ["k"])


def test_plain_numbers_are_read_by_the_scanner() -> None:
    data = b"a,1.5,7\nb,-2e3,NA\na,,0.125\n"
    out = scan(data, ["k", "x", "y"], ["k"], ["x", "y"])
    assert out is not None
    rows, groups, count_all, _keys, values = out
    assert (rows, groups) == (3, 2)
    assert pa.py_buffer(count_all).to_pybytes() == pa.array([2, 1], pa.int64()).buffers()[1].to_pybytes()
    sums = pa.Array.from_buffers(pa.float64(), groups, [None, pa.py_buffer(values[0][1])]).to_pylist()
    assert sums == [1.5, -2000.0]


DECIMALS = st.builds(
    lambda sign, whole, frac: f"{sign}{whole}{'.' + frac if frac is not None else ''}",
    st.sampled_from(["", "-"]),
    st.text("0123456789", min_size=1, max_size=18),
    st.none() | st.text("0123456789", min_size=1, max_size=18),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(DECIMALS, min_size=1, max_size=40))
def test_decimals_are_read_exactly_as_float_reads_them(texts: list[str]) -> None:
    """Every plain decimal (up to 36 digits, with or without a fraction) is the double Python's
    float() gives, bit for bit: the scanner's short-number fast path and its general path alike."""
    data = "".join(f"g{i},{text}\n" for i, text in enumerate(texts)).encode()
    out = scan(data, ["k", "x"], ["k"], ["x"])
    assert out is not None
    _rows, groups, _count_all, _keys, values = out
    high = values[0][3]  # one value a group: its max is the value itself (a sum would add it to 0.0)
    got = pa.Array.from_buffers(pa.float64(), groups, [None, pa.py_buffer(high)]).to_pylist()
    want = [float(text) for text in texts]
    assert [math.copysign(1, g) for g in got] == [math.copysign(1, w) for w in want]
    assert got == want


# --- what the scanner leaves to the Python path ---------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"a,1\nb\n",  # too few fields
        b"a,1,2\n",  # too many
        b'a,5" screen\n',  # a quote inside an unquoted field
        b'"a"x,1\n',  # text after a closing quote
        b'"a,1\n',  # an unterminated quote
        b"\xff\xfe,1\n",  # a key that is not UTF-8
        b"a,inf\n",  # a number outside the scanner's grammar
        b"\n\r\n",  # no record at all
    ],
)
def test_what_the_scanner_is_unsure_of_is_left_to_the_python_path(data: bytes) -> None:
    assert scan(data, ["k", "x"], ["k"], ["x"]) is None
    assert_same_outcome(b"k,x\n" + data, ["k"], metrics=METRICS_X)


def test_quoting_line_endings_and_empty_lines_are_read_by_the_scanner() -> None:
    data = b'"a,b",1\r\n\r\n"say ""hi""",2\r"multi\nline",3\n\nc,4'
    out = scan(data, ["k", "x"], ["k"], ["x"])
    assert out is not None and out[0] == 4
    python = assert_same_outcome(b"k,x\n" + data, ["k"], metrics=METRICS_X)
    assert [r["k"] for r in python[1]] == ["a,b", "c", "multi\nline", 'say "hi"']
    assert [r["sum_x"] for r in python[1]] == [1.0, 4.0, 3.0, 2.0]


def test_records_with_far_too_many_fields_and_wide_headers() -> None:
    """A record with many more commas than the header has fields is left to the Python path
    (the scanner counts a word's commas before checking); a header of 300 fields is read."""
    assert scan(b"a,1\n" + b"b," + b",".join([b"1"] * 200) + b"\n", ["k", "x"], ["k"], ["x"]) is None
    names = ["k", *[f"c{i}" for i in range(298)], "x"]
    row = b"a," + b",".join(b"7" for _ in range(298)) + b",2.5\n"
    out = scan(row * 3, names, ["k"], ["x"])
    assert out is not None and out[0] == 3
    assert scan(row + row[:-5] + b"\n", names, ["k"], ["x"]) is None  # a field short


def test_a_quoted_field_after_plain_ones_is_read_by_the_scanner() -> None:
    """Quoted fields are stepped over by the record's word masks: the fields after them too."""
    data = b'a,1,"x,y",2\nb,2,"say ""z""",3\nc,3,plain,4\n"d",4,"",5\r\n'
    out = scan(data, ["k", "x", "u", "y"], ["k"], ["x", "y"])
    assert out is not None and out[0] == 4
    python = assert_same_outcome(b"k,x,u,y\n" + data, ["k"])
    assert [r["sum_x"] for r in python[1]] == [1.0, 2.0, 3.0, 4.0]
    assert scan(b'a,1,"x",2,9\n', ["k", "x", "u", "y"], ["k"], ["x", "y"]) is None  # a field too many


def test_a_quoted_last_field_is_read_by_the_scanner_at_every_word_offset() -> None:
    """A quoted last field whose quotes, pairs, commas and line breaks land at every offset of a
    64-byte word (a pair across two words): the scanner answers, as the Python path does."""
    lines = []
    for pad in range(70):
        v = "v" * pad
        lines.append(f'{v},{pad},"{v}, x ""q"" y"\n')
        lines.append(f'{v},{pad},"{v}""\r\n"""\r\n')
        lines.append(f'{v},{pad},""\n')
    data = "".join(lines).encode() + b'z,1,"end, no break"'
    names = ["k", "x", "u"]
    for keys in (["k"], ["u"], ["u", "k"]):
        out = scan(data, names, keys, ["x"])
        assert out is not None and out[0] == 3 * 70 + 1, keys
        python = assert_same_outcome(b"k,x,u\n" + data, keys, metrics=METRICS_X)
        assert sum(r["count"] for r in python[1]) == 3 * 70 + 1
    assert scan(b'a,1,"x"\nb,2,"y,""z"""', names, ["u"], ["x"]) is not None


@pytest.mark.parametrize(
    "data",
    [
        b'a,1,"x"y\n',  # text after the closing quote of the last field
        b'a,1,"x",\n',  # a comma after it: a field too many
        b'a,1,"x","y"\n',  # a quoted field too many
        b'a,1,"x\n',  # unterminated at the block's end
        b'a,1,"',  # the opening quote is the block's last byte
        b'a,1,"x""',  # a pair at the end, unterminated
        b'a,"1","x"\nb,1\n',  # a record a field short after a quoted one
        b'a,1,x"y"\n',  # a quote inside the unquoted last field
    ],
)
def test_a_quoted_last_field_out_of_place_is_left_to_the_python_path(data: bytes) -> None:
    assert scan(data, ["k", "x", "u"], ["k"], ["x"]) is None
    assert_same_outcome(b"k,x,u\n" + data, ["k"], metrics=METRICS_X)


def test_a_quoted_field_before_the_fields_read_is_skipped_at_every_word_offset() -> None:
    """A quoted field before the fields read (commas, pairs and line breaks inside, landing at
    every offset of a 64-byte word) is stepped over: the fields after it, the record's end and
    the count of fields are as the Python path reads them."""
    lines = []
    for pad in range(70):
        v = "v" * pad
        lines.append(f'{v},"{v}, x ""q""\n y",{pad}\n')
        lines.append(f'{v},"{v}""\r\n""",{pad}\r\n')
        lines.append(f'{v},"",{pad}\n')
        lines.append(f'{v},"a",{pad}\n')
    data = "".join(lines).encode() + b'z,"end, no break",1'
    names = ["k", "u", "x"]
    out = scan(data, names, ["k"], ["x"])
    assert out is not None and out[0] == 4 * 70 + 1
    python = assert_same_outcome(b"k,u,x\n" + data, ["k"], metrics=METRICS_X)
    assert sum(r["count"] for r in python[1]) == 4 * 70 + 1
    assert python[1][-1]["k"] == "z" and python[1][-1]["sum_x"] == 1.0


@pytest.mark.parametrize(
    "data",
    [
        b'a,"x"y,1\n',  # text after the closing quote
        b'a,x"y",1\n',  # a quote inside an unquoted field
        b'a,"x,1\n',  # unterminated at the block's end
        b'a,"x",1,2\n',  # a field too many after it
        b'a,"x"\n',  # a field short after it
        b'a,"x""",1\nb,"y"",2\n',  # a pair, then one left open
    ],
)
def test_a_quoted_field_out_of_place_before_the_fields_read_is_left_to_the_python_path(data: bytes) -> None:
    assert scan(data, ["k", "u", "x"], ["k"], ["x"]) is None
    assert_same_outcome(b"k,u,x\n" + data, ["k"], metrics=METRICS_X)


def test_the_wide_benchmark_file_is_read_by_the_scanner_alone() -> None:
    text = "".join(wide_csv_lines(3000)).encode()
    header, _, body = text.partition(b"\n")
    names = header.decode().split(",")
    key, numbers = names[2], [n for n in names if n.startswith(("temp", "wind", "precip"))][:3]
    assert numbers, names
    assert scan(body, names, [key], numbers) is not None
    assert_same_outcome(text, [key], block_size=4096)


# --- groups and values: the scanner's table --------------------------------------------------


def short_keys() -> list[str]:
    """Keys the table tells apart by their two words and length: runs of one byte at every length
    around 8 and 16 (the same words, other lengths), keys differing in one middle byte, keys of 16
    and 17 bytes that share their first 16, and thousands more (the table grows)."""
    keys = [c * n for c in "a\x01" for n in range(1, 21)]
    keys += [("x" * n)[: n // 2] + "y" + ("x" * n)[n // 2 + 1 :] for n in range(2, 18)]
    keys += ["0123456789abcdef", "0123456789abcdefg", "0123456789abcdeg", "é" * 8, "é" * 9]
    return keys + [f"k{i}" for i in range(3000)]


def test_short_keys_alike_in_their_words_are_told_apart() -> None:
    keys = short_keys()
    assert len(set(keys)) == len(keys)
    records = [f"{k},{i % 7}.5\n".encode() for i, k in enumerate(keys)]
    data = b"".join(records + records[::-1])  # each key twice, in two orders
    out = scan(data, ["k", "x"], ["k"], ["x"])
    assert out is not None and out[0] == 2 * len(keys)
    python = assert_same_outcome(b"k,x\n" + data, ["k"], metrics=METRICS_X)
    assert sorted(r["k"] for r in python[1]) == sorted(keys)
    assert all(r["count"] == 2 for r in python[1])


@pytest.mark.parametrize("nulls", [["", "NA"], ["NA", "0"], [" -1 "], ["7"]])
def test_null_texts_that_read_as_numbers_are_null(nulls: list[str]) -> None:
    """A numeric column is read as a number before it is compared with the null texts, unless a
    null text reads as one: then a field equal to it is null, not that number."""
    values = ["0", "-1", "7", " -1 ", *nulls]
    body = "".join(f"a,{v},1\nb,2,{v}\n" for v in values).encode()
    out = scan(body, ["k", "x", "y"], ["k"], ["x", "y"], tuple(n.encode() for n in nulls))
    assert out is not None and out[0] == 2 * len(values)
    python = assert_same_outcome(b"k,x,y\n" + body, ["k"], null_values=nulls)
    a = next(r for r in python[1] if r["k"] == "a")
    numbers = [float(v) for v in values if v not in nulls]
    assert a["count_x"] == len(numbers) and a["sum_x"] == sum(numbers)


def test_a_group_whose_values_are_all_null_has_null_extremes() -> None:
    """The scanner's extremes start out infinite; a group with no value answers 0.0 (and null)."""
    data = b"k,x,y\na,1,-0\nb,NA,NA\na,-2.5,0\nb,,\nc,3,2\n"
    out = scan(data.partition(b"\n")[2], ["k", "x", "y"], ["k"], ["x", "y"])
    assert out is not None
    for count, _, low, high, _, nulls in out[4]:
        assert nulls == 1 and struct.unpack("<3q", count)[1] == 0
        assert struct.unpack("<3d", low)[1] == 0.0 and struct.unpack("<3d", high)[1] == 0.0
    python = assert_same_outcome(data, ["k"])
    b = next(r for r in python[1] if r["k"] == "b")
    assert b["count_x"] == 0 and b["sum_x"] is None and b["max_x"] is None and b["min_y"] is None
    a = next(r for r in python[1] if r["k"] == "a")
    assert a["max_x"] == 1.0 and a["min_y"] == 0.0 and a["count"] == 2


# --- property: random CSV, scanner on and off -----------------------------------------------

FIELDS = st.sampled_from(
    [
        "a",
        "b",
        "",
        "NA",
        "7",
        "-0",
        "1.5",
        " 2 ",
        "1e3",
        "x y",
        "é",
        "a,b",
        'q"x',
        "line\nbreak",
        "inf",
        "1.",
        "+3",
    ]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(st.lists(FIELDS, min_size=3, max_size=3), max_size=40),
    group_by=st.sampled_from([[], ["k"], ["x", "k"]]),
    terminator=st.sampled_from(["\n", "\r\n", "\r"]),
    blank_lines=st.booleans(),
    ragged=st.booleans(),
    block_size=st.sampled_from([16, 64, 1 << 20]),
    nulls=st.sampled_from([["", "NA"], ["NA", "7"], [" 2 ", ""], ["-0"]]),
)
def test_property_scanner_on_and_off_give_the_same_answer(
    rows: list[list[str]],
    group_by: list[str],
    terminator: str,
    blank_lines: bool,
    ragged: bool,
    block_size: int,
    nulls: list[str],
) -> None:
    out = io.StringIO(newline="")
    writer = csv.writer(out, lineterminator=terminator)
    writer.writerow(["k", "x", "y"])
    for i, row in enumerate(rows):
        writer.writerow(row[:2] if ragged and i == len(rows) // 2 else row)
        if blank_lines and i % 3 == 0:
            out.write(terminator)
    assert_same_outcome(out.getvalue().encode(), group_by, block_size=block_size, null_values=nulls)


@pytest.mark.parametrize("size", [0, 15, 16, 4080, 4081, 100_000])
def test_count_byte_counts_every_occurrence(size: int) -> None:
    dense = bytearray(b'"' * size)  # every byte counted: past the 255-step per-byte counters
    assert aggkernel.count_byte(dense, 34, 0, size) == size
    mixed = bytearray(b'a"\n' * (size // 3 + 1))
    for start, end in [(0, len(mixed)), (1, len(mixed) - 1), (2, 2)]:
        assert aggkernel.count_byte(mixed, 34, start, end) == mixed.count(b'"', start, end)
    with pytest.raises(ValueError):
        aggkernel.count_byte(dense, 34, 0, size + 1)


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_the_engine_hands_clean_blocks_to_the_scanner_alone(
    monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    """End to end: on the benchmark's wide file no block reaches the Python path's parsers."""

    def python_path(*args: Any) -> Any:
        raise AssertionError("a clean block went to the Python path")

    monkeypatch.setattr(csv_path.CsvParser, "_read", python_path)
    monkeypatch.setattr(jsonl_path.JsonParser, "_fast", python_path)
    monkeypatch.setattr(jsonl_path, "exact_frame", python_path)
    lines = wide_csv_lines(20_000) if fmt == "csv" else wide_jsonl_lines(20_000)
    data = "".join(lines).encode()
    spec = parse_aggregate_payload(
        {
            "input": "data/in",
            "format": fmt,
            "group_by": ["station"],
            "metrics": [
                {"op": "count"},
                {"op": "mean", "column": "temp"},
                {"op": "max", "column": "wind_speed"},
            ],
        }
    )
    result = aggregate_stream(io.BytesIO(data), spec, options=EngineOptions(block_size=64 * 1024))
    assert result.input_rows == 20_000
    assert sum(row["count"] for row in result.rows) == 20_000
