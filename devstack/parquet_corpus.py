"""The Parquet corpus: the same rows written by each writer installable here (pyarrow, Polars,
DuckDB, Spark in local mode) with its defaults and common options, for `make bench`
(`bench.bench_parquet`, large files: each writer's defaults) and the tests (tiny files, every
variant: `tests/data/parquet_corpus/`, answered as pyarrow and Polars answer them).

The rows: `parquetgen`'s weather-station rows (a string key, floats with nulls, int32s, a date, a
bool, strings) and three more columns: `amount` (decimal(12, 2)), `level` (int16, nulls) and
`code` (int64 of few values: dictionary-encoded by every writer). A writer rewrites a source
file written by pyarrow, streaming (Polars `sink_parquet`, DuckDB `COPY`, Spark `write`), so a
1 GB file never needs its rows in memory.

    python -m devstack.parquet_corpus --tests                        # the tests' corpus
    python -m devstack.parquet_corpus --mb 300 --out /tmp/corpus     # each writer's defaults
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from devstack import parquetgen

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = REPO_ROOT / "tests" / "data" / "parquet_corpus"
TEST_ROWS = 1200
"""Rows of a test file (tiny: tens of KB)."""
TEST_COLUMNS = (
    "station",
    "day",
    "kind",
    "temp",
    "precip",
    "wind_speed",
    "humidity",
    "amount",
    "level",
    "code",
)
"""The test files' columns (those that compress: full-precision floats and ids do not)."""
WRITERS = ("pyarrow", "polars", "duckdb", "spark")


@dataclass(frozen=True)
class Variant:
    writer: str
    name: str
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def stem(self) -> str:
        return f"{self.writer}-{self.name}"


VARIANTS: tuple[Variant, ...] = (
    Variant("pyarrow", "defaults"),
    Variant("pyarrow", "v2-zstd", {"data_page_version": "2.0", "compression": "zstd"}),
    Variant(
        "pyarrow",
        "plain-gzip-nostats",
        {"use_dictionary": False, "compression": "gzip", "write_statistics": False},
    ),
    Variant("pyarrow", "lz4-small-groups", {"compression": "lz4", "row_group_size": 300}),
    Variant(
        "pyarrow", "none-small-pages", {"compression": "none", "data_page_size": 1024, "row_group_size": 500}
    ),
    Variant("polars", "defaults"),
    Variant("polars", "snappy-nostats", {"compression": "snappy", "statistics": False}),
    Variant("polars", "lz4-small-groups", {"compression": "lz4", "row_group_size": 300}),
    Variant("polars", "uncompressed", {"compression": "uncompressed", "row_group_size": 500}),
    Variant("polars", "gzip", {"compression": "gzip"}),
    Variant("duckdb", "defaults"),
    Variant("duckdb", "zstd-v2", {"COMPRESSION": "zstd", "PARQUET_VERSION": "V2"}),
    Variant("duckdb", "gzip-small-groups", {"COMPRESSION": "gzip", "ROW_GROUP_SIZE": 300}),
    Variant("duckdb", "uncompressed", {"COMPRESSION": "uncompressed"}),
    Variant("spark", "defaults"),
    Variant("spark", "gzip-v2", {"compression": "gzip", "parquet.writer.version": "v2"}),
    Variant("spark", "zstd-nodictionary", {"compression": "zstd", "parquet.enable.dictionary": "false"}),
    Variant("spark", "uncompressed-small-groups", {"compression": "none", "parquet.block.size": "8192"}),
)


def rows(count: int, seed: int = 47, start: int = 0) -> pa.Table:
    """`count` corpus rows."""
    rng = np.random.default_rng(seed + start)
    table = parquetgen.batch(rng, start, count)
    cents = rng.integers(-500_000, 500_000, count).astype(np.int64)
    unscaled = np.stack([cents, cents >> 63], axis=1)  # decimal128's 16 bytes: the value, its sign
    amount = pa.Array.from_buffers(pa.decimal128(12, 2), count, [None, pa.py_buffer(unscaled.tobytes())])
    table = table.append_column("amount", amount)
    table = table.append_column(
        "level", pa.array(rng.integers(-300, 300, count).astype(np.int16), mask=rng.random(count) < 0.03)
    )
    return table.append_column("code", pa.array(rng.integers(0, 40, count).astype(np.int64) * 1000))


