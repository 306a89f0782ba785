"""aggkernel.jsonl_reduce (the C JSON-lines scanner) against the engine's exact JSON-lines path.

For every block the kernel either returns None (the caller then runs the Python path) or exactly
the exact path's partial aggregates: groups, row counts, value counts, sums (to rounding),
minima, maxima, the records read and the columns seen. Where the exact path raises, the kernel
must return None. Common clean inputs must not fall back.
"""

from __future__ import annotations

import io
import json
import math
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.aggregation import (
    AggregateSpec,
    EngineOptions,
    MetricSpec,
    aggregate_stream,
    parse_aggregate_payload,
)
from shared.aggregation.jsonl_exact import exact_frame
from shared.aggregation.plan import Accumulator, Plan
from shared.core.errors import InputDataError

aggkernel = pytest.importorskip("aggkernel")

DEFAULT_NULLS = ("", "NA")
# group by g; numeric metrics over x; s only counted
METRICS = (("count", None), ("sum", "x"), ("mean", "x"), ("min", "x"), ("max", "x"), ("count", "s"))


def plan_of(
    group_by: tuple[str, ...], metrics: tuple[tuple[str, str | None], ...], nulls: tuple[str, ...]
) -> Plan:
    spec = AggregateSpec(
        container="c",
        blob="b.jsonl",
        format="jsonl",
        group_by=group_by,
        metrics=tuple(MetricSpec(op, column, f"m{i}") for i, (op, column) in enumerate(metrics)),  # type: ignore[arg-type]
        null_values=nulls,
    )
    return Plan.of(spec)


def kernel(plan: Plan, block: bytes, nulls: tuple[str, ...]) -> Any:
    columns = plan.columns
    return aggkernel.jsonl_reduce(
        block,
        tuple(c.encode() for c in columns),
        tuple(columns.index(k) for k in plan.keys),
        tuple(columns.index(v) for v in plan.values),
        tuple(int(v in plan.numeric) for v in plan.values),
        tuple(n.encode() for n in nulls),
    )


