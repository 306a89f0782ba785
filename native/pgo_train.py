"""The training run of aggkernel's profile-guided build (setup.py runs it on the instrumented
module): seeded CSV and JSON-lines inputs of several shapes, a few MB each, scanned in blocks the
way the aggregate engine calls the scanner (shared/aggregation/native.py), and synthetic Parquet
pages folded as shared/aggregation/parquet_native.py folds them (untrained, GCC built pq.c for
size: 20-25% more CPU on a row group). Standard library and the module only: pip builds native/
on its own.

    python -I pgo_train.py LIB_DIR   # imports aggkernel from LIB_DIR; exit 1 if a block fell back
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

BLOCK_SIZES = (48 << 10, 1 << 20, 4 << 20)
"""Block sizes, in turn (the engine reads 4 MiB blocks, its first ones smaller)."""
DEFAULT_NULLS = (b"", b"NA")


@dataclass(frozen=True)
class Query:
    """One group-by as the engine asks it: the needed columns (group columns first), keys and
    values as indexes into them, per value 1 when numeric (sum, min, max, mean) or 0 (counted)."""

    columns: tuple[str, ...]
    keys: tuple[int, ...]
    values: tuple[int, ...]
    numeric: tuple[int, ...]
    nulls: tuple[bytes, ...] = DEFAULT_NULLS


def query(
    keys: Sequence[str],
    numbers: Sequence[str],
    counted: Sequence[str] = (),
    nulls: Sequence[bytes] = DEFAULT_NULLS,
) -> Query:
    """The query grouping by `keys`, with numeric metrics on `numbers` and counts of `counted`."""
    values = tuple(dict.fromkeys([*numbers, *counted]))
    columns = tuple(dict.fromkeys([*keys, *values]))
    return Query(
        columns=columns,
        keys=tuple(columns.index(k) for k in keys),
        values=tuple(columns.index(v) for v in values),
        numeric=tuple(int(v in numbers) for v in values),
        nulls=tuple(nulls),
    )


@dataclass(frozen=True)
class Case:
    """One input: "csv" (its header apart from `body`) or "jsonl", and the queries run on it."""

    name: str
    kind: str
    header: tuple[str, ...]
    body: bytes
    queries: tuple[Query, ...]

    def args(self, q: Query) -> tuple[Any, ...]:
        """The scanner's arguments after the block: (columns, keys, values, numeric, nulls)."""
        if self.kind == "csv":
            columns: tuple[Any, ...] = tuple(
                q.columns.index(h) if h in q.columns else -1 for h in self.header
            )
        else:
            columns = tuple(c.encode() for c in q.columns)
        return (columns, q.keys, q.values, q.numeric, q.nulls)


# ---- values -------------------------------------------------------------------------------


def _pick(rng: random.Random, pool: Sequence[str], n: int, skew: bool = False) -> list[str]:
    """n values of `pool`, uniform or skewed (the first ones most frequent)."""
    weights = [1.0 / (i + 1) for i in range(len(pool))] if skew else None
    return rng.choices(pool, weights=weights, k=n)


def _with_nulls(rng: random.Random, values: list[str], rate: float, nulls: Sequence[str]) -> list[str]:
    """`values` with about `rate` of them replaced by null texts."""
    return [rng.choice(nulls) if rng.random() < rate else v for v in values]


def _numbers(
    rng: random.Random, n: int, low: float, high: float, decimals: int, odd: float = 0.0
) -> list[str]:
    """n numbers as text; `odd` of them exponent forms or long digit strings."""
    pool = [f"{rng.uniform(low, high):.{decimals}f}" for _ in range(997)]
    if odd:
        pool += [f"{rng.uniform(low, high):.3e}" for _ in range(int(997 * odd))]
        pool += [f"{rng.uniform(-1, 1) * 1e6:.{rng.randint(10, 14)}f}" for _ in range(int(997 * odd))]
        pool += [f"{rng.randint(1, 9)}E{rng.randint(-5, 5)}" for _ in range(int(499 * odd) + 1)]
    return _pick(rng, pool, n)


def _words(rng: random.Random, count: int, low: int, high: int, alphabet: str) -> list[str]:
    """`count` distinct words of `low` to `high` characters of `alphabet`."""
    words: dict[str, None] = {}
    while len(words) < count:
        words["".join(rng.choices(alphabet, k=rng.randint(low, high)))] = None
    return list(words)


LOWER = "abcdefghijklmnopqrstuvwxyz"
TEXT = LOWER + "ABCDEFGHIJ0123456789 -_/."
UNICODE = LOWER + "éüßøçñ中文ё"


