"""Differential fuzz of the aggregate engine: the C scanner against the Python path, at many
block sizes. One input must give one answer: the same rows, or the same error message.

Inputs are random and mutated CSV / JSON-lines texts over a small alphabet of the bytes that
matter (quotes, separators, line breaks, a BOM, escapes, bytes that are not UTF-8, nesting),
with random group-by and metrics over the columns. Numbers are dyadic (exact in binary), so a
sum does not depend on the order of the additions.

Parquet (`parquet_run`): random files written every way pyarrow writes them, the scanner's page
decode and fold (`parquet_native`) against pyarrow's decode; then their column chunks' bytes
changed at random, where only a crash or a read past a buffer (the sanitizers) is a finding;
and (`parquet_mutations`) page headers, levels, dictionaries and footers changed, each file
answered as pyarrow's read_table answers it or refused where it refuses.

    python -m tests.fuzz.differential --seconds 180     # what `make fuzz` runs (under sanitizers)
"""

from __future__ import annotations

import argparse
import io
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shared.aggregation import EngineOptions, engine, parse_aggregate_payload
from shared.aggregation import native as bridge
from shared.core.errors import InputDataError
from tests.fuzz import parquet_mutations

BLOCK_SIZES = (16, 37, 64, 256, 4096, 1 << 20)
COLUMNS = ("k", "v", "w", "\ufeffk", "k\u00e9")
NUMBERS = (
    "1",
    "2.5",
    "-0",
    "0",
    "-3.25",
    " 4 ",
    "1e3",
    "1e400",
    "0x10",
    "NA",
    "",
    "nan",
    "x",
    "007",
    "1.",
    ".5",
)
STRINGS = ("a", "b", "NA", "", "\u00e9", "a b", "\ufeffa", "x\r", '"q"', "1", "true")
CSV_NOISE = (b'"', b",", b"\n", b"\r", b"\r\n", b"\xef\xbb\xbf", b"\xff", b"\xc3", b"a", b" ", b'""')
JSON_NOISE = (
    b"[",
    b"]",
    b"{",
    b"}",
    b'"',
    b"\\",
    b"\\u",
    b"\\ud800",
    b",",
    b":",
    b"\n",
    b"\r",
    b"\xff",
    b"1",
)
NULLS = (("", "NA"), ("NA",), ("", "NA", "1"))


@dataclass
class Case:
    """One input and one query."""

    data: bytes
    payload: dict[str, Any]


@dataclass
class Report:
    """What a run found."""

    cases: int = 0
    mismatches: list[str] = field(default_factory=list)


def _number_or_text(rng: random.Random) -> str:
    return rng.choice(NUMBERS) if rng.random() < 0.6 else rng.choice(STRINGS)


def _csv_text(rng: random.Random, header: list[str]) -> bytes:
    lines = [",".join(_csv_field(rng, name) for name in header)]
    for _ in range(rng.randrange(0, 12)):
        fields = [_csv_field(rng, _number_or_text(rng)) for _ in header]
        if rng.random() < 0.1:
            fields.append("extra")
        lines.append(",".join(fields))
    ending = rng.choice(("\n", "\r\n", "\r", "\n"))
    text = ending.join(lines) + (ending if rng.random() < 0.8 else "")
    return text.encode()