def decode(
    plan: Plan, out: Any
) -> tuple[int, frozenset[str], dict[tuple[str | None, ...], tuple[int, list[Any]]], int]:
    """(rows, columns seen, {key: (rows, [(count, sum, min, max) per value column])}, line breaks)."""
    rows, ngroups, count_all, keys, values, seen, breaks = out
    counts = struct.unpack(f"={ngroups}q", count_all)
    key_columns = []
    for offsets_raw, data, validity, _ in keys:
        offsets = struct.unpack(f"={ngroups + 1}i", offsets_raw)
        key_columns.append(
            [
                data[offsets[g] : offsets[g + 1]].decode()
                if validity is None or validity[g // 8] >> g % 8 & 1
                else None
                for g in range(ngroups)
            ]
        )
    value_columns = []
    for count, total, low, high, _, _ in values:
        value_columns.append(
            list(
                zip(
                    struct.unpack(f"={ngroups}q", count),
                    struct.unpack(f"={ngroups}d", total),
                    struct.unpack(f"={ngroups}d", low),
                    struct.unpack(f"={ngroups}d", high),
                    strict=True,
                )
            )
        )
    groups = {}
    for g in range(ngroups):
        key = tuple(column[g] for column in key_columns)
        assert key not in groups, f"group {key} twice"
        groups[key] = (counts[g], [column[g] for column in value_columns])
    names = frozenset(c for i, c in enumerate(plan.columns) if seen >> i & 1)
    return rows, names, groups, breaks


def reference(plan: Plan, block: bytes, nulls: tuple[str, ...]) -> tuple[int, frozenset[str], dict[Any, Any]]:
    frame, seen = exact_frame(plan, block, 1, frozenset(nulls))
    partial = Accumulator(plan).reduce(frame)
    groups = {}
    for row in partial.to_pylist():
        if row["count_all"]:  # no group columns: one row even for no records
            groups[tuple(row[f"k{i}"] for i in range(len(plan.keys)))] = row
    return frame.num_rows, seen, groups


def check(
    lines: bytes,
    group_by: tuple[str, ...] = ("g",),
    metrics: tuple[tuple[str, str | None], ...] = METRICS,
    nulls: tuple[str, ...] = DEFAULT_NULLS,
) -> bool:
    """The kernel's answer is None or the exact path's; True when it answered."""
    plan = plan_of(group_by, metrics, nulls)
    out = kernel(plan, lines, nulls)
    try:
        expected_rows, expected_seen, expected = reference(plan, lines, nulls)
    except (InputDataError, ValueError, RecursionError):  # bad input (or a lone surrogate)
        assert out is None, f"the exact path raises, the kernel answered: {lines!r}"
        return False
    if out is None:
        return False
    rows, seen, groups, breaks = decode(plan, out)
    assert rows == expected_rows, lines
    assert seen == expected_seen, lines
    assert breaks == lines.count(b"\n"), lines  # what the engine numbers lines by
    assert set(groups) == set(expected), lines
    for key, row in expected.items():
        count_all, stats = groups[key]
        assert count_all == row["count_all"], (key, lines)
        for column, func, _ in plan.partial:
            count, total, low, high = stats[int(column[1:])]
            want = row[f"{column}_{func}"]
            if func == "count":
                assert count == want, (key, column, lines)
            elif count == 0:
                assert want is None, (key, column, lines)
            elif func == "sum":
                scale = max(abs(low), abs(high)) * count
                assert math.isclose(total, want, rel_tol=1e-9, abs_tol=1e-9 * scale), (key, column, lines)
            else:
                assert (low if func == "min" else high) == want, (key, column, func, lines)
    return True


# --- hand-written cases -------------------------------------------------------------------------

CLEAN = [
    b'{"g":"a","x":1,"s":"q"}\n{"g":"b","x":2.5,"s":"r"}\n{"g":"a","x":-3e2,"s":null}\n',
    b'{"g": "a", "x": -0.5e3 , "s" : "q" }\r\n{ "g":"a" }\r\n',
    b'{"g":3.10,"x":"2.5"}\n{"g":"3.10","x":" 4 "}\n{"g":3,"x":1}\n{"g":"3","x":"1E2"}\n',
    b'{"g":-0,"x":-0}\n{"g":0,"x":0.0}\n{"g":"-0","x":"-0.0"}\n',
    b'{"g":null,"x":null,"s":null}\n{"g":"NA","x":"NA","s":"NA"}\n{"g":"","x":"","s":""}\n',
    b'{}\n{"other":1}\n{"g":"a"}\n',
    b'{"g":"a","n":{"a":[1,{"b":null},[],{}],"c":"d\\"e"},"x":2,"arr":[true,false,null,-1.5e-3]}\n',
    b'{"u":"a\\"b\\\\c\\/\\n\\t\\b\\f\\r\\u00e9\\ud83d\\ude00","g":"a","x":1}\n',
    b'\n\n  \n\t\r\n{"g":"a","x":1}\n\n',
    b'{"g":true,"s":false}\n{"g":false,"s":true}\n{"g":"true","x":1}\n',
    b'{"g":"a\\"b\\tc\\\\d\\/","x":1}\n{"g":"a\\"b\\tc\\\\d/","x":2}\n',
    b'{"g":"\\u00e9\\u20ac\\ud83d\\ude00","x":1}\n{"g":"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80","x":2}\n',
    b'{"g":"\\u0000x","x":1}\n',
    b'{"g":"\\b\\f\\n\\r\\t","x":1}\n{"g":"\\u0008\\u000c\\u000a\\u000d\\u0009","x":2}\n{"g":"bfnrt"}\n',
    '{"g":"é€😀 ß","x":1,"ü":"ä"}\n'.encode(),
    b'{"g":"a","x":1}',
    b'{"g":"a","x":1}\n{"g":"b","x":12345678901234567890}\n{"g":"b","x":1.7976931348623157e308}\n',
    b'{"g":"a","x":0.1}\n{"g":"a","x":0.2}\n{"g":"a","x":1e-300}\n{"g":"a","x":123456.789e-3}\n',
    b'{"g":"a","u":{"deep":[[[[[[1]]]]]]},"x":"007"}\n',
]


@pytest.mark.parametrize("lines", CLEAN)
def test_clean_inputs_are_answered_exactly(lines: bytes) -> None:
    assert check(lines), f"fell back: {lines!r}"


def test_two_group_columns_and_a_column_both_key_and_value() -> None:
    lines = b'{"g":"a","h":1,"x":2}\n{"g":"a","h":"1","x":3}\n{"g":"b","h":null}\n{"h":2.5}\n'
    assert check(lines, ("g", "h"), (("sum", "h"), ("count", "x"), ("max", "x")))


def test_no_columns_needed() -> None:
    assert check(b'{"a":1}\n\n{"b":[1,2]}\n', (), (("count", None),))


@pytest.mark.parametrize("block", [b"", b"\n \n", b"\r\n\t\n"])
def test_a_block_without_a_record_is_left_to_the_python_path(block: bytes) -> None:
    # the Python path gives the empty partial (one row for the global group)
    for group_by in [("g",), ()]:
        assert kernel(plan_of(group_by, (("count", None),), DEFAULT_NULLS), block, DEFAULT_NULLS) is None


def test_nulls_apply_to_strings_and_numbers_not_to_booleans() -> None:
    nulls = ("0", "true", "null")
    lines = b'{"g":0,"x":0}\n{"g":"0","x":"0"}\n{"g":true,"x":1}\n{"g":"true"}\n{"g":"null","x":null}\n'
    assert check(lines, nulls=nulls)
    assert check(lines, nulls=())


def test_wide_generated_lines() -> None:
    rows = []
    for i in range(2000):
        rows.append(
            json.dumps(
                {
                    "id": i,
                    "station": f"ST{i % 37:03d}",
                    "note": 'say "hi"' if i % 5 else None,
                    "temp": None if i % 11 == 0 else round((i % 400) / 10 - 10, 1),
                    "humidity": i % 100,
                    "nested": {"a": [i, "x"]},
                }
            )
        )
    lines = ("\n".join(rows) + "\n").encode()
    metrics = (("sum", "temp"), ("mean", "humidity"), ("max", "id"), ("count", "note"))
    assert check(lines, ("station",), metrics)


FALLBACK = [
    # not an object, or invalid JSON: the exact path raises
    b"[1,2]\n",
    b'"str"\n',
    b"1\n",
    b"null\n",
    b'{"g":01}\n',
    b'{"g":1.}\n',
    b'{"g":.5}\n',
    b'{"g":+1}\n',
    b'{"g":1e}\n',
    b'{"g":-}\n',
    b'{"g":"a}\n',
    b'{"g":"a"\n',
    b'{"g" "a"}\n',
    b'{"g":"a",}\n',
    b"{,}\n",
    b'{"g":tru}\n',
    b'{"g":nul}\n',
    b'{"u":[1,]}\n',
    b'{"u":[1 2]}\n',
    b'{"u":{"a"}}\n',
    b'{"g":"a\x01"}\n',
    b'{"g":"a\tb"}\n',
    b'{"u":"a\x1fb"}\n',
    b'{"g":"\\x"}\n',
    b'{"g":"\\u12"}\n',
    b'{"u":"\\u12G4"}\n',
    b'{"a":1}{"b":2}\n',
    b'{"a":1} x\n',
    b'{"g":\n"a"}\n',  # a line break inside the object: two lines, neither whole
    b'{"g":"a"\n}\n',
    b'{"g":"a\nb"}\n',
    b'{"a":1}}\n',
    b'{"u":"\xff"}\n',
    b'{"u":"\xc0\xaf"}\n',
    b'{"u":"\xe0\x80\x80"}\n',
    b'{"u":"\xc3"}\n',
    b'{"u":"\xc3("}\n',
    b'{"u":"\xe2\x82("}\n',
    b'{"u":"\xf0\x9f\x98("}\n',
    b'{"u":"\x80"}\n',
    b'{"u":"\xf4\x90\x80\x80"}\n',
    b'{"u":"\xed\xa0\x80"}\n',
    b'\xef\xbb\xbf{"g":"a"}\n',
    b'{"g":"a"}\n\x0b\n',
    b'{"g":"a"}\n\x0c\n',
    b'\x0b{"g":"a"}\n',
    b'{"g":"a"}\x00\n',
    b'{"g":"a",\xc3\xa9:1}\n',
    b'{"u":' + b"[" * 70 + b"]" * 70 + b"}\n",
    b'{"u":' + b"[" * 5000 + b"]" * 5000 + b"}\n",
    b'{"u":' + b"[" * 70 + b"\n",
    # valid JSON the exact path answers or rejects in its own way
    b'{"g":NaN}\n',
    b'{"u":Infinity,"g":"a"}\n',
    b'{"u":-Infinity,"g":"a"}\n',
    b'{"g":"\\ud800","x":1}\n',
    b'{"g":"\\udc00x","x":1}\n',
    b'{"g":{"a":1}}\n',
    b'{"g":[1]}\n',
    b'{"x":{}}\n',
    b'{"x":true}\n',
    b'{"x":"abc"}\n',
    b'{"x":"1e400"}\n',
    b'{"x":1e400}\n',
    b'{"x":"+5"}\n',
    b'{"x":".5"}\n',
    b'{"x":"3.5\\n"}\n',
    b'{"g":"a","g":"b"}\n',
    b'{"\\u0067":"a","x":1}\n',
    b'{"g\\n":"a","x":1}\n',
]


@pytest.mark.parametrize("lines", FALLBACK)
def test_bad_or_unusual_inputs_fall_back_or_match(lines: bytes) -> None:
    assert not check(lines)
    assert not check(b'{"g":"a","x":1}\n' + lines + b'{"g":"b","x":2}')


def test_blank_space_blank_lines_and_no_last_line_break_are_answered() -> None:
    assert check(b'{"g":"a","x":1} \t\r\n{"g":"b","x":2}\n\n \t\n{"g":"a","x":3}')
    assert check(b'\n\n{"g":"a","x":1}\r\n  \n')


def test_keys_like_the_last_lines_keys_are_told_apart() -> None:
    """A key is compared with the key at the same place in earlier lines (through its ':'):
    keys sharing a prefix, differing in the last byte, spaced differently or moved are read as
    themselves."""
    lines = [
        b'{"g":"a","x":1}',
        b'{"gx":"b","x":2}',  # longer key with the same start: g is missing here
        b'{"x":3,"g":"c"}',  # moved
        b'{"g" :"d","x" : 4}',  # spaced
        b'{"h":"e","x":5}',  # same length, another key
        b'{"g":"f","y":6}',
        b'{"g":"a","x":7}',
    ]
    assert check(b"\n".join(lines) + b"\n")
    assert not check(b'{"g":"a","x":1}\n{"g":"a","g":"b"}\n')  # a repeated key, the first one remembered


def test_a_bad_line_anywhere_in_the_block_falls_back() -> None:
    good = b'{"g":"a","x":1,"u":{"v":[1,"w"]}}\n' * 50
    for bad in (b'{"g":"a" "x":1}\n', b'{"u":"\xff"}\n', b'{"u":[1,]}\n', b"[]\n"):
        assert check(good + good)
        assert not check(good + bad + good)
        assert not check(good + good + bad.rstrip(b"\n"))


# --- random lines -------------------------------------------------------------------------------

NAMES = ["g", "h", "x", "s", "other", "é", ""]
NUMBER = st.from_regex(r"-?(0|[1-9][0-9]{0,6})(\.[0-9]{1,4})?([eE][+-]?[0-9]{1,2})?", fullmatch=True)
TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6)
STRING = st.one_of(
    st.tuples(TEXT, st.booleans()).map(lambda t: json.dumps(t[0], ensure_ascii=t[1])),
    NUMBER.map(lambda n: f'"{n}"'),
    st.sampled_from(['"NA"', '""', '" 3.5 "', '"a\\"b"', '"\\u00e9"', '"\\ud83d\\ude00"', '"\\/\\\\"']),
)
SCALAR = st.one_of(st.sampled_from(["null", "true", "false"]), NUMBER, STRING)
VALUE = st.recursive(
    SCALAR,
    lambda children: st.one_of(
        st.lists(children, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.lists(st.tuples(STRING, children), max_size=3).map(
            lambda kv: "{" + ",".join(f"{k}:{v}" for k, v in kv) + "}"
        ),
    ),
    max_leaves=5,
)
NUMERIC = st.one_of(
    NUMBER, NUMBER, NUMBER.map(lambda n: f'" {n}"'), st.sampled_from(["null", '"NA"', '""', "true", '"abc"'])
)
WS = st.sampled_from(["", "", " ", "\t", "\r"])
RARE = st.integers(0, 19).map(lambda i: i == 13)  # True about one time in 20


@st.composite
def record(draw: st.DrawFn) -> str:
    """One object: needed columns mostly with scalars (x mostly numbers), others anything."""
    members = []
    names = st.sampled_from([*NAMES, "u", "v"])
    for name in draw(st.lists(names, max_size=8, unique=not draw(RARE))):
        if name == "x":
            value = draw(NUMERIC)
        elif name in ("g", "h", "s"):
            value = draw(VALUE if draw(RARE) else SCALAR)
        else:
            value = draw(VALUE)
        key = '"\\u0067"' if draw(RARE) else json.dumps(name, ensure_ascii=draw(RARE))
        members.append(f"{draw(WS)}{key}{draw(WS)}:{draw(WS)}{value}")
    return draw(WS) + "{" + ",".join(members) + "}" + draw(WS)


SPECIAL = st.sampled_from(["", " ", "\t\r", "\x0b", "[1]", '{"g":1', '{"g":"a\tb"}', '{"g":NaN}', "{} {}"])
LINE = st.one_of(*[record()] * 12, SPECIAL)
SPECS = [
    (("g",), METRICS),
    (("g", "h"), (("sum", "h"), ("count", "x"), ("min", "x"))),
    ((), (("count", None), ("max", "x"), ("count", "s"))),
    (("x",), (("mean", "x"),)),
]


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lines=st.lists(LINE, max_size=10),
    ending=st.sampled_from(["\n", "\r\n"]),
    last=st.booleans(),
    spec=st.sampled_from(SPECS),
    nulls=st.sampled_from([DEFAULT_NULLS, (), ("0", "true", "x")]),
    mutation=st.one_of(st.none(), st.tuples(st.integers(0, 10_000), st.binary(min_size=1, max_size=1))),
)
def test_random_lines_match_the_exact_path(
    lines: list[str],
    ending: str,
    last: bool,
    spec: tuple[tuple[str, ...], tuple[tuple[str, str | None], ...]],
    nulls: tuple[str, ...],
    mutation: tuple[int, bytes] | None,
) -> None:
    block = (ending.join(lines) + (ending if last else "")).encode()
    if mutation is not None:
        at = mutation[0] % (len(block) + 1)
        block = block[:at] + mutation[1] + block[at:]
    check(block, spec[0], spec[1], nulls)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["g", "x", "s", "u"]),
            st.one_of(
                st.none(),
                st.booleans(),
                st.integers(-(10**6), 10**6),
                st.floats(-1e6, 1e6),
                TEXT,
                st.lists(st.integers(), max_size=2),
            ),
            max_size=4,
        ),
        min_size=1,
        max_size=10,
    )
)
def test_clean_random_records_do_not_fall_back(records: list[dict[str, Any]]) -> None:
    block = "\n".join(json.dumps(r, ensure_ascii=False) for r in records).encode()
    # only scalars in g, x numeric, no \u escapes needed for surrogates: always answered
    clean = all(
        not isinstance(r.get("g"), list)
        and not isinstance(r.get("s"), list)
        and not isinstance(r.get("x"), (list, str, bool))
        for r in records
    )
    answered = check(block)
    if clean:
        assert answered, block


