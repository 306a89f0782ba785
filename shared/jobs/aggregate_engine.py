"""The inline `aggregate` engine: a streaming group-by over CSV or JSON lines, pure over a stream.

How it stays fast and bounded:

- The stream is read in blocks of `block_size` bytes (the first ones smaller, so parsing starts
  at once), each cut at its last record boundary (CSV: a line break outside quotes, quotes
  counted in C; JSON lines: a line break). Two blocks are parsed at a time, each on a thread of
  its own, while the next ones are read.
  A stream that hands over its own buffers (the blob reader: `next_chunk` / `give_back`) is
  cut in place instead of copied (`_ChunkSplitter`): only a record spanning two buffers is.
- Each block goes first to the C scanner (`aggkernel`, built from native/): one pass, off the
  GIL, that finds the structural bytes 64 at a time, reads only the needed fields, parses
  numbers (correctly rounded) and reduces the block's rows in a hash table to partial
  aggregates per group (rows, non-null count, sum, min, max). It answers only when it is sure
  to give what the Python path gives (`_NativeArgs`); anything else goes to the Python path.
- The Python path (also the whole engine where the scanner is not built, e.g. the engine zip on
  Spark executors): CSV blocks parsed by pyarrow's `read_csv` as a single chunk (only the needed
  columns; numeric-only columns straight to float64), JSON lines by pyarrow's JSON reader with an
  explicit schema (`_JsonParser`), and what that cannot answer exactly as Python's `json` would
  (a float group key, mixed types, an object, a bad value...) by the exact path, line by line,
  which keeps numbers as written and names the line of a bad value. Each block is reduced with
  Arrow's `Table.group_by`.
- Partials are concatenated and re-aggregated when they grow, so memory depends on the block
  size and the number of groups, never on the input size.

Measured (bench/bench_aggregate.py: 2 cores, interleaved, best of 7; see the README): engine /
Polars 2.1 streaming 1.84-1.88x on the wide CSV (20 columns), 1.45x on the narrow one, 2.0x on
JSON lines (the pyarrow path alone: 0.67-0.87x, 0.74-0.97x, 0.54-0.57x); peak RSS ~130 MB on
1 GB of CSV or of JSON lines.

Semantics are SQL's: see `aggregate_stream`.

Input rules (one answer per input: both paths and every block size give the same rows or the
same error; `tests/fuzz/differential.py` checks it):

- Errors: the first bad record (CSV) or line (JSON lines) in file order is named, with its
  physical line number (a line break is \n, \r\n or a lone \r; breaks inside quoted CSV values
  count). Within a CSV record: its quoting and number of fields first, then its columns in
  header order (a group or numeric column that is not UTF-8, then a value that is not a number).
- CSV: RFC 4180 quoting, `,` between fields, empty lines skipped. A quote must open or close a
  whole field: one inside an unquoted field (`5" screen`), text after a closing quote, or a
  quoted field never closed is refused (they would make the block cut ambiguous). A byte-order
  mark is skipped only at the start of the input; elsewhere it is data. Group and numeric columns
  must be UTF-8; a column only counted is counted whatever its bytes. The header has at most
  MAX_CSV_COLUMNS (16,384) columns; a record (so any key or value) at most MAX_RECORD_BYTES.
- JSON lines: one object per line, `\n` or `\r\n` endings (a lone `\r` is not a line break,
  as in Python's `json`); one byte-order mark at the start of a line is ignored. Nesting deeper
  than MAX_JSON_DEPTH (64) and a lone surrogate (`"\\ud800"`) in a needed column are bad input
  naming the line; invalid UTF-8 is invalid JSON. A line is at most MAX_RECORD_BYTES; pyarrow
  guesses types from a block's first GUESS_LINES lines / GUESS_BYTES only.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson

from shared.errors import InputDataError, LimitExceeded

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy is in requirements.txt (not always on Spark executors)
    np = None  # type: ignore[assignment]

try:
    import aggkernel as _kernel  # the C scanner in native/ (built by pip from source)
except ImportError:  # not built here (e.g. the engine zip on Spark executors): pyarrow does it all
    _kernel = None

NATIVE: bool = _kernel is not None
"""Whether blocks go to the C scanner first (tests turn it off to compare both paths)."""

Op = Literal["count", "sum", "mean", "min", "max"]
Format = Literal["csv", "jsonl"]
Engine = Literal["auto", "inline", "spark"]

OPS: Final = ("count", "sum", "mean", "min", "max")
NUMERIC_OPS: Final = ("sum", "mean", "min", "max")
FORMATS: Final = ("csv", "jsonl")
ENGINES: Final = ("auto", "inline", "spark")
DEFAULT_NULL_VALUES: Final = ("", "NA")

DEFAULT_BLOCK_SIZE: Final = 4 * 1024 * 1024
"""Bytes of input parsed at a time by one thread. Measured side by side (2 cores, shared): 3-4
MiB were the fastest of 1-16 MiB (smaller blocks stay in the CPU caches); peak RSS on a 1 GB
input ~205 MB (8 MiB: 230-270 MB)."""
JSONL_BLOCK_SIZE: Final = 1024 * 1024
"""Bytes of JSON lines parsed at a time by one thread on the Python path: 1 MiB was faster than
0.5, 2 and 4 MiB (measured side by side: pyarrow's JSON parser works in the CPU caches). With the
C scanner, JSON lines use DEFAULT_BLOCK_SIZE: 4 MiB was 12% faster than 1 MiB (fewer hand-offs)."""
MAX_RECORD_BYTES: Final = 64 * 1024 * 1024
"""A single CSV record (or the header) larger than this is refused: memory stays bounded."""
MAX_CSV_COLUMNS: Final = 16_384
"""Columns of a CSV header: a wider one is refused (each column costs pyarrow and the scanner
memory per block, whatever the record size)."""
GUESS_LINES: Final = 1_000
GUESS_BYTES: Final = 256 * 1024
"""The JSON lines whose types pyarrow guesses for the fast path (the first lines of a block, at
most this many and bytes): a guess over every distinct key of a whole block costs rows x keys."""
MAX_JSON_DEPTH: Final = 64
"""Arrays and objects nested in one JSON line, the line's own object included: a deeper line is
refused before any parser sees it (pyarrow's JSON reader and Python's `json` recurse: ~60,000
levels overflow the thread's stack, ~1,000 raise RecursionError). The C scanner keeps the same
bound (JSON_MAX_DEPTH) and hands deeper lines to the Python path, whose check names the line."""
COMBINE_ROWS: Final = 262_144
"""Partial aggregate rows held before they are combined (more when there are many groups)."""

PARSE_WORKERS: Final = 2
"""Blocks parsed at once, each on a thread of its own (the machines have 2 cores)."""
IN_FLIGHT_EXTRA: Final = 1
"""Blocks handed to the threads beyond PARSE_WORKERS, so that a thread does not wait for the
reader while the oldest block is awaited in order: with the C scanner, 2-5% faster on CSV and 8%
on JSON lines than none (measured side by side; more gave nothing)."""
KEPT_BUFFERS: Final = PARSE_WORKERS + IN_FLIGHT_EXTRA + 1
"""Block buffers kept between inputs: what one input of the default block size uses."""


class TooManyGroups(LimitExceeded):
    """The input has more distinct groups than `limit` (`seen` is how many were counted when it
    was noticed: more than the limit, not necessarily all of them)."""

    def __init__(self, limit: int, seen: int) -> None:
        self.limit, self.seen = limit, seen
        super().__init__(f"the input has more than {limit} groups ({seen} found before stopping)")


class ByteStream(Protocol):
    """A binary stream: a local file, io.BytesIO, or the blob reader. `readinto` is used when present."""

    def read(self, size: int = -1, /) -> bytes | None: ...


@dataclass(frozen=True)
class MetricSpec:
    """One output column: `op` over `column` (None: count rows), named `name`."""

    op: Op
    column: str | None
    name: str


@dataclass(frozen=True)
class AggregateSpec:
    """A validated `aggregate` payload (see `shared.jobs.aggregate.parse_aggregate_payload`)."""

    container: str
    blob: str
    format: Format
    group_by: tuple[str, ...]
    metrics: tuple[MetricSpec, ...]
    engine: Engine = "auto"
    null_values: tuple[str, ...] = DEFAULT_NULL_VALUES

    @property
    def input(self) -> str:
        """The input as written in the payload: '<container>/<blob path>'."""
        return f"{self.container}/{self.blob}"


@dataclass(frozen=True)
class AggregateResult:
    """Result rows (group columns then metrics, sorted by the group columns) and rows read."""

    rows: list[dict[str, Any]]
    input_rows: int

    @property
    def groups(self) -> int:
        return len(self.rows)


def aggregate_stream(
    stream: ByteStream,
    spec: AggregateSpec,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_groups: int | None = None,
) -> AggregateResult:
    """Group-by aggregate of a CSV / JSON-lines byte stream, in bounded memory.

    SQL semantics: `count` without a column counts rows, with one its non-null values; sum,
    mean, min and max skip nulls (null when a group has no value; mean = sum / count).
    Values in `spec.null_values` are null. Group keys are strings as written; a null key is
    its own group, sorted first. A non-number in a numeric metric's column, or a missing
    column, raises InputDataError naming the column (and the value and line).

    More than `max_groups` distinct groups (None: no limit) raises TooManyGroups as soon as the
    partial aggregates show it, so memory stays bounded by the limit, not by the input.
    """
    table, input_rows = aggregate_table(stream, spec, block_size, max_groups)
    rows: list[dict[str, Any]] = table.to_pylist()
    return AggregateResult(rows=rows, input_rows=input_rows)


def aggregate_table(
    stream: ByteStream,
    spec: AggregateSpec,
    block_size: int = DEFAULT_BLOCK_SIZE,
    max_groups: int | None = None,
) -> tuple[pa.Table, int]:
    """`aggregate_stream`'s result as an Arrow table (its rows' columns, in order), and the number
    of input rows: what the handler serialises a batch at a time (see `result_json`)."""
    plan = _Plan.of(spec)
    acc = _Accumulator(plan, max_groups)
    if spec.format == "csv":
        partials = _csv_partials(stream, plan, spec.null_values, block_size)
        with contextlib.closing(partials):
            for partial, rows in partials:
                acc.add_partial(partial, rows)
    else:
        jsonl_block = (
            block_size if _NativeArgs.jsonl(plan, spec.null_values) else min(block_size, JSONL_BLOCK_SIZE)
        )
        partials = _jsonl_partials(stream, plan, spec.null_values, jsonl_block)
        with contextlib.closing(partials):
            for partial, rows in partials:
                acc.add_partial(partial, rows)
    return acc.result_table(spec.metrics), acc.input_rows


# --- what to compute ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Plan:
    """Which columns are read, and how each is typed and reduced.

    The aggregation table has key columns `k0..` (strings) and value columns `v0..`: floats for
    columns of numeric metrics, strings for columns only counted.
    """

    keys: tuple[str, ...]
    values: tuple[str, ...]
    numeric: frozenset[str]
    partial: tuple[tuple[str, str, str], ...]
    """(value column, first aggregation, combining aggregation) for each partial column."""

    @classmethod
    def of(cls, spec: AggregateSpec) -> _Plan:
        values: list[str] = []
        funcs: dict[str, list[str]] = {}
        for metric in spec.metrics:
            if metric.column is None:
                continue
            if metric.column not in values:
                values.append(metric.column)
                funcs[metric.column] = []
            needs = {"count": ["count"], "sum": ["sum"], "mean": ["sum", "count"]}.get(metric.op, [metric.op])
            funcs[metric.column].extend(f for f in needs if f not in funcs[metric.column])
        combine = {"sum": "sum", "count": "sum", "min": "min", "max": "max"}
        partial = tuple(
            (f"v{i}", func, combine[func]) for i, column in enumerate(values) for func in funcs[column]
        )
        numeric = frozenset(m.column for m in spec.metrics if m.op in NUMERIC_OPS and m.column is not None)
        return cls(keys=spec.group_by, values=tuple(values), numeric=numeric, partial=partial)

    @property
    def columns(self) -> tuple[str, ...]:
        """Every input column read, each once, group columns first."""
        return tuple(dict.fromkeys(self.keys + self.values))

    def csv_type(self, column: str) -> pa.DataType:
        """float64 for columns only used by numeric metrics; otherwise strings as written."""
        return pa.float64() if column in self.numeric and column not in self.keys else pa.string()

    def frame(self, columns: dict[str, pa.Array], to_float: Callable[[str, pa.Array], pa.Array]) -> pa.Table:
        """The aggregation table (k*, v*) from input columns; numeric ones converted by `to_float`."""
        data: dict[str, Any] = {f"k{i}": columns[name] for i, name in enumerate(self.keys)}
        first_bad: BadNumber | None = None
        for i, name in enumerate(self.values):
            array = columns[name]
            if name in self.numeric and not pa.types.is_floating(array.type):
                try:
                    array = to_float(name, array)
                except BadNumber as bad:  # the first bad row wins, whatever its column
                    if first_bad is None or bad.index < first_bad.index:
                        first_bad = bad
            data[f"v{i}"] = array
        if first_bad is not None:
            raise first_bad
        return pa.table(data)


# --- partial aggregation -----------------------------------------------------------------------


class _Accumulator:
    """Partial aggregates of the blocks seen so far, combined when they grow.

    `pending_rows` counts every partial row held (the combined ones too); they are combined when
    that passes twice the groups found so far, or COMBINE_ROWS. With `max_groups` the floor is
    max_groups + 1 when that is smaller, and a combine that finds more groups than the limit
    raises TooManyGroups: rows held stay below 2 * max_groups + one block's partials, and an
    input of distinct keys is stopped once about max_groups rows are held.
    """

    def __init__(self, plan: _Plan, max_groups: int | None = None) -> None:
        self.plan = plan
        self.max_groups = max_groups
        self.key_names = [f"k{i}" for i in range(len(plan.keys))]
        self.partials: list[pa.Table] = []
        self.pending_rows = 0
        self.combined_rows = 0
        self.input_rows = 0

    def add(self, table: pa.Table) -> None:
        """Reduce one block to partial aggregates and keep them."""
        self.add_partial(self.reduce(table), table.num_rows)

    def reduce(self, table: pa.Table) -> pa.Table:
        """Partial aggregates of one block (pure: called on the parsing threads too).

        Keys read as binary (or dictionary-encoded) are grouped as they are, then turned into
        strings: ArrowInvalid if one is not valid UTF-8.
        """
        aggs: list[tuple[Any, ...]] = [([], "count_all")]
        aggs += [(column, func) for column, func, _ in self.plan.partial]
        partial = self._ordered(table.group_by(self.key_names, use_threads=False).aggregate(aggs))
        for name in self.key_names:
            column = partial[name]
            if column.type != pa.string():
                partial = partial.set_column(
                    partial.schema.get_field_index(name), name, pc.cast(column, pa.string())
                )
        return partial

    def add_partial(self, partial: pa.Table, input_rows: int) -> None:
        """Keep a block's partial aggregates (from `reduce`); combine them when they grow."""
        self.input_rows += input_rows
        self.partials.append(partial)
        self.pending_rows += partial.num_rows
        limit = self.max_groups
        if limit is not None and partial.num_rows > limit:
            raise TooManyGroups(limit, partial.num_rows)
        floor = COMBINE_ROWS if limit is None else min(COMBINE_ROWS, limit + 1)
        if self.pending_rows > max(floor, 2 * self.combined_rows):
            self._combine()

    def _ordered(self, table: pa.Table) -> pa.Table:
        names = ["count_all", *(f"{c}_{f}" for c, f, _ in self.plan.partial), *self.key_names]
        return table.select(names)

    def _combine(self) -> None:
        if len(self.partials) > 1:
            merged = pa.concat_tables(self.partials)
            aggs: list[tuple[Any, ...]] = [("count_all", "sum")]
            aggs += [(f"{c}_{f}", combine) for c, f, combine in self.plan.partial]
            out = merged.group_by(self.key_names, use_threads=False).aggregate(aggs)
            names = ["count_all_sum", *(f"{c}_{f}_{combine}" for c, f, combine in self.plan.partial)]
            out = out.select(names + self.key_names)
            final_names = ["count_all", *(f"{c}_{f}" for c, f, _ in self.plan.partial), *self.key_names]
            self.partials = [out.rename_columns(final_names)]
        self.combined_rows = self.partials[0].num_rows if self.partials else 0
        self.pending_rows = self.combined_rows
        if self.max_groups is not None and self.combined_rows > self.max_groups:
            raise TooManyGroups(self.max_groups, self.combined_rows)

    def _final(self) -> pa.Table:
        if not self.partials:
            self.add(self._empty_frame())
            self.input_rows = 0
        self._combine()
        return self.partials[0]

    def _empty_frame(self) -> pa.Table:
        data: dict[str, pa.Array] = {name: pa.array([], pa.string()) for name in self.key_names}
        for i, name in enumerate(self.plan.values):
            data[f"v{i}"] = pa.array([], pa.float64() if name in self.plan.numeric else pa.string())
        return pa.table(data) if data else pa.table({"_": pa.array([], pa.null())})

    def result_rows(self, metrics: Sequence[MetricSpec]) -> list[dict[str, Any]]:
        """The final rows: group columns, then each metric by name; sorted, nulls first."""
        rows: list[dict[str, Any]] = self.result_table(metrics).to_pylist()
        return rows

    def result_table(self, metrics: Sequence[MetricSpec]) -> pa.Table:
        """The final rows as a table: group columns, then each metric by name; sorted, nulls first."""
        table = self._final()
        out: dict[str, pa.Array | pa.ChunkedArray] = {
            name: table[key] for name, key in zip(self.plan.keys, self.key_names, strict=True)
        }
        for metric in metrics:
            out[metric.name] = self._metric_column(table, metric)
        result = pa.table(out)
        if self.plan.keys:
            keys = [(k, "ascending", "at_start") for k in self.plan.keys]
            order = pc.sort_indices(result, sort_keys=keys)
            result = result.take(order)
        return result

    def _metric_column(self, table: pa.Table, metric: MetricSpec) -> pa.ChunkedArray:
        if metric.column is None:
            return table["count_all"]
        value = f"v{self.plan.values.index(metric.column)}"
        if metric.op == "mean":
            return pc.divide(table[f"{value}_sum"], pc.cast(table[f"{value}_count"], pa.float64()))
        func = {"count": "count", "sum": "sum", "min": "min", "max": "max"}[metric.op]
        column = table[f"{value}_{func}"]
        return column if metric.op == "count" else pc.cast(column, pa.float64())


# --- numbers -----------------------------------------------------------------------------------


class BadNumber(Exception):
    """A non-null value of a numeric metric's column is not a number (`index` in its array)."""

    def __init__(self, column: str, value: str | None, index: int) -> None:
        self.column, self.value, self.index = column, value, index
        super().__init__(f"column {column!r} has a value that is not a number: {value!r}")

    def message_parts(self) -> tuple[str, str]:
        """The error message around its line number."""
        return f"column {self.column!r} has a value that is not a number on line ", f": {self.value!r}"


def to_float(column: str, values: pa.Array) -> pa.Array:
    """Strings to float64 (surrounding blanks allowed); BadNumber for the first bad value."""
    try:
        return pc.cast(values, pa.float64())
    except pa.ArrowInvalid:
        pass
    trimmed = pc.utf8_trim_whitespace(values)
    try:
        return pc.cast(trimmed, pa.float64())
    except pa.ArrowInvalid:
        index = _first_unparsable(trimmed)
    raise BadNumber(column, values[index].as_py(), index)


def _first_unparsable(values: pa.Array) -> int:
    """Index of the first value that does not cast to float64 (bisection over slices)."""
    lo, hi = 0, len(values)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            pc.cast(values.slice(lo, mid - lo), pa.float64())
            lo = mid
        except pa.ArrowInvalid:
            hi = mid
    return lo


# --- CSV ---------------------------------------------------------------------------------------


class _BadRecord(Exception):
    """A CSV problem in the block at byte `offset`, `line_in_block` lines into it.

    The line number in the file is worked out by the reading thread (see `_csv_partials`).
    """

    def __init__(self, before: str, after: str, offset: int, lines_before: int, line_in_block: int) -> None:
        super().__init__(before + after)
        self.before, self.after = before, after
        self.offset, self.lines_before, self.line_in_block = offset, lines_before, line_in_block


def _csv_partials(
    stream: ByteStream, plan: _Plan, null_values: Sequence[str], block_size: int
) -> Generator[tuple[pa.Table, int], None, None]:
    """(partial aggregates, records) of each CSV block, in input order.

    Up to `PARSE_WORKERS` blocks are parsed and reduced at once, each on a thread of its own,
    while the next block is read; errors are raised in input order (the first bad block wins).
    """
    origin = _position(stream)
    splitter = _splitter(stream, block_size)
    parser = _CsvParser(splitter.read_header(), plan, null_values)
    workers = max(1, PARSE_WORKERS)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="csv-parse")
    pending: deque[tuple[Future[tuple[pa.Table, int]], bytearray, int]] = deque()
    lines_read = 0

    def oldest() -> tuple[pa.Table, int]:
        nonlocal lines_read
        future, buf, lines = pending.popleft()
        try:
            partial, rows = future.result()
        except _BadRecord as bad:
            bad.lines_before = lines_read
            raise
        lines_read += lines
        splitter.release(buf)
        return partial, rows

    try:
        try:
            for block in splitter.blocks():
                while len(pending) >= workers + IN_FLIGHT_EXTRA:
                    yield oldest()
                lines = 0 if origin is not None else _block_lines(block.buf, block.start, block.end)
                pending.append((pool.submit(parser.parse, block.data, block.offset), block.buf, lines))
        except InputDataError:
            while pending:  # a bad record before this point is reported first
                oldest()
            raise
        while pending:
            yield oldest()
    except _BadRecord as bad:
        pool.shutdown(wait=True, cancel_futures=True)
        first = _line_at(stream, origin, bad.offset)
        if first is None:  # not seekable: the line breaks of the blocks before, counted as read
            first = 1 + splitter.header_lines + bad.lines_before
        raise InputDataError(f"{bad.before}{first + bad.line_in_block}{bad.after}") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        splitter.close()


