"""The CSV path: blocks of whole records, to the C scanner first, else parsed by pyarrow; the
first bad record in file order named by its physical line."""

from __future__ import annotations

import csv
import io
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Final

import pyarrow as pa
import pyarrow.csv as pacsv

from shared.aggregation.blocks import Block, InPlaceSplitter, Replay, Splitter, line_breaks
from shared.aggregation.csv_check import CsvChecker, quotes_in_place
from shared.aggregation.native import NativeArgs, kernel
from shared.aggregation.number_parsing import BadNumber, to_float
from shared.aggregation.options import (
    IN_FLIGHT_EXTRA,
    MAX_CSV_COLUMNS,
    EngineOptions,
)
from shared.aggregation.plan import Accumulator, Plan
from shared.aggregation.spec import ByteStream
from shared.core.errors import InputDataError


class BadRecord(Exception):
    """A CSV problem in the block at byte `offset`, `line_in_block` lines into it.

    The line number in the file is worked out by the reading thread (see `csv_partials`).
    """

    def __init__(self, before: str, after: str, offset: int, lines_before: int, line_in_block: int) -> None:
        super().__init__(before + after)
        self.before, self.after = before, after
        self.offset, self.lines_before, self.line_in_block = offset, lines_before, line_in_block


Pending = deque[tuple[Future[tuple[pa.Table, int]], Block, int]]
"""Blocks handed to the parse threads, in input order: (its answer, the block, its line breaks)."""


class CutInQuotes(Exception):
    """A block cut at its last line break was cut inside a quoted value (`line_cut` guessed
    wrong): the input is read again from the block's start, cut by `record_cut`."""

    def __init__(self, offset: int) -> None:
        super().__init__(f"the block at byte {offset} ends inside a quoted value")
        self.offset = offset


def csv_partials(
    stream: ByteStream, plan: Plan, null_values: Sequence[str], options: EngineOptions
) -> Generator[tuple[pa.Table, int], None, None]:
    """(partial aggregates, records) of each CSV block, in input order.

    Up to `options.parse_workers` blocks are parsed and reduced at once, each on a thread of its own,
    while the next block is read; errors are raised in input order (the first bad block wins).

    Blocks of a seekable input read by the C scanner are cut at their last line break, without
    counting the quotes before it (`line_cut`): the scanner answers only a block whose quotes
    close, and a block it declines has its quotes counted on its thread. A block cut inside a
    quoted value (an odd count: a value with line breaks in it) is thrown away with every block
    after it, and the input is cut again from its start by `record_cut`, to the end: the same
    blocks as `record_cut` gives throughout, once per input at most. Over a stream that hands
    over its buffers (the blob reader) the bytes already read are cut again from a copy, not
    read again (`cut_again`).
    """
    origin = _position(stream)
    splitter = Splitter.over(stream, options.block_size, record_cut, "a CSV record", options.max_record_bytes)
    parser = CsvParser(_read_header(splitter), plan, null_values, options.native)
    splitter.whole_buffers = parser.native is not None
    if options.fit_blocks:
        splitter.start_narrow()
    speculate = origin is not None and parser.native is not None and options.speculative_cuts
    if speculate:
        splitter.cut = line_cut
    workers = max(1, options.parse_workers)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="csv-parse")
    pending: Pending = deque()
    unsent: list[Block] = []  # a block the splitter handed out, not yet in `pending`
    stopped = False  # the splitter stopped on a record over the limit: its state is gone
    lines_read = 0

    def oldest() -> tuple[pa.Table, int]:
        nonlocal lines_read
        future, block, lines = pending[0]  # a block cut inside quotes stays: it is cut again
        try:
            partial, rows = future.result()
        except BadRecord as bad:
            bad.lines_before = lines_read
            raise
        pending.popleft()
        lines_read += lines
        splitter.release(block.buf)
        if options.fit_blocks:
            splitter.fit(partial.num_rows, block.end - block.start)
        return partial, rows

    def partials() -> Generator[tuple[pa.Table, int], None, None]:
        nonlocal stopped
        try:
            for block in splitter.blocks():
                unsent[:] = [block]
                while len(pending) >= workers + IN_FLIGHT_EXTRA:
                    yield oldest()
                lines = 0 if origin is not None else _block_lines(block.buf, block.start, block.end)
                job = pool.submit(parser.parse, block.data, block.offset, splitter.cut is line_cut)
                pending.append((job, block, lines))
                unsent.clear()
        except InputDataError:
            stopped = True
            while pending:  # a bad record before this point is reported first
                oldest()
            raise
        while pending:
            yield oldest()

    try:
        while True:
            try:
                yield from partials()
                return
            except CutInQuotes:
                assert origin is not None
                splitter = cut_again(splitter, stream, origin, pending, unsent, copy=not stopped)
                stopped = False
    except BadRecord as bad:
        pool.shutdown(wait=True, cancel_futures=True)
        first = _line_at(stream, origin, bad.offset)
        if first is None:  # not seekable: the line breaks of the blocks before, counted as read
            first = 1 + splitter.header_lines + bad.lines_before
        raise InputDataError(f"{bad.before}{first + bad.line_in_block}{bad.after}") from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        splitter.close()