def _csv_field(value: str, always: bool = False) -> str:
    """`value` as a CSV field: quoted when it must be (or `always`), quotes doubled."""
    if always or any(c in value for c in ',"\r\n'):
        return '"' + value.replace('"', '""') + '"'
    return value


def _csv(rng: random.Random, columns: Sequence[list[str]], crlf: float = 0.0, blank: float = 0.0) -> bytes:
    """Records of `columns` (texts as written), \\r\\n-ended at rate `crlf`, some blank lines."""
    lines = [",".join(row) for row in zip(*columns, strict=True)]
    ends = rng.choices(("\n", "\r\n", "\n\n"), weights=(1 - crlf - blank, crlf, blank), k=len(lines))
    return "".join(line + end for line, end in zip(lines, ends, strict=True)).encode()


# ---- CSV inputs ---------------------------------------------------------------------------


def csv_narrow(rng: random.Random, n: int) -> Case:
    """Sales-like: 9 columns, a few groups, prices and quantities, some empty fields."""
    header = ("order", "day", "region", "store", "channel", "qty", "price", "discount", "note")
    regions = ["north", "south", "east", "west", "north-east", "south-west", "centre", "islands"]
    cols = [
        [str(100000 + i) for i in range(n)],
        _pick(rng, [f"2024-{m:02d}-{d:02d}" for m in range(1, 13) for d in range(1, 29)], n),
        _pick(rng, regions, n, skew=True),
        _pick(rng, [f"S{i:04d}" for i in range(400)], n),
        _with_nulls(rng, _pick(rng, ["web", "store", "partner", "phone"], n), 0.05, [""]),
        _with_nulls(rng, [str(x) for x in _pick(rng, [str(i) for i in range(1, 60)], n)], 0.02, [""]),
        _numbers(rng, n, 1, 900, 2),
        _with_nulls(rng, _numbers(rng, n, 0, 0.5, 2), 0.3, ["", "NA"]),
        _with_nulls(rng, _pick(rng, _words(rng, 50, 3, 18, TEXT), n), 0.6, [""]),
    ]
    queries = (
        query(["region"], ["price", "qty"]),
        query(["region", "channel"], ["price", "discount"], ["note"]),
        query([], ["qty"], ["channel"]),
    )
    return Case("csv-narrow", "csv", header, _csv(rng, cols), queries)


def csv_wide(rng: random.Random, n: int) -> Case:
    """Weather-like: 26 columns, hundreds of groups, many NA, negatives, exponents, CRLF."""
    header: tuple[str, ...] = ("id", "station", "ts", "country", "kind", "lat", "lon", "elev", "temp")
    header += ("dew", "hum", "press", "wdir", "wspd", "gust", "precip", "vis", "sky", "flag")
    header += ("q1", "q2", "q3", "q4", "q5", "src", "rev")
    stations = [f"ST{i:04d}" for i in range(700)]
    cols = [
        [str(5_000_000 + i) for i in range(n)],
        _pick(rng, stations, n),
        _pick(
            rng,
            [f"2024-03-{d:02d} {h:02d}:{m:02d}:00" for d in range(1, 29) for h in range(24) for m in (0, 30)],
            n,
        ),
        _pick(rng, ["ES", "SE", "FR", "DE", "IT", "PL", "NO", "IE"], n, skew=True),
        _pick(rng, ["synop", "metar", "buoy"], n),
        _numbers(rng, n, -60, 70, 4),
        _numbers(rng, n, -180, 180, 3),
        _pick(rng, [str(i) for i in range(-20, 3000, 7)], n),
        _with_nulls(rng, _numbers(rng, n, -30, 40, 1, odd=0.02), 0.05, ["NA"]),
        _with_nulls(rng, _numbers(rng, n, -30, 25, 1), 0.3, ["NA"]),
        _pick(rng, [str(i) for i in range(5, 101)], n),
        _with_nulls(rng, _numbers(rng, n, 950, 1050, 1), 0.4, ["NA", ""]),
        _pick(rng, [str(i) for i in range(0, 360, 10)], n),
        _with_nulls(rng, _numbers(rng, n, 0, 60, 0), 0.02, ["NA"]),
        _with_nulls(rng, _pick(rng, [str(i) for i in range(10, 90)], n), 0.7, ["NA"]),
        _with_nulls(rng, _numbers(rng, n, 0, 3, 2, odd=0.05), 0.2, ["NA", ""]),
        _pick(rng, [str(i * 100) for i in range(100)], n),
        _pick(rng, ["FEW", "SCT", "BKN", "OVC", "CLR"], n),
        _with_nulls(rng, _pick(rng, ["X", "Y", "Z"], n), 0.9, ["NA"]),
        *(_numbers(rng, n, -1, 1, 6) for _ in range(5)),
        _pick(rng, ["auto", "manual"], n),
        [str(rng.randint(1, 9)) for _ in range(n)],
    ]
    queries = (
        query(["station"], ["temp", "precip", "wspd"]),
        query(["country", "kind"], ["temp", "press", "gust", "dew"], ["flag"]),
        query(["sky"], ["q1", "q2", "q3", "q4", "q5", "elev"]),
    )
    return Case("csv-wide", "csv", header, _csv(rng, cols, crlf=0.5), queries)


