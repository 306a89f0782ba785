"""Groups past a bound spilled to sorted runs on local disk and merged a key range at a time
(`SpillingAccumulator`): a result written as data (Parquet, CSV) of any number of groups, in
memory bounded by the bound, not by the groups.

- It is the in-memory `Accumulator`, folding at most twice `spill_rows` rows at a time, until it
  holds more than half of `spill_rows` groups (or one block has more than `spill_rows`): a result
  of up to half of `spill_rows` groups never spills.
- Past them, the groups held are sorted by key and written as a run: an Arrow IPC file of record
  batches of `RUN_BATCH_ROWS` rows; each batch's first key stays in memory (`Run.firsts`).
- When `MAX_RUNS` runs are written they are merged into one, a key range at a time (ranges cut at
  batches' first keys, about `RANGE_ROWS` rows each): a range's rows from every run combined by
  group and sorted. A merged run has one row per group: past `max_groups` rows, TooManyGroups.
- At the end the runs are merged into one; the result is read back from it a batch at a time
  (`ResultRows`), its metrics computed per batch.

Keys compare as the result sorts them: nulls first, then strings by their UTF-8 bytes (the order
of Python's `str` too). The files are removed by `ResultRows.close` (or `SpillingAccumulator.close`);
a worker that dies mid-job leaves them until the next spill on its machine (`spill_folder`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import pyarrow as pa

from shared.aggregation.options import COMBINE_ROWS
from shared.aggregation.plan import Accumulator, Plan
from shared.aggregation.spec import MetricSpec, TooManyGroups
from shared.aggregation.spill_folder import SpillFolder

SPILL_ROWS: Final = 32_768
"""Rows of partial aggregates (~100 bytes each with two keys) folded in memory at a time, at most
twice this: Arrow's group-by takes 3-4x its input, more than linearly (131,072 rows of two keys:
47 MB; 65,536: 16 MB). Past half of it in groups, they are written as a run."""
RUN_BATCH_ROWS: Final = 512
"""Rows of a run read back at a time; each batch's first key places it. A merged range holds up to
a batch of each run beside its RANGE_ROWS: 64 runs of 512 rows as many as 16 of 2,048, and a
million groups recurring through 1 GB took 19-20 s instead of 28-31 s (fewer merges)."""
RANGE_ROWS: Final = 16_384
"""Rows of the runs merged at a time (about: plus up to a batch of each run)."""
MAX_RUNS: Final = 64
"""Runs written before they are merged into one (each merge reads the run of the groups so far
again: 16 merged ~2.5 passes of the rows through Arrow's group-by where groups recur through a
large input, 64 ~1.4)."""

Key = tuple[tuple[bool, str], ...]
"""A group's key as Python compares it: (not null, value) for each group column."""


def key_at(batch: pa.RecordBatch, names: Sequence[str], row: int) -> Key:
    """The key of `batch`'s row `row` (group columns `names`)."""
    values = [batch[name][row].as_py() for name in names]
    return tuple((value is not None, value or "") for value in values)


def first_at_or_after(batch: pa.RecordBatch, names: Sequence[str], bound: Key, start: int) -> int:
    """The first row from `start` of a sorted batch whose key is at or after `bound`."""
    return bisect.bisect_left(
        range(batch.num_rows), bound, lo=start, key=lambda row: key_at(batch, names, row)
    )


@dataclass
class Run:
    """A run file: combined partial aggregates, one row per group, sorted by key."""

    path: Path
    firsts: list[Key] = field(default_factory=list)
    """The first key of each record batch."""
    lengths: list[int] = field(default_factory=list)
    """The rows of each record batch."""

    @property
    def rows(self) -> int:
        return sum(self.lengths)


class RunWriter:
    """Writes sorted tables to a run file, `batch_rows` rows a record batch at most."""

    def __init__(self, path: Path, schema: pa.Schema, keys: Sequence[str], batch_rows: int) -> None:
        self.run = Run(path)
        self.schema, self.keys, self.batch_rows = schema, keys, batch_rows
        self._writer = pa.ipc.new_file(str(path), schema)

    def write(self, table: pa.Table) -> None:
        if table.schema != self.schema:
            table = table.cast(self.schema)
        for batch in table.to_batches(max_chunksize=self.batch_rows):
            if batch.num_rows:
                self.run.firsts.append(key_at(batch, self.keys, 0))
                self.run.lengths.append(batch.num_rows)
                self._writer.write_batch(batch)

    def close(self) -> Run:
        self._writer.close()
        return self.run