def cut_again(
    splitter: Splitter,
    stream: ByteStream,
    origin: int,
    pending: Pending,
    unsent: list[Block],
    copy: bool = True,
) -> Splitter:
    """A splitter cutting by `record_cut` from the first pending block (a record boundary: the
    blocks before it were read whole), once no thread reads the pending blocks.

    An `InPlaceSplitter` hands back a copy of those blocks and of the bytes it took after them
    (at most the blocks in flight and one stream buffer), cut again before the stream's next
    buffers: nothing is read twice. Any other splitter's stream (or with `copy` False: the
    splitter stopped on an error) seeks back to the block."""
    blocks = [block for _job, block, _lines in pending] + unsent
    for job, _block, _lines in pending:
        job.cancel()
    wait([job for job, _block, _lines in pending])
    pending.clear()
    unsent.clear()
    offset = blocks[0].offset
    size, what, most = splitter.size, splitter.what, splitter.max_record_bytes
    again: Splitter
    if copy and isinstance(splitter, InPlaceSplitter):
        again = InPlaceSplitter(
            Replay(splitter.hand_back(blocks), splitter.stream), size, record_cut, what, most
        )
    else:
        splitter.close()
        getattr(stream, "seek")(origin + offset)  # noqa: B009
        again = Splitter.over(stream, size, record_cut, what, most)
    again.offset, again.header_lines = offset, splitter.header_lines
    again.whole_buffers = splitter.whole_buffers
    again.wide, again.narrowed = splitter.wide, splitter.narrowed
    return again


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
        lines += line_breaks(data) - (last == b"\r" and data[:1] == b"\n")
        last = data[-1:]
        left -= len(data)
    return lines


def _block_lines(buf: bytearray, start: int, end: int) -> int:
    """Line breaks in buf[start:end], as `line_breaks` counts them (no copy)."""
    crs = buf.count(b"\r", start, end)
    crlfs = buf.count(b"\r\n", start, end) if crs else 0
    return buf.count(b"\n", start, end) + crs - crlfs


_PARSE_OPTIONS: Final = pacsv.ParseOptions(newlines_in_values=False)
"""Newlines in quoted values are parsed all the same within a chunk: the option only tells how
pyarrow may split its input into chunks, and a block is one chunk."""