def csv_quoted(rng: random.Random, n: int) -> Case:
    """Text-heavy: quoted fields with commas and doubled quotes, long UTF-8 keys, many groups."""
    header = ("customer", "city", "comment", "amount", "score", "tags")
    customers = _words(rng, 6000, 8, 40, UNICODE)
    comments = [
        *_words(rng, 100, 5, 60, TEXT),
        'said "fine", then left',
        "a, b, and c",
        '"quoted" start',
        'ends with a quote"',
        "multi, comma, text, here",
    ]
    cols = [
        [_csv_field(v, always=rng.random() < 0.2) for v in _pick(rng, customers, n, skew=True)],
        [
            _csv_field(v)
            for v in _with_nulls(rng, _pick(rng, _words(rng, 60, 4, 14, UNICODE), n), 0.05, ["", "NA"])
        ],
        [_csv_field(v) for v in _with_nulls(rng, _pick(rng, comments, n), 0.3, [""])],
        [_csv_field(v, always=rng.random() < 0.1) for v in _numbers(rng, n, -5000, 5000, 2, odd=0.03)],
        _with_nulls(rng, _numbers(rng, n, 0, 1, 4), 0.1, ["", "NA"]),
        [_csv_field(v) for v in _pick(rng, ["a", "a,b", "b,c,d", "", "x"], n)],
    ]
    queries = (
        query(["customer"], ["amount", "score"]),
        query(["city"], ["amount"], ["comment", "tags"]),
        query(["city", "customer"], ["score"], ["city"]),
    )
    return Case("csv-quoted", "csv", header, _csv(rng, cols, crlf=0.1), queries)


def csv_tiny(rng: random.Random, n: int) -> Case:
    """Three short columns, integer keys, negative integers, blank lines, custom nulls."""
    header = ("k", "v", "w")
    cols = [
        _pick(rng, [str(i) for i in range(40000)], n),
        _pick(rng, [str(i) for i in range(-999, 1000)], n),
        _with_nulls(rng, _pick(rng, [str(i) for i in range(100)], n), 0.1, ["null", "-"]),
    ]
    queries = (
        query(["k"], ["v", "w"], nulls=(b"", b"null", b"-")),
        query(["w"], ["v"], nulls=(b"null", b"-")),
    )
    return Case("csv-tiny", "csv", header, _csv(rng, cols, blank=0.01), queries)


# ---- JSON-lines inputs --------------------------------------------------------------------


def _jsonl(rows: Sequence[dict[str, Any]], dump: Callable[[Any], str]) -> bytes:
    """One object a line."""
    return "".join(dump(row) + "\n" for row in rows).encode()


def _compact(row: Any) -> str:
    return json.dumps(row, separators=(",", ":"))


def jsonl_records(rng: random.Random, n: int) -> Case:
    """Compact objects, keys in one order, some missing or null, nested values in other keys."""
    stations = [f"ST{i:03d}" for i in range(300)]
    temps, winds = _numbers(rng, n, -20, 40, 1), _numbers(rng, n, 0, 50, 0)
    rows = []
    for i in range(n):
        row: dict[str, Any] = {
            "id": 1_000_000 + i,
            "station": rng.choice(stations),
            "ts": f"2024-01-{i % 28 + 1:02d} {i % 24:02d}:00:00",
            "temp": float(temps[i]),
            "wind": int(float(winds[i])),
            "gust": None if rng.random() < 0.4 else rng.randint(10, 90),
            "precip": round(rng.uniform(0, 3), 2),
            "sky": rng.choice(["FEW", "SCT", "BKN", "OVC"]),
            "ok": rng.random() < 0.9,
        }
        if rng.random() < 0.1:
            row["meta"] = {"src": rng.choice(["a", "b"]), "seq": [1, 2, {"x": None}], "w": 1.5e-3}
        if rng.random() < 0.05:
            del row["temp"]
        if rng.random() < 0.03:
            row["flag"] = None
        rows.append(row)
    queries = (
        query(["station"], ["temp", "precip", "wind"]),
        query(["sky", "ok"], ["gust"], ["ts"]),
        query([], ["temp"]),
    )
    return Case("jsonl-records", "jsonl", (), _jsonl(rows, _compact), queries)