def _position(stream: ByteStream) -> int | None:
    """The stream's position if it can seek back to it later, else None."""
    seekable = getattr(stream, "seekable", None)
    if seekable is None or not seekable():
        return None
    return int(getattr(stream, "tell")())  # noqa: B009


def _line_at(stream: ByteStream, origin: int | None, offset: int) -> int | None:
    """Physical line number at byte `offset` of the input, by reading it again (error path only)."""
    if origin is None:
        return None
    getattr(stream, "seek")(origin)  # noqa: B009
    lines, left, last = 1, offset, b""
    while left > 0:
        data = stream.read(min(left, 4 * 1024 * 1024)) or b""
        if not data:
            break
        lines += _line_breaks(data) - (last == b"\r" and data[:1] == b"\n")
        last = data[-1:]
        left -= len(data)
    return lines


def _block_lines(buf: bytearray, start: int, end: int) -> int:
    """Line breaks in buf[start:end], as `_line_breaks` counts them (no copy)."""
    crs = buf.count(b"\r", start, end)
    crlfs = buf.count(b"\r\n", start, end) if crs else 0
    return buf.count(b"\n", start, end) + crs - crlfs


def _line_breaks(data: bytes) -> int:
    """Line breaks in `data`: \\n, \\r\\n or a lone \\r (the CSV record endings) each count one."""
    return data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")


