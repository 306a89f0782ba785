"""Byte spans of one blob, read by concurrent ranged GETs: what a Parquet reader asks for (the
footer, then only the needed column chunks of each row group).

`SpanReader` reads through a `Ranges` (`shared.blobio.reader.HttpRanges`, or a test double), as
`BlobStream` does:

- one version: the first GET (`first_size` bytes at offset 0: the blob's size and ETag) is the
  only one without If-Match (unless an `etag` is given: a Spark task reads the driver's
  version); every later one carries its ETag, so a blob replaced mid-read fails (`BlobChanged`,
  transient) instead of mixing two versions;
- spans closer than `gap` bytes are fetched as one range (one GET instead of several small ones:
  Azurite checksums every response of 4 MiB or less, ~3x its CPU per byte), and a range is cut
  into GETs of at most `piece` bytes, `depth` of them in flight at once;
- each range comes back in one buffer, its GETs written straight into it; buffers handed back
  (`give_back`) are reused by later reads.

Only the standard library and `shared.blobio.stream`: the Spark job ships it as it is.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from shared.blobio.stream import CHUNK_BYTES, DEPTH, Range, Ranges

GAP_BYTES: Final = 4 * 1024 * 1024
"""Spans at most this far apart are read as one range (the bytes between them read and dropped).
Measured on a 1 GB Parquet blob on Azurite (4 of 13 columns, 3 ranges a row group), side by side:
5 MiB gave 0.65-0.96 s where 1 MiB gave 0.85-1.19 s (a smaller range costs Azurite a checksum)."""
KEPT: Final = 8
"""Buffers kept for the next reads: a row group's ranges are read into the buffers of one before."""
ROUND: Final = 1024 * 1024
"""New buffers are a whole number of MiB, so that later ranges of about the same size fit them."""
FIRST_BYTES: Final = 64 * 1024
"""Bytes of the first GET (size and ETag; the whole of a small blob)."""


class SpanReader:
    """Spans of one blob's bytes, read in parallel; `read` may be called from several threads."""

    def __init__(
        self,
        ranges: Ranges,
        *,
        depth: int = DEPTH,
        piece: int = CHUNK_BYTES,
        gap: int = GAP_BYTES,
        first_size: int = FIRST_BYTES,
        etag: str | None = None,
    ) -> None:
        self.ranges, self.label = ranges, ranges.label
        self.piece, self.gap = max(1, piece), max(0, gap)
        self.head = bytearray(max(1, first_size))
        got = ranges.get_into(memoryview(self.head), 0, etag)
        self.head = self.head[: got.length]
        self.size, self.etag = got.size, got.etag
        self.requests = 1
        """GETs made so far (the first one included)."""
        self._free: list[bytearray] = []
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(1, depth), thread_name_prefix="blob-spans")

    def read(self, spans: Sequence[tuple[int, int]]) -> list[tuple[int, memoryview]]:
        """(offset, bytes) of ranges covering the (offset, length) spans (those less than `gap`
        apart read as one), in offset order; nothing past the blob's end."""
        wanted = [(max(0, offset), min(length, self.size - offset)) for offset, length in spans]
        merged = coalesce([w for w in wanted if w[1] > 0], self.gap)
        return [(start, self._fetch(start, end)) for start, end in merged]

    @property
    def kept(self) -> int:
        """Buffers given back and not yet reused."""
        return len(self._free)

    def give_back(self, ranges: Sequence[tuple[int, Any]]) -> None:
        """Buffers from `read` no longer read by anyone: the next reads may write into them
        (fresh memory is faulted in 4 KiB at a time: reused, it is not)."""
        with self._lock:
            for _offset, view in ranges:
                buf = view.obj if isinstance(view, memoryview) else view
                if isinstance(buf, bytearray) and buf is not self.head and len(self._free) < KEPT:
                    self._free.append(buf)

    def _buffer(self, size: int) -> bytearray:
        with self._lock:
            fits = [b for b in self._free if len(b) >= size]
            if fits:
                buf = min(fits, key=len)
                self._free.remove(buf)
                return buf
        return bytearray(-(-size // ROUND) * ROUND)

    def _fetch(self, start: int, end: int) -> memoryview:
        if end <= len(self.head) and start < end:
            return memoryview(self.head)[start:end]
        view = memoryview(self._buffer(end - start))[: end - start]
        count = -(-(end - start) // self.piece)  # GETs of equal size: none much smaller than the rest
        step = -(-(end - start) // count)
        futures = [
            self._pool.submit(
                self.ranges.get_into, view[pos - start : min(end, pos + step) - start], pos, self.etag
            )
            for pos in range(start, end, step)
        ]
        with self._lock:  # read() may be called from several threads at once
            self.requests += len(futures)
        for future in futures:
            got: Range = future.result()
            if got.size != self.size:  # pragma: no cover - the ETag makes this a 412 first
                raise RuntimeError(f"{self.label}: its size changed while it was read")
        return view

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> SpanReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def coalesce(spans: Sequence[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """(start, end) ranges covering the (offset, length) spans, those less than `gap` apart merged."""
    merged: list[tuple[int, int]] = []
    for offset, length in sorted(spans):
        if merged and offset - merged[-1][1] <= gap:
            merged[-1] = (merged[-1][0], max(merged[-1][1], offset + length))
        else:
            merged.append((offset, offset + length))
    return merged