def jsonl_text(rng: random.Random, n: int) -> Case:
    """Spaced objects (json.dumps' default), shuffled keys in part, UTF-8 and escaped strings,
    numbers as strings or in exponent form, integer and boolean group keys."""
    names = [*_words(rng, 3000, 5, 30, UNICODE), 'Ann "A" B', "tab\there", "back\\slash", "line\nbreak"]
    rows = []
    amounts = _numbers(rng, n, -1000, 1000, 2, odd=0.05)
    for i in range(n):
        row: dict[str, Any] = {
            "user": rng.choice(names),
            "age": rng.randint(18, 90),
            "vip": rng.random() < 0.2,
            "amount": amounts[i] if rng.random() < 0.2 else float(amounts[i]),
            "note": rng.choice(["", "ok", "line\nnext", 'quote " here', "ünïcödé", None]),
            "tags": rng.sample(["a", "b", "c", "d"], rng.randint(0, 3)),
        }
        if rng.random() < 0.15:
            keys = list(row)
            rng.shuffle(keys)
            row = {k: row[k] for k in keys}
        rows.append(row)
    ascii_half = _jsonl(rows[: n // 2], lambda row: json.dumps(row))
    utf8_half = _jsonl(rows[n // 2 :], lambda row: json.dumps(row, ensure_ascii=False))
    queries = (
        query(["user"], ["amount"]),
        query(["age", "vip"], ["amount"], ["note"]),
        query(["vip"], ["age"], ["user"]),
    )
    return Case("jsonl-text", "jsonl", (), ascii_half + utf8_half, queries)


def jsonl_small(rng: random.Random, n: int) -> Case:
    """Four-key objects, long string keys, many groups, NA strings."""
    keys = _words(rng, 20000, 12, 48, LOWER + "-_0123456789")
    rows = [
        {
            "k": rng.choice(keys),
            "v": rng.randint(-(10**6), 10**6),
            "w": "NA" if rng.random() < 0.1 else round(rng.uniform(-1, 1), 5),
            "z": rng.choice([None, "x", 1]),
        }
        for _ in range(n)
    ]
    queries = (query(["k"], ["v", "w"]), query(["z"], ["w"], ["k"]))
    return Case("jsonl-small", "jsonl", (), _jsonl(rows, _compact), queries)


CASES: tuple[tuple[Callable[[random.Random, int], Case], int], ...] = (
    (csv_narrow, 36000),
    (csv_wide, 22000),
    (csv_quoted, 30000),
    (csv_tiny, 200000),
    (jsonl_records, 16000),
    (jsonl_text, 16000),
    (jsonl_small, 40000),
)
"""Each input's maker and its records (about 2 to 4 MB each)."""


def cases(scale: float = 1.0, seed: int = 20240517) -> Iterator[Case]:
    """The training inputs, `scale` times their full size; the same for the same seed."""
    for make, n in CASES:
        yield make(random.Random(f"{seed}-{make.__name__}"), max(10, int(n * scale)))


def blocks(body: bytes, sizes: Sequence[int] = BLOCK_SIZES) -> Iterator[memoryview]:
    """`body` in blocks of whole lines (no line break inside a value), of `sizes` in turn."""
    view, start, turn = memoryview(body), 0, 0
    while start < len(body):
        end = start + sizes[turn % len(sizes)]
        end = len(body) if end >= len(body) else body.index(b"\n", end) + 1
        yield view[start:end]
        start, turn = end, turn + 1


def scan(kernel: Any, case: Case, sizes: Sequence[int] = BLOCK_SIZES) -> tuple[int, int, int]:
    """(blocks, blocks the scanner fell back on, records) over every query of `case`."""
    reduce = kernel.csv_reduce if case.kind == "csv" else kernel.jsonl_reduce
    count, fallbacks, records = 0, 0, 0
    for q in case.queries:
        args = case.args(q)
        for block in blocks(case.body, sizes):
            kernel.count_byte(block, 34 if case.kind == "csv" else 10, 0, len(block))
            out = reduce(block, *args)
            count += 1
            if out is None:
                fallbacks += 1
            else:
                records += out[0]
    return count, fallbacks, records


# --- Parquet pages (pq.c): synthetic pages as writers make them, folded as parquet_native.py does


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _hybrid(values: Sequence[int], bw: int, rng: random.Random) -> bytes:
    """Parquet's RLE / bit-packed hybrid of `values`: runs of 8+ equal values as RLE runs (as
    writers make them), the rest bit-packed in groups of 8, at random lengths."""
    out, i, n = bytearray(), 0, len(values)
    while i < n:
        run = 1
        while i + run < n and values[i + run] == values[i]:
            run += 1
        if run >= 8:
            out += _varint(run << 1) + values[i].to_bytes((bw + 7) // 8, "little")
            i += run
            continue
        groups = min(-(-(n - i) // 8), rng.randint(1, 64))
        chunk = list(values[i : i + groups * 8]) + [0] * (groups * 8 - len(values[i : i + groups * 8]))
        bits = sum(v << (k * bw) for k, v in enumerate(chunk))
        out += _varint(groups << 1 | 1) + bits.to_bytes(groups * bw, "little")
        i += groups * 8
    return bytes(out)


def parquet_pages(kernel: Any, seed: int = 20240517, pages: int = 36) -> int:
    """Key and value pages of several shapes through pq_key_page / pq_fold_page (and a dictionary
    page through pq_byte_arrays); the rows folded, or -1 when a page was refused."""
    import array
    import struct

    rng, rows_done = random.Random(f"{seed}-parquet"), 0
    for page in range(pages):
        rows = rng.choice((1000, 20_000, 65_536))
        ndict = rng.choice((3, 200, 2000))
        bw = max(1, (ndict - 1).bit_length())
        names = [f"station-{i}".encode() for i in range(ndict)]
        if kernel.pq_byte_arrays(b"".join(struct.pack("<I", len(x)) + x for x in names), ndict) is None:
            return -1
        null_rate = (0.0, 0.02, 0.3)[page % 3]
        defined = [int(rng.random() >= null_rate) for _ in range(rows)]
        levels = _hybrid(defined, 1, rng) if null_rate else None
        keys = [min(ndict - 1, int(rng.expovariate(8 / ndict))) for _ in range(sum(defined))]
        ids, counts = bytearray(4 * rows), bytearray(8 * (ndict + 1))
        if kernel.pq_key_page(levels, bytes([bw]) + _hybrid(keys, bw, rng), rows, ndict, ids, 0, counts) < 0:
            return -1
        slots = bytearray(32 * (ndict + 1))
        present = sum(defined)
        for phys in (0, 3, 2, 1):
            args: tuple[bytes, int, array.array[float] | None]
            if phys == 0 and page % 2:  # dictionary-encoded doubles
                dictionary = array.array("d", [rng.uniform(-50, 50) for _ in range(700)])
                coded = [rng.randrange(700) for _ in range(present)]
                args = (bytes([10]) + _hybrid(coded, 10, rng), 1, dictionary)
            else:
                fmt = {0: "d", 1: "f", 2: "i", 3: "q"}[phys]
                nums = [
                    rng.uniform(-1e3, 1e3) if fmt in "df" else rng.randint(-(10**6), 10**6)
                    for _ in range(present)
                ]
                args = (array.array(fmt, nums).tobytes(), 0, None)
            for want in (1, 4, 7):
                values, encoding, stored = args
                if (
                    kernel.pq_fold_page(levels, values, rows, encoding, phys, stored, ids, 0, slots, want)
                    != 1
                ):
                    return -1
        rows_done += rows
    return rows_done


def main(argv: Sequence[str]) -> int:
    """Train the module found in argv[1]; 1 when a block fell back (the profile would be off)."""
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    sys.path.insert(0, argv[1])
    import aggkernel

    if not aggkernel.__file__.startswith(argv[1]):
        print(f"pgo_train: imported {aggkernel.__file__}, not the build in {argv[1]}", file=sys.stderr)
        return 1
    status = 0
    for case in cases():
        count, fallbacks, records = scan(aggkernel, case)
        print(f"pgo_train: {case.name}: {len(case.body) / 1e6:.1f} MB, {count} blocks, {records} records")
        if fallbacks:
            print(f"pgo_train: {case.name}: {fallbacks} blocks fell back", file=sys.stderr)
            status = 1
    folded = parquet_pages(aggkernel) if hasattr(aggkernel, "pq_fold_page") else 0
    print(f"pgo_train: Parquet pages: {folded} rows")
    if folded < 0:
        print("pgo_train: a Parquet page was refused", file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
