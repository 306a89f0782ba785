"""The exact JSON-lines path: Python's `json` line by line, numbers kept as written, errors naming
the line; and the nesting check every line passes first."""

from __future__ import annotations

import json
import re
from typing import Any, Final

import pyarrow as pa

from shared.aggregation.number_parsing import BadNumber, to_float
from shared.aggregation.options import MAX_JSON_DEPTH
from shared.aggregation.plan import Plan
from shared.core.errors import InputDataError

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy is in requirements.txt (not always on Spark executors)
    np = None  # type: ignore[assignment]


def first_deep_line(buf: bytearray, start: int, end: int) -> tuple[int, int] | None:
    """(index, start offset) of the first line of buf[start:end] nested more than MAX_JSON_DEPTH
    deep, or None. Vectorised over the structural bytes only (no parser, no recursion): brackets
    inside strings do not count (a quote after an odd run of backslashes is escaped, and a line
    break ends any string). Where the line is not JSON the count may be high, never low: a parser
    stops at the first error, and up to there it tokenises the line as this does."""
    if np is None:  # pragma: no cover - numpy is in requirements.txt
        return _first_deep_line_slowly(bytes(buf[start:end]), start)
    data = np.frombuffer(buf, np.uint8, end - start, start)
    opens = np.flatnonzero((data == 91) | (data == 123))
    if len(opens) <= MAX_JSON_DEPTH:
        return None
    closes = np.flatnonzero((data == 93) | (data == 125))
    quotes = _unescaped_quotes(data)
    newlines = np.flatnonzero(data == 10)
    events = np.concatenate((opens, closes))
    delta = np.concatenate((np.ones(len(opens), np.int64), -np.ones(len(closes), np.int64)))
    order = np.argsort(events, kind="stable")
    events, delta = events[order], delta[order]
    line = np.searchsorted(newlines, events)
    quotes_before_line = np.concatenate(([0], np.searchsorted(quotes, newlines)))[line]
    outside = (np.searchsorted(quotes, events) - quotes_before_line) % 2 == 0
    events, delta, line = events[outside], delta[outside], line[outside]
    if len(events) == 0:
        return None
    depth = np.cumsum(delta)
    first = np.concatenate(([True], line[1:] != line[:-1]))
    base = (depth - delta)[np.maximum.accumulate(np.where(first, np.arange(len(line)), 0))]
    deep = np.flatnonzero(depth - base > MAX_JSON_DEPTH)
    if len(deep) == 0:
        return None
    index = int(line[deep[0]])
    return index, start + (int(newlines[index - 1]) + 1 if index else 0)


_JSON_STRING: Final = re.compile(rb'"(?:[^"\\\n]|\\.)*"')
_BRACKET: Final = re.compile(rb"[][{}]")


def _first_deep_line_slowly(block: bytes, start: int) -> tuple[int, int] | None:
    """`first_deep_line` without numpy: bracket by bracket, only in lines with enough of them."""
    offset = 0
    for index, line in enumerate(block.split(b"\n")):
        if line.count(b"[") + line.count(b"{") > MAX_JSON_DEPTH:
            depth = 0
            for bracket in _BRACKET.finditer(_JSON_STRING.sub(b'""', line)):
                depth += 1 if bracket.group() in (b"[", b"{") else -1
                if depth > MAX_JSON_DEPTH:
                    return index, start + offset
        offset += len(line) + 1
    return None


def _unescaped_quotes(data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Positions of the quotes not escaped by a backslash (one after an odd run of them)."""
    quotes = np.flatnonzero(data == 34)
    slashes = np.flatnonzero(data == 92)
    if len(quotes) == 0 or len(slashes) == 0:
        return quotes
    runs = slashes[np.concatenate(([True], np.diff(slashes) != 1))]
    after = quotes[(quotes > 0) & (data[np.maximum(quotes - 1, 0)] == 92)]
    run_start = runs[np.searchsorted(runs, after - 1, side="right") - 1]
    escaped = after[(after - run_start) % 2 == 1]
    return np.setdiff1d(quotes, escaped, assume_unique=True)


def exact_frame(
    plan: Plan, block: bytes, first_line: int, nulls: frozenset[str]
) -> tuple[pa.Table, frozenset[str]]:
    """The exact path: (aggregation table, columns seen) of a block, numbers kept as written
    (3.10 -> '3.10'); InputDataError naming the line of the first bad one."""
    columns: dict[str, list[str | None]] = {name: [] for name in plan.columns}
    lines: list[int] = []
    unseen = set(plan.columns)
    try:
        for line, raw in enumerate(block.split(b"\n"), start=first_line):
            if not raw.strip():
                continue
            record = _json_record(raw, line)
            row = [_json_value(record.get(name), name, line, nulls) for name in columns]
            lines.append(line)
            if unseen:
                unseen.difference_update(record.keys())
            for values, value in zip(columns.values(), row, strict=True):
                values.append(value)
    except InputDataError:
        _json_frame(plan, columns, lines)  # a bad number on an earlier line is reported first
        raise
    seen = frozenset(plan.columns) - unseen
    return _json_frame(plan, columns, lines), seen


def _json_record(raw: bytes, line: int) -> dict[str, Any]:
    try:
        record = json.loads(raw, parse_float=str, parse_int=str, parse_constant=str)
    except (ValueError, UnicodeDecodeError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise InputDataError(f"line {line} is not valid JSON: {reason}") from None
    if not isinstance(record, dict):
        raise InputDataError(f"line {line} is not a JSON object")
    return record


def _json_value(value: Any, column: str, line: int, nulls: frozenset[str]) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        if not value.isascii() and _SURROGATE.search(value):
            raise InputDataError(
                f"column {column!r} holds a lone surrogate on line {line}: not valid Unicode"
            )
        return None if value in nulls else value
    if isinstance(value, bool):
        return "true" if value else "false"
    kind = "object" if isinstance(value, dict) else "array"
    raise InputDataError(f"column {column!r} holds a JSON {kind} on line {line}, not a single value")


_SURROGATE: Final = re.compile("[\ud800-\udfff]")
"""A code point Python's `json` accepts (from a lone \\ud800 escape) but UTF-8 cannot hold."""


def _json_frame(plan: Plan, columns: dict[str, list[str | None]], lines: list[int]) -> pa.Table:
    arrays = {name: pa.array(values, pa.string()) for name, values in columns.items()}
    if not arrays:
        return pa.table({"_": pa.nulls(len(lines))})
    try:
        return plan.frame(arrays, to_float)
    except BadNumber as bad:
        before, after = bad.message_parts()
        raise InputDataError(f"{before}{lines[bad.index]}{after}") from None
