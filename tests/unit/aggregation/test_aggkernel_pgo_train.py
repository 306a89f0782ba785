"""native/pgo_train.py, the training run of the scanner's profile-guided build: its inputs are
valid CSV / JSON lines, the same for the same seed, answered by the scanner without falling back
(a profile of fallbacks would tune the wrong code), and the engine gives the same result with the
scanner as without it.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from shared.aggregation import EngineOptions, aggregate_stream, parse_aggregate_payload

aggkernel = pytest.importorskip("aggkernel")


def _load() -> ModuleType:
    path = Path(__file__).resolve().parents[3] / "native" / "pgo_train.py"
    spec = importlib.util.spec_from_file_location("pgo_train", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pgo_train"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


train = _load()
CASES = list(train.cases(scale=0.03))


def _records(case: Any) -> int:
    """The case's records, read by Python's csv / json (every line must parse)."""
    text = case.body.decode()
    if case.kind == "jsonl":
        rows = [json.loads(line) for line in text.splitlines()]
        assert all(isinstance(row, dict) for row in rows)
        return len(rows)
    rows = [row for row in csv.reader(io.StringIO(text, newline="")) if row]
    assert {len(row) for row in rows} == {len(case.header)}
    return len(rows)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_inputs_are_valid_and_answered_by_the_scanner(case: Any) -> None:
    count, fallbacks, records = train.scan(aggkernel, case, sizes=(4096, 64 << 10))
    assert count > len(case.queries)
    assert fallbacks == 0
    assert records == _records(case) * len(case.queries)


def test_inputs_are_deterministic() -> None:
    again = list(train.cases(scale=0.03))
    assert [c.body for c in again] == [c.body for c in CASES]
    assert [c.body for c in train.cases(scale=0.03, seed=1)] != [c.body for c in CASES]


def _result(case: Any, q: Any, native: bool) -> Any:
    metrics: list[dict[str, str]] = [{"op": "count"}]
    for column, numeric in zip((q.columns[i] for i in q.values), q.numeric, strict=True):
        ops = ("sum", "min", "max") if numeric else ("count",)
        metrics += [{"op": op, "column": column} for op in ops]
    spec = parse_aggregate_payload(
        {
            "input": "data/in",
            "format": case.kind,
            "group_by": [q.columns[i] for i in q.keys],
            "metrics": metrics,
            "null_values": [v.decode() for v in q.nulls],
        }
    )
    data = (",".join(case.header) + "\n").encode() + case.body if case.kind == "csv" else case.body
    result = aggregate_stream(
        io.BytesIO(data), spec, options=EngineOptions(block_size=64 << 10, native=native)
    )
    return result.input_rows, result.rows


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_engine_gives_the_same_result_with_and_without_the_scanner(case: Any) -> None:
    for q in case.queries:
        (got_rows, got), (want_rows, want) = _result(case, q, True), _result(case, q, False)
        assert got_rows == want_rows
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.keys() == w.keys()
            for name, value in w.items():
                if isinstance(value, float):
                    assert math.isclose(g[name], value, rel_tol=1e-9, abs_tol=1e-9), (name, g, w)
                else:
                    assert g[name] == value, (name, g, w)


def _unhybrid(data: bytes, bw: int, count: int) -> list[int]:
    """Parquet's RLE / bit-packed hybrid read back (an independent reader, for `_hybrid`)."""
    out: list[int] = []
    at = 0
    while len(out) < count:
        header = shift = 0
        while True:
            byte = data[at]
            at += 1
            header |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if header & 1:
            groups = header >> 1
            bits = int.from_bytes(data[at : at + groups * bw], "little")
            at += groups * bw
            out += [(bits >> (k * bw)) & ((1 << bw) - 1) for k in range(groups * 8)]
        else:
            width = (bw + 7) // 8
            out += [int.from_bytes(data[at : at + width], "little")] * (header >> 1)
            at += width
    assert at == len(data)
    return out[:count]


@pytest.mark.parametrize("bw", [1, 3, 8, 11])
def test_parquet_training_pages_encode_their_values(bw: int) -> None:
    import random

    rng = random.Random(bw)
    values = [
        rng.choice((0, (1 << bw) - 1)) if rng.random() < 0.5 else rng.randrange(1 << bw) for _ in range(5000)
    ]
    values[100:300] = [1] * 200  # a long run: written as an RLE run
    assert _unhybrid(train._hybrid(values, bw, rng), bw, len(values)) == values


def test_parquet_training_pages_are_folded_without_refusal() -> None:
    rows = train.parquet_pages(aggkernel, pages=6)
    assert rows > 0
    assert rows == train.parquet_pages(aggkernel, pages=6)
