"""Byte-range splits of the aggregate job's input (spark_jobs/aggregate_job.py, Blob SDK mode):
ranges planned over the blob, and each split's whole lines (Hadoop's line-record rule; JSON lines)
or whole records (CSV, whose quoted values may hold line breaks).

CSV: a split's first record starts after the first line break outside quotes, which depends on
whether the split starts inside a quoted value. A task cannot know (that takes every quote before
it), so it guesses from its first quotes (`starts_inside`: a quote where a reading puts it out of
place rules that reading out) and counts the quotes of its range; the driver then knows every
split's true start (`wrong_starts`, the quotes before it) and runs again the few it guessed wrong.

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


QUOTE = 34
SEPARATORS = (b",", b"\n", b"\r")
"""What may stand before an opening quote and after a closing one (or the data's edge)."""
GUESS_BYTES = 64 * 1024
"""The bytes of a split's start whose quotes say whether it starts inside a quoted value."""


def starts_inside(data: bytes, limit: int = GUESS_BYTES) -> bool:
    """Whether `data` (a split's first bytes) starts inside a quoted value: True only where
    reading it as outside puts a quote out of place and reading it as inside does not."""
    return not _consistent(data, False, limit) and _consistent(data, True, limit)


def _consistent(data: bytes, inside: bool, limit: int) -> bool:
    """Whether every quote run in data[:limit] is in place if data[0] is (or not) inside a quoted value."""
    pos = data.find(b'"', 0, limit)
    while pos >= 0:
        end = pos
        while end < len(data) and data[end] == QUOTE:
            end += 1
        odd = (end - pos) % 2 == 1
        after = data[end : end + 1]
        if not inside:
            if pos > 0 and data[pos - 1 : pos] not in SEPARATORS:
                return False  # an opening quote inside a field
            inside = odd
            if not odd and after and after not in SEPARATORS:
                return False  # an empty quoted value followed by more of its field
        elif odd:
            if after and after not in SEPARATORS:
                return False  # a closing quote followed by more of its field
            inside = False
        pos = data.find(b'"', end, limit)
    return True


def split_records(
    read: Callable[[int, int], bytes], size: int, s: int, e: int, first: bool, inside: bool | None = None
) -> tuple[bytes, int, bool]:
    """The whole CSV records of split [s, e): a record belongs to the split holding the line break
    (outside quotes) before it. `inside`: whether s is inside a quoted value (None: guessed).

    Returns (the records, the quotes in [s, e), the `inside` taken)."""
    if s >= size:
        return b"", 0, False
    data = read(s, min(size, e + OVERHANG) - s)
    quotes = data.count(b'"', 0, e - s)
    if first:
        inside, begin = False, 0
    else:
        if inside is None:
            inside = starts_inside(data)
        data, nl = _next_break(read, size, s, data, 0, inside)
        if nl < 0 or s + nl >= e:
            return b"", quotes, inside
        begin = nl + 1
    rel_e = max(e - s, begin)
    data, stop = _next_break(read, size, s, data, rel_e, data.count(b'"', begin, rel_e) % 2 == 1)
    return (data[begin : stop + 1] if stop >= 0 else data[begin:]), quotes, inside


def _next_break(
    read: Callable[[int, int], bytes], size: int, s: int, data: bytes, pos: int, inside: bool
) -> tuple[bytes, int]:
    """(data, read further if needed; the first line break at or after pos outside quotes, or -1),
    `inside` saying whether pos is inside a quoted value."""
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            if s + len(data) >= size:
                return data, -1
            data += read(s + len(data), min(max(OVERHANG, len(data) // 4), size - s - len(data)))
            continue
        inside ^= data.count(b'"', pos, nl) % 2 == 1
        if not inside:
            return data, nl
        pos = nl + 1


def wrong_starts(splits: list[tuple[int, int, bool]]) -> list[tuple[int, bool]]:
    """(index, true `inside`) of the splits whose start was taken wrongly, from each split's
    (index, quotes in its range, `inside` taken), in input order."""
    wrong, inside = [], False
    for index, quotes, taken in splits:
        if taken != inside:
            wrong.append((index, inside))
        inside ^= quotes % 2 == 1
    return wrong


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
