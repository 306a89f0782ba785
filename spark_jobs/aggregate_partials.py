"""The aggregate job's partial aggregates (spark_jobs/aggregate_job.py): what each task computes
over its split with the inline engine (`run_split`), how two are merged (`merge`), and how the
driver finishes them into the result's rows (`Partials.finish`).

Shipped to the cluster in the engine zip (`JOB_MODULES`); imports `shared.aggregation` only
inside its functions, as the job does.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

PREFIX = "\x00"
"""Prefix of internal metric names (cannot collide with a real column)."""

Vector = tuple[Any, ...]
Key = tuple[str | None, ...]


@dataclass(frozen=True)
class Partials:
    """How each task's partial aggregates are computed, merged and finished."""

    spec: Any
    """The job's AggregateSpec."""
    derived: Any
    """The AggregateSpec each task runs: rows, and per value column count/sum/min/max as needed."""
    columns: tuple[str, ...]
    """Value columns, in order; slot i of a vector is 1 + 4 * i + (0 n, 1 sum, 2 min, 3 max)."""

    @classmethod
    def of(cls, spec: Any) -> Partials:
        """The derived spec: per value column its non-null count, and the sum, min and max the
        job's metrics need (`shared.aggregation.partials_by_column`, the inline engine's rule)."""
        from dataclasses import replace

        from shared.aggregation import MetricSpec, partials_by_column

        needs = partials_by_column(spec.metrics)
        columns = list(needs)
        derived = [MetricSpec("count", None, PREFIX + "rows")]
        for i, column in enumerate(columns):
            derived.append(MetricSpec("count", column, f"{PREFIX}n{i}"))
            derived += [
                MetricSpec(op, column, f"{PREFIX}{op}{i}")
                for op in ("sum", "min", "max")
                if op in needs[column]
            ]
        return cls(spec=spec, derived=replace(spec, metrics=tuple(derived)), columns=tuple(columns))

    def vectors(self, rows: Iterable[Mapping[str, Any]]) -> Iterator[tuple[Key, Vector]]:
        """(group key, partial vector) per row the engine returned for the derived spec."""
        for row in rows:
            key = tuple(row[c] for c in self.spec.group_by)
            vec: list[Any] = [row[PREFIX + "rows"]]
            for i in range(len(self.columns)):
                vec += [row[f"{PREFIX}n{i}"]] + [row.get(f"{PREFIX}{op}{i}") for op in ("sum", "min", "max")]
            yield key, tuple(vec)

    def finish(self, merged: Iterable[tuple[Key, Vector]]) -> list[dict[str, Any]]:
        """Final rows from merged vectors, as the inline engine shapes and sorts them."""
        items = list(merged)
        if not self.spec.group_by and not items:
            items = [((), (0, *([0, None, None, None] * len(self.columns))))]
        items.sort(key=lambda kv: tuple((v is not None, v or "") for v in kv[0]))
        rows = []
        for key, vec in items:
            row: dict[str, Any] = dict(zip(self.spec.group_by, key, strict=True))
            for metric in self.spec.metrics:
                row[metric.name] = self._metric(metric, vec)
            rows.append(row)
        return rows

    def _metric(self, metric: Any, vec: Vector) -> Any:
        if metric.column is None:
            return vec[0]
        base = 1 + 4 * self.columns.index(metric.column)
        n, total, low, high = vec[base : base + 4]
        if metric.op == "count":
            return n
        if metric.op == "sum":
            return total
        if metric.op == "mean":
            return None if not n or total is None else total / n
        return low if metric.op == "min" else high


def merge(a: Vector, b: Vector) -> Vector:
    """Combine two partial vectors: rows and counts add, sums add, min of mins, max of maxes."""
    out: list[Any] = [a[0] + b[0]]
    for base in range(1, len(a), 4):
        out.append(a[base] + b[base])
        out.append(_combine(a[base + 1], b[base + 1], lambda x, y: x + y))
        out.append(_combine(a[base + 2], b[base + 2], min))
        out.append(_combine(a[base + 3], b[base + 3], max))
    return tuple(out)


def _combine(x: Any, y: Any, op: Callable[[Any, Any], Any]) -> Any:
    if x is None:
        return y
    if y is None:
        return x
    return op(x, y)


# --- one task ----------------------------------------------------------------------------------


@dataclass
class TaskResult:
    """What one split produced: its partial vectors, or the error it met, and its line count."""

    index: int
    lines: int
    input_rows: int = 0
    vectors: list[tuple[Key, Vector]] = field(default_factory=list)
    error: str | None = None
    error_kind: str = "input_data"
    unseen: tuple[str, ...] = ()
    """JSON lines: needed columns absent from every line of this split."""
    quotes: int = 0
    """CSV: the quotes in the split's range (Blob SDK mode) or lines (Hadoop mode)."""
    inside: bool = False
    """CSV (Blob SDK mode): whether the split was taken to start inside a quoted value."""
    scanner: str = ""
    """What the task's process parses with: the C scanner (which build, from where) or the Python path."""


_UNSEEN = re.compile(r"column\(s\) (.+) occur in no line of the JSON-lines input")


def run_split(partials: Partials, index: int, data: bytes, header: bytes) -> TaskResult:
    """Aggregate one split's whole lines (`header` first for CSV) with the inline engine."""
    import io

    from shared.aggregation import aggregate_stream
    from shared.core.errors import InputDataError

    lines = data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    result = TaskResult(index=index, lines=lines)
    if not data.strip() and partials.spec.format == "jsonl":
        return result
    try:
        out = aggregate_stream(io.BytesIO(header + data), partials.derived)
    except InputDataError as exc:
        match = _UNSEEN.search(str(exc))
        if match is None:
            result.error = str(exc)
            return result
        # Absent from this split only: aggregate with a null line; the driver decides about the whole input.
        unseen = tuple(ast.literal_eval("[" + match.group(1) + "]"))
        filler = json.dumps(dict.fromkeys(unseen)).encode() + b"\n"
        try:
            out = aggregate_stream(io.BytesIO(data + b"\n" + filler), partials.derived)
        except InputDataError as again:
            result.error = str(again)
            return result
        result.unseen = unseen
        out_rows = _drop_filler(partials, out.rows)
        result.input_rows = out.input_rows - 1
        result.vectors = list(partials.vectors(out_rows))
        return result
    result.input_rows = out.input_rows
    result.vectors = list(partials.vectors(out.rows))
    return result


def merge_results(results: Iterable[TaskResult]) -> dict[Key, Vector]:
    """Every task's partial vectors merged by group key (on the driver)."""
    merged: dict[Key, Vector] = {}
    for result in results:
        for key, vec in result.vectors:
            merged[key] = merge(merged[key], vec) if key in merged else vec
    return merged


def _drop_filler(partials: Partials, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Remove the filler line's row count from the all-null group (and the group if it empties)."""
    kept = []
    for row in rows:
        if all(row[c] is None for c in partials.spec.group_by):
            row = {**row, PREFIX + "rows": row[PREFIX + "rows"] - 1}
            if row[PREFIX + "rows"] == 0 and partials.spec.group_by:
                continue
        kept.append(row)
    return kept


def global_line_message(message: str, lines_before: int, header_lines: int) -> str:
    """Turn the engine's per-split line numbers into line numbers of the whole input."""

    def fix(match: re.Match[str]) -> str:
        line = int(match.group(1))
        return f"line {line if line <= header_lines else line + lines_before}"

    return re.sub(r"\bline (\d+)", fix, message)
