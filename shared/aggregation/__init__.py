"""The aggregation package: the `aggregate` job's payload, its engine and its result document.

Pure (no Azure SDK, no app settings): the function app runs it inline, and the Spark job ships
this folder whole to its executors (`spark_jobs/aggregate_job.py`), so both engines share one
payload parser, one semantics and one result document.

- `spec`: what a job asks for (`AggregateSpec`, `MetricSpec`) and which partial aggregates each
  metric needs (`partials_by_column`, for the inline engine and Spark); `payload`: the payload's validation into a spec; `output`: the payload's `output` (json,
  parquet, csv); `result`: the result document; `result_data`: a result as Parquet or CSV, in batches.
- `engine`: the public functions (`aggregate_stream`, `aggregate_table`, `aggregate_rows`); `options`: the tuning
  (`EngineOptions`, passed in; its defaults are the shipped values).
- `plan`: the columns read and the partial aggregation; `number_parsing`: strings to numbers;
  `spill`: a data output's groups past a bound spilled to sorted runs on local disk and merged a
  key range at a time (`aggregate_rows`), so its memory does not grow with its groups.
- `blocks`: the stream cut into blocks of whole records; `csv_path`, `csv_check`: CSV;
  `jsonl_path`, `jsonl_exact`: JSON lines; `native`: the bridge to the C scanner;
  `parquet_path`: Parquet, read by spans (the footer, then the needed column chunks of each row
  group), typed keys and numbers, the next row group read while one is reduced.

How the engine stays fast and bounded:

- The stream is read in blocks of `block_size` bytes (the first ones smaller, so parsing starts
  at once), each cut at its last record boundary (CSV: a line break outside quotes, quotes
  counted in C; JSON lines: a line break). Two blocks are parsed at a time, each on a thread of
  its own, while the next ones are read.
  A stream that hands over its own buffers (the blob reader: `next_chunk` / `give_back`) is
  cut in place instead of copied (`InPlaceSplitter`): only a record spanning two buffers is.
- Each block goes first to the C scanner (`aggkernel`, built from native/): one pass, off the
  GIL, that finds the structural bytes 64 at a time, reads only the needed fields, parses
  numbers (correctly rounded) and reduces the block's rows in a hash table to partial
  aggregates per group (rows, non-null count, sum, min, max). It answers only when it is sure
  to give what the Python path gives (`NativeArgs`); anything else goes to the Python path.
- The Python path (also the whole engine where the scanner is not built or cannot load, e.g.
  Spark executors without a build for their platform): CSV blocks parsed by pyarrow's `read_csv` as a single chunk (only the needed
  columns; numeric-only columns straight to float64), JSON lines by pyarrow's JSON reader with an
  explicit schema (`JsonParser`), and what that cannot answer exactly as Python's `json` would
  (a float group key, mixed types, an object, a bad value...) by the exact path, line by line,
  which keeps numbers as written and names the line of a bad value. Each block is reduced with
  Arrow's `Table.group_by`.
- Partials are concatenated and re-aggregated when they grow, so memory depends on the block
  size and the number of groups, never on the input size.

Measured (bench/bench_aggregate.py: 2 cores, interleaved, best of 7; see docs/performance.md):
engine / Polars 2.1 streaming 1.84-1.88x on the wide CSV (20 columns), 1.45x on the narrow one,
2.0x on JSON lines (the pyarrow path alone: 0.67-0.87x, 0.74-0.97x, 0.54-0.57x); peak RSS ~130 MB
on 1 GB of CSV or of JSON lines.

Semantics are SQL's: see `aggregate_stream`.

Input rules (one answer per input: both paths and every block size give the same rows or the
same error; `tests/fuzz/differential.py` checks it):

- Errors: the first bad record (CSV) or line (JSON lines) in file order is named, with its
  physical line number (a line break is \\n, \\r\\n or a lone \\r; breaks inside quoted CSV values
  count). Within a CSV record: its quoting and number of fields first, then its columns in
  header order (a group or numeric column that is not UTF-8, then a value that is not a number).
- CSV: RFC 4180 quoting, `,` between fields, empty lines skipped. A quote must open or close a
  whole field: one inside an unquoted field (`5" screen`), text after a closing quote, or a
  quoted field never closed is refused (they would make the block cut ambiguous). A byte-order
  mark is skipped only at the start of the input; elsewhere it is data. Group and numeric columns
  must be UTF-8; a column only counted is counted whatever its bytes. The header has at most
  MAX_CSV_COLUMNS (16,384) columns; a record (so any key or value) at most MAX_RECORD_BYTES.
- JSON lines: one object per line, `\\n` or `\\r\\n` endings (a lone `\\r` is not a line break,
  as in Python's `json`); one byte-order mark at the start of a line is ignored. Nesting deeper
  than MAX_JSON_DEPTH (64) and a lone surrogate (`"\\ud800"`) in a needed column are bad input
  naming the line; invalid UTF-8 is invalid JSON. A line is at most MAX_RECORD_BYTES; pyarrow
  guesses types from a block's first GUESS_LINES lines / GUESS_BYTES only.
"""

from __future__ import annotations

from shared.aggregation.engine import aggregate_rows, aggregate_stream, aggregate_table
from shared.aggregation.native import NATIVE
from shared.aggregation.options import DEFAULT_BLOCK_SIZE, DEFAULT_OPTIONS, EngineOptions
from shared.aggregation.payload import parse_aggregate_payload
from shared.aggregation.spec import (
    DEFAULT_NULL_VALUES,
    ENGINES,
    FORMATS,
    NUMERIC_OPS,
    OPS,
    PARTIALS,
    AggregateResult,
    AggregateSpec,
    ByteStream,
    Engine,
    Format,
    MetricSpec,
    Op,
    TooManyGroups,
    partials_by_column,
)

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_NULL_VALUES",
    "DEFAULT_OPTIONS",
    "ENGINES",
    "FORMATS",
    "NATIVE",
    "NUMERIC_OPS",
    "OPS",
    "PARTIALS",
    "AggregateResult",
    "AggregateSpec",
    "ByteStream",
    "Engine",
    "EngineOptions",
    "Format",
    "MetricSpec",
    "Op",
    "TooManyGroups",
    "aggregate_rows",
    "aggregate_stream",
    "aggregate_table",
    "parse_aggregate_payload",
    "partials_by_column",
]