def _csv_field(rng: random.Random, text: str) -> str:
    if rng.random() < 0.2 or any(c in text for c in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


def _json_value(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.35:
        text = rng.choice(NUMBERS)
        try:
            number = json.loads(text)
        except ValueError:
            return text
        return number if math.isfinite(number) else text
    if roll < 0.7:
        return rng.choice(STRINGS)
    if roll < 0.8:
        return rng.choice((None, True, False))
    if roll < 0.9:
        return {rng.choice(COLUMNS): rng.choice(STRINGS)}
    return [1, [2]]


def _jsonl_text(rng: random.Random) -> bytes:
    lines = []
    for _ in range(rng.randrange(0, 12)):
        record = {name: _json_value(rng) for name in COLUMNS if rng.random() < 0.6}
        if rng.random() < 0.1:
            record["n"] = {"k": "nested"}
        line = json.dumps(record, ensure_ascii=rng.random() < 0.3, allow_nan=False)
        lines.append(line if rng.random() < 0.9 else "")
    ending = rng.choice(("\n", "\r\n", "\n"))
    return (ending.join(lines) + (ending if rng.random() < 0.8 else "")).encode()


def _mutate(rng: random.Random, data: bytes, noise: tuple[bytes, ...]) -> bytes:
    out = bytearray(data)
    for _ in range(rng.choice((0, 0, 1, 1, 2, 4))):
        pos = rng.randrange(0, len(out) + 1)
        roll = rng.random()
        if roll < 0.5:
            out[pos:pos] = rng.choice(noise)
        elif roll < 0.8 and out:
            del out[pos : pos + rng.randrange(1, 4)]
        elif out:
            out[pos : pos + 1] = rng.choice(noise)
    return bytes(out)


CSV_UTF8_NOISE = tuple(n for n in CSV_NOISE if n not in (b"\xff", b"\xc3"))
"""The CSV noise without bytes that are not UTF-8 (`csv_utf8_only`: to look at other mismatches
on their own)."""


def make_case(
    rng: random.Random, csv_utf8_only: bool = False, formats: tuple[str, ...] = ("csv", "jsonl")
) -> Case:
    """A random input and a query over its columns."""
    fmt = rng.choice(formats)
    header = rng.sample(COLUMNS, rng.randrange(1, len(COLUMNS) + 1))
    if fmt == "csv":
        data = _mutate(rng, _csv_text(rng, header), CSV_UTF8_NOISE if csv_utf8_only else CSV_NOISE)
        if csv_utf8_only:
            data = data.decode("utf-8", "replace").encode()
        if rng.random() < 0.1:
            data = b"\xef\xbb\xbf" + data
    else:
        data = _mutate(rng, _jsonl_text(rng), JSON_NOISE)
    names = header if fmt == "csv" else list(COLUMNS)
    group_by = rng.sample(names, rng.randrange(0, min(2, len(names)) + 1))
    metrics: list[dict[str, Any]] = [{"op": "count"}]
    for _ in range(rng.randrange(0, 3)):
        metrics.append(
            {"op": rng.choice(("count", "sum", "mean", "min", "max")), "column": rng.choice(names)}
        )
    payload = {
        "input": "data/in",
        "format": fmt,
        "group_by": group_by,
        "metrics": metrics,
        "null_values": list(rng.choice(NULLS)),
    }
    return Case(data, payload)


class OneWay(io.RawIOBase):
    """A stream that cannot seek (errors name lines from the line breaks counted as read)."""

    def __init__(self, data: bytes) -> None:
        self.inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self.inner.readinto(buffer)


SEEKABLE_SIZES = (16, 64, 256, 4096, 1 << 20)
"""Block sizes read from a seekable stream; the other size (37) from one that cannot seek."""


def outcome(case: Case, native: bool, block_size: int) -> Any:
    """The engine's answer (rows, input rows) or its error message, comparable with ==."""
    try:
        spec = parse_aggregate_payload(case.payload)
    except Exception as exc:  # a query the generator made invalid (e.g. a repeated metric name)
        return ("payload", str(exc))
    try:
        stream = io.BytesIO(case.data) if block_size in SEEKABLE_SIZES else OneWay(case.data)
        result = engine.aggregate_stream(
            stream, spec, options=EngineOptions(block_size=block_size, native=native)
        )
    except InputDataError as exc:
        return ("error", str(exc))
    return (result.input_rows, [_comparable(row) for row in result.rows])


def _comparable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}


def check(case: Case, native_available: bool) -> str | None:
    """None when every path and block size agrees, else a description of the mismatch."""
    first: Any = None
    first_how = ""
    for native in (True, False) if native_available else (False,):
        for size in BLOCK_SIZES:
            got = outcome(case, native, size)
            how = f"native={native} block={size}"
            if first_how == "":
                first, first_how = got, how
            elif got != first:
                return f"{case.payload}\n{case.data!r}\n  {first_how}: {first}\n  {how}: {got}"
    return None


def run(
    seed: int,
    cases: int | None = None,
    seconds: float | None = None,
    csv_utf8_only: bool = False,
    formats: tuple[str, ...] = ("csv", "jsonl"),
) -> Report:
    """Check `cases` random cases (or as many as fit in `seconds`) from `seed`."""
    rng = random.Random(seed)
    report = Report()
    native = bridge.kernel is not None
    deadline = None if seconds is None else time.monotonic() + seconds
    while (cases is None or report.cases < cases) and (deadline is None or time.monotonic() < deadline):
        problem = check(make_case(rng, csv_utf8_only, formats), native)
        report.cases += 1
        if problem is not None:
            report.mismatches.append(problem)
    return report


PARQUET_METRICS = [
    {"op": "count"},
    {"op": "mean", "column": "t"},
    {"op": "sum", "column": "i"},
    {"op": "min", "column": "f"},
    {"op": "max", "column": "t"},
]


def parquet_case(rng: random.Random, sizes: tuple[int, ...] = (1, 5, 300, 3000)) -> bytes:
    """A random Parquet file of one of `sizes` rows: a string key (nulls or not), float64, int64
    and float32 values."""
    rows = rng.choice(sizes)
    names = [f"k{i}" for i in range(rng.choice((1, 4, 200)))]
    key_nulls, nulls = rng.choice((0.0, 0.2, 1.0)), rng.choice((0.0, 0.1, 1.0))

    def maybe(value: Any, share: float) -> Any:
        return None if rng.random() < share else value

    table = pa.table(
        {
            "k": pa.array([maybe(rng.choice(names), key_nulls) for _ in range(rows)], pa.string()),
            "t": pa.array(
                [maybe(rng.choice((0.5, -2.25, 8.0, 1e3)), nulls) for _ in range(rows)], pa.float64()
            ),
            "i": pa.array([maybe(rng.randint(-9, 9), nulls) for _ in range(rows)], pa.int64()),
            "f": pa.array([maybe(rng.choice((0.25, 3.5)), nulls) for _ in range(rows)], pa.float32()),
        }
    )
    sink = io.BytesIO()
    pq.write_table(
        table,
        sink,
        compression=rng.choice(("none", "snappy", "zstd", "gzip")),
        data_page_version=rng.choice(("1.0", "2.0")),
        data_page_size=rng.choice((64, 1024, 1 << 20)),
        row_group_size=rng.choice((7, 500, 100_000)),
        dictionary_pagesize_limit=rng.choice((64, 1 << 20)),
    )
    return sink.getvalue()


def parquet_outcome(data: bytes, native: bool) -> Any:
    from shared.aggregation.parquet_path import BytesSpans

    spec = parse_aggregate_payload(
        {"input": "data/in.parquet", "format": "parquet", "group_by": ["k"], "metrics": PARQUET_METRICS}
    )
    try:
        result = engine.aggregate_stream(BytesSpans(data), spec, options=EngineOptions(native=native))
    except InputDataError as exc:
        return ("error", str(exc))
    return (result.input_rows, [_comparable(row) for row in result.rows])


def _chunk_mutated(rng: random.Random, data: bytes) -> bytes:
    """Bytes changed inside the first row group's column chunks (page headers, levels, values)."""
    out = bytearray(data)
    group = pq.read_metadata(io.BytesIO(data)).row_group(0)
    for _ in range(rng.choice((1, 2, 8))):
        column = group.column(rng.randrange(group.num_columns))
        start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
        at = (start or column.data_page_offset) + rng.randrange(max(1, column.total_compressed_size))
        if at < len(out) - 8:
            out[at] = rng.choice((0, 0xFF, 0x15, 0x80, rng.randrange(256)))
    return bytes(out)


def parquet_run(seed: int, cases: int | None = None, seconds: float | None = None) -> Report:
    """Parquet files, each decoded by the scanner and by pyarrow (the same answer), then mutated
    and decoded by the scanner again (any answer or error: the sanitizers judge)."""
    rng = random.Random(seed)
    report = Report()
    deadline = None if seconds is None else time.monotonic() + seconds
    while (cases is None or report.cases < cases) and (deadline is None or time.monotonic() < deadline):
        data = parquet_case(rng)
        report.cases += 1
        if bridge.kernel is not None:
            fast, slow = parquet_outcome(data, True), parquet_outcome(data, False)
            if fast != slow:
                report.mismatches.append(
                    f"parquet seed {seed} case {report.cases}:\n  scanner {fast}\n  pyarrow {slow}"
                )
        parquet_outcome(_chunk_mutated(rng, data), True)
    return report


def hand_blocks_in_exact_buffers() -> None:
    """Give the scanner each block in a buffer of its own size (a block is otherwise a slice of
    a larger buffer, where a read past its end goes unseen): under ASan, with PYTHONMALLOC=malloc,
    any read past a block is reported."""
    for name in ("csv_reduce", "jsonl_reduce"):
        reduce = getattr(bridge.NativeArgs, name)

        def exact(self: bridge.NativeArgs, block: pa.Buffer, reduce: Any = reduce) -> Any:
            return reduce(self, pa.py_buffer(np.frombuffer(block, np.uint8).copy()))

        setattr(bridge.NativeArgs, name, exact)


def _kernel_file() -> str:
    """Where the scanner was loaded from (`make fuzz` must load the sanitized build)."""
    return "NOT BUILT" if bridge.kernel is None else f"from {bridge.kernel.__file__}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--exact-buffers", action="store_true", help="see hand_blocks_in_exact_buffers")
    args = parser.parse_args(argv)
    if args.exact_buffers:
        hand_blocks_in_exact_buffers()
    started = time.monotonic()
    report = run(args.seed, seconds=args.seconds * 0.75)
    parquet = parquet_run(args.seed, seconds=args.seconds * 0.125)
    mutated = parquet_mutations.run(args.seed, seconds=args.seconds * 0.125)
    mismatches = report.mismatches + parquet.mismatches + mutated.mismatches
    for problem in mismatches[:20]:
        print("MISMATCH", problem)
    print(
        f"differential fuzz: seed {args.seed}, {report.cases} CSV / JSON-lines cases, {parquet.cases} "
        f"Parquet files and {mutated.cases} mutated ones against pyarrow ({mutated.refused} refused by "
        f"it), {len(mismatches)} mismatches, scanner {_kernel_file()}, {time.monotonic() - started:.0f} s"
    )
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
