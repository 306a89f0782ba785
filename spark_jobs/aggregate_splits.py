"""Byte-range splits of the aggregate job's input (spark_jobs/aggregate_job.py, Blob SDK mode):
ranges planned over the blob, and each split's whole lines (Hadoop's line-record rule).

Shipped to the cluster in the engine zip (`JOB_MODULES`); standard library only.
"""

from __future__ import annotations

from collections.abc import Callable

OVERHANG = 64 * 1024
"""Bytes read past a split's end at first to finish its last line (more if that is not enough)."""


def plan_splits(start: int, size: int, split_bytes: int, min_splits: int) -> list[tuple[int, int]]:
    """Byte ranges [s, e) covering [start, size): at least `min_splits`, at most split_bytes each."""
    total = max(0, size - start)
    if total == 0:
        return [(start, start)]
    count = max(min_splits, -(-total // split_bytes))
    count = min(count, total)
    step = -(-total // count)
    return [(s, min(s + step, size)) for s in range(start, size, step)]


def split_lines(read: Callable[[int, int], bytes], size: int, s: int, e: int, first: bool) -> bytes:
    """The whole lines of split [s, e): a line belongs to the split holding the break before it.

    `first`: the split starts at a line start (the data region's start) and keeps its first line.
    `read(offset, length)` reads bytes of the blob.
    """
    if s >= size:
        return b""
    end_goal = min(size, e + OVERHANG)
    data = read(s, end_goal - s)
    if first:
        begin = 0
    else:
        nl = data.find(b"\n")
        while nl < 0 and s + len(data) < size and s + len(data) < e:
            more = read(s + len(data), min(size, e + OVERHANG) - s - len(data))
            data += more
            nl = data.find(b"\n")
        if nl < 0 or s + nl >= e:
            return b""
        begin = nl + 1
    rel_e = e - s
    stop = data.find(b"\n", max(rel_e, begin))
    while stop < 0 and s + len(data) < size:
        chunk = max(OVERHANG, len(data) // 4)
        data += read(s + len(data), min(chunk, size - s - len(data)))
        stop = data.find(b"\n", max(rel_e, begin))
    return data[begin : stop + 1] if stop >= 0 else data[begin:]


def csv_header(read: Callable[[int, int], bytes], size: int) -> bytes:
    """The CSV header record (up to its line break outside quotes, inclusive)."""
    length = min(size, OVERHANG)
    while True:
        data = read(0, length) if length else b""
        pos = data.find(b"\n")
        while pos >= 0 and data.count(b'"', 0, pos) % 2:
            pos = data.find(b"\n", pos + 1)
        if pos >= 0:
            return data[: pos + 1]
        if length >= size:
            return data
        length = min(size, length * 4)