def write_source(
    path: Path, count: int, row_group: int = parquetgen.ROW_GROUP, columns: tuple[str, ...] | None = None
) -> Path:
    """The rows (`columns` of them) as pyarrow writes them by default, `row_group` rows at a time
    (streamed)."""

    def rows_of(n: int, start: int = 0) -> pa.Table:
        table = rows(n, start=start)
        if columns is None:
            return table
        precip = pc.round(table["precip"], 2)  # full precision does not compress
        return table.set_column(table.schema.get_field_index("precip"), "precip", precip).select(
            list(columns)
        )

    first = rows_of(min(count, row_group))
    with pq.ParquetWriter(path, first.schema) as writer:
        writer.write_table(first, row_group_size=row_group)
        done = first.num_rows
        while done < count:
            part = rows_of(min(row_group, count - done), start=done)
            writer.write_table(part, row_group_size=row_group)
            done += part.num_rows
    return path


def source_rows_for(mb: float) -> int:
    """Rows of about `mb` MB as pyarrow writes them."""
    sample = pa.BufferOutputStream()
    pq.write_table(rows(parquetgen.ROW_GROUP), sample)  # a whole row group: dictionaries as in the file
    return int(mb * 1e6 / (sample.getvalue().size / parquetgen.ROW_GROUP))


def by_pyarrow(source: Path, out: Path, options: dict[str, Any]) -> None:
    reader = pq.ParquetFile(source)
    group = options.pop("row_group_size", parquetgen.ROW_GROUP)
    with pq.ParquetWriter(out, reader.schema_arrow, **options) as writer:
        for batch in reader.iter_batches(batch_size=group):
            writer.write_table(pa.Table.from_batches([batch]), row_group_size=group)


def by_polars(source: Path, out: Path, options: dict[str, Any]) -> None:
    import polars as pl

    pl.scan_parquet(source).sink_parquet(out, **options)


def by_duckdb(source: Path, out: Path, options: dict[str, Any]) -> None:
    import duckdb

    extra = "".join(
        f", {key} {value!r}" if isinstance(value, str) else f", {key} {value}"
        for key, value in options.items()
    )
    with duckdb.connect() as con:
        con.execute(f"COPY (SELECT * FROM read_parquet('{source}')) TO '{out}' (FORMAT parquet{extra})")


_SPARK: Any = None


def spark_session() -> Any:
    """A local Spark session (two cores), started once."""
    global _SPARK
    if _SPARK is None:
        from pyspark.sql import SparkSession

        _SPARK = (
            SparkSession.builder.master("local[2]")
            .appName("parquet-corpus")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.memory", "2g")
            .getOrCreate()
        )
    return _SPARK


def by_spark(source: Path, out: Path, options: dict[str, Any]) -> None:
    spark = spark_session()
    frame = spark.read.parquet(str(source)).coalesce(1)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        target = Path(tmp) / "out"
        writer = frame.write.mode("overwrite")
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.parquet(str(target))
        (part,) = target.glob("part-*.parquet")
        shutil.move(str(part), out)


WRITE: dict[str, Callable[[Path, Path, dict[str, Any]], None]] = {
    "pyarrow": by_pyarrow,
    "polars": by_polars,
    "duckdb": by_duckdb,
    "spark": by_spark,
}


def write(variant: Variant, source: Path, out: Path) -> Path:
    """`source` rewritten by the variant's writer with its options."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    WRITE[variant.writer](source, tmp, dict(variant.options))
    tmp.replace(out)
    return out


def defaults(writer: str) -> Variant:
    return next(v for v in VARIANTS if v.writer == writer and v.name == "defaults")


def tests_corpus(directory: Path = TESTS_DIR, writers: tuple[str, ...] = WRITERS) -> list[Path]:
    """The tests' tiny files: every variant of `writers`, TEST_ROWS rows each."""
    directory.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []
    with tempfile.TemporaryDirectory() as tmp:
        source = write_source(Path(tmp) / "source.parquet", TEST_ROWS, columns=TEST_COLUMNS)
        for variant in VARIANTS:
            if variant.writer in writers:
                out.append(write(variant, source, directory / f"{variant.stem}.parquet"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tests", action="store_true", help=f"write the tests' corpus to {TESTS_DIR}")
    parser.add_argument("--mb", type=float, help="write each writer's defaults of about this size")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "parquet-corpus")
    parser.add_argument("--writers", default=",".join(WRITERS))
    args = parser.parse_args(argv)
    writers = tuple(args.writers.split(","))
    if args.tests:
        for path in tests_corpus(writers=writers):
            print(f"{path.name}: {path.stat().st_size} bytes")
    if args.mb:
        source = write_source(args.out / f"source-{args.mb:g}mb.parquet", source_rows_for(args.mb))
        for writer in writers:
            path = write(defaults(writer), source, args.out / f"{writer}-{args.mb:g}mb.parquet")
            print(f"{path}: {path.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
