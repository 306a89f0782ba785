"""What the aggregate engine's tests share: every test run with the C scanner and without it, an
independent computation (only the `csv` / `json` modules and dict accumulators), generated inputs."""

from __future__ import annotations

import csv
import io
import logging
import math
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import pytest

from shared.aggregation import (
    AggregateResult,
    AggregateSpec,
    EngineOptions,
    aggregate_stream,
    options,
    parse_aggregate_payload,
)
from shared.config.settings import Settings
from shared.jobs.base import JobContext
from shared.storage.memory_account import MemoryAccount


@pytest.fixture(autouse=True, params=["scanner", "python"])
def scanner(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test twice: blocks to the C scanner first (as deployed), and the Python (pyarrow)
    path alone (as on Spark executors without the built scanner). Tests about the pyarrow JSON
    path's own choices (`pyarrow_path`) run on the Python path only."""
    if request.param == "scanner" and request.node.get_closest_marker("pyarrow_path"):
        pytest.skip("about the pyarrow path's own choices")
    global TUNING
    TUNING = EngineOptions(native=request.param == "scanner")
    yield
    TUNING = EngineOptions()


TUNING = EngineOptions()
"""The engine's options in the running test: the scanner on or off (the `scanner` fixture)."""


def tuned(**changes: Any) -> EngineOptions:
    """The running test's options, with `changes`."""
    return replace(TUNING, **changes)


# --- an independent computation ----------------------------------------------------------------


def reference(
    records: Iterable[dict[str, Any]],
    group_by: Sequence[str],
    metrics: Sequence[dict[str, str]],
    null_values: Sequence[str] = ("", "NA"),
) -> list[dict[str, Any]]:
    """Group-by with SQL semantics over records of strings (None = missing), plain Python."""
    nulls = set(null_values)

    def value(record: dict[str, Any], column: str) -> str | None:
        raw = record.get(column)
        return None if raw is None or raw in nulls else raw

    groups: dict[tuple[str | None, ...], dict[str, Any]] = {}
    for record in records:
        key = tuple(value(record, c) for c in group_by)
        acc = groups.setdefault(key, {"rows": 0, "values": {}})
        acc["rows"] += 1
        for m in metrics:
            if "column" in m:
                raw = value(record, m["column"])
                if raw is not None:
                    number = float(raw) if m["op"] != "count" else 1.0
                    acc["values"].setdefault((m["op"], m["column"]), []).append(number)
    if not groups and not group_by:
        groups[()] = {"rows": 0, "values": {}}
    out = []
    for key in sorted(groups, key=lambda k: tuple((v is not None, v or "") for v in k)):
        acc = groups[key]
        row: dict[str, Any] = dict(zip(group_by, key, strict=True))
        for m in metrics:
            name = m.get("as") or ("count" if "column" not in m else f"{m['op']}_{m['column']}")
            values = acc["values"].get((m["op"], m.get("column")), [])
            if m["op"] == "count":
                row[name] = acc["rows"] if "column" not in m else len(values)
            elif not values:
                row[name] = None
            elif m["op"] == "sum":
                row[name] = math.fsum(values)
            elif m["op"] == "mean":
                row[name] = math.fsum(values) / len(values)
            else:
                row[name] = min(values) if m["op"] == "min" else max(values)
        out.append(row)
    return out


def csv_records(text: str) -> list[dict[str, Any]]:
    return list(csv.DictReader(io.StringIO(text, newline="")))


def assert_same(actual: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert list(got) == list(want), (got, want)
        for name, w in want.items():
            g = got[name]
            if isinstance(w, float):
                assert isinstance(g, float), (name, got, want)
                assert math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-9), (name, got, want)
            else:
                assert g == w and type(g) is type(w), (name, got, want)


def run(
    data: bytes | str,
    group_by: Sequence[str] = (),
    metrics: Sequence[dict[str, str]] = ({"op": "count"},),
    fmt: str = "csv",
    block_size: int = options.DEFAULT_BLOCK_SIZE,
    tuning: dict[str, Any] | None = None,
    **extra: Any,
) -> AggregateResult:
    """The engine's result; `tuning`: options changed (`EngineOptions` fields), `extra`: payload keys."""
    raw = data.encode() if isinstance(data, str) else data
    spec = make_spec(group_by, metrics, fmt, **extra)
    return aggregate_stream(io.BytesIO(raw), spec, options=tuned(block_size=block_size, **(tuning or {})))


def make_spec(
    group_by: Sequence[str], metrics: Sequence[dict[str, str]], fmt: str = "csv", **extra: Any
) -> AggregateSpec:
    return parse_aggregate_payload(
        {"input": "data/in", "format": fmt, "group_by": list(group_by), "metrics": list(metrics), **extra}
    )


ALL_METRICS = [
    {"op": "count"},
    {"op": "count", "column": "qty"},
    {"op": "sum", "column": "qty"},
    {"op": "mean", "column": "price"},
    {"op": "min", "column": "price"},
    {"op": "max", "column": "price", "as": "top"},
]


# --- generated data ----------------------------------------------------------------------------


def generated_csv(rows: int, seed: int) -> str:
    """Sales-like CSV with nulls, NA, quoted fields (commas, quotes, line breaks) and CRLF."""
    rnd = random.Random(seed)
    out = io.StringIO(newline="")
    writer = csv.writer(out, lineterminator="\r\n" if seed % 2 else "\n")
    writer.writerow(["region", "product", "qty", "price", "note"])
    regions = ["north", "south", "east, central", 'the "west"', "", "NA", "7"]
    for _ in range(rows):
        qty = rnd.choice(["", "NA", str(rnd.randint(-5, 50)), f" {rnd.randint(0, 9)} "])
        price = rnd.choice(["", "NA", f"{rnd.uniform(0, 500):.2f}", f"{rnd.uniform(-1, 1):.3e}", "0"])
        note = rnd.choice(["", "plain", "with, comma", 'with "quotes"', "line\nbreak", "NA"])
        writer.writerow([rnd.choice(regions), f"P{rnd.randrange(12):02d}", qty, price, note])
    return out.getvalue()


def ctx_on(
    account: MemoryAccount, payload: dict[str, Any], version: int = 0, job_id: str = "job-7"
) -> JobContext:
    """An `aggregate` job's context on the in-memory account (settings of the local stack)."""
    settings = Settings.from_env({"AzureWebJobsStorage": "UseDevelopmentStorage=true"})
    return JobContext(
        job_id=job_id,
        kind="aggregate",
        attempt=0,
        payload=payload,
        settings=settings,
        storage=account,
        log=logging.LoggerAdapter(logging.getLogger("test"), {}),
        checkpoint=lambda progress: None,
        version=version,
    )
