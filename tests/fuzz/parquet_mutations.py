"""Differential fuzz of the Parquet path against pyarrow's `read_table`: valid files (as
`differential.parquet_case` writes them) taken apart (`tests.parquet_craft`) and put back with one
thing changed: a page header's field set to an extreme value, a page dropped, doubled or moved,
definition levels or a dictionary page's bytes changed, a footer value changed. The engine
(the C scanner where it takes the row group) must answer what pyarrow's read_table and a
group-by answer, or refuse the file (InputDataError) where pyarrow does.
"""

from __future__ import annotations

import copy
import io
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shared.aggregation import EngineOptions, engine, parse_aggregate_payload
from shared.core.errors import InputDataError
from tests.parquet_craft import DATA_PAGE_V2, DICTIONARY_PAGE, I32, I64, Crafted

METRICS = [
    {"op": "count"},
    {"op": "mean", "column": "t"},
    {"op": "sum", "column": "i"},
    {"op": "min", "column": "f"},
    {"op": "max", "column": "t"},
]
SIZES = (1, 5, 40, 300)
"""Rows of a file mutated (few pages: each is taken apart and put back in Python)."""
EXTREMES = (0, 1, -1, 2**31 - 1, -(2**31), 2**31, 2**32, 2**32 + 7)


@dataclass
class Report:
    cases: int = 0
    refused: int = 0
    mismatches: list[str] = field(default_factory=list)


Answer = tuple[int, list[tuple[Any, ...]]] | str


def engine_answer(data: bytes, native: bool = True) -> Answer:
    from shared.aggregation.parquet_path import BytesSpans

    spec = parse_aggregate_payload(
        {"input": "data/in.parquet", "format": "parquet", "group_by": ["k"], "metrics": METRICS}
    )
    try:
        result = engine.aggregate_stream(BytesSpans(data), spec, options=EngineOptions(native=native))
    except InputDataError as exc:
        return f"refused: {exc}"
    return result.input_rows, [
        (r["k"], r["count"], r["mean_t"], r["sum_i"], r["min_f"], r["max_t"]) for r in result.rows
    ]


def pyarrow_answer(data: bytes) -> Answer:
    """read_table, then a group-by in one thread (numbers as float64, as the engine reads them);
    'refused' where pyarrow refuses the file, or its keys (not UTF-8) or indices (past the
    dictionary) cannot be grouped."""
    try:
        table = pq.read_table(io.BytesIO(data))
        if not pa.types.is_string(table.schema.field("k").type):
            return "refused: key type"
        table.column("k").validate(full=True)
        frame = pa.table(
            {
                "k": table["k"],
                **{name: pc.cast(table[name], pa.float64(), safe=False) for name in ("t", "i", "f")},
            }
        )
        grouped = frame.group_by("k", use_threads=False).aggregate(
            [([], "count_all"), ("t", "sum"), ("t", "count"), ("i", "sum"), ("f", "min"), ("t", "max")]
        )
    except (OSError, pa.ArrowException, IndexError) as exc:
        return f"pyarrow refuses: {exc}"
    rows = []
    for row in grouped.to_pylist():
        mean = None if not row["t_count"] else row["t_sum"] / row["t_count"]
        rows.append((row["k"], row["count_all"], mean, row["i_sum"], row["f_min"], row["t_max"]))
    rows.sort(key=lambda r: (r[0] is not None, r[0] or ""))
    return table.num_rows, rows


def agree(got: Answer, want: Answer) -> bool:
    if isinstance(want, str) or isinstance(got, str):
        return isinstance(want, str) and isinstance(got, str) and "Parquet" in got
    if got[0] != want[0] or len(got[1]) != len(want[1]):
        return False
    return all(_close(a, b) for x, y in zip(got[1], want[1], strict=True) for a, b in zip(x, y, strict=True))


def _close(a: Any, b: Any) -> bool:
    if isinstance(b, float) and isinstance(a, float):
        if math.isnan(b) or math.isnan(a):
            return math.isnan(a) and math.isnan(b)
        if math.isinf(a) or math.isinf(b):
            return a == b
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return bool(a == b)


def _pages(file: Crafted, rng: random.Random) -> list[Any]:
    group = file.chunks[rng.randrange(len(file.chunks))]
    return group[rng.randrange(len(group))]