class _Block(NamedTuple):
    """Whole records: `buf[start:end]` (also as `data`), at byte `offset` of the input."""

    data: pa.Buffer
    offset: int
    buf: bytearray
    start: int
    end: int


_BUFFERS_LOCK = threading.Lock()
_BUFFERS: list[bytearray] = []
"""Block buffers of the default size kept between inputs (at most `KEPT_BUFFERS`)."""


def _take_buffer(size: int) -> bytearray:
    """A buffer of `size` bytes: a kept one if there is one (fresh memory costs a page fault
    every 4 KiB, about as much time as parsing those bytes)."""
    with _BUFFERS_LOCK:
        for i, buf in enumerate(_BUFFERS):
            if len(buf) == size:
                return _BUFFERS.pop(i)
    return bytearray(size)


def _keep_buffers(buffers: list[bytearray]) -> None:
    with _BUFFERS_LOCK:
        for buf in buffers:
            if len(_BUFFERS) < KEPT_BUFFERS and len(buf) == DEFAULT_BLOCK_SIZE:
                _BUFFERS.append(buf)


class _BlockSplitter:
    """Cuts a stream into blocks of whole records, each read into a buffer of its own.

    `cut(buf, start, end)` is the offset just after the last record boundary in buf[start:end]
    (0 if none): `_record_cut` for CSV, `_line_cut` for JSON lines; `what` names a record in
    the error for one larger than MAX_RECORD_BYTES.

    A block handed out stays untouched until its buffer is given back with `release`, so blocks
    can be parsed while the next ones are read. The first blocks are smaller (1/8, 1/4, 1/2 of
    the block size), so the parsing threads start early.
    """

    def __init__(
        self,
        stream: ByteStream,
        block_size: int,
        cut: Callable[[bytearray, int, int], int] | None = None,
        what: str = "a CSV record",
    ) -> None:
        self.stream = stream
        self.cut = cut or _record_cut
        self.what = what
        self.size = max(block_size, 16)
        self.taken: list[bytearray] = []
        """Buffers of the block size in use, kept for the next input by `close`."""
        self.free: list[bytearray] = []
        self.buf = self._new_buffer()
        self.target = max(16, self.size // 8)
        """Bytes to read before looking for a cut: doubles up to the buffer's size."""
        self.start = 0
        self.filled = 0
        self.eof = False
        self.offset = 0
        """Input offset of `buf[start]`."""
        self.header_lines = 1

    def read_header(self) -> list[str]:
        """Column names from the first record; InputDataError if the input is empty."""
        while True:
            self._fill(min(len(self.buf), self.target))
            if self.filled == 0:
                raise InputDataError("the input is empty: a CSV input needs a header line")
            end = _header_end(self.buf, self.filled)
            if end or self.eof:
                break
            if self.filled < len(self.buf):
                self.target = len(self.buf)
            else:
                self._grow("the header line")
        end = end or self.filled
        raw = bytes(self.buf[:end])
        self.header_lines = max(1, _line_breaks(raw))
        self.start = self.offset = end
        return _header_names(raw)

    def blocks(self) -> Iterator[_Block]:
        """Blocks of whole records, in order."""
        while True:
            self._fill(min(len(self.buf), self.start + self.target))
            if self.filled == self.start:
                if self.eof:
                    return
                self._make_room()  # the buffer ended just where the header did: not the end
                continue
            cut = self.filled if self.eof else self.cut(self.buf, self.start, self.filled)
            if cut == 0:
                self._make_room()
                continue
            data = pa.py_buffer(self.buf).slice(self.start, cut - self.start)
            yield _Block(data, self.offset, self.buf, self.start, cut)
            self.offset += cut - self.start
            self.target = min(2 * self.target, len(self.buf))
            self._swap(cut)

    def release(self, buf: bytearray) -> None:
        """Give back the buffer of a block that is no longer read."""
        self.free.append(buf)

    def close(self) -> None:
        """Keep the buffers for the next input (once no thread reads them any more)."""
        _keep_buffers(self.taken)
        self.taken = []

    def _new_buffer(self) -> bytearray:
        buf = _take_buffer(self.size)
        self.taken.append(buf)
        return buf

    def _fill(self, limit: int) -> None:
        with memoryview(self.buf) as view:
            while self.filled < limit and not self.eof:
                n = _readinto(self.stream, view[self.filled : limit])
                if n == 0:
                    self.eof = True
                self.filled += n

    def _swap(self, cut: int) -> None:
        """Carry the partial record after `cut` to a free buffer and switch to it."""
        rest = self.filled - cut
        other = self.free.pop() if self.free else self._new_buffer()
        if len(other) < len(self.buf):
            other = bytearray(len(self.buf))
        other[:rest] = self.buf[cut : self.filled]
        self.buf = other
        self.start, self.filled = 0, rest

    def _make_room(self) -> None:
        """No record boundary in the data: read more, move the data to the front, or grow."""
        if self.filled < len(self.buf) and not self.eof:
            self.target = len(self.buf)
        elif self.start > 0:
            rest = self.filled - self.start
            self.buf[:rest] = self.buf[self.start : self.filled]
            self.start, self.filled = 0, rest
        else:
            self._grow(self.what)

    def _grow(self, what: str) -> None:
        if len(self.buf) >= MAX_RECORD_BYTES:
            raise InputDataError(
                f"{what} at byte {self.offset} is longer than {MAX_RECORD_BYTES // 2**20} MiB "
                "(or the input has no line breaks)"
            )
        grown = bytearray(min(2 * len(self.buf), MAX_RECORD_BYTES))  # the bound, whatever the block size
        grown[: self.filled] = self.buf[: self.filled]
        self.buf = grown
        self.target = len(grown)


class ChunkStream(Protocol):
    """A stream that hands over its own buffers (the blob reader's `BlobStream`): no copy."""

    def next_chunk(self) -> tuple[bytearray, int, int] | None: ...

    def give_back(self, buf: bytearray) -> None: ...


SEAM_BYTES: Final = 64 * 1024
"""Bytes after a record that spans two buffers copied with it (`_ChunkSplitter`), doubled as
needed: the seam block ends at the last record boundary in them."""


def _splitter(
    stream: ByteStream,
    block_size: int,
    cut: Callable[[bytearray, int, int], int] | None = None,
    what: str = "a CSV record",
) -> _BlockSplitter | _ChunkSplitter:
    """A `_ChunkSplitter` over a stream that hands over its buffers, else a `_BlockSplitter`."""
    if callable(getattr(stream, "next_chunk", None)) and callable(getattr(stream, "give_back", None)):
        return _ChunkSplitter(stream, block_size, cut, what)  # type: ignore[arg-type]
    return _BlockSplitter(stream, block_size, cut, what)


class _ChunkSplitter:
    """`_BlockSplitter` for a stream that hands over its own buffers (`ChunkStream`): blocks
    are slices of those buffers, parsed where the reader wrote them.

    Each buffer is cut into blocks of about `block_size` at record boundaries (each cut
    starting where the last ended, so the bytes are looked at once); it goes back to the stream once every block cut from it is released.
    Only a record that spans two buffers is copied: the bytes after the last boundary, with
    the next buffer's first `SEAM_BYTES` (more if the record is longer), form a small block of
    their own, cut at its last boundary. Blocks, offsets, `header_lines` and errors are as
    `_BlockSplitter`'s.
    """

    def __init__(
        self,
        stream: ChunkStream,
        block_size: int,
        cut: Callable[[bytearray, int, int], int] | None = None,
        what: str = "a CSV record",
    ) -> None:
        self.stream = stream
        self.cut = cut or _record_cut
        self.what = what
        self.size = max(block_size, 16)
        self.refs: dict[int, list[Any]] = {}
        """id(buffer) -> [buffer, blocks not released + 1 while it is being cut]."""
        self.chunk: tuple[bytearray, int, int] | None = None
        """The buffer being cut and its bytes not yet in a block: (buffer, start, end)."""
        self.carry = bytearray()
        """A record begun at the end of the last buffer (a copy)."""
        self.offset = 0
        """Input offset of the next block."""
        self.header_lines = 1

    def read_header(self) -> list[str]:
        """Column names from the first record; InputDataError if the input is empty."""
        window = bytearray()
        end = 0
        while self._current() is not None:

            def header(data: bytearray) -> int:
                at = _header_end(data, len(data))
                return 0 if at == len(data) and data.endswith(b"\r") else at  # \r\n may straddle

            end = self._extend(window, header, "the header line")
            if end:
                break
        if not window:
            raise InputDataError("the input is empty: a CSV input needs a header line")
        end = end or len(window)
        raw = bytes(window[:end])
        self.header_lines = max(1, raw.count(b"\n"))
        self.offset = end
        return _header_names(raw)

    def blocks(self) -> Iterator[_Block]:
        """Blocks of whole records, in order."""
        while True:
            current = self._current()
            if current is None:
                if self.carry:  # the last record, without a line break at the end
                    seam, self.carry = self.carry, bytearray()
                    yield self._block(seam, 0, len(seam))
                return
            if self.carry:
                window, self.carry = self.carry, bytearray()
                cut = 0
                while not cut and self._current() is not None:
                    cut = self._extend(window, lambda data: self.cut(data, 0, len(data)), self.what)
                if cut:
                    del window[cut:]
                    yield self._block(window, 0, cut)
                else:
                    self.carry = window  # the input ends within this record
                continue
            buf, lo, hi = current
            while lo < hi:  # each cut starts where the last ended: every byte is looked at once
                end = 0
                if hi - lo >= self.size + self.size // 2:
                    end = self.cut(buf, lo, lo + self.size)
                end = end or self.cut(buf, lo, hi)
                if end == 0:
                    break
                self.chunk = (buf, end, hi)
                self.refs[id(buf)][1] += 1
                yield self._block(buf, lo, end)
                lo = end
            if lo < hi:  # a record that ends in a later buffer (or the input's last one)
                self.carry = bytearray(memoryview(buf)[lo:hi])
            self._done(buf)

    def release(self, buf: bytearray) -> None:
        """Give back the buffer of a block that is no longer read."""
        ref = self.refs.get(id(buf))
        if ref is not None and ref[0] is buf:
            ref[1] -= 1
            if ref[1] == 0:
                del self.refs[id(buf)]
                self.stream.give_back(buf)

    def close(self) -> None:
        self.refs.clear()
        self.chunk = None

    def _block(self, buf: bytearray, start: int, end: int) -> _Block:
        block = _Block(pa.py_buffer(buf).slice(start, end - start), self.offset, buf, start, end)
        self.offset += end - start
        return block

    def _current(self) -> tuple[bytearray, int, int] | None:
        """The buffer being cut, the stream's next one when it is used up; None at the end."""
        while self.chunk is None or self.chunk[1] >= self.chunk[2]:
            if self.chunk is not None:
                self._done(self.chunk[0])
            got = self.stream.next_chunk()
            if got is None:
                return None
            self.chunk = got
            self.refs[id(got[0])] = [got[0], 1]
        return self.chunk

    def _done(self, buf: bytearray) -> None:
        """The buffer is cut: it goes back once its blocks are released."""
        if self.chunk is not None and self.chunk[0] is buf:
            self.chunk = None
        self.release(buf)

    def _extend(self, window: bytearray, find: Callable[[bytearray], int], what: str) -> int:
        """Append the current buffer's next bytes to `window` (at least SEAM_BYTES, doubling) and
        return `find(window)`; the bytes past it stay in the buffer. 0: not found yet."""
        assert self.chunk is not None
        buf, lo, hi = self.chunk
        before = len(window)
        step = min(hi - lo, max(SEAM_BYTES, before))
        with memoryview(buf) as view:
            window += view[lo : lo + step]
        found = find(window)
        if found >= before and found:  # (a boundary within the bytes carried is not one: none is)
            self.chunk = (buf, lo + found - before, hi)
            return found
        self.chunk = (buf, lo + step, hi)
        if len(window) > MAX_RECORD_BYTES:
            raise InputDataError(
                f"{what} at byte {self.offset} is longer than {MAX_RECORD_BYTES // 2**20} MiB "
                "(or the input has no line breaks)"
            )
        return 0


_PARSE_OPTIONS: Final = pacsv.ParseOptions(newlines_in_values=False)
"""Newlines in quoted values are parsed all the same within a chunk: the option only tells how
pyarrow may split its input into chunks, and a block is one chunk."""


class _CsvParser:
    """Parses blocks of whole CSV records into partial aggregates; thread-safe (no state).

    A block is parsed by pyarrow's `read_csv` on the calling thread, as a single chunk: no
    split inside a block, so line breaks in quoted values need no care (our cut is quote-aware).
    Numeric-only columns are read straight as float64, group columns as binary (checked as
    UTF-8 after the reduction: every distinct key is in the partial aggregates), counted ones
    as strings. A block that fails is parsed again with every column as strings, to say where
    and why.
    """

    def __init__(self, names: list[str], plan: _Plan, null_values: Sequence[str]) -> None:
        self.names = names
        self.plan = plan
        self.null_values = list(null_values)
        self._check_columns()
        self.reducer = _Accumulator(plan)
        self.fast = self._convert_options(fast=True)
        self.slow = self._convert_options(fast=False)
        self.native = _NativeArgs.csv(names, plan, null_values)

    def _check_columns(self) -> None:
        missing = [c for c in self.plan.columns if c not in self.names]
        if missing:
            shown = ", ".join(self.names[:30]) + (", ..." if len(self.names) > 30 else "")
            listed = ", ".join(repr(c) for c in missing)
            raise InputDataError(
                f"column(s) {listed} not in the CSV header (line 1); the header has: {shown}"
            )
        doubled = [c for c in self.plan.columns if self.names.count(c) > 1]
        if doubled:
            raise InputDataError(f"column {doubled[0]!r} appears more than once in the CSV header (line 1)")

    def _convert_options(self, fast: bool) -> pacsv.ConvertOptions:
        """Fast: as `_CsvParser` says. Slow: every column as strings. Columns only counted are
        binary in both: a value is counted whatever its bytes (as the C scanner does)."""
        columns = list(self.plan.columns) or self.names[:1]
        if fast:
            types = {c: self.plan.csv_type(c) for c in columns}
            types.update({c: pa.binary() for c in self.plan.keys if c not in self.plan.numeric})
        else:
            types = {c: pa.string() for c in columns}
        keys_or_numbers = set(self.plan.keys) | self.plan.numeric
        types.update({c: pa.binary() for c in columns if c not in keys_or_numbers})
        return pacsv.ConvertOptions(
            include_columns=columns,
            column_types=types,
            null_values=self.null_values,
            strings_can_be_null=True,
            quoted_strings_can_be_null=True,
        )

    def _read(
        self, block: pa.Buffer, convert: pacsv.ConvertOptions, parse: pacsv.ParseOptions = _PARSE_OPTIONS
    ) -> pa.Table:
        """`block` parsed on this thread as one chunk (pyarrow's chunk size is above its size).
        A byte-order mark is data except at the start of the input: pyarrow would skip one at
        the start of a block, so a block starting with one is read after an empty line."""
        if block.size >= 3 and block[:3].to_pybytes() == _BOM:
            block = pa.py_buffer(b"\n" + block.to_pybytes())
        read = pacsv.ReadOptions(column_names=self.names, block_size=block.size + 1, use_threads=False)
        table: pa.Table = pacsv.read_csv(block, read, parse, convert)
        return table

    def parse(self, block: pa.Buffer, offset: int) -> tuple[pa.Table, int]:
        """(partial aggregates, records) of `block` (at `offset` in the input); _BadRecord if bad.

        The scanner answers only blocks it is sure of; pyarrow reads the others, first with the
        fast types, then all as strings. A block either refuses (or one with a quote out of
        place, which pyarrow would take as text) is read record by record by `_first_bad_record`,
        which names the first bad record in file order: the error never depends on the block.
        """
        if self.native is not None:
            done = self.native.csv_reduce(block)
            if done is not None:
                return done
        if _quotes_in_place(block):
            try:
                return self._reduce(self._read(block, self.fast))
            except (pa.ArrowInvalid, BadNumber):  # a bad record, number or key, or spaced numbers
                pass
            try:
                return self._reduce(self._read(block, self.slow))
            except (pa.ArrowInvalid, BadNumber):
                pass
        raise self._first_bad_record(block, offset)

    def _reduce(self, table: pa.Table) -> tuple[pa.Table, int]:
        """(partial aggregates, records) of a parsed block; BadNumber if a value is not a number."""
        rows = table.num_rows
        if self.plan.columns:
            frame = self.plan.frame({name: table[name] for name in self.plan.columns}, to_float)
        else:
            frame = pa.table({"_": pa.nulls(rows)})
        return self.reducer.reduce(frame), rows

    def _first_bad_record(self, block: pa.Buffer, offset: int) -> _BadRecord:
        """The first bad record of a block that pyarrow refused, read record by record."""
        checked = _CsvChecker(self.names, self.plan, self.null_values)
        found = checked.first_problem(block.to_pybytes())
        if found is None:  # pragma: no cover - pyarrow refused what the checker accepts
            return _BadRecord("CSV input is not valid in the block starting on line ", "", offset, 0, 0)
        line, before, after = found
        return _BadRecord(before, after, offset, 0, line)


_CSV_FIELD: Final = re.compile(rb'"[^"]*+(?:""[^"]*+)*+"|[^,"\r\n]*+')
"""One CSV field: quoted (RFC 4180: "" is a quote) or unquoted (no quote, separator or line break)."""
_CSV_QUOTES: Final = re.compile(rb'(?:[^"]++|(?<![^,\r\n])"[^"]*+(?:""[^"]*+)*+"(?![^,\r\n]))*+')
"""Text whose every quote opens or closes a whole quoted field (matched in C, possessively)."""


def _quotes_in_place(block: pa.Buffer) -> bool:
    """Whether every quote in `block` opens or closes a whole field. pyarrow takes a quote inside
    an unquoted field (`5" screen`) or after a closing one as text, but the block cut counts
    quotes: such input is refused, so that no answer depends on where the blocks are cut."""
    view = memoryview(block)
    if np is None:  # pragma: no cover - numpy is in requirements.txt
        match = _CSV_QUOTES.match(view)
        return match is not None and match.end() == len(view)
    return _quotes_in_place_np(np.frombuffer(view, np.uint8))


_FIELD_EDGE: Final = None if np is None else np.isin(np.arange(256), (44, 13, 10, 34))
"""By byte: `,` `\r` `\n` `"`, what may precede an opening quote and follow a closing one."""


def _quotes_in_place_np(data: np.ndarray[Any, Any]) -> bool:
    """`_quotes_in_place`, vectorised (~6x faster than the regex on quoted CSV). Counted from a
    record boundary, an even quote (the 0th, 2nd...) opens a field, so follows a field edge or
    starts the block; an odd one closes it, so precedes a field edge or ends the block. A `"`
    as the edge is a doubled quote inside a field, whose two halves have those parities."""
    is_quote = data == 34
    if not is_quote.any():  # ~0.4 ms a 4 MiB block (a regex search: ~9 ms)
        return True
    quotes = np.flatnonzero(is_quote)
    if len(quotes) % 2:
        return False  # a quoted field is not closed
    opening, closing = quotes[0::2], quotes[1::2]
    before = data[opening[opening > 0] - 1]
    after = data[closing[closing < len(data) - 1] + 1]
    assert _FIELD_EDGE is not None
    return bool(_FIELD_EDGE[before].all() and _FIELD_EDGE[after].all())


class _CsvChecker:
    """Reads a block record by record, as pyarrow would, to find its first bad record (error
    path only): a quote out of place, a wrong number of fields, a group or numeric column that is
    not UTF-8, or a numeric value that is not a number. The first in file order wins; within a
    record, its fields come first, then its columns in header order."""

    def __init__(self, names: list[str], plan: _Plan, null_values: Sequence[str]) -> None:
        self.names = names
        needed = set(plan.keys) | plan.numeric
        self.checked = [(i, name) for i, name in enumerate(names) if name in needed]
        self.numeric = plan.numeric
        self.nulls = frozenset(value.encode() for value in null_values)
        self.numbers: dict[str, tuple[list[str | None], list[tuple[int, int, int]]]] = {
            name: ([], []) for name in plan.numeric
        }

    def first_problem(self, data: bytes) -> tuple[int, str, str] | None:
        """(lines before the record in `data`, message before and after the line number)."""
        pos, line, record = 0, 0, 0
        stop: tuple[int, int, int, str, str] | None = None
        while pos < len(data) and stop is None:
            if data[pos] in b"\r\n":
                pos += 2 if data[pos : pos + 2] == b"\r\n" else 1
                line += 1
                continue
            fields, end, problem = _csv_fields(data, pos)
            if problem is None and len(fields) != len(self.names):
                text = _without_line_break(data[pos:end]).decode("utf-8", "replace")
                problem = f"Expected {len(self.names)} columns, got {len(fields)}: {text}"
            if problem is not None:
                stop = (record, -1, line, "CSV input is not valid on line ", f": {problem[:300]}")
                break
            stop = self._values(fields, record, line)
            line += _line_breaks(data[pos:end])
            pos = end
            record += 1
        return self._earliest(stop)

    def _values(self, fields: list[bytes], record: int, line: int) -> tuple[int, int, int, str, str] | None:
        for i, name in self.checked:
            raw = _unquote(fields[i])
            if raw in self.nulls:
                value: str | None = None
            else:
                try:
                    value = raw.decode("utf-8")
                except UnicodeDecodeError:
                    after = f": column {name!r} has a value that is not UTF-8: {raw[:100]!r}"
                    return (record, i, line, "CSV input is not valid on line ", after)
            if name in self.numbers:
                values, where = self.numbers[name]
                values.append(value)
                where.append((record, i, line))
        return None

    def _earliest(self, stop: tuple[int, int, int, str, str] | None) -> tuple[int, str, str] | None:
        found = [stop] if stop is not None else []
        for name, (values, where) in self.numbers.items():
            try:
                to_float(name, pa.array(values, pa.string()))
            except BadNumber as bad:
                record, column, line = where[bad.index]
                found.append((record, column, line, *bad.message_parts()))
        if not found:
            return None
        _, _, line, before, after = min(found)
        return line, before, after


def _csv_fields(data: bytes, pos: int) -> tuple[list[bytes], int, str | None]:
    """The raw fields of the record at `pos`, the offset after its line break, and what is wrong
    with its quoting (None if nothing)."""
    fields: list[bytes] = []
    while True:
        match = _CSV_FIELD.match(data, pos)
        assert match is not None  # the unquoted alternative matches the empty string
        end = match.end()
        if end < len(data) and data[end] not in b",\r\n":
            if end == pos:
                return fields, end, "a quoted field is not closed"
            return fields, end, "a quote inside an unquoted field or after a closing quote"
        fields.append(data[pos:end])
        if end < len(data) and data[end] == 44:  # ','
            pos = end + 1
            continue
        if data[end : end + 2] == b"\r\n":
            return fields, end + 2, None
        return fields, min(end + 1, len(data)), None


def _without_line_break(record: bytes) -> bytes:
    if record.endswith(b"\r\n"):
        return record[:-2]
    return record[:-1] if record.endswith((b"\n", b"\r")) else record


def _unquote(raw: bytes) -> bytes:
    return raw[1:-1].replace(b'""', b'"') if raw[:1] == b'"' else raw


_BOM: Final = b"\xef\xbb\xbf"


def _readinto(stream: ByteStream, view: memoryview) -> int:
    readinto = getattr(stream, "readinto", None)
    if readinto is not None:
        n = readinto(view)
        return int(n or 0)
    data = stream.read(len(view)) or b""
    view[: len(data)] = data
    return len(data)


def _last_newline(buf: bytearray, start: int, end: int) -> int:
    pos = buf.rfind(b"\n", start, end)
    return pos if pos >= 0 else buf.rfind(b"\r", start, end)


def _record_cut(buf: bytearray, start: int, end: int) -> int:
    """Offset just after the last line break outside quotes in buf[start:end]; 0 if none.

    `start` must be a record boundary. A quote out of place (`5" screen`) can mislead the
    count, but only after it: such a record is refused (`_quotes_in_place`), and the first one is
    in the block cut before the count went wrong. A \r at the end is no cut: a \n may follow.
    """
    pos = _last_newline(buf, start, end)
    if pos >= 0 and pos == end - 1 and buf[pos] == 13:  # a \r at the end: \r\n may be cut in two
        pos = _last_newline(buf, start, pos)
    if pos < 0:
        return 0
    if buf.find(b'"', start, pos) < 0:
        return pos + 1
    quotes = _count_quotes(buf, start, pos)
    while quotes % 2:
        prev = _last_newline(buf, start, pos)
        if prev < 0:
            return 0
        quotes -= buf.count(b'"', prev, pos)
        pos = prev
    return pos + 1


def _quote_counter(native: bool = True) -> Callable[[bytearray, int, int], int]:
    """Counts the quotes in buf[start:end]: the C scanner's counter (16 bytes a step, off the
    GIL), else numpy 256 KiB at a time (~6x faster than bytes.count, which is the fallback where
    numpy is missing, e.g. on a Spark executor)."""
    if native and _kernel is not None:
        count_byte = _kernel.count_byte
        return lambda buf, start, end: int(count_byte(buf, 34, start, end))
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is in requirements.txt
        return lambda buf, start, end: buf.count(b'"', start, end)

    step = 256 * 1024

    def count_quotes(buf: bytearray, start: int, end: int) -> int:
        scratch = np.empty(min(step, end - start), np.bool_)
        count = 0
        for pos in range(start, end, step):
            size = min(step, end - pos)
            equal = np.equal(np.frombuffer(buf, np.uint8, size, pos), 34, out=scratch[:size])
            count += int(np.count_nonzero(equal))
        return count

    return count_quotes


_count_quotes: Final = _quote_counter()


def _header_end(buf: bytearray, end: int) -> int:
    """Offset just after the header's line break (outside quotes); 0 if not in buf[:end]."""
    pos = 0
    while True:
        newline, cr = buf.find(b"\n", pos, end), buf.find(b"\r", pos, end)
        pos = min(p for p in (newline, cr, end) if p >= 0)
        if pos >= end or (pos == end - 1 and buf[pos] == 13):  # a \n may follow the \r
            return 0
        if buf.count(b'"', 0, pos) % 2 == 0:
            return pos + 2 if buf[pos : pos + 2] == b"\r\n" else pos + 1
        pos += 1


def _header_names(raw: bytes) -> list[str]:
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputDataError(f"the CSV header (line 1) is not valid UTF-8: {exc.reason}") from None
    rows = list(csv.reader(io.StringIO(text, newline="")))
    if not rows or not rows[0]:
        raise InputDataError("the CSV header (line 1) is empty")
    if len(rows[0]) > MAX_CSV_COLUMNS:
        raise InputDataError(
            f"the CSV header (line 1) has {len(rows[0])} columns: more than {MAX_CSV_COLUMNS} are refused"
        )
    return rows[0]


# --- JSON lines --------------------------------------------------------------------------------


def _jsonl_partials(
    stream: ByteStream, plan: _Plan, null_values: Sequence[str], block_size: int
) -> Generator[tuple[pa.Table, int], None, None]:
    """(partial aggregates, records) of each block of JSON lines, in input order.

    Blocks are cut at line breaks (a JSON line has none inside) and parsed `PARSE_WORKERS` at
    a time, each on a thread of its own, by `_JsonParser`; errors are raised in input order.
    """
    splitter = _splitter(stream, block_size, cut=_line_cut, what="a JSON line")
    parser = _JsonParser(plan, null_values)
    workers = max(1, PARSE_WORKERS)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="jsonl-parse")
    pending: deque[tuple[Future[_JsonPartial], bytearray]] = deque()
    unseen = set(plan.columns)
    records = 0

    def oldest() -> tuple[pa.Table, int]:
        nonlocal records
        future, buf = pending.popleft()
        done = future.result()
        splitter.release(buf)
        unseen.difference_update(done.seen)
        records += done.rows
        return done.partial, done.rows

    try:
        line = 1
        for block in splitter.blocks():
            while len(pending) >= workers + IN_FLIGHT_EXTRA:
                yield oldest()
            newlines = _count_newlines(block.buf, block.start, block.end)
            lines = newlines + (block.buf[block.end - 1] != 10)
            pending.append((pool.submit(parser.parse, block, line, lines), block.buf))
            line += newlines
        while pending:
            yield oldest()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        splitter.close()
    if unseen and records:
        listed = ", ".join(repr(c) for c in sorted(unseen))
        raise InputDataError(f"column(s) {listed} occur in no line of the JSON-lines input")