class CsvParser:
    """Parses blocks of whole CSV records into partial aggregates; thread-safe (no state).

    A block is parsed by pyarrow's `read_csv` on the calling thread, as a single chunk: no
    split inside a block, so line breaks in quoted values need no care (our cut is quote-aware).
    Numeric-only columns are read straight as float64, group columns as binary (checked as
    UTF-8 after the reduction: every distinct key is in the partial aggregates), counted ones
    as strings. A block that fails is parsed again with every column as strings, to say where
    and why.
    """

    def __init__(self, names: list[str], plan: Plan, null_values: Sequence[str], native: bool = True) -> None:
        self.names = names
        self.plan = plan
        self.null_values = list(null_values)
        self._check_columns()
        self.reducer = Accumulator(plan)
        self.fast = self._convert_options(fast=True)
        self.slow = self._convert_options(fast=False)
        self.native = NativeArgs.csv(names, plan, null_values, native)

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
        """Fast: as `CsvParser` says. Slow: every column as strings. Columns only counted are
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

    def parse(self, block: pa.Buffer, offset: int, check_cut: bool = False) -> tuple[pa.Table, int]:
        """(partial aggregates, records) of `block` (at `offset` in the input); BadRecord if bad;
        with `check_cut` (a block cut by `line_cut`), CutInQuotes if it ends inside a quoted value.

        The scanner answers only blocks it is sure of; pyarrow reads the others, first with the
        fast types, then all as strings. A block either refuses (or one with a quote out of
        place, which pyarrow would take as text) is read record by record by `_first_bad_record`,
        which names the first bad record in file order: the error never depends on the block.
        """
        if self.native is not None:
            done = self.native.csv_reduce(block)
            if done is not None:
                return done  # its quotes close: a block `record_cut` would cut the same
        if check_cut and int(kernel.count_byte(block, 34, 0, block.size)) % 2:
            raise CutInQuotes(offset)  # `record_cut` would have cut it shorter
        if quotes_in_place(block):
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

    def _first_bad_record(self, block: pa.Buffer, offset: int) -> BadRecord:
        """The first bad record of a block that pyarrow refused, read record by record."""
        checked = CsvChecker(self.names, self.plan, self.null_values)
        found = checked.first_problem(block.to_pybytes())
        if found is None:  # pragma: no cover - pyarrow refused what the checker accepts
            return BadRecord("CSV input is not valid in the block starting on line ", "", offset, 0, 0)
        line, before, after = found
        return BadRecord(before, after, offset, 0, line)


_BOM: Final = b"\xef\xbb\xbf"


def _last_newline(buf: bytearray, start: int, end: int) -> int:
    pos = buf.rfind(b"\n", start, end)
    return pos if pos >= 0 else buf.rfind(b"\r", start, end)


def line_cut(buf: bytearray, start: int, end: int) -> int:
    """Offset just after the last line break in buf[start:end]; 0 if none. A \r at the end is no
    cut: a \n may follow. Inside quotes or not: see `record_cut`."""
    pos = _last_newline(buf, start, end)
    if pos >= 0 and pos == end - 1 and buf[pos] == 13:  # a \r at the end: \r\n may be cut in two
        pos = _last_newline(buf, start, pos)
    return pos + 1


def record_cut(buf: bytearray, start: int, end: int) -> int:
    """Offset just after the last line break outside quotes in buf[start:end]; 0 if none.

    `start` must be a record boundary. It is `line_cut` when the quotes before that line break
    are even, else the line break before it with an even count. A quote out of place
    (`5" screen`) can mislead the count, but only after it: such a record is refused
    (`quotes_in_place`), and the first one is in the block cut before the count went wrong.
    """
    pos = line_cut(buf, start, end) - 1
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


def quote_counter(native: bool = True) -> Callable[[bytearray, int, int], int]:
    """Counts the quotes in buf[start:end]: the C scanner's counter (16 bytes a step, off the
    GIL), else numpy 256 KiB at a time (~6x faster than bytes.count, which is the fallback where
    numpy is missing, e.g. on a Spark executor)."""
    if native and kernel is not None:
        count_byte = kernel.count_byte
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


_count_quotes: Final = quote_counter()


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


def _read_header(splitter: Splitter) -> list[str]:
    """Column names from the first record; InputDataError if the input is empty."""
    raw = splitter.read_head(_header_end)
    if not raw:
        raise InputDataError("the input is empty: a CSV input needs a header line")
    return _header_names(raw)


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
