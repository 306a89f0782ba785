"""What to compute for a spec (`Plan`: columns read, their types, the partial aggregates) and the
partial aggregation of blocks (`Accumulator`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from shared.aggregation.number_parsing import BadNumber
from shared.aggregation.options import COMBINE_ROWS
from shared.aggregation.spec import NUMERIC_OPS, AggregateSpec, MetricSpec, TooManyGroups, partials_by_column

# --- what to compute ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Which columns are read, and how each is typed and reduced.

    The aggregation table has key columns `k0..` (strings) and value columns `v0..`: floats for
    columns of numeric metrics, strings for columns only counted.
    """

    keys: tuple[str, ...]
    values: tuple[str, ...]
    numeric: frozenset[str]
    partial: tuple[tuple[str, str, str], ...]
    """(value column, first aggregation, combining aggregation) for each partial column."""

    @classmethod
    def of(cls, spec: AggregateSpec) -> Plan:
        funcs = partials_by_column(spec.metrics)
        values = list(funcs)
        combine = {"sum": "sum", "count": "sum", "min": "min", "max": "max"}
        partial = tuple(
            (f"v{i}", func, combine[func]) for i, column in enumerate(values) for func in funcs[column]
        )
        numeric = frozenset(m.column for m in spec.metrics if m.op in NUMERIC_OPS and m.column is not None)
        return cls(keys=spec.group_by, values=tuple(values), numeric=numeric, partial=partial)

    @property
    def columns(self) -> tuple[str, ...]:
        """Every input column read, each once, group columns first."""
        return tuple(dict.fromkeys(self.keys + self.values))

    def csv_type(self, column: str) -> pa.DataType:
        """float64 for columns only used by numeric metrics; otherwise strings as written."""
        return pa.float64() if column in self.numeric and column not in self.keys else pa.string()

    def frame(self, columns: dict[str, pa.Array], to_float: Callable[[str, pa.Array], pa.Array]) -> pa.Table:
        """The aggregation table (k*, v*) from input columns; numeric ones converted by `to_float`."""
        data: dict[str, Any] = {f"k{i}": columns[name] for i, name in enumerate(self.keys)}
        first_bad: BadNumber | None = None
        for i, name in enumerate(self.values):
            array = columns[name]
            if name in self.numeric and not pa.types.is_floating(array.type):
                try:
                    array = to_float(name, array)
                except BadNumber as bad:  # the first bad row wins, whatever its column
                    if first_bad is None or bad.index < first_bad.index:
                        first_bad = bad
            data[f"v{i}"] = array
        if first_bad is not None:
            raise first_bad
        return pa.table(data)


# --- partial aggregation -----------------------------------------------------------------------


