"""The Parquet path: the footer read once, then row group by row group only the needed column
chunks (`SpanSource.read`: concurrent ranged GETs over a blob), the next row group read while one
is decoded by pyarrow from those bytes alone, a batch at a time, each batch reduced by Arrow's
group-by (`parquet_partials`).

Memory is bounded by the row groups in hand (one decoded, one read ahead), not the file.

Semantics (docs/jobs.md, "Parquet"): columns keep their types. A group column may be a string,
binary (valid UTF-8), integer, boolean, float, decimal, date or timestamp: rows are grouped by
value, then each key is written as text (`42`, `true`, `1.5`, `1.50`, `2024-01-02`); a null is
null, its own group. A numeric metric's column must be an integer, float or decimal column
(read as float64, as CSV's numbers are); any other type is refused by name before any row is
read. `null_values` do not apply: Parquet has its own nulls. A file that is not Parquet, is
truncated or is corrupt is bad input (`InputDataError`) saying what was wrong, never another error.
"""

from __future__ import annotations

import io
from collections import deque
from collections.abc import Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shared.aggregation.dict_keys import dict_partial
from shared.aggregation.parquet_layout import ParquetLayout, check_columns
from shared.aggregation.parquet_native import NativePlan, native_partial, native_plan
from shared.aggregation.parquet_source import BytesSpans, SpanSource, StreamSpans, as_source, read_footer
from shared.aggregation.plan import Accumulator, Plan
from shared.core.errors import InputDataError

__all__ = [
    "BytesSpans",
    "ParquetLayout",
    "SpanSource",
    "StreamSpans",
    "aggregate_parquet",
    "as_source",
    "check_columns",
    "load_row_group",
    "parquet_partials",
    "read_footer",
    "reduce_table",
]

WORKERS: Final = 1
"""Row groups decoded and reduced at once, each on a thread of its own; with one, its columns are
decoded in parallel on pyarrow's CPU pool. Peak RSS over a 1 GB blob (child process, Azurite,
side by side): one 250-270 MB, two 292-303 MB (each thread's allocator keeps its own pages), for
no speed the noise could show."""
READ_BYTES: Final = 32 * 1024 * 1024
"""Needed bytes of the row groups read ahead of those decoded, at least (with more than `workers`
row groups when they are small: DuckDB's and Polars' ~100 k-row groups need ~2 MB each here, read
one GET after the other before, as many GETs as row groups, the decode waiting on each). Row
groups of ~15 MB needed or more (pyarrow's, Spark's defaults) are held as with 16 MiB."""
READ_THREADS: Final = 8
"""Row groups read at once (their GETs in flight together, each range's behind it; at most the
blob reader's `depth` GETs at once). 4 threads and 16 MiB against 8 and 32 MiB, the engine over
the reader, 13 interleaved rounds at load 17-20: DuckDB's 300 MB file 1.47 -> 0.96 s (median;
faster in 10 of 13 rounds), Polars' 1 GB file 3.64 -> 3.58 s; the same CPU (ours and Azurite's)."""
NATIVE_WORKERS: Final = 2
"""Row groups decoded at once where the C scanner takes them (one a core: it builds no Arrow
array, so two cost little memory; a row group it leaves to pyarrow is decoded on its thread)."""
BATCH_ROWS: Final = 1024 * 1024
"""Rows decoded and reduced at a time (at most; a row group's). CPU seconds on a 1 GB file (21 row
groups of 1 Mi rows), best of 4 side by side: 64 Ki and 128 Ki rows 1.09-1.14 s (a group-by's
fixed cost per batch), 256 Ki 0.93 s, 512 Ki 0.90 s, 1 Mi 0.89 s; peak RSS 1 Mi 250 MB, 512 Ki
264-270 MB."""


class _Sparse(io.RawIOBase):
    """A read-only file of `size` bytes of which only some spans are held (the needed column
    chunks of one row group, and the footer): what pyarrow reads a row group from."""

    def __init__(self, size: int, spans: Sequence[tuple[int, Any]]) -> None:
        super().__init__()
        self._size = size
        self._spans = sorted(((offset, memoryview(data)) for offset, data in spans), key=lambda s: s[0])
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def size(self) -> int:
        return self._size

    def read(self, size: int = -1, /) -> bytes | memoryview:
        end = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        for offset, data in self._spans:
            if offset <= self._pos and end <= offset + len(data):
                out = data[self._pos - offset : end - offset]
                self._pos = end
                return out
        raise OSError(
            f"bytes {self._pos}-{end} of the Parquet input were not read (not a needed column chunk)"
        )


