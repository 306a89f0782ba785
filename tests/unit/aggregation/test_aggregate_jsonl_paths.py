"""JSON lines: the fast path (pyarrow) against the exact path (json per line) and the reference."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

import pytest

from shared.aggregation import jsonl_exact, jsonl_path
from shared.core.errors import InputDataError
from tests.unit.aggregation import aggregate_support
from tests.unit.aggregation.aggregate_support import (
    assert_same,
    reference,
    run,
    scanner,  # noqa: F401 (the autouse fixture: every test with and without the scanner)
)

# --- JSON lines: the fast path (pyarrow) against the exact path (json per line) ---------------


@pytest.fixture
def exact_only() -> None:
    """Every JSON-lines block the scanner does not answer parsed by the exact path."""
    aggregate_support.TUNING = replace(aggregate_support.TUNING, jsonl_pyarrow=False)


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