class Accumulator:
    """Partial aggregates of the blocks seen so far, combined when they grow.

    `pending_rows` counts every partial row held (the combined ones too); they are combined when
    that passes twice the groups found so far, or `combine_rows`. With `max_groups` the floor is
    max_groups + 1 when that is smaller, and a combine that finds more groups than the limit
    raises TooManyGroups: rows held stay below 2 * max_groups + one block's partials, and an
    input of distinct keys is stopped once about max_groups rows are held.
    """

    def __init__(self, plan: Plan, max_groups: int | None = None, combine_rows: int = COMBINE_ROWS) -> None:
        self.plan = plan
        self.max_groups = max_groups
        self.combine_rows = combine_rows
        self.key_names = [f"k{i}" for i in range(len(plan.keys))]
        self.partials: list[pa.Table] = []
        self.pending_rows = 0
        self.combined_rows = 0
        self.input_rows = 0

    def add(self, table: pa.Table) -> None:
        """Reduce one block to partial aggregates and keep them."""
        self.add_partial(self.reduce(table), table.num_rows)

    def reduce(self, table: pa.Table) -> pa.Table:
        """Partial aggregates of one block (pure: called on the parsing threads too).

        Keys read as binary (or dictionary-encoded) are grouped as they are, then turned into
        strings: ArrowInvalid if one is not valid UTF-8.
        """
        aggs: list[tuple[Any, ...]] = [([], "count_all")]
        aggs += [(column, func) for column, func, _ in self.plan.partial]
        partial = self._ordered(table.group_by(self.key_names, use_threads=False).aggregate(aggs))
        for name in self.key_names:
            column = partial[name]
            if column.type != pa.string():
                partial = partial.set_column(
                    partial.schema.get_field_index(name), name, pc.cast(column, pa.string())
                )
        return partial

    def add_partial(self, partial: pa.Table, input_rows: int) -> None:
        """Keep a block's partial aggregates (from `reduce`); combine them when they grow."""
        self.input_rows += input_rows
        self.partials.append(partial)
        self.pending_rows += partial.num_rows
        limit = self.max_groups
        if limit is not None and partial.num_rows > limit:
            raise TooManyGroups(limit, partial.num_rows)
        floor = self.combine_rows if limit is None else min(self.combine_rows, limit + 1)
        if self.pending_rows > max(floor, 2 * self.combined_rows):
            self.combine()

    def _ordered(self, table: pa.Table) -> pa.Table:
        names = ["count_all", *(f"{c}_{f}" for c, f, _ in self.plan.partial), *self.key_names]
        return table.select(names)

    def combine(self) -> None:
        """Fold the partials held into one table (called when enough rows are pending, and at the end)."""
        if len(self.partials) > 1:
            self.partials = [self.combined(pa.concat_tables(self.partials))]
        self.combined_rows = self.partials[0].num_rows if self.partials else 0
        self.pending_rows = self.combined_rows
        if self.max_groups is not None and self.combined_rows > self.max_groups:
            raise TooManyGroups(self.max_groups, self.combined_rows)

    def drain(self) -> pa.Table | None:
        """The partials held, combined (None if none), leaving none held (`input_rows` kept)."""
        if not self.partials:
            return None
        self.combine()
        table = self.partials[0]
        self.partials = []
        self.pending_rows = self.combined_rows = 0
        return table

    def combined(self, partials: pa.Table) -> pa.Table:
        """Partial aggregates (rows of `reduce`'s columns, a group in several rows) folded to one
        row per group, in the same columns."""
        aggs: list[tuple[Any, ...]] = [("count_all", "sum")]
        aggs += [(f"{c}_{f}", combine) for c, f, combine in self.plan.partial]
        both = [
            f"{c}_{f}"
            for c, f, _ in self.plan.partial
            if f == "sum" and _both_infinities(partials[f"{c}_{f}"])
        ]
        for name in both:  # sums that overflowed both ways in different parts (rare): see _overflowed
            partials = partials.append_column(
                f"{name}_inf", pc.if_else(pc.is_inf(partials[name]), partials[name], None)
            )
            partials = partials.append_column(f"{name}_nan", pc.is_nan(partials[name]))
            aggs += [(f"{name}_inf", "first"), (f"{name}_nan", "any")]
        out = partials.group_by(self.key_names, use_threads=False).aggregate(aggs)
        for name in both:
            out = out.set_column(
                out.schema.get_field_index(f"{name}_sum"), f"{name}_sum", _overflowed(out, name)
            )
        names = ["count_all_sum", *(f"{c}_{f}_{combine}" for c, f, combine in self.plan.partial)]
        out = out.select(names + self.key_names)
        final_names = ["count_all", *(f"{c}_{f}" for c, f, _ in self.plan.partial), *self.key_names]
        return out.rename_columns(final_names)

    def sorted(self, partials: pa.Table) -> pa.Table:
        """Rows sorted by the group columns, nulls first (the result's order)."""
        if not self.key_names:
            return partials
        keys = [(k, "ascending", "at_start") for k in self.key_names]
        return partials.take(pc.sort_indices(partials, sort_keys=keys))

    def _final(self) -> pa.Table:
        if not self.partials:
            self.add(self._empty_frame())
            self.input_rows = 0
        self.combine()
        return self.partials[0]

    def _empty_frame(self) -> pa.Table:
        data: dict[str, pa.Array] = {name: pa.array([], pa.string()) for name in self.key_names}
        for i, name in enumerate(self.plan.values):
            data[f"v{i}"] = pa.array([], pa.float64() if name in self.plan.numeric else pa.string())
        return pa.table(data) if data else pa.table({"_": pa.array([], pa.null())})

    def result_rows(self, metrics: Sequence[MetricSpec]) -> list[dict[str, Any]]:
        """The final rows: group columns, then each metric by name; sorted, nulls first."""
        rows: list[dict[str, Any]] = self.result_table(metrics).to_pylist()
        return rows

    def result_table(self, metrics: Sequence[MetricSpec]) -> pa.Table:
        """The final rows as a table: group columns, then each metric by name; sorted, nulls first."""
        return self.result_columns(self.sorted(self._final()), metrics)

    def result_columns(self, table: pa.Table | pa.RecordBatch, metrics: Sequence[MetricSpec]) -> pa.Table:
        """Combined partial aggregates as result rows (group columns, then each metric by name),
        in the order given."""
        out: dict[str, Any] = {
            name: table[key] for name, key in zip(self.plan.keys, self.key_names, strict=True)
        }
        for metric in metrics:
            out[metric.name] = self._metric_column(table, metric)
        return pa.table(out)

    def _metric_column(self, table: pa.Table | pa.RecordBatch, metric: MetricSpec) -> Any:
        if metric.column is None:
            return table["count_all"]
        value = f"v{self.plan.values.index(metric.column)}"
        if metric.op == "mean":
            return pc.divide(table[f"{value}_sum"], pc.cast(table[f"{value}_count"], pa.float64()))
        func = {"count": "count", "sum": "sum", "min": "min", "max": "max"}[metric.op]
        column = table[f"{value}_{func}"]
        return column if metric.op == "count" else pc.cast(column, pa.float64())


def _both_infinities(column: pa.ChunkedArray) -> bool:
    if not pa.types.is_floating(column.type):
        return False
    bounds = pc.min_max(column).as_py()
    return bool(bounds["min"] == -math.inf and bounds["max"] == math.inf)


def _overflowed(out: pa.Table, name: str) -> pa.ChunkedArray:
    """A combined sum as one sum over the rows in order would be: its parts summed to +inf and
    -inf (each overflowed), so the first infinity reached stays (a single sum does not come back
    from it), where the parts' sum gave NaN; a part that is NaN keeps it NaN. (An infinity that
    is a value of the column, not an overflow, is taken as one too: a single sum of +inf and
    -inf values would be NaN.)"""
    total, first, nan = out[f"{name}_sum"], out[f"{name}_inf_first"], out[f"{name}_nan_any"]
    crossed = pc.and_(pc.is_nan(total), pc.and_(pc.is_valid(first), pc.invert(nan)))
    return pc.if_else(crossed, first, total)


@dataclass(frozen=True)
class JsonPartial:
    partial: pa.Table
    rows: int
    seen: frozenset[str]
    """Needed columns that occur (as keys) in the block."""
    line_breaks: int | None = None
    """The block's \\n (blank lines' included), where the C scanner counted them."""
