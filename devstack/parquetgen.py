"""Deterministic weather-station-like Parquet files for the aggregate job's Parquet path.

Columns: id (int64), station (string, 2,000 names), station_id (int32), day (date), kind (bool),
temp (float64, 0.1 steps, ~2% null), precip (float64, ~5% null), wind_speed (float64, 0.01
steps), humidity (int32, ~1% null), pressure, lat, lon (float64), note (string, ~30% null).
Full-precision floats do not compress: a file's size follows its rows (~60 bytes a row).

    python -m devstack.parquetgen --mb 300 --out weather.parquet
    python -m devstack.parquetgen --rows 100000 --row-group 20000 --out small.parquet
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROW_GROUP = 1024 * 1024
"""Rows per row group (pyarrow's default)."""
NOTES = ("gust front", "fog", "calm", "sensor reset", "manual reading")


def batch(rng: np.random.Generator, start: int, rows: int) -> pa.Table:
    """`rows` rows starting at id `start`."""
    station = rng.integers(0, 2000, rows)
    names = np.array([f"ST{n:05d}" for n in range(2000)], dtype=object)
    day = np.datetime64("2020-01-01") + rng.integers(0, 1500, rows).astype("timedelta64[D]")

    def with_nulls(values: np.ndarray[Any, Any], share: float) -> pa.Array:
        return pa.array(values, mask=rng.random(rows) < share)

    notes = np.array(NOTES, dtype=object)[rng.integers(0, len(NOTES), rows)]
    return pa.table(
        {
            "id": pa.array(np.arange(start, start + rows, dtype=np.int64)),
            "station": pa.array(names[station], pa.string()),
            "station_id": pa.array(station.astype(np.int32)),
            "day": pa.array(day, pa.date32()),
            "kind": pa.array(rng.random(rows) < 0.5),
            "temp": with_nulls(np.round(rng.normal(12, 9, rows), 1), 0.02),
            "precip": with_nulls(rng.gamma(0.6, 2.0, rows), 0.05),
            "wind_speed": pa.array(np.round(rng.gamma(2.0, 3.0, rows), 2)),
            "humidity": with_nulls(rng.integers(10, 100, rows).astype(np.int32), 0.01),
            "pressure": pa.array(rng.normal(1013.0, 8.0, rows)),
            "lat": pa.array(rng.uniform(-60, 70, rows)),
            "lon": pa.array(rng.uniform(-180, 180, rows)),
            "note": pa.array(notes, pa.string(), mask=rng.random(rows) < 0.3),
        }
    )


def write(
    path: Path,
    *,
    rows: int | None = None,
    mb: float | None = None,
    row_group: int = ROW_GROUP,
    seed: int = 37,
) -> Path:
    """Write `rows` rows (or about `mb` MB) to `path`, `row_group` rows per row group."""
    rng = np.random.default_rng(seed)
    if rows is None:
        sample = pa.BufferOutputStream()
        sample_rows = min(row_group, ROW_GROUP)  # a whole row group: dictionaries as in the file
        pq.write_table(batch(np.random.default_rng(seed), 0, sample_rows), sample, row_group_size=row_group)
        rows = int((mb or 1) * 1e6 / (sample.getvalue().size / sample_rows))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    first = batch(rng, 0, min(rows, row_group))
    with pq.ParquetWriter(tmp, first.schema) as writer:
        writer.write_table(first, row_group_size=row_group)
        done = first.num_rows
        while done < rows:
            part = batch(rng, done, min(row_group, rows - done))
            writer.write_table(part, row_group_size=row_group)
            done += part.num_rows
    tmp.replace(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int)
    parser.add_argument("--mb", type=float)
    parser.add_argument("--row-group", type=int, default=ROW_GROUP)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    write(args.out, rows=args.rows, mb=args.mb, row_group=args.row_group)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