def _line_cut(buf: bytearray, start: int, end: int) -> int:
    """Offset just after the last line break in buf[start:end]; 0 if none."""
    return buf.rfind(b"\n", start, end) + 1


def _byte_scanners() -> tuple[Callable[[bytearray, int, int], int], Callable[[bytearray, int, int], bool]]:
    """(count of line breaks, is it all ASCII) over buf[start:end]: numpy (~4x faster than
    bytes.count, and it releases the GIL) where present, bytes methods otherwise."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is in requirements.txt
        return (lambda buf, start, end: buf.count(b"\n", start, end)), (
            lambda buf, start, end: buf[start:end].isascii()
        )

    def count_newlines(buf: bytearray, start: int, end: int) -> int:
        if _kernel is not None:  # the C scanner's counter: ~3x numpy's, off the GIL
            return int(_kernel.count_byte(buf, 10, start, end))
        return int(np.count_nonzero(np.frombuffer(buf, np.uint8, end - start, start) == 10))

    def is_ascii(buf: bytearray, start: int, end: int) -> bool:
        return end == start or int(np.frombuffer(buf, np.uint8, end - start, start).max()) < 128

    return count_newlines, is_ascii


_count_newlines, _is_ascii = _byte_scanners()


@dataclass(frozen=True)
class _JsonPartial:
    partial: pa.Table
    rows: int
    seen: frozenset[str]
    """Needed columns that occur (as keys) in the block."""


_TWO_OBJECTS: Final = r"}[ \t\r]*{|\\u[dD][89a-fA-F]"
"""Two objects on a line, or what may be a surrogate's escape: the exact path decides."""


