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
- each range comes back in one buffer, its GETs written straight into it.

Only the standard library and `shared.blobio.stream`: the Spark job ships it as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final

from shared.blobio.stream import CHUNK_BYTES, DEPTH, Range, Ranges

GAP_BYTES: Final = 1024 * 1024
"""Spans at most this far apart are read as one range (the bytes between them read and dropped)."""
FIRST_BYTES: Final = 64 * 1024
"""Bytes of the first GET (size and ETag; the whole of a small blob)."""


class SpanReader:
    """Spans of one blob's bytes, read in parallel; thread-safe for one caller at a time per call."""

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
        del self.head[got.length :]
        self.size, self.etag = got.size, got.etag
        self.requests = 1
        """GETs made so far (the first one included)."""
        self._pool = ThreadPoolExecutor(max_workers=max(1, depth), thread_name_prefix="blob-spans")

    def read(self, spans: Sequence[tuple[int, int]]) -> list[tuple[int, bytearray]]:
        """(offset, bytes) of ranges covering the (offset, length) spans (those less than `gap`
        apart read as one), in offset order; nothing past the blob's end."""
        wanted = [(max(0, offset), min(length, self.size - offset)) for offset, length in spans]
        merged = coalesce([w for w in wanted if w[1] > 0], self.gap)
        return [(start, self._fetch(start, end)) for start, end in merged]

    def _fetch(self, start: int, end: int) -> bytearray:
        if end <= len(self.head) and start < end:
            return self.head[start:end]
        buf = bytearray(end - start)
        view = memoryview(buf)
        futures = [
            self._pool.submit(
                self.ranges.get_into, view[pos - start : min(end, pos + self.piece) - start], pos, self.etag
            )
            for pos in range(start, end, self.piece)
        ]
        self.requests += len(futures)
        for future in futures:
            got: Range = future.result()
            if got.size != self.size:  # pragma: no cover - the ETag makes this a 412 first
                raise RuntimeError(f"{self.label}: its size changed while it was read")
        return buf

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
