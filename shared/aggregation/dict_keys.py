"""The group-by of a block keyed by one dictionary-encoded column (Parquet's string columns, read
with `read_dictionary`), in the C scanner: rows are grouped by their index into the dictionary, so
no key is hashed. Its answer is the table `Accumulator.reduce` gives for the same block; None
where the block is not of that shape, or the scanner leaves it to Arrow (an index out of range,
a NaN), and the caller then groups it with Arrow."""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from shared.aggregation.native import kernel
from shared.aggregation.plan import Plan

MAX_DICTIONARY: Final = 65_536
"""Dictionary entries past which Arrow groups the batch: the scanner's figures are dense, a slot
per entry (32 bytes a column; 6 MB for three columns here), whatever the batch holds."""
WANT = {"sum": 1, "min": 2, "max": 4}
"""The figures the scanner folds for a value column (or'ed); its count always."""


def dict_partial(frame: pa.Table, plan: Plan) -> pa.Table | None:
    """Partial aggregates of an aggregation table (`k0`, `v0..`) whose one key is dictionary-encoded."""
    if kernel is None or not hasattr(kernel, "dict_reduce") or len(plan.keys) != 1:
        return None
    key = _one_chunk(frame["k0"])
    if key is None or not _plain_dictionary(key):
        return None
    columns: list[tuple[Any, Any, int, int]] = []
    for i in range(len(plan.values)):
        column = _one_chunk(frame[f"v{i}"])
        taken = None if column is None else _buffers(column)
        if taken is None:
            return None
        want = sum(WANT.get(func, 0) for name, func, _ in plan.partial if name == f"v{i}")
        columns.append((*taken, want))
    indices = key.indices
    valid, data = indices.buffers()[:2]
    answer = kernel.dict_reduce(
        data, valid, indices.offset, len(indices), len(key.dictionary), tuple(columns)
    )
    if answer is None:
        return None
    return partial_table(plan, key.dictionary, answer)


def _one_chunk(column: pa.ChunkedArray) -> pa.Array | None:
    return column.chunk(0) if column.num_chunks == 1 else None


def _plain_dictionary(key: pa.Array) -> bool:
    """int32 indices into a dictionary of distinct, non-null texts or bytes (a partial must
    hold each group once: a single partial is the result)."""
    kind = key.type
    if not pa.types.is_dictionary(kind) or kind.index_type != pa.int32():
        return False
    values = key.dictionary
    if not (pa.types.is_string(values.type) or pa.types.is_binary(values.type)) or values.null_count:
        return False
    return groupable(values)


def groupable(values: pa.Array) -> bool:
    """A dictionary the scanner may group by: at most MAX_DICTIONARY texts, each once (a partial
    holds each group once)."""
    if len(values) > MAX_DICTIONARY:
        return False
    return len(values) < 2 or pc.count_distinct(values).as_py() == len(values)


def _buffers(column: pa.Array) -> tuple[Any, Any, int] | None:
    """(float64 values or None for a column only counted, validity bitmap, offset)."""
    kind = column.type
    if kind == pa.float64():
        valid, data = column.buffers()[:2]
        return data, valid, column.offset
    if pa.types.is_dictionary(kind):
        column = column.indices
    elif not (pa.types.is_primitive(kind) or pa.types.is_string(kind) or pa.types.is_binary(kind)):
        return None  # nested, null or union columns: their validity is not a plain bitmap
    if pa.types.is_null(column.type):
        return None
    return None, column.buffers()[0], column.offset


def partial_table(
    plan: Plan, dictionary: pa.Array, answer: tuple[bytes, tuple[tuple[bytes, ...], ...]]
) -> pa.Table:
    """The partial aggregates table of a scanner's answer: the groups present, keyed by their text."""
    count_all_all, folded = answer
    count_all = np.frombuffer(count_all_all, dtype=np.int64)
    present = np.flatnonzero(count_all)
    ndict = len(dictionary)
    keys = dictionary.take(pa.array(present, pa.int32(), mask=present == ndict))
    data: dict[str, Any] = {"count_all": pa.array(count_all[present])}
    for column, func, _ in plan.partial:
        stats = folded[int(column[1:])]
        count = np.frombuffer(stats[0], dtype=np.int64)[present]
        if func == "count":
            data[f"{column}_count"] = pa.array(count)
            continue
        values = np.frombuffer(stats[("sum", "min", "max").index(func) + 1], dtype=np.float64)[present]
        data[f"{column}_{func}"] = pa.array(values, pa.float64(), mask=count == 0)
    data["k0"] = keys if keys.type == pa.string() else pc.cast(keys, pa.string())
    return pa.table(data)