class RunCursor:
    """Reads a run forward, the rows before a key at a time, a record batch read when needed."""

    def __init__(self, run: Run, keys: Sequence[str]) -> None:
        self.run, self.keys = run, keys
        self._file = pa.OSFile(str(run.path), "rb")
        self._reader = pa.ipc.open_file(self._file)
        self.index = 0
        """The batch being read."""
        self.offset = 0
        """Its rows already taken."""
        self._batch: pa.RecordBatch | None = None

    def take_before(self, bound: Key | None) -> list[pa.RecordBatch]:
        """The rows from here to the first key at or after `bound` (None: to the end)."""
        out: list[pa.RecordBatch] = []
        firsts = self.run.firsts
        while self.index < len(firsts):
            if bound is not None and self.offset == 0 and firsts[self.index] >= bound:
                break
            batch = self._current()
            whole = bound is None or (self.index + 1 < len(firsts) and firsts[self.index + 1] < bound)
            stop = (
                batch.num_rows
                if whole or bound is None
                else first_at_or_after(batch, self.keys, bound, self.offset)
            )
            if stop > self.offset:
                out.append(batch.slice(self.offset, stop - self.offset))
            if stop < batch.num_rows:
                self.offset = stop
                break
            self.index, self.offset, self._batch = self.index + 1, 0, None
        return out

    def _current(self) -> pa.RecordBatch:
        if self._batch is None:
            self._batch = self._reader.get_batch(self.index)
        return self._batch

    def close(self) -> None:
        self._batch = None
        self._file.close()


def release_unused() -> None:
    """Memory the Arrow pool holds freed given back now (mimalloc's purge waits otherwise, and
    each group-by here frees ~10-20 MB: ~30 MB of peak RSS over a million groups)."""
    pa.default_memory_pool().release_unused()


def range_bounds(runs: Sequence[Run], range_rows: int) -> list[Key]:
    """Keys cutting the runs' rows into ranges of about `range_rows` rows (plus up to a batch of
    each run): batches' first keys, increasing."""
    samples = sorted((key, rows) for run in runs for key, rows in zip(run.firsts, run.lengths, strict=True))
    bounds: list[Key] = []
    held = 0
    for key, rows in samples:
        if held and held + rows > range_rows and (not bounds or key > bounds[-1]):
            bounds.append(key)
            held = 0
        held += rows
    return bounds


def merged(runs: Sequence[Run], acc: Accumulator, range_rows: int) -> Iterator[pa.Table]:
    """The runs' rows combined by group (`acc.combined`), a key range at a time, in key order."""
    cursors = [RunCursor(run, acc.key_names) for run in runs]
    try:
        for bound in [*range_bounds(runs, range_rows), None]:
            pieces = [batch for cursor in cursors for batch in cursor.take_before(bound)]
            if pieces:
                yield acc.sorted(acc.combined(pa.Table.from_batches(pieces)))
                release_unused()
    finally:
        for cursor in cursors:
            cursor.close()


@dataclass(frozen=True)
class SpillLimits:
    """When and how groups spill (the defaults are the shipped values; tests make them small)."""

    spill_rows: int = SPILL_ROWS
    batch_rows: int = RUN_BATCH_ROWS
    range_rows: int = RANGE_ROWS
    max_runs: int = MAX_RUNS
    directory: str | None = None
    """Where the runs' temporary folder is made (None: the system's temporary directory)."""


DEFAULT_LIMITS: Final = SpillLimits()


