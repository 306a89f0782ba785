"""Deterministic sales-like test data for the aggregate job (CSV or JSON lines).

Columns (about 100 bytes a row, like a typical sales export): order_id, ts, region, country,
store, product, category, customer, channel, qty (int), price (float), discount (float),
currency, note (free text, sometimes quoted with a comma or doubled quotes inside). About 2% of
qty/price are empty and 1% are `NA`; about 0.5% of regions are empty (a null group key).

    python -m bench.datagen --rows 100000 --out data.csv
    python -m bench.datagen --mb 1000 --out big.csv
    python -m bench.datagen --rows 1000 --format jsonl --out data.jsonl
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


def write(
    out: Path, rows: int | None = None, mb: float | None = None, fmt: str = "csv", seed: int = 7
) -> int:
    """Write `rows` rows (or about `mb` megabytes) to `out`; returns the number of data rows."""
    if rows is None:
        if mb is None:
            raise ValueError("give rows or mb")
        rows = _rows_for_mb(mb, fmt, seed)
    blocks = csv_lines(rows, seed) if fmt == "csv" else jsonl_lines(rows, seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8", newline="") as fh:
        for block in blocks:
            fh.write(block)
    return rows


def _rows_for_mb(mb: float, fmt: str, seed: int) -> int:
    sample = 20_000
    blocks = csv_lines(sample, seed) if fmt == "csv" else jsonl_lines(sample, seed)
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
    args = parser.parse_args(argv)
    fmt = args.format or ("jsonl" if args.out.suffix in (".jsonl", ".json", ".ndjson") else "csv")
    rows = write(args.out, rows=args.rows, mb=args.mb, fmt=fmt, seed=args.seed)
    print(f"wrote {rows} rows to {args.out} ({args.out.stat().st_size / 1e6:.1f} MB, {fmt})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
