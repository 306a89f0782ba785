"""The bridge to the C scanner (`aggkernel`, built from native/): what it is asked for one input,
and its answers as the partial aggregates the Python path gives."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa

from shared.aggregation.plan import JsonPartial, Plan

try:
    import aggkernel as _aggkernel  # the C scanner in native/ (built by pip from source)
except ImportError:  # not built here (or refused on a Spark executor: spark_jobs/aggregate_native.py)
    _aggkernel = None

kernel: Any = _aggkernel
"""The C scanner's module, None where it is not built."""
NATIVE: Final = kernel is not None
"""Whether the C scanner is built here (`EngineOptions.native` decides whether a run uses it)."""


@dataclass(frozen=True)
class NativeArgs:
    """What the C scanner (`aggkernel`, native/) is asked for one input, and its answers turned
    into the partial aggregates `Accumulator.reduce` gives for the same block.

    The scanner reads a block in one pass, off the GIL, and answers only when it is sure to give
    what the Python path gives (else None: the block goes to the Python path, which decides or
    names what is wrong). Needed columns are `plan.columns`; keys and values index into them.
    """

    plan: Plan
    columns: tuple[int, ...] | tuple[bytes, ...]
    """CSV: per header field, its index in plan.columns or -1. JSON lines: the names, UTF-8."""
    keys: tuple[int, ...]
    values: tuple[int, ...]
    numeric: tuple[int, ...]
    nulls: tuple[bytes, ...]

    @classmethod
    def _of(
        cls, plan: Plan, columns: tuple[int, ...] | tuple[bytes, ...], nulls: Sequence[str], enabled: bool
    ) -> NativeArgs | None:
        if kernel is None or not enabled or len(plan.columns) > kernel.MAX_COLUMNS:
            return None
        return cls(
            plan=plan,
            columns=columns,
            keys=tuple(plan.columns.index(name) for name in plan.keys),
            values=tuple(plan.columns.index(name) for name in plan.values),
            numeric=tuple(int(name in plan.numeric) for name in plan.values),
            nulls=tuple(value.encode() for value in dict.fromkeys(nulls)),
        )

    @classmethod
    def csv(
        cls, names: Sequence[str], plan: Plan, nulls: Sequence[str], enabled: bool = True
    ) -> NativeArgs | None:
        """The scanner's arguments for a CSV input, None where it is off, not built or cannot read it."""
        index = {name: i for i, name in enumerate(plan.columns)}
        return cls._of(plan, tuple(index.get(name, -1) for name in names), nulls, enabled)

    @classmethod
    def jsonl(cls, plan: Plan, nulls: Sequence[str], enabled: bool = True) -> NativeArgs | None:
        """The scanner's arguments for a JSON-lines input, None as for `csv`."""
        return cls._of(plan, tuple(name.encode() for name in plan.columns), nulls, enabled)

    def csv_reduce(self, block: pa.Buffer) -> tuple[pa.Table, int] | None:
        """(partial aggregates, records) of a block of CSV records, or None."""
        assert kernel is not None
        out = kernel.csv_reduce(block, self.columns, self.keys, self.values, self.numeric, self.nulls)
        return None if out is None else (self._partial(out), out[0])

    def jsonl_reduce(self, block: pa.Buffer) -> JsonPartial | None:
        """A block of JSON lines' partial aggregates, records, columns seen and line breaks, or None."""
        assert kernel is not None
        out = kernel.jsonl_reduce(block, self.columns, self.keys, self.values, self.numeric, self.nulls)
        if out is None:
            return None
        seen = frozenset(name for i, name in enumerate(self.plan.columns) if out[5] >> i & 1)
        return JsonPartial(self._partial(out), out[0], seen, out[6])

    def _partial(self, out: tuple[Any, ...]) -> pa.Table:
        """The scanner's buffers as the table `Accumulator.reduce` makes (same names and types)."""
        _, groups, count_all, keys, values = out[:5]
        data: dict[str, pa.Array] = {"count_all": _array(pa.int64(), groups, count_all)}
        for column, func, _ in self.plan.partial:
            count, total, low, high, valid, nulls = values[int(column[1:])]
            if func == "count":
                data[f"{column}_{func}"] = _array(pa.int64(), groups, count)
            else:
                buffer = {"sum": total, "min": low, "max": high}[func]
                data[f"{column}_{func}"] = _array(pa.float64(), groups, buffer, valid, nulls)
        for i, (offsets, text, valid, nulls) in enumerate(keys):
            data[f"k{i}"] = pa.Array.from_buffers(
                pa.string(),
                groups,
                [_bitmap(valid), pa.py_buffer(offsets), pa.py_buffer(text)],
                null_count=nulls,
            )
        return pa.table(data)


def _bitmap(valid: bytes | None) -> pa.Buffer | None:
    return None if valid is None else pa.py_buffer(valid)


def _array(
    kind: pa.DataType, length: int, data: bytes, valid: bytes | None = None, nulls: int = 0
) -> pa.Array:
    return pa.Array.from_buffers(kind, length, [_bitmap(valid), pa.py_buffer(data)], null_count=nulls)
