"""A read-only file over a blob: `depth` ranged reads in flight ahead of the reader.

`BlobStream` reads through a `Ranges` (the only I/O: `shared.blobio.reader.HttpRanges`, or a test
double). Its guarantees:

- bounded memory: `depth + 1` buffers of `chunk_size` bytes, reused for every GET of the stream
  (plus at most `lend` handed out by `next_chunk`); when it closes they go to a pool the next
  stream takes from (`shared.blobio.buffers`: at most one stream's worth, freed after 60 s idle);
- one version: every read after the first carries the first read's ETag, so a blob replaced
  mid-read fails (`shared.blobio.reader.BlobChanged`, transient) instead of mixing two versions.

Only the standard library and `shared.blobio.buffers`: the Spark job ships these modules as they are,
with `shared/blobio/reader.py`.
"""

from __future__ import annotations

import contextlib
import io
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

from shared.blobio.buffers import BufferPool, pool_for

CHUNK_BYTES: Final = 8 * 1024 * 1024
"""Bytes per ranged GET (bench/bench_read.py: 8 MiB x 6 reads as fast as 16 MiB x 8 on Azurite).
Keep it above 4 MiB: Azurite computes a Content-MD5 of every response of 4 MiB or less, reading
the range twice (~3x its CPU per byte; see docs/performance.md)."""
DEPTH: Final = 6
"""GETs in flight ahead of the reader."""
START_DEPTH: Final = 2
"""GETs in flight when a stream starts (the first among them), more as ranges are taken (one
each, two when handed over by `next_chunk`), up to `depth`. The storage serves GETs in flight side by side: six started at once all
end together, so the first bytes reach the caller only when ~48 MiB have been sent (about
half of it, ~20 ms in, where two start; traced on Azurite, 300 MB: the first 8 MiB range
handed over at 136 ms against 379 ms, the second at 192 against 497, medians of 16 rounds under
a load of 18-25, docs/performance.md). Two in flight keep Azurite's one serving thread busy."""
LEND: Final = 4
"""Buffers a caller of `BlobStream.next_chunk` may hold at once (the engine: blocks being parsed):
memory <= (DEPTH + 1 + LEND) * CHUNK_BYTES."""
FIRST_BYTES: Final = 1024 * 1024
"""Bytes of the first GET (size and ETag) where the ranges cannot announce its headers (a test
double): small, so the parallel GETs start early. `AnnouncingRanges` (the HTTP reader) need not
wait for a body: their first GET is a whole chunk and the GETs ahead start at its headers."""


@dataclass(frozen=True)
class Range:
    """What one GET returned: bytes written, the blob's total size and ETag."""

    length: int
    size: int
    etag: str


@runtime_checkable
class Ranges(Protocol):
    """Ranged reads of one blob (the stream's only I/O): `HttpRanges`, or a test double."""

    @property
    def label(self) -> str: ...

    def get_into(self, view: memoryview, offset: int, etag: str | None) -> Range:
        """Read [offset, offset + len(view)) into `view` (fewer bytes at the end); under `etag`."""
        ...


@runtime_checkable
class AnnouncingRanges(Ranges, Protocol):
    """`Ranges` that can say what a GET returns (its length, the blob's size and ETag) as soon as
    its headers arrive, before its body: the stream's GETs ahead then start without waiting for it."""

    def get_into_announced(
        self, view: memoryview, offset: int, etag: str | None, announce: Callable[[Range], None]
    ) -> Range:
        """`get_into`, calling `announce` once with the answer's Range before the body is read
        (not for an empty blob); a retry after the announcement reads under the announced ETag."""
        ...


