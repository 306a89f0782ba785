"""The C scanner's group-by of a dictionary-encoded key (`dict_keys`) against Arrow's."""

from __future__ import annotations

import math
import random
from typing import Any

import pyarrow as pa
import pytest

from shared.aggregation.dict_keys import MAX_DICTIONARY, dict_partial
from shared.aggregation.native import kernel
from shared.aggregation.payload import parse_aggregate_payload
from shared.aggregation.plan import Accumulator, Plan

pytestmark = pytest.mark.skipif(kernel is None, reason="the C scanner is not built here")


def plan_of(*metrics: dict[str, str]) -> Plan:
    payload = {"input": "data/x.parquet", "format": "parquet", "group_by": ["k"], "metrics": list(metrics)}
    return Plan.of(parse_aggregate_payload(payload))


PLAN = plan_of(
    {"op": "count"},
    {"op": "mean", "column": "t"},
    {"op": "sum", "column": "p"},
    {"op": "min", "column": "t"},
    {"op": "max", "column": "w"},
    {"op": "count", "column": "note"},
)


def frame(rnd: random.Random, rows: int, texts: int, key_nulls: float, value_nulls: float) -> pa.Table:
    names = [f"station-{i}" for i in range(texts)] or ["only"]
    key = pa.array(
        [None if rnd.random() < key_nulls else rnd.choice(names) for _ in range(rows)], pa.string()
    ).dictionary_encode()

    def numbers() -> pa.Array:
        return pa.array(
            [None if rnd.random() < value_nulls else rnd.uniform(-100, 100) for _ in range(rows)],
            pa.float64(),
        )

    note = pa.array([None if rnd.random() < 0.3 else "n" for _ in range(rows)], pa.string())
    columns = {"k": key, "t": numbers(), "p": numbers(), "w": numbers(), "note": note}
    data: dict[str, Any] = {"k0": columns["k"]}
    for i, name in enumerate(PLAN.values):
        data[f"v{i}"] = columns[name]
    return pa.table(data)


def rows_of(table: pa.Table) -> dict[Any, dict[str, Any]]:
    out: dict[Any, dict[str, Any]] = {}
    for row in table.to_pylist():
        key = row.pop("k0")
        assert key not in out, f"group {key!r} twice in one partial"
        out[key] = row
    return out


def assert_same(got: pa.Table, want: pa.Table) -> None:
    assert got.schema.names == want.schema.names
    assert [f.type for f in got.schema] == [f.type for f in want.schema]
    a, b = rows_of(got), rows_of(want)
    assert a.keys() == b.keys()
    for key, row in b.items():
        for name, value in row.items():
            if isinstance(value, float):
                assert math.isclose(a[key][name], value, rel_tol=1e-12, abs_tol=1e-9), (key, name)
            else:
                assert a[key][name] == value, (key, name)


@pytest.mark.parametrize("seed", range(12))
def test_the_scanners_groups_are_arrows(seed: int) -> None:
    rnd = random.Random(seed)
    table = frame(
        rnd,
        rnd.choice([0, 1, 7, 300, 5000]),
        rnd.choice([1, 3, 40, 2000]),
        rnd.choice([0, 0.1, 1]),
        rnd.choice([0, 0.2, 1]),
    )
    got = dict_partial(table, PLAN)
    assert got is not None
    assert_same(got, Accumulator(PLAN).reduce(table))


def test_a_slice_is_read_from_its_offset() -> None:
    table = frame(random.Random(3), 1000, 30, 0.1, 0.2).slice(333, 401)
    got = dict_partial(table, PLAN)
    assert got is not None and sum(got["count_all"].to_pylist()) == 401
    assert_same(got, Accumulator(PLAN).reduce(table))


def test_a_counted_dictionary_column_counts_its_valid_keys() -> None:
    plan = plan_of({"op": "count", "column": "k"})
    key = pa.array(["a", None, "b", "a", None], pa.string()).dictionary_encode()
    table = pa.table({"k0": key, "v0": key})
    got = dict_partial(table, plan)
    assert got is not None
    assert rows_of(got) == {
        "a": {"count_all": 2, "v0_count": 2},
        "b": {"count_all": 1, "v0_count": 1},
        None: {"count_all": 2, "v0_count": 0},
    }


def test_arrow_decides_a_nan_a_repeated_text_and_several_chunks() -> None:
    table = frame(random.Random(1), 50, 5, 0, 0)
    with_nan = table.set_column(1, "v0", pa.array([math.nan] + [1.0] * 49))
    assert dict_partial(with_nan, PLAN) is None
    repeated = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0], pa.int32()), pa.array(["a", "a"]))
    rows = pa.table(
        {"k0": repeated, "v0": [1.0, 2.0, 3.0], "v1": [1.0] * 3, "v2": [1.0] * 3, "v3": ["x"] * 3}
    )
    assert dict_partial(rows, PLAN) is None
    assert dict_partial(pa.concat_tables([table, table]), PLAN) is None
    plain = table.set_column(0, "k0", table["k0"].cast(pa.string()))
    assert dict_partial(plain, PLAN) is None


def test_a_binary_key_that_is_not_utf8_is_refused_as_arrow_refuses_it() -> None:
    key = pa.array([b"ok", b"\xff\xfe"], pa.binary()).dictionary_encode()
    table = pa.table({"k0": key, "v0": [1.0, 2.0], "v1": [1.0, 2.0], "v2": [1.0, 2.0], "v3": ["x", "y"]})
    with pytest.raises(pa.ArrowInvalid):
        dict_partial(table, PLAN)
    with pytest.raises(pa.ArrowInvalid):
        Accumulator(PLAN).reduce(table)


def test_bad_buffers_are_refused_not_read_past() -> None:
    indices = pa.array([0, 1, 2], pa.int32())
    with pytest.raises(ValueError, match="bad arguments"):
        kernel.dict_reduce(indices.buffers()[1], None, 2, 5, 3, ())
    short = pa.array([1.0], pa.float64())
    with pytest.raises(ValueError, match="too short"):
        kernel.dict_reduce(indices.buffers()[1], None, 0, 3, 3, ((short.buffers()[1], None, 0, 7),))
    assert kernel.dict_reduce(indices.buffers()[1], None, 0, 3, 2, ()) is None  # index 2 of 2


@pytest.mark.parametrize("op", ["min", "max", "sum", "mean"])
def test_one_figure_wanted_is_folded_alone_and_right(op: str) -> None:
    plan = plan_of({"op": op, "column": "t"})
    rnd = random.Random(7)
    key = pa.array([rnd.choice("abc") for _ in range(500)], pa.string()).dictionary_encode()
    values = pa.array([None if rnd.random() < 0.1 else rnd.uniform(-5, 5) for _ in range(500)], pa.float64())
    table = pa.table({"k0": key, "v0": values})
    got = dict_partial(table, plan)
    assert got is not None
    assert_same(got, Accumulator(plan).reduce(table))


def test_a_dictionary_past_the_bound_goes_to_arrow() -> None:
    plan = plan_of({"op": "sum", "column": "t"})
    texts = pa.array([f"s{i}" for i in range(MAX_DICTIONARY + 1)])
    for size, grouped in ((MAX_DICTIONARY, True), (MAX_DICTIONARY + 1, False)):
        key = pa.DictionaryArray.from_arrays(pa.array([0, size - 1, 0], pa.int32()), texts.slice(0, size))
        table = pa.table({"k0": key, "v0": [1.0, 2.0, 3.0]})
        assert (dict_partial(table, plan) is not None) is grouped