def _offsets(size: int) -> pa.Buffer:
    """The offsets of a binary array of one value of `size` bytes."""
    return pa.array([0, size], pa.int32()).buffers()[1]


_NUMBER_TEXT = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?|true|false")
_NEGATIVE_ZERO = re.compile(rb"-0(?![0-9.eE])")


class _JsonParser:
    """Parses blocks of JSON lines into partial aggregates; safe to call from several threads.

    Fast path: pyarrow's JSON reader on the block, on the calling thread, with an explicit
    schema of the needed columns only (other fields are skipped), learnt from the first block
    by inference: strings as written, integers, floats, booleans. It is used only when its
    answer is the exact one's: valid UTF-8, one object per line (as many rows as lines, no two
    objects on a line), group keys that are strings, integers (not `-0`) or booleans (their
    text as written), numbers or strings in numeric columns, and null values that cannot be the
    text of a number. Anything else (a blank line, a float or mixed-type group column, an
    object, a repeated key, a bad value, invalid JSON) is parsed again by the exact path:
    Python's `json` per line, numbers kept as written, errors naming the line.
    """

    def __init__(self, plan: _Plan, null_values: Sequence[str]) -> None:
        self.plan = plan
        self.nulls = frozenset(null_values)
        self.null_array = pa.array(sorted(self.nulls), pa.string())
        self.fast = not any(_NUMBER_TEXT.fullmatch(v) for v in self.nulls)
        """Off when a null value could be a number's text (only the exact path sees that text)."""
        self.schema: pa.Schema | None = None
        self.reducer = _Accumulator(plan)
        self.native = _NativeArgs.jsonl(plan, null_values)
        self.key_patterns = {
            c: re.compile(re.escape(json.dumps(c, ensure_ascii=False).encode()) + rb"\s*:")
            for c in plan.columns
        }

    def parse(self, block: _Block, first_line: int, lines: int) -> _JsonPartial:
        """The block's partial aggregates (its `lines` start at `first_line`); InputDataError
        naming the line if it is bad."""
        if self.native is not None:
            done = self.native.jsonl_reduce(block.data)
            if done is not None:
                return done
        deep = _first_deep_line(block.buf, block.start, block.end)
        if deep is not None:
            line, offset = deep
            _exact_frame(self.plan, bytes(block.buf[block.start : offset]), first_line, self.nulls)
            raise InputDataError(
                f"line {first_line + line} is nested more than {MAX_JSON_DEPTH} arrays or objects deep: "
                "refused before parsing (flatten it, or remove the line)"
            )
        fast = self._fast(block, lines) if self.fast else None
        if fast is not None:
            frame, seen = fast
        else:
            frame, seen = _exact_frame(self.plan, bytes(block.data), first_line, self.nulls)
        return _JsonPartial(self.reducer.reduce(frame), frame.num_rows, seen)

    def _fast(self, block: _Block, lines: int) -> tuple[pa.Table, frozenset[str]] | None:
        """(aggregation table, columns seen) by pyarrow, or None where the exact path must decide.

        One object per line: as many rows as lines, and no `}` followed on its line by `{`.
        (Two objects on a line are the only way to make up for a blank line or an object
        spread over lines; the check is RE2's, off the GIL, ~0.3 ms a 4 MiB block.) Valid
        UTF-8 throughout, as Python's decoder wants (pyarrow checks only the fields it keeps).
        """
        whole = pa.Array.from_buffers(pa.binary(), 1, [None, _offsets(block.data.size), block.data])
        if not _is_ascii(block.buf, block.start, block.end):
            try:
                whole.cast(pa.string())  # validates UTF-8
            except pa.ArrowInvalid:
                return None
        if pc.match_substring_regex(whole, _TWO_OBJECTS)[0].as_py():
            return None
        table = self._read(block.data)
        if table is None or table.num_rows != lines:
            return None
        if not self.plan.columns:
            return pa.table({"_": pa.nulls(table.num_rows)}), frozenset()
        columns: dict[str, pa.Array] = {}
        for name in self.plan.columns:
            column = table[name].combine_chunks()
            converted = self._convert(name, column, block)
            if converted is None:
                return None
            columns[name] = converted
        try:
            frame = self.plan.frame(columns, to_float)
        except BadNumber:
            return None
        seen = self._seen(table, block)
        return None if seen is None else (frame, seen)

    def _read(self, data: pa.Buffer) -> pa.Table | None:
        read = pajson.ReadOptions(use_threads=False, block_size=data.size + 1)
        schema = self.schema
        if schema is not None:
            options = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
            with contextlib.suppress(pa.ArrowInvalid):
                return pajson.read_json(pa.BufferReader(data), read, options)
        prefix = _guess_prefix(data)
        if prefix is None:
            return None
        try:
            inferred = pajson.read_json(pa.BufferReader(prefix), read)
        except pa.ArrowInvalid:
            return None
        learnt = self._learn(inferred.schema)
        if learnt is None:
            return None
        self.schema = learnt
        options = pajson.ParseOptions(explicit_schema=learnt, unexpected_field_behavior="ignore")
        try:
            return pajson.read_json(pa.BufferReader(data), read, options)
        except pa.ArrowInvalid:
            return None

    def _learn(self, inferred: pa.Schema) -> pa.Schema | None:
        """The needed columns' types for the fast path, from a block's inferred schema."""
        fields = []
        for name in self.plan.columns:
            index = inferred.get_field_index(name)
            kind = inferred.field(index).type if index >= 0 else pa.null()
            typ = self._fast_type(name, kind)
            if typ is None:
                return None
            fields.append(pa.field(name, typ))
        return pa.schema(fields)

    def _fast_type(self, name: str, kind: pa.DataType) -> pa.DataType | None:
        if pa.types.is_timestamp(kind) or pa.types.is_date(kind):
            kind = pa.string()  # inferred from strings: read them as written
        key = name in self.plan.keys
        if name in self.plan.numeric and not key:
            if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_null(kind):
                return pa.float64()
            return pa.string() if pa.types.is_string(kind) else None
        if pa.types.is_null(kind) or pa.types.is_string(kind):
            return pa.string()
        if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
            return kind
        if pa.types.is_floating(kind) and not key:
            return kind
        return None

    def _convert(self, name: str, column: pa.Array, block: _Block) -> pa.Array | None:
        """A fast-path column as the exact path would give it (strings as written, nulls
        applied; numbers of numeric-only columns as float64), or None."""
        kind = column.type
        if pa.types.is_string(kind):
            matched = pc.is_in(column, value_set=self.null_array)
            if pc.any(matched).as_py():
                column = pc.if_else(matched, pa.scalar(None, pa.string()), column)
            return column
        if name in self.plan.numeric and name not in self.plan.keys:
            return column if pa.types.is_floating(kind) else None
        if pa.types.is_integer(kind):
            if _NEGATIVE_ZERO.search(block.buf, block.start, block.end):
                return None
            return pc.cast(column, pa.string())
        if pa.types.is_boolean(kind) or pa.types.is_floating(kind):
            return pc.cast(column, pa.string())
        return None

    def _seen(self, table: pa.Table, block: _Block) -> frozenset[str] | None:
        """Needed columns that occur in the block (as a key of a line's object, not of a nested
        one): a non-null value, or the key as written where no line holds a nested object (one
        `{` per line); None where only the exact path can tell."""
        seen = set()
        flat: bool | None = None
        for name in self.plan.columns:
            column = table[name]
            if column.null_count < len(column):
                seen.add(name)
            elif self.key_patterns[name].search(block.buf, block.start, block.end):
                if flat is None:
                    flat = block.buf.count(b"{", block.start, block.end) == table.num_rows
                if not flat:
                    return None
                seen.add(name)
        return frozenset(seen)


