"""The engine's tuning and its bounds: block sizes, parse threads, record and header limits.

`EngineOptions` is what a caller may change (tests do: small blocks, one thread, a low record
limit, the scanner or pyarrow's JSON reader off); its defaults are the constants below, the
values measured and shipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

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
MANY_GROUPS: Final = 16_384
"""Groups in one block's partial aggregates past which the blocks after it are narrowed to
NARROW_BLOCK_SIZE (read in place, `Splitter.fit`, with `EngineOptions.fit_blocks`): the scanner's
hash table and its answer grow with a block's groups (an 8 MiB block of distinct keys: ~50 MB on
each parse thread)."""
NARROW_BLOCK_SIZE: Final = 1024 * 1024
"""Bytes of a block once blocks hold MANY_GROUPS groups: 1 MiB was as fast as 4 and 8 MiB on
distinct keys, and the engine's peak over the blob reader ~60 MB lower."""
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


@dataclass(frozen=True)
class EngineOptions:
    """How one run of the engine is tuned (the defaults are the shipped values)."""

    block_size: int = DEFAULT_BLOCK_SIZE
    """Bytes of input parsed at a time by one thread (JSON lines on the Python path: at most
    JSONL_BLOCK_SIZE)."""
    parse_workers: int = PARSE_WORKERS
    """Blocks parsed at once, each on a thread of its own (at least 1)."""
    max_record_bytes: int = MAX_RECORD_BYTES
    """A CSV record (or the header) or JSON line larger than this is refused."""
    combine_rows: int = COMBINE_ROWS
    """Partial aggregate rows held before they are combined."""
    native: bool = True
    """Blocks go to the C scanner first where it is built; False: the Python path alone (as on a
    Spark executor without the scanner)."""
    speculative_cuts: bool = True
    """CSV blocks of a seekable input read by the scanner are cut at their last line break, the
    quotes before it counted only when the scanner declines the block (`csv_path.line_cut`);
    False: every cut counts them (`csv_path.record_cut`)."""
    fit_blocks: bool = False
    """Blocks read in place are fitted to their groups (`Splitter.fit`): NARROW_BLOCK_SIZE from the
    start, the reader's whole buffers again while they hold few groups. Set for a result written
    as data, whose groups may be many (`aggregate_rows`); the JSON document's runs keep the
    shipped block sizes."""
    jsonl_pyarrow: bool = True
    """JSON-lines blocks the scanner does not answer go to pyarrow's JSON reader before the exact
    path; False: the exact path (Python's `json`, line by line) alone."""


DEFAULT_OPTIONS: Final = EngineOptions()