class SpillingAccumulator:
    """An `Accumulator` whose groups, past `limits.spill_rows`, go to sorted runs on disk."""

    def __init__(
        self,
        plan: Plan,
        max_groups: int | None = None,
        combine_rows: int = COMBINE_ROWS,
        limits: SpillLimits = DEFAULT_LIMITS,
    ) -> None:
        self.memory = Accumulator(plan, max_groups, min(combine_rows, limits.spill_rows))
        self.max_groups = max_groups
        self.limits = limits
        self.runs: list[Run] = []
        self._folder: SpillFolder | None = None
        self._files = 0
        self._schema: pa.Schema | None = None

    @property
    def input_rows(self) -> int:
        return self.memory.input_rows

    def add_partial(self, partial: pa.Table, input_rows: int) -> None:
        """Keep a block's partial aggregates (a row per group): more than `spill_rows` go to a run
        as they are; the groups held in memory go to one once combined past half of them, so no
        combine folds more than twice `spill_rows` rows."""
        if partial.num_rows <= self.limits.spill_rows:
            self.memory.add_partial(partial, input_rows)
            if self.memory.combined_rows > self.limits.spill_rows // 2:
                self._spill()
            return
        self.memory.input_rows += input_rows
        if self.max_groups is not None and partial.num_rows > self.max_groups:
            raise TooManyGroups(self.max_groups, partial.num_rows)
        self._write_run([self.memory.sorted(partial)])
        self._merge_if_many()

    def finish(self, metrics: Sequence[MetricSpec]) -> ResultRows:
        """The result rows: in memory if nothing spilled, else read back from the one merged run
        (the files are the `ResultRows`' to remove)."""
        if not self.runs:
            return ResultRows(self.memory.input_rows, table=self.memory.result_table(metrics))
        self._spill()
        if len(self.runs) > 1:
            self._merge()
        assert self._folder is not None
        folder, self._folder = self._folder, None
        return ResultRows(self.input_rows, spilled=Spilled(self.runs[0], folder, self.memory, metrics))

    def close(self) -> None:
        """Remove the runs (on an error; `finish` hands them over)."""
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None

    def _spill(self) -> None:
        table = self.memory.drain()
        if table is None or table.num_rows == 0:
            return
        self._write_run([self.memory.sorted(table)])
        self._merge_if_many()

    def _merge_if_many(self) -> None:
        if len(self.runs) >= self.limits.max_runs:
            self._merge()

    def _write_run(self, tables: Iterable[pa.Table], limit: int | None = None) -> None:
        """A run of `tables` (sorted, one row per group if `limit`: TooManyGroups past it)."""
        if self._folder is None:
            self._folder = SpillFolder(self.limits.directory)  # sweeps folders of jobs that died
        self._files += 1
        path = Path(self._folder.name) / f"run-{self._files}.arrow"
        writer: RunWriter | None = None
        try:
            for table in tables:  # a generator stopped here is closed (its files too) when dropped
                if writer is None:
                    self._schema = self._schema or table.schema
                    writer = RunWriter(path, self._schema, self.memory.key_names, self.limits.batch_rows)
                writer.write(table)
                if limit is not None and writer.run.rows > limit:
                    raise TooManyGroups(limit, writer.run.rows)
        finally:
            if writer is not None:
                self.runs.append(writer.close())
            release_unused()

    def _merge(self) -> None:
        runs, self.runs = self.runs, []
        self._write_run(merged(runs, self.memory, self.limits.range_rows), self.max_groups)
        for run in runs:
            run.path.unlink()


class ResultRows:
    """An aggregation's result rows (group columns, then each metric by name, sorted), held in
    memory (`table`) or read back from a run a batch at a time; `close` removes the run."""

    def __init__(
        self, input_rows: int, table: pa.Table | None = None, spilled: Spilled | None = None
    ) -> None:
        self.input_rows, self.table, self.spilled = input_rows, table, spilled
        if spilled is not None:
            self.schema, self.groups = spilled.schema(), spilled.run.rows
        else:
            assert table is not None
            self.schema, self.groups = table.schema, table.num_rows

    def batches(self, batch_rows: int) -> Iterator[pa.RecordBatch]:
        """The rows in order, `batch_rows` at a time (the last batch shorter)."""
        if self.spilled is None:
            assert self.table is not None
            yield from self.table.to_batches(max_chunksize=batch_rows)
            return
        held: list[pa.Table] = []
        rows = 0
        for table in self.spilled.tables():
            held.append(table)
            rows += table.num_rows
            if rows >= batch_rows:
                whole = pa.concat_tables(held).combine_chunks()
                cut = rows - rows % batch_rows
                yield from whole.slice(0, cut).to_batches(max_chunksize=batch_rows)
                held, rows = [whole.slice(cut)], rows - cut
        if rows:
            yield from pa.concat_tables(held).combine_chunks().to_batches()

    def close(self) -> None:
        if self.spilled is not None:
            self.spilled.folder.cleanup()

    def __enter__(self) -> ResultRows:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Spilled:
    """A merged run and how its rows become result rows."""

    run: Run
    folder: SpillFolder
    acc: Accumulator
    metrics: Sequence[MetricSpec]

    def schema(self) -> pa.Schema:
        with pa.OSFile(str(self.run.path), "rb") as file:
            empty = pa.ipc.open_file(file).schema.empty_table()
        return self.acc.result_columns(empty, self.metrics).schema

    def tables(self) -> Iterator[pa.Table]:
        """The run's record batches as result rows, in order."""
        with pa.OSFile(str(self.run.path), "rb") as file:
            reader = pa.ipc.open_file(file)
            for index in range(reader.num_record_batches):
                yield self.acc.result_columns(reader.get_batch(index), self.metrics)
