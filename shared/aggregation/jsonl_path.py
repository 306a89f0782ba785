"""The JSON-lines path: blocks of whole lines, to the C scanner first, else pyarrow's JSON reader
with an explicit schema where its answer is the exact one's, else the exact path."""

from __future__ import annotations

import contextlib
import json
import re
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from shared.aggregation.blocks import Block, Splitter
from shared.aggregation.jsonl_exact import exact_frame, first_deep_line
from shared.aggregation.native import NativeArgs, kernel
from shared.aggregation.number_parsing import BadNumber, to_float
from shared.aggregation.options import (
    GUESS_BYTES,
    GUESS_LINES,
    IN_FLIGHT_EXTRA,
    MAX_JSON_DEPTH,
    EngineOptions,
)
from shared.aggregation.plan import Accumulator, JsonPartial, Plan
from shared.aggregation.spec import ByteStream
from shared.core.errors import InputDataError


def jsonl_partials(
    stream: ByteStream, plan: Plan, null_values: Sequence[str], options: EngineOptions, block_size: int
) -> Generator[tuple[pa.Table, int], None, None]:
    """(partial aggregates, records) of each block of JSON lines, in input order.

    Blocks are cut at line breaks (a JSON line has none inside) and parsed `options.parse_workers` at
    a time, each on a thread of its own, by `JsonParser`; errors are raised in input order.

    Line numbers are needed only off the C scanner (the Python path names bad lines): while the
    scanner answers, a block's line breaks come from it, not from a pass of their own. The first
    block it declines is parsed on this thread once the lines before it are known, the blocks in
    flight behind it are handed to the threads again with their first lines, and from then on
    every block is counted as it is cut.
    """
    splitter = Splitter.over(stream, block_size, _line_cut, "a JSON line", options.max_record_bytes)
    parser = JsonParser(plan, null_values, options.native, options.jsonl_pyarrow)
    splitter.whole_buffers = parser.native is not None
    if options.fit_blocks:
        splitter.start_narrow()
    workers = max(1, options.parse_workers)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="jsonl-parse")
    pending: deque[_Pending] = deque()
    unseen = set(plan.columns)
    records = 0
    line = 1
    """The first line of the oldest pending block."""
    counted: int | None = None if parser.native is not None else 1
    """Once blocks are counted as they are cut: the first line of the next block."""

    def oldest() -> tuple[pa.Table, int]:
        nonlocal records, line, counted
        entry = pending.popleft()
        assert entry.future is not None
        done = entry.future.result()  # awaited even when handed again: a thread may still read the buffer
        if entry.again is not None:
            done = entry.again.result()
        elif done is None:  # the scanner declined it: the Python path, now that its first line is known
            if counted is None:  # the first time: the blocks in flight again, with their first lines
                counted = line + entry.count()
                for later in pending:
                    later.again = pool.submit(parser.parse, later.block, counted, later.lines())
                    counted += later.count()
            done = parser.parse(entry.block, line, entry.lines(), scanner=False)
        breaks = entry.breaks if entry.breaks is not None else done.line_breaks
        assert breaks is not None  # counted, or answered by the scanner (which counts)
        line += breaks
        splitter.release(entry.block.buf)
        if options.fit_blocks:
            splitter.fit(done.partial.num_rows, entry.block.end - entry.block.start)
        unseen.difference_update(done.seen)
        records += done.rows
        return done.partial, done.rows

    try:
        for cut in splitter.blocks():
            while len(pending) >= workers + IN_FLIGHT_EXTRA:
                yield oldest()
            entry = _Pending(cut)
            if counted is None:
                entry.future = pool.submit(parser.scan, cut)
            else:
                entry.future = pool.submit(parser.parse, cut, counted, entry.lines())
                counted += entry.count()
            pending.append(entry)
        while pending:
            yield oldest()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        splitter.close()
    if unseen and records:
        listed = ", ".join(repr(c) for c in sorted(unseen))
        raise InputDataError(f"column(s) {listed} occur in no line of the JSON-lines input")


class _Pending:
    """A block handed to the threads: its future (a partial, or None where the scanner declined
    it and its first line was not known), the same block handed again with its first line, and
    its line breaks once counted."""

    def __init__(self, block: Block) -> None:
        self.block = block
        self.future: Future[JsonPartial | None] | Future[JsonPartial] | None = None
        self.again: Future[JsonPartial] | None = None
        self.breaks: int | None = None

    def count(self) -> int:
        """The block's line breaks (\\n), counted once."""
        if self.breaks is None:
            self.breaks = _count_newlines(self.block.buf, self.block.start, self.block.end)
        return self.breaks

    def lines(self) -> int:
        """The block's lines: its breaks, and one more if it ends without one (the input's end)."""
        return self.count() + (self.block.buf[self.block.end - 1] != 10)


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
        if kernel is not None:  # the C scanner's counter: ~3x numpy's, off the GIL
            return int(kernel.count_byte(buf, 10, start, end))
        return int(np.count_nonzero(np.frombuffer(buf, np.uint8, end - start, start) == 10))

    def is_ascii(buf: bytearray, start: int, end: int) -> bool:
        return end == start or int(np.frombuffer(buf, np.uint8, end - start, start).max()) < 128

    return count_newlines, is_ascii


