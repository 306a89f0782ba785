"""Deterministic sales-like test data for the aggregate job (CSV or JSON lines).

Columns (about 100 bytes a row, like a typical sales export): order_id, ts, region, country,
store, product, category, customer, channel, qty (int), price (float), discount (float),
currency, note (free text, sometimes quoted with a comma or doubled quotes inside). About 2% of
qty/price are empty and 1% are `NA`; about 0.5% of regions are empty (a null group key).

    python -m devstack.datagen --rows 100000 --out data.csv
    python -m devstack.datagen --mb 1000 --out big.csv
    python -m devstack.datagen --rows 1000 --format jsonl --out data.jsonl
    python -m devstack.datagen --rows 340000 --wide --out wide.csv
    python -m devstack.datagen --mb 1000 --repeat --out big.csv   # 4 MB of rows, repeated: seconds

`--wide`: a 20-column table like a public weather-station export (integers with NA, floats,
strings, timestamps; ~90 bytes a row as CSV, ~300 as JSON lines), see `WIDE_HEADER`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

HEADER = (
    "order_id",
    "ts",
    "region",
    "country",
    "store",
    "product",
    "category",
    "customer",
    "channel",
    "qty",
    "price",
    "discount",
    "currency",
    "note",
)
REGIONS = ("north", "south", "east", "west", "central", "north-east", "south-west", "islands")
COUNTRIES = ("DE", "FR", "NL", "BE", "AT", "IT", "ES", "PL", "SE", "DK", "IE", "PT")
CATEGORIES = ("garden", "kitchen", "toys", "office", "sports", "audio", "books", "tools")
CHANNELS = ("web", "store", "phone", "partner")
CURRENCIES = ("EUR", "EUR", "EUR", "GBP", "USD", "SEK", "PLN")
PRODUCTS = tuple(f"P{n:04d}" for n in range(200))
NOTES = (
    "",
    "",
    "",
    "",
    "gift",
    "promo",
    '"bulk, pallet"',
    '"returns, damaged"',
    "web order",
    '"said ""rush"""',
)
WIDE_HEADER = (
    "id",
    "station",
    "ts",
    "date",
    "country",
    "kind",
    "lat",
    "lon",
    "elevation",
    "temp",
    "dewpoint",
    "humidity",
    "pressure",
    "wind_dir",
    "wind_speed",
    "gust",
    "precip",
    "visibility",
    "sky",
    "flag",
)
WIDE_STATIONS = tuple(f"ST{n:03d}" for n in range(60))
WIDE_SKY = ("CLR", "FEW", "SCT", "BKN", "OVC", "VV")
WIDE_KINDS = ("auto", "manual", "synop")
ROWS_PER_BLOCK = 20_000
_START = datetime(2024, 1, 1)


def _maybe_null(rnd: random.Random, value: str) -> str:
    roll = rnd.random()
    if roll < 0.02:
        return ""
    if roll < 0.03:
        return "NA"
    return value


def _fields(rnd: random.Random, n: int) -> dict[str, object]:
    """One sales line as Python values (None = missing)."""
    ts = _START + timedelta(seconds=rnd.randrange(366 * 86400))
    return {
        "order_id": 10_000_000 + n,
        "ts": ts.strftime("%Y-%m-%dT%H:%M:%S"),
        "region": None if rnd.random() < 0.005 else rnd.choice(REGIONS),
        "country": rnd.choice(COUNTRIES),
        "store": f"S{rnd.randrange(400):04d}",
        "product": rnd.choice(PRODUCTS),
        "category": rnd.choice(CATEGORIES),
        "customer": f"C{rnd.randrange(2_000_000):07d}",
        "channel": rnd.choice(CHANNELS),
        "qty": rnd.randint(1, 50),
        "price": round(rnd.uniform(0.5, 500), 2),
        "discount": round(rnd.choice((0.0, 0.0, 0.05, 0.1, 0.15, 0.2)), 2),
        "currency": rnd.choice(CURRENCIES),
    }