def mutate(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    """One change (what, the file): page headers, page order, levels, dictionaries, footers."""
    file = Crafted.of(data)
    if not file.chunks:
        return "none", data
    what = rng.choice(("header", "pages", "levels", "dictionary", "footer"))
    pages = _pages(file, rng)
    page = rng.choice(pages) if pages else None
    keep_sizes = False
    if what == "header" and page is not None:
        fields = rng.choice((page.header, page.sub))
        key = rng.choice([k for k, (kind, _) in fields.items() if kind == I32] or [1])
        old = fields.get(key, (I32, 0))[1]
        fields[key] = (I32, rng.choice((*EXTREMES, old + 1, old - 1, old * 2, old + 2**32)))
        what += f" field {key}"
    elif what == "pages" and len(pages) > 1:
        i = rng.randrange(len(pages))
        how = rng.choice(("drop", "double", "swap"))
        if how == "drop":
            del pages[i]
        elif how == "double":
            pages.insert(i, copy.deepcopy(pages[i]))
        else:
            j = (i + 1) % len(pages)
            pages[i], pages[j] = pages[j], pages[i]
        what += f" {how}"
    elif what == "levels" and page is not None and page.kind == DATA_PAGE_V2 and page.sub[5][1]:
        size = page.sub[5][1]
        body = bytearray(page.body)
        body[rng.randrange(size)] = rng.choice((0, 1, 2, 3, 0x0A, 0xFF, 0x80, rng.randrange(256)))
        page.body = bytes(body)
    elif what == "dictionary" and pages and pages[0].kind == DICTIONARY_PAGE:
        dictionary = pages[0]
        how = rng.choice(("count", "byte", "encoding"))
        if how == "count":
            dictionary.sub[1] = (I32, rng.choice((0, -1, dictionary.sub[1][1] + 1, dictionary.sub[1][1] - 1)))
        elif how == "encoding":
            dictionary.sub[2] = (I32, rng.choice((0, 1, 2, 3, 5, 8)))
        elif dictionary.body:
            body = bytearray(dictionary.body)
            body[rng.randrange(len(body))] = rng.randrange(256)
            dictionary.body = bytes(body)
        what += f" {how}"
    elif what == "footer":
        g = rng.randrange(len(file.chunks))
        c = rng.randrange(len(file.chunks[g]))
        meta = file.meta(g, c)
        how = rng.choice(("num_values", "type", "codec", "num_rows", "size"))
        if how == "num_values":
            meta[5] = (I64, rng.choice((0, meta[5][1] - 1, meta[5][1] + 1, 2**40)))
        elif how == "type":
            meta[1] = (I32, rng.choice((0, 1, 2, 4, 5, 6, 7)))
        elif how == "codec":
            meta[4] = (I32, rng.choice((0, 1, 2, 3, 4, 5, 6, 7)))
        elif how == "num_rows":
            group = file.row_group(g)
            group[3] = (I64, rng.choice((0, group[3][1] - 1, group[3][1] + 1)))
        else:
            keep_sizes = True
            meta[7] = (I64, rng.choice((meta[7][1] - 1, meta[7][1] + 1, meta[7][1] // 2)))
        what += f" {how}"
    return what, file.build(keep_sizes=keep_sizes)


def run(seed: int, cases: int | None = None, seconds: float | None = None, native: bool = True) -> Report:
    """Mutated files, each answered by the engine and by pyarrow: the same answer or both refuse."""
    from tests.fuzz.differential import parquet_case

    rng = random.Random(seed)
    report = Report()
    deadline = None if seconds is None else time.monotonic() + seconds
    while (cases is None or report.cases < cases) and (deadline is None or time.monotonic() < deadline):
        what, data = mutate(rng, parquet_case(rng, SIZES))
        report.cases += 1
        want = pyarrow_answer(data)
        try:
            got = engine_answer(data, native)
        except Exception as exc:  # any other error is a finding
            got = f"unexpected {type(exc).__name__}: {exc}"
        report.refused += isinstance(want, str)
        if not agree(got, want):
            report.mismatches.append(
                f"parquet mutation seed {seed} case {report.cases} ({what}):\n  engine  {got}\n  pyarrow {want}"
            )
    return report