def aggregate_parquet(
    source: SpanSource,
    plan: Plan,
    acc: Accumulator,
    *,
    row_groups: Sequence[int] | None = None,
    metadata: pq.FileMetaData | None = None,
) -> None:
    """Add every row group's (or those of `row_groups`) partial aggregates to `acc`."""
    for partial, rows in parquet_partials(source, plan, row_groups=row_groups, metadata=metadata):
        acc.add_partial(partial, rows)


def parquet_partials(
    source: SpanSource,
    plan: Plan,
    *,
    row_groups: Sequence[int] | None = None,
    metadata: pq.FileMetaData | None = None,
    workers: int = WORKERS,
    batch_rows: int = BATCH_ROWS,
    native: bool = True,
    read_bytes: int | None = None,
) -> Generator[tuple[pa.Table, int], None, None]:
    """(partial aggregates, rows) of each batch of each row group, in file order.

    READ_THREADS threads read the needed column chunks of the next row groups (concurrent ranged
    GETs behind each); `workers` threads each decode a row group `batch_rows` rows at a time and
    reduce each batch as it comes (pyarrow and Arrow's group-by, off the GIL). Row groups held:
    the `workers` being decoded and one read ahead, or more read ahead while those held need at
    most `read_bytes` (READ_BYTES; small row groups), and one batch each decoded: memory follows the row
    groups' needed bytes, not the file. `native`: a batch keyed by one dictionary-encoded column
    is grouped by the C scanner where it is built (`dict_keys`)."""
    footer = read_footer(source) if metadata is None else metadata
    layout = ParquetLayout.of(footer, plan, source.size)
    groups = list(range(footer.num_row_groups)) if row_groups is None else list(row_groups)
    groups = [index for index in groups if layout.needed(index)]
    reducer = Accumulator(plan)
    fast = native_plan(footer, layout.schema, layout.leaves, plan) if native else None
    workers = max(1, workers if fast is None else max(workers, NATIVE_WORKERS))
    reads = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="parquet-read")
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="parquet-decode")
    ahead: deque[tuple[Future[list[tuple[pa.Table, int]]], int]] = deque()
    held = 0
    read_bytes = READ_BYTES if read_bytes is None else read_bytes
    try:
        for index in groups:
            spans = layout.spans(index)
            chunks = reads.submit(source.read, spans)
            decoded = pool.submit(
                _row_group, source, layout, index, chunks, reducer, batch_rows, workers == 1, native, fast
            )
            ahead.append((decoded, sum(length for _, length in spans)))
            held += ahead[-1][1]
            while len(ahead) > workers and held > read_bytes:
                future, need = ahead.popleft()
                held -= need
                yield from future.result()
        while ahead:
            yield from ahead.popleft()[0].result()
    finally:
        for future, _ in ahead:
            future.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
        reads.shutdown(wait=True, cancel_futures=True)


def _row_group(
    source: SpanSource,
    layout: ParquetLayout,
    index: int,
    read: Future[list[tuple[int, Any]]],
    reducer: Accumulator,
    batch_rows: int,
    threads: bool,
    native: bool,
    fast: NativePlan | None = None,
) -> list[tuple[pa.Table, int]]:
    """A row group's partial aggregates, `batch_rows` rows at a time (`threads`: its columns
    decoded in parallel, on pyarrow's CPU pool); `fast`: decoded and folded by the C scanner
    where it can (`parquet_native`)."""
    rows = layout.metadata.row_group(index).num_rows
    if not layout.leaves:  # rows counted only: the footer says how many
        return [(reducer.reduce(pa.table({"_": pa.nulls(rows)})), rows)]
    chunks = read.result()
    where = f"row group {index}"
    try:
        if fast is not None:
            partial = native_partial(chunks, layout.metadata, index, reducer.plan, fast)
            if partial is not None:
                return [(partial, rows)]
        out: list[tuple[pa.Table, int]] = []
        for table in _batches(source, layout, index, chunks, batch_rows, threads):
            out.append((reduce_table(table, reducer.plan, reducer, where, native), table.num_rows))
        got = sum(n for _, n in out)
        if got != rows and not layout.holds(index, got):  # a chunk short of its values: never rows lost
            raise InputDataError(
                f"{where} of the Parquet input holds {rows} rows by its footer, but its columns "
                f"{', '.join(repr(c) for c in layout.leaves)} give {got} (the file is corrupt)"
            )
        return out
    finally:
        source.give_back(chunks)