def csv_lines(rows: int, seed: int = 7) -> Iterator[str]:
    """Yield blocks of CSV text (header first), `rows` data rows in all."""
    rnd = random.Random(seed)
    yield ",".join(HEADER) + "\n"
    done = 0
    while done < rows:
        n = min(ROWS_PER_BLOCK, rows - done)
        yield "".join(_csv_row(rnd, done + i) for i in range(n))
        done += n


def _csv_row(rnd: random.Random, n: int) -> str:
    f = _fields(rnd, n)
    qty = _maybe_null(rnd, str(f["qty"]))
    price = _maybe_null(rnd, f"{f['price']:.2f}")
    region = f["region"] or ""
    return (
        f"{f['order_id']},{f['ts']},{region},{f['country']},{f['store']},{f['product']},{f['category']},"
        f"{f['customer']},{f['channel']},{qty},{price},{f['discount']},{f['currency']},{rnd.choice(NOTES)}\n"
    )


def jsonl_lines(rows: int, seed: int = 7) -> Iterator[str]:
    """Yield blocks of JSON lines: numbers as JSON numbers, nulls as null or "NA"."""
    rnd = random.Random(seed)
    done = 0
    while done < rows:
        n = min(ROWS_PER_BLOCK, rows - done)
        yield "".join(_json_row(rnd, done + i) for i in range(n))
        done += n


def _json_row(rnd: random.Random, n: int) -> str:
    row = _fields(rnd, n)
    if rnd.random() < 0.03:
        row["qty"] = None if rnd.random() < 0.6 else "NA"
    if rnd.random() < 0.03:
        row["price"] = None
    return json.dumps(row, separators=(",", ":")) + "\n"


def _wide_fields(rnd: random.Random, n: int) -> dict[str, object]:
    """One wide line as Python values (None = missing; about 3-10% of the measurements)."""
    station = WIDE_STATIONS[rnd.randrange(len(WIDE_STATIONS))]
    ts = _START + timedelta(seconds=n * 90 + rnd.randrange(60))

    def maybe(value: object, rate: float) -> object:
        return None if rnd.random() < rate else value

    return {
        "id": 1_000_000 + n,
        "station": station,
        "ts": ts.strftime("%Y-%m-%d %H:%M:%S"),
        "date": ts.strftime("%Y-%m-%d"),
        "country": COUNTRIES[rnd.randrange(len(COUNTRIES))],
        "kind": WIDE_KINDS[rnd.randrange(3)],
        "lat": round(rnd.uniform(35, 70), 4),
        "lon": round(rnd.uniform(-10, 30), 4),
        "elevation": rnd.randrange(0, 2500),
        "temp": maybe(round(rnd.gauss(10, 9), 1), 0.03),
        "dewpoint": maybe(round(rnd.gauss(4, 7), 1), 0.05),
        "humidity": maybe(rnd.randrange(5, 101), 0.04),
        "pressure": maybe(round(rnd.gauss(1013, 9), 1), 0.10),
        "wind_dir": maybe(rnd.randrange(0, 360, 10), 0.06),
        "wind_speed": maybe(rnd.randrange(0, 40), 0.05),
        "gust": maybe(rnd.randrange(10, 80), 0.6),
        "precip": maybe(round(rnd.expovariate(2), 2), 0.08),
        "visibility": maybe(rnd.randrange(100, 10000, 100), 0.07),
        "sky": WIDE_SKY[rnd.randrange(len(WIDE_SKY))],
        "flag": maybe("E", 0.9),
    }


def wide_csv_lines(rows: int, seed: int = 7) -> Iterator[str]:
    """Blocks of wide CSV text (header first); missing values are `NA`, a few empty."""
    rnd = random.Random(seed)
    yield ",".join(WIDE_HEADER) + "\n"
    done = 0
    while done < rows:
        n = min(ROWS_PER_BLOCK, rows - done)
        lines = []
        for i in range(n):
            values = _wide_fields(rnd, done + i).values()
            lines.append(",".join("NA" if v is None else str(v) for v in values) + "\n")
        yield "".join(lines)
        done += n