class BlobStream(io.RawIOBase):
    """A read-only file over a blob, `depth` ranged GETs in flight ahead of the reader (from
    `START_DEPTH` at its start, one more per range taken).

    The GETs write straight into reused buffers. Two ways to consume them:

    - `readinto` / `read` copy out of them (a file like any other);
    - `next_chunk` hands a filled buffer itself to the caller (no copy) until `give_back`:
      the aggregate engine parses blocks in place. At most `lend` buffers are out at once
      beyond the `depth + 1` the stream reads into; with all of them out, no new GET starts
      until one comes back, so memory stays at `(depth + 1 + lend) * chunk_size`.

    The first GET (in the constructor: size, ETag, InputMissing) is `first_size` bytes, so the
    parallel GETs and the caller start early; with `AnnouncingRanges` it is a whole chunk, and the
    constructor returns at its headers, the GETs ahead started and its body still arriving: no
    round trip of its own before the others, and one GET fewer for a blob of at most a chunk.
    """

    def __init__(
        self,
        ranges: Ranges,
        chunk_size: int = CHUNK_BYTES,
        depth: int = DEPTH,
        *,
        lend: int = LEND,
        first_size: int = FIRST_BYTES,
        pool: BufferPool | None = None,
    ) -> None:
        super().__init__()
        self.ranges, self.label = ranges, ranges.label
        self.chunk_size, self.depth = chunk_size, max(1, depth)
        self._in_flight = min(self.depth, START_DEPTH)  # grows as ranges are taken
        self.max_buffers = self.depth + 1 + max(0, lend)
        self.pool = pool or pool_for(chunk_size, self.max_buffers)
        self._pool = ThreadPoolExecutor(max_workers=self.depth, thread_name_prefix="blob-read")
        self._ahead: deque[tuple[Future[Range], bytearray, int]] = deque()
        self._buffers: list[bytearray] = []  # every buffer this stream owns: at most max_buffers
        self._free: list[bytearray] = []
        self._lent: dict[int, bytearray] = {}  # handed out by next_chunk, by id
        self._held: bytearray | None = None  # the buffer being read from: bytes [_lo, _hi)
        self._lo = self._hi = self._pos = 0
        first = self.pool.take()
        try:
            got = self._first_get(ranges, first, first_size)
        except BaseException:
            self._pool.shutdown(wait=False)
            self.pool.put([first])  # the GET has ended: nothing writes into it any more
            raise
        self.size, self.etag = got.size, got.etag
        self._buffers.append(first)
        self._next_offset = got.length
        self._schedule()

    def _first_get(self, ranges: Ranges, first: bytearray, first_size: int) -> Range:
        """The first GET, from offset 0: what it returns. Announcing ranges read a whole chunk,
        and the stream goes on at its headers (the GET then ahead, writing into `first`)."""
        if not isinstance(ranges, AnnouncingRanges):
            got = ranges.get_into(memoryview(first)[: max(1, min(first_size, self.chunk_size))], 0, None)
            self._held, self._hi = first, got.length
            return got
        heard: Future[Range] = Future()

        def announce(got: Range) -> None:
            if not heard.done():  # a retry announces again (only this GET's thread calls it)
                heard.set_result(got)

        view = memoryview(first)[: self.chunk_size]
        body = self._pool.submit(ranges.get_into_announced, view, 0, None, announce)
        wait((heard, body), return_when=FIRST_COMPLETED)
        if heard.done():
            got = heard.result()
            self._ahead.append((body, first, got.length))
            return got
        got = body.result()  # an error before any header, or an empty blob (nothing announced)
        self._held, self._hi = first, got.length
        return got

    @property
    def buffers_allocated(self) -> int:
        """Buffers allocated so far (bounded by depth + 1 + lend, whatever the blob's size)."""
        return len(self._buffers)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move to `offset`: the read-ahead restarts there (used to count lines on errors).

        Buffers handed out by `next_chunk` are the caller's from then on (not reused).
        """
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        self._pos = min(max(0, base + offset), self.size)
        self._drain()
        self._release()
        if self._lent:
            self._buffers = [b for b in self._buffers if id(b) not in self._lent]
            self._lent.clear()
        self._next_offset = self._pos
        self._schedule()
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if not self._fill():
            return 0
        assert self._held is not None
        n = min(len(view), self._hi - self._lo)
        view[:n] = memoryview(self._held)[self._lo : self._lo + n]
        self._lo += n
        self._pos += n
        return n

    def next_chunk(self) -> tuple[bytearray, int, int] | None:
        """The next bytes of the blob where the GET put them: (buffer, start, end), None at the
        end. The buffer is the caller's until `give_back(buffer)`; no copy is made."""
        if not self._fill():
            return None
        buf, lo, hi = self._held, self._lo, self._hi
        assert buf is not None
        self._held, self._lo, self._hi = None, 0, 0
        self._lent[id(buf)] = buf
        self._pos += hi - lo
        self._in_flight = min(self.depth, self._in_flight + 1)
        self._schedule()
        return buf, lo, hi

    def give_back(self, buf: bytearray) -> None:
        """A buffer from `next_chunk` is no longer read: the next GETs may use it."""
        if self._lent.pop(id(buf), None) is not None and not self.closed:
            self._free.append(buf)
            self._schedule()

    def close(self) -> None:
        """Stop the GETs ahead; the buffers no one reads or writes go to the pool. Not those a
        GET may still be writing into, nor those lent out and not given back."""
        if not self.closed:
            busy = {
                id(buf) for future, buf, _length in self._ahead if not future.cancel() and not future.done()
            }
            self._pool.shutdown(wait=False, cancel_futures=True)
            idle = [b for b in self._buffers if id(b) not in busy and id(b) not in self._lent]
            self._ahead.clear()
            self._buffers, self._free, self._held = [], [], None
            self.pool.put(idle)
        super().close()

    def _fill(self) -> bool:
        """Bytes to read in the held buffer, waiting for the next GET if needed; False at the end."""
        while self._lo >= self._hi and self._ahead:
            future, buf, length = self._ahead.popleft()
            try:
                got = future.result()
            except BaseException:
                self._free.append(buf)
                raise
            self._release()
            self._held, self._lo, self._hi = buf, 0, min(got.length, length)
            self._in_flight = min(self.depth, self._in_flight + 1)
            self._schedule()
        if self._lo >= self._hi and self._next_offset < self.size:
            raise RuntimeError(f"{self.label}: every buffer is lent out (give_back some)")
        return self._lo < self._hi

    def _release(self) -> None:
        """The buffer being read from is done: free for the next GET."""
        if self._held is not None:
            self._free.append(self._held)
        self._held, self._lo, self._hi = None, 0, 0

    def _buffer(self) -> bytearray | None:
        if self._free:
            return self._free.pop()
        if len(self._buffers) >= self.max_buffers:
            return None  # every buffer is being read or lent: wait for one to come back
        buf = self.pool.take()
        self._buffers.append(buf)
        return buf

    def _drain(self) -> None:
        """Wait for the GETs in flight (their buffers are then free again); errors are dropped."""
        while self._ahead:
            future, buf, _length = self._ahead.popleft()
            if not future.cancel():
                with contextlib.suppress(Exception):  # a later read retries that range
                    future.result()
            self._free.append(buf)

    def _schedule(self) -> None:
        while len(self._ahead) < self._in_flight and self._next_offset < self.size:
            buf = self._buffer()
            if buf is None:
                return
            length = min(self.chunk_size, self.size - self._next_offset)
            view = memoryview(buf)[:length]
            future = self._pool.submit(self.ranges.get_into, view, self._next_offset, self.etag)
            self._ahead.append((future, buf, length))
            self._next_offset += length