def _guess_prefix(data: pa.Buffer) -> pa.Buffer | None:
    """The block's first lines whose types are guessed (GUESS_LINES, GUESS_BYTES), or None if
    its first line is longer (the exact path reads such a block)."""
    head = memoryview(data)[: GUESS_BYTES + 1].tobytes()
    end, lines = 0, 0
    while lines < GUESS_LINES:
        found = head.find(b"\n", end, GUESS_BYTES)
        if found < 0:
            break
        end, lines = found + 1, lines + 1
    if len(head) <= GUESS_BYTES and lines < GUESS_LINES:
        return data  # the whole block is a small one
    return data.slice(0, end) if end else None


def _first_deep_line(buf: bytearray, start: int, end: int) -> tuple[int, int] | None:
    """(index, start offset) of the first line of buf[start:end] nested more than MAX_JSON_DEPTH
    deep, or None. Vectorised over the structural bytes only (no parser, no recursion): brackets
    inside strings do not count (a quote after an odd run of backslashes is escaped, and a line
    break ends any string). Where the line is not JSON the count may be high, never low: a parser
    stops at the first error, and up to there it tokenises the line as this does."""
    if np is None:  # pragma: no cover - numpy is in requirements.txt
        return _first_deep_line_slowly(bytes(buf[start:end]), start)
    data = np.frombuffer(buf, np.uint8, end - start, start)
    opens = np.flatnonzero((data == 91) | (data == 123))
    if len(opens) <= MAX_JSON_DEPTH:
        return None
    closes = np.flatnonzero((data == 93) | (data == 125))
    quotes = _unescaped_quotes(data)
    newlines = np.flatnonzero(data == 10)
    events = np.concatenate((opens, closes))
    delta = np.concatenate((np.ones(len(opens), np.int64), -np.ones(len(closes), np.int64)))
    order = np.argsort(events, kind="stable")
    events, delta = events[order], delta[order]
    line = np.searchsorted(newlines, events)
    quotes_before_line = np.concatenate(([0], np.searchsorted(quotes, newlines)))[line]
    outside = (np.searchsorted(quotes, events) - quotes_before_line) % 2 == 0
    events, delta, line = events[outside], delta[outside], line[outside]
    if len(events) == 0:
        return None
    depth = np.cumsum(delta)
    first = np.concatenate(([True], line[1:] != line[:-1]))
    base = (depth - delta)[np.maximum.accumulate(np.where(first, np.arange(len(line)), 0))]
    deep = np.flatnonzero(depth - base > MAX_JSON_DEPTH)
    if len(deep) == 0:
        return None
    index = int(line[deep[0]])
    return index, start + (int(newlines[index - 1]) + 1 if index else 0)