def wide_jsonl_lines(rows: int, seed: int = 7) -> Iterator[str]:
    """The same rows as `wide_csv_lines` as JSON lines: numbers as numbers, missing as null."""
    rnd = random.Random(seed)
    done = 0
    while done < rows:
        n = min(ROWS_PER_BLOCK, rows - done)
        yield "".join(json.dumps(_wide_fields(rnd, done + i), separators=(",", ":")) + "\n" for i in range(n))
        done += n


def _blocks(rows: int, fmt: str, seed: int, wide: bool) -> Iterator[str]:
    if wide:
        return wide_csv_lines(rows, seed) if fmt == "csv" else wide_jsonl_lines(rows, seed)
    return csv_lines(rows, seed) if fmt == "csv" else jsonl_lines(rows, seed)


def write(
    out: Path,
    rows: int | None = None,
    mb: float | None = None,
    fmt: str = "csv",
    seed: int = 7,
    wide: bool = False,
) -> int:
    """Write `rows` rows (or about `mb` megabytes) to `out`; returns the number of data rows."""
    if rows is None:
        if mb is None:
            raise ValueError("give rows or mb")
        rows = _rows_for_mb(mb, fmt, seed, wide)
    blocks = _blocks(rows, fmt, seed, wide)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8", newline="") as fh:
        for block in blocks:
            fh.write(block)
    return rows


def write_repeated(
    out: Path, mb: float, fmt: str = "csv", seed: int = 7, wide: bool = False, sample_mb: float = 4.0
) -> int:
    """About `mb` megabytes in seconds: `sample_mb` of rows generated once, their bytes repeated
    (a CSV header once). For throughput benchmarks, where rows repeating every few MB do not
    matter; returns the number of data rows."""
    sample_rows = _rows_for_mb(min(mb, sample_mb), fmt, seed, wide)
    blocks = list(_blocks(sample_rows, fmt, seed, wide))
    header = blocks.pop(0).encode() if fmt == "csv" else b""
    body = "".join(blocks).encode()
    copies = max(1, round((mb * 1_000_000 - len(header)) / len(body)))
    tmp = out.with_name(out.name + ".part")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tmp.open("wb") as fh:
        fh.write(header)
        for _ in range(copies):
            fh.write(body)
    tmp.replace(out)  # a run stopped half-way leaves no short file under the cached name
    return sample_rows * copies


def _rows_for_mb(mb: float, fmt: str, seed: int, wide: bool = False) -> int:
    sample = 20_000
    blocks = _blocks(sample, fmt, seed, wide)
    size = sum(len(b.encode()) for b in blocks)
    return max(1, int(mb * 1_000_000 / (size / sample)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--rows", type=int, help="number of data rows")
    size.add_argument("--mb", type=float, help="approximate size in megabytes (10^6 bytes)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--format", choices=("csv", "jsonl"), default=None, help="default: from --out suffix")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--wide", action="store_true", help="the 20-column weather-like table")
    parser.add_argument("--repeat", action="store_true", help="with --mb: 4 MB of rows repeated (fast)")
    args = parser.parse_args(argv)
    fmt = args.format or ("jsonl" if args.out.suffix in (".jsonl", ".json", ".ndjson") else "csv")
    if args.repeat:
        if args.mb is None:
            parser.error("--repeat needs --mb")
        rows = write_repeated(args.out, args.mb, fmt=fmt, seed=args.seed, wide=args.wide)
    else:
        rows = write(args.out, rows=args.rows, mb=args.mb, fmt=fmt, seed=args.seed, wide=args.wide)
    print(f"wrote {rows} rows to {args.out} ({args.out.stat().st_size / 1e6:.1f} MB, {fmt})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