def engine_outcome(data: bytes, native: bool, block_size: int) -> Any:
    """The engine's rows and input rows over `data`, or the error it raises."""
    spec = parse_aggregate_payload(
        {"input": "data/in", "format": "jsonl", "group_by": ["g"], "metrics": [{"op": "sum", "column": "x"}]}
    )
    options = EngineOptions(block_size=block_size, native=native)
    try:
        result = aggregate_stream(io.BytesIO(data), spec, options=options)
    except InputDataError as exc:
        return ("error", str(exc))
    return (result.input_rows, result.rows)


@pytest.mark.parametrize("block_size", [512, 4096, 65536])
@pytest.mark.parametrize("bad_at", [None, 1240, 1701])
def test_lines_are_numbered_from_the_scanners_counts(block_size: int, bad_at: int | None) -> None:
    """While the scanner answers, the engine numbers lines by the breaks it counted (blank lines
    too); the first block it declines is numbered from them, the blocks in flight behind it (a bad
    line 1240: one or two blocks on, at 512 bytes) and those cut after them as they are cut: a
    bad line is named as the Python path alone names it."""
    lines = []
    for i in range(2000):
        lines.append(f'{{"g": "k{i % 7}", "x": {i}}}')
        if i % 97 == 0:
            lines.append("")  # a blank line: a line, no record
        if i == 1200:
            lines.append('{"g": "k1", "x": 1, "\\u0061b": 2}')  # a key with an escape: the scanner declines
    if bad_at is not None:
        lines.insert(bad_at - 1, '{"g": "k2", "x": }')
    data = ("\n".join(lines) + "\n").encode()
    native = engine_outcome(data, True, block_size)
    assert native == engine_outcome(data, False, block_size)
    if bad_at is not None:
        assert native[0] == "error" and f"line {bad_at}" in native[1], native
    else:
        assert native[0] == 2001