_count_newlines, _is_ascii = _byte_scanners()


_TWO_OBJECTS: Final = r"}[ \t\r]*{|\\u[dD][89a-fA-F]"
"""Two objects on a line, or what may be a surrogate's escape: the exact path decides."""
_NOT_AN_OBJECT: Final = r"(?m)^[ \t\r]*[^{ \t\r\n]"
"""A line that does not start with `{` (after blank space): pyarrow's JSON reader takes a line
`null` for a row of nulls, and crashes the process (SIGSEGV, pyarrow 26) when it is a block's
first line; the exact path names the line instead."""


def _offsets(size: int) -> pa.Buffer:
    """The offsets of a binary array of one value of `size` bytes."""
    return pa.array([0, size], pa.int32()).buffers()[1]


_ESCAPED_KEY = re.compile(rb'\\.(?:[^"\\\n]|\\.)*"\s*:')
"""A key written with an escape (`"k\\u00e9":` is the key `ké`): the key patterns, which look for
a key as written, cannot see it; where one may be in a block, the exact path decides."""
_NUMBER_TEXT = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?|true|false")
_NEGATIVE_ZERO = re.compile(rb"-0(?![0-9.eE])")


class JsonParser:
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

    def __init__(
        self, plan: Plan, null_values: Sequence[str], native: bool = True, pyarrow: bool = True
    ) -> None:
        self.plan = plan
        self.nulls = frozenset(null_values)
        self.null_array = pa.array(sorted(self.nulls), pa.string())
        self.fast = pyarrow and not any(_NUMBER_TEXT.fullmatch(v) for v in self.nulls)
        """Off when asked, or when a null value could be a number's text (only the exact path sees
        that text)."""
        self.schema: pa.Schema | None = None
        self.reducer = Accumulator(plan)
        self.native = NativeArgs.jsonl(plan, null_values, native)
        self.key_patterns = {
            c: re.compile(re.escape(json.dumps(c, ensure_ascii=False).encode()) + rb"\s*:")
            for c in plan.columns
        }

    def scan(self, block: Block) -> JsonPartial | None:
        """The block's partial aggregates by the C scanner, or None where it does not answer."""
        return None if self.native is None else self.native.jsonl_reduce(block.data)

    def parse(self, block: Block, first_line: int, lines: int, scanner: bool = True) -> JsonPartial:
        """The block's partial aggregates (its `lines` start at `first_line`); InputDataError
        naming the line if it is bad. `scanner`: False where the C scanner has declined it."""
        if scanner and (done := self.scan(block)) is not None:
            return done
        deep = first_deep_line(block.buf, block.start, block.end)
        if deep is not None:
            line, offset = deep
            exact_frame(self.plan, bytes(block.buf[block.start : offset]), first_line, self.nulls)
            raise InputDataError(
                f"line {first_line + line} is nested more than {MAX_JSON_DEPTH} arrays or objects deep: "
                "refused before parsing (flatten it, or remove the line)"
            )
        fast = self._fast(block, lines) if self.fast else None
        if fast is not None:
            frame, seen = fast
        else:
            frame, seen = exact_frame(self.plan, bytes(block.data), first_line, self.nulls)
        return JsonPartial(self.reducer.reduce(frame), frame.num_rows, seen)

    def _fast(self, block: Block, lines: int) -> tuple[pa.Table, frozenset[str]] | None:
        """(aggregation table, columns seen) by pyarrow, or None where the exact path must decide.

        One object per line: as many rows as lines, every line starting with `{`, and no `}`
        followed on its line by `{`.
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
        if pc.match_substring_regex(whole, _NOT_AN_OBJECT)[0].as_py():
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
        prefix = guess_prefix(data)
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

    def _convert(self, name: str, column: pa.Array, block: Block) -> pa.Array | None:
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

    def _seen(self, table: pa.Table, block: Block) -> frozenset[str] | None:
        """Needed columns that occur in the block (as a key of a line's object, not of a nested
        one): a non-null value, or the key as written where no line holds a nested object (one
        `{` per line); None where only the exact path can tell (nested objects, or a key written
        with an escape)."""
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
            elif _ESCAPED_KEY.search(block.buf, block.start, block.end):
                return None  # the key may be there, written with an escape
        return frozenset(seen)


def guess_prefix(data: pa.Buffer) -> pa.Buffer | None:
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
