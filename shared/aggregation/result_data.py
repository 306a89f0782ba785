"""Result rows as data: Parquet or CSV written to a binary sink a batch at a time (pure: the sink
is the caller's, e.g. `shared.storage.staged.StagedBlobWriter`, which uploads it in blocks).

Columns, in the result document's order: the group columns (`string`, as written in the input; a
null key stays null), then each metric by its output name: `count` as `int64`, `sum`, `mean`,
`min`, `max` as `double` (null where a group has no value). Rows are sorted by the group columns,
nulls first, as in the JSON document.

- Parquet: one row group per `batch_rows` groups (Snappy-compressed, the format's usual default).
- CSV: RFC 4180 with a header line; every string quoted (`"a"`, the empty string `""`), a null
  an empty unquoted field, numbers as the shortest text that reads back the same double.

Neither the encoded file nor the rows as Python objects is ever held whole: the writer encodes a
batch and hands its bytes to the sink, which passes them on.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

    from shared.aggregation.spec import AggregateSpec

DATA_BATCH_ROWS: Final = 65_536
"""Groups encoded at a time: one Parquet row group, one CSV batch."""


class Sink(Protocol):
    """Where the encoded bytes go: a binary file open for writing."""

    def write(self, data: bytes, /) -> int | None: ...


@dataclass(frozen=True)
class DataWritten:
    """What a data write produced: its rows and its columns' names and types."""

    rows: int
    columns: tuple[tuple[str, str], ...]

    def column_list(self) -> list[dict[str, str]]:
        """The columns as the result document lists them: [{"name", "type"}, ...]."""
        return [{"name": name, "type": kind} for name, kind in self.columns]


def column_types(schema: pa.Schema) -> tuple[tuple[str, str], ...]:
    """(name, type) of each column: string, int64 or double (Arrow's names, Parquet's logical ones)."""
    return tuple((field.name, str(field.type)) for field in schema)


def result_schema(spec: AggregateSpec) -> pa.Schema:
    """The columns of a spec's result, as the inline engine's table has them: the group columns
    as strings, `count` as int64, every other metric as double (the Spark driver's rows are typed
    by it)."""
    import pyarrow as pa

    fields = [pa.field(name, pa.string()) for name in spec.group_by]
    fields += [pa.field(m.name, pa.int64() if m.op == "count" else pa.float64()) for m in spec.metrics]
    return pa.schema(fields)


def row_batches(
    rows: Sequence[dict[str, Any]], schema: pa.Schema, batch_rows: int = DATA_BATCH_ROWS
) -> Iterator[pa.RecordBatch]:
    """Rows (as the Spark driver holds them) turned into record batches of `schema`, `batch_rows`
    at a time."""
    import pyarrow as pa

    for start in range(0, len(rows), batch_rows):
        yield pa.RecordBatch.from_pylist(list(rows[start : start + batch_rows]), schema=schema)


def write_data(table: pa.Table, fmt: str, sink: Sink, batch_rows: int = DATA_BATCH_ROWS) -> DataWritten:
    """Write `table` to `sink` as `fmt` (parquet | csv), `batch_rows` rows at a time.

    The sink is written to and flushed, not closed (the caller commits it).
    """
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
    table = _plain_strings(table)
    return write_batches(table.to_batches(max_chunksize=batch_rows), table.schema, fmt, sink, batch_rows)


def write_batches(
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    fmt: str,
    sink: Sink,
    batch_rows: int = DATA_BATCH_ROWS,
) -> DataWritten:
    """Write record batches of `schema` to `sink` as `fmt`, one Parquet row group / CSV batch each
    (a batch longer than `batch_rows` is cut)."""
    if fmt not in ("parquet", "csv"):
        raise ValueError(f"not a data format: {fmt!r}")
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be at least 1, got {batch_rows}")
    rows = 0
    if fmt == "parquet":
        import pyarrow.parquet as pq

        with pq.ParquetWriter(sink, schema, compression="snappy") as writer:
            for batch in batches:
                if batch.num_rows:
                    writer.write_batch(batch, row_group_size=batch_rows)
                    rows += batch.num_rows
    else:
        import pyarrow.csv as pacsv

        options = pacsv.WriteOptions(include_header=True, batch_size=batch_rows, quoting_style="needed")
        with pacsv.CSVWriter(sink, schema, write_options=options) as csv_writer:
            for batch in batches:
                if batch.num_rows:
                    csv_writer.write_batch(batch)
                    rows += batch.num_rows
    return DataWritten(rows=rows, columns=column_types(schema))


def _plain_strings(table: pa.Table) -> pa.Table:
    """Group columns as plain `string` (a large_string or dictionary key column is cast), so every
    file of the same payload has the same schema whatever path computed it."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns: list[Any] = []
    changed = False
    for column in table.columns:
        kind = column.type
        if pa.types.is_large_string(kind) or pa.types.is_dictionary(kind):
            columns.append(pc.cast(column, pa.string()))
            changed = True
        else:
            columns.append(column)
    return pa.table(columns, names=table.column_names) if changed else table