def _batches(
    source: SpanSource,
    layout: ParquetLayout,
    index: int,
    chunks: list[tuple[int, Any]],
    batch_rows: int,
    threads: bool = True,
) -> Generator[pa.Table, None, None]:
    """A row group's needed columns decoded from its chunks alone, `batch_rows` rows at a time
    (string and binary group columns dictionary-encoded: grouped by their indices' values)."""
    try:
        reader = pq.ParquetFile(
            _Sparse(source.size, chunks),
            metadata=layout.metadata,
            pre_buffer=False,
            read_dictionary=layout.dictionary_keys_of(index),
        )
        batches = reader.iter_batches(
            batch_size=batch_rows, row_groups=[index], columns=list(layout.leaves), use_threads=threads
        )
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            yield pa.Table.from_batches([batch])
    except (OSError, pa.ArrowException) as exc:
        raise InputDataError(
            f"row group {index} of the Parquet input cannot be decoded (the file is corrupt): {exc}"
        ) from None


def load_row_group(source: SpanSource, layout: ParquetLayout, index: int) -> list[pa.Table]:
    """One row group's needed columns, read and decoded (`bench.bench_parquet`'s decode figure)."""
    chunks = source.read(layout.spans(index))
    try:
        return list(_batches(source, layout, index, chunks, BATCH_ROWS))
    finally:
        source.give_back(chunks)


def reduce_table(
    table: pa.Table, plan: Plan, reducer: Accumulator, where: str, native: bool = True
) -> pa.Table:
    """Partial aggregates of a table of typed columns: numbers to float64, keys grouped by value
    and then written as text (InputDataError naming a binary key column that is not UTF-8);
    `native`: one dictionary-encoded key grouped by the C scanner where it can."""
    data: dict[str, Any] = {f"k{i}": _key(table[name]) for i, name in enumerate(plan.keys)}
    for i, name in enumerate(plan.values):
        column = table[name]
        if name in plan.numeric:
            column = pc.cast(column, pa.float64(), safe=False)
        elif _nested(column.type):
            column = _validity(column)
        data[f"v{i}"] = column
    frame = pa.table(data) if data else pa.table({"_": pa.nulls(table.num_rows)})
    try:
        for i in range(len(plan.keys)):
            _check_text(frame[f"k{i}"])
        partial = dict_partial(frame, plan) if native else None
        if partial is not None:
            return partial
        try:
            return reducer.reduce(frame)
        except pa.ArrowNotImplementedError:  # dictionaries that differ between chunks
            return reducer.reduce(_decoded_keys(frame, len(plan.keys)))
    except pa.ArrowIndexError as exc:  # a dictionary index past its dictionary: pyarrow reads it as it is
        raise InputDataError(
            f"{where} of the Parquet input cannot be decoded (the file is corrupt): {exc}"
        ) from None
    except pa.ArrowInvalid as exc:
        keys = ", ".join(repr(k) for k in plan.keys)
        raise InputDataError(
            f"{where} of the Parquet input: a group key ({keys}) is not valid UTF-8: {exc}"
        ) from None


def _decoded_keys(frame: pa.Table, keys: int) -> pa.Table:
    for i in range(keys):
        column = frame[f"k{i}"]
        if pa.types.is_dictionary(column.type):
            frame = frame.set_column(i, f"k{i}", pc.cast(column, column.type.value_type))
    return frame


def _key(column: pa.ChunkedArray) -> pa.ChunkedArray:
    kind = column.type
    if pa.types.is_large_string(kind) or pa.types.is_large_binary(kind):
        return pc.cast(column, pa.string() if pa.types.is_large_string(kind) else pa.binary())
    return column


def _check_text(column: pa.ChunkedArray) -> None:
    """ArrowInvalid when a string key (or its dictionary) is not UTF-8: pyarrow's decode of a
    corrupt page does not check, and the texts would fail only when the result is written."""
    kind = column.type
    if pa.types.is_dictionary(kind) and pa.types.is_string(kind.value_type):
        for chunk in column.chunks:
            chunk.dictionary.validate(full=True)
    elif pa.types.is_string(kind):
        column.validate(full=True)


def _nested(kind: pa.DataType) -> bool:
    return bool(pa.types.is_nested(kind) or pa.types.is_dictionary(kind))


def _validity(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A column counted only, of a type Arrow's group-by cannot count: its nulls, as booleans."""
    valid = pc.is_valid(column)
    return pc.if_else(valid, True, pa.scalar(None, pa.bool_()))