_JSON_STRING: Final = re.compile(rb'"(?:[^"\\\n]|\\.)*"')
_BRACKET: Final = re.compile(rb"[][{}]")


def _first_deep_line_slowly(block: bytes, start: int) -> tuple[int, int] | None:
    """`_first_deep_line` without numpy: bracket by bracket, only in lines with enough of them."""
    offset = 0
    for index, line in enumerate(block.split(b"\n")):
        if line.count(b"[") + line.count(b"{") > MAX_JSON_DEPTH:
            depth = 0
            for bracket in _BRACKET.finditer(_JSON_STRING.sub(b'""', line)):
                depth += 1 if bracket.group() in (b"[", b"{") else -1
                if depth > MAX_JSON_DEPTH:
                    return index, start + offset
        offset += len(line) + 1
    return None


def _unescaped_quotes(data: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Positions of the quotes not escaped by a backslash (one after an odd run of them)."""
    quotes = np.flatnonzero(data == 34)
    slashes = np.flatnonzero(data == 92)
    if len(quotes) == 0 or len(slashes) == 0:
        return quotes
    runs = slashes[np.concatenate(([True], np.diff(slashes) != 1))]
    after = quotes[(quotes > 0) & (data[np.maximum(quotes - 1, 0)] == 92)]
    run_start = runs[np.searchsorted(runs, after - 1, side="right") - 1]
    escaped = after[(after - run_start) % 2 == 1]
    return np.setdiff1d(quotes, escaped, assume_unique=True)


def _exact_frame(
    plan: _Plan, block: bytes, first_line: int, nulls: frozenset[str]
) -> tuple[pa.Table, frozenset[str]]:
    """The exact path: (aggregation table, columns seen) of a block, numbers kept as written
    (3.10 -> '3.10'); InputDataError naming the line of the first bad one."""
    columns: dict[str, list[str | None]] = {name: [] for name in plan.columns}
    lines: list[int] = []
    unseen = set(plan.columns)
    try:
        for line, raw in enumerate(block.split(b"\n"), start=first_line):
            if not raw.strip():
                continue
            record = _json_record(raw, line)
            row = [_json_value(record.get(name), name, line, nulls) for name in columns]
            lines.append(line)
            if unseen:
                unseen.difference_update(record.keys())
            for values, value in zip(columns.values(), row, strict=True):
                values.append(value)
    except InputDataError:
        _json_frame(plan, columns, lines)  # a bad number on an earlier line is reported first
        raise
    seen = frozenset(plan.columns) - unseen
    return _json_frame(plan, columns, lines), seen


def _json_record(raw: bytes, line: int) -> dict[str, Any]:
    try:
        record = json.loads(raw, parse_float=str, parse_int=str, parse_constant=str)
    except (ValueError, UnicodeDecodeError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise InputDataError(f"line {line} is not valid JSON: {reason}") from None
    if not isinstance(record, dict):
        raise InputDataError(f"line {line} is not a JSON object")
    return record


def _json_value(value: Any, column: str, line: int, nulls: frozenset[str]) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        if not value.isascii() and _SURROGATE.search(value):
            raise InputDataError(
                f"column {column!r} holds a lone surrogate on line {line}: not valid Unicode"
            )
        return None if value in nulls else value
    if isinstance(value, bool):
        return "true" if value else "false"
    kind = "object" if isinstance(value, dict) else "array"
    raise InputDataError(f"column {column!r} holds a JSON {kind} on line {line}, not a single value")


_SURROGATE: Final = re.compile("[\ud800-\udfff]")
"""A code point Python's `json` accepts (from a lone \\ud800 escape) but UTF-8 cannot hold."""


def _json_frame(plan: _Plan, columns: dict[str, list[str | None]], lines: list[int]) -> pa.Table:
    arrays = {name: pa.array(values, pa.string()) for name, values in columns.items()}
    if not arrays:
        return pa.table({"_": pa.nulls(len(lines))})
    try:
        return plan.frame(arrays, to_float)
    except BadNumber as bad:
        before, after = bad.message_parts()
        raise InputDataError(f"{before}{lines[bad.index]}{after}") from None


# --- the C scanner -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _NativeArgs:
    """What the C scanner (`aggkernel`, native/) is asked for one input, and its answers turned
    into the partial aggregates `_Accumulator.reduce` gives for the same block.

    The scanner reads a block in one pass, off the GIL, and answers only when it is sure to give
    what the Python path gives (else None: the block goes to the Python path, which decides or
    names what is wrong). Needed columns are `plan.columns`; keys and values index into them.
    """

    plan: _Plan
    columns: tuple[int, ...] | tuple[bytes, ...]
    """CSV: per header field, its index in plan.columns or -1. JSON lines: the names, UTF-8."""
    keys: tuple[int, ...]
    values: tuple[int, ...]
    numeric: tuple[int, ...]
    nulls: tuple[bytes, ...]

    @classmethod
    def _of(
        cls, plan: _Plan, columns: tuple[int, ...] | tuple[bytes, ...], nulls: Sequence[str]
    ) -> _NativeArgs | None:
        if _kernel is None or not NATIVE or len(plan.columns) > _kernel.MAX_COLUMNS:
            return None
        return cls(
            plan=plan,
            columns=columns,
            keys=tuple(plan.columns.index(name) for name in plan.keys),
            values=tuple(plan.columns.index(name) for name in plan.values),
            numeric=tuple(int(name in plan.numeric) for name in plan.values),
            nulls=tuple(value.encode() for value in dict.fromkeys(nulls)),
        )

    @classmethod
    def csv(cls, names: Sequence[str], plan: _Plan, nulls: Sequence[str]) -> _NativeArgs | None:
        index = {name: i for i, name in enumerate(plan.columns)}
        return cls._of(plan, tuple(index.get(name, -1) for name in names), nulls)

    @classmethod
    def jsonl(cls, plan: _Plan, nulls: Sequence[str]) -> _NativeArgs | None:
        return cls._of(plan, tuple(name.encode() for name in plan.columns), nulls)

    def csv_reduce(self, block: pa.Buffer) -> tuple[pa.Table, int] | None:
        """(partial aggregates, records) of a block of CSV records, or None."""
        assert _kernel is not None
        out = _kernel.csv_reduce(block, self.columns, self.keys, self.values, self.numeric, self.nulls)
        return None if out is None else (self._partial(out), out[0])

    def jsonl_reduce(self, block: pa.Buffer) -> _JsonPartial | None:
        """A block of JSON lines' partial aggregates, records and columns seen, or None."""
        assert _kernel is not None
        out = _kernel.jsonl_reduce(block, self.columns, self.keys, self.values, self.numeric, self.nulls)
        if out is None:
            return None
        seen = frozenset(name for i, name in enumerate(self.plan.columns) if out[5] >> i & 1)
        return _JsonPartial(self._partial(out), out[0], seen)

    def _partial(self, out: tuple[Any, ...]) -> pa.Table:
        """The scanner's buffers as the table `_Accumulator.reduce` makes (same names and types)."""
        _, groups, count_all, keys, values = out[:5]
        data: dict[str, pa.Array] = {"count_all": _array(pa.int64(), groups, count_all)}
        for column, func, _ in self.plan.partial:
            count, total, low, high, valid, nulls = values[int(column[1:])]
            if func == "count":
                data[f"{column}_{func}"] = _array(pa.int64(), groups, count)
            else:
                buffer = {"sum": total, "min": low, "max": high}[func]
                data[f"{column}_{func}"] = _array(pa.float64(), groups, buffer, valid, nulls)
        for i, (offsets, text, valid, nulls) in enumerate(keys):
            data[f"k{i}"] = pa.Array.from_buffers(
                pa.string(),
                groups,
                [_bitmap(valid), pa.py_buffer(offsets), pa.py_buffer(text)],
                null_count=nulls,
            )
        return pa.table(data)


def _bitmap(valid: bytes | None) -> pa.Buffer | None:
    return None if valid is None else pa.py_buffer(valid)


def _array(
    kind: pa.DataType, length: int, data: bytes, valid: bytes | None = None, nulls: int = 0
) -> pa.Array:
    return pa.Array.from_buffers(kind, length, [_bitmap(valid), pa.py_buffer(data)], null_count=nulls)
