"""Blocks of whole records cut from a stream: copied into buffers of their own, or cut in place
in the buffers of a stream that hands them over (the blob reader)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, NamedTuple, Protocol

import pyarrow as pa

from shared.aggregation.options import DEFAULT_BLOCK_SIZE, KEPT_BUFFERS, MANY_GROUPS, NARROW_BLOCK_SIZE
from shared.aggregation.spec import ByteStream
from shared.blobio.buffers import pool_for
from shared.core.errors import InputDataError


def line_breaks(data: bytes) -> int:
    """Line breaks in `data`: \\n, \\r\\n or a lone \\r (the CSV record endings) each count one."""
    return data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")


class Block(NamedTuple):
    """Whole records: `buf[start:end]` (also as `data`), at byte `offset` of the input."""

    data: pa.Buffer
    offset: int
    buf: bytearray
    start: int
    end: int


_BLOCK_BUFFERS: Final = pool_for(DEFAULT_BLOCK_SIZE, KEPT_BUFFERS)
"""Block buffers of the default size kept between inputs (fresh memory costs a page fault every
4 KiB, about as much time as parsing those bytes)."""


def _take_buffer(size: int) -> bytearray:
    """A buffer of `size` bytes: a kept one for the default size if there is one."""
    return _BLOCK_BUFFERS.take() if size == DEFAULT_BLOCK_SIZE else bytearray(size)


Cut = Callable[[bytearray, int, int], int]
"""`cut(buf, start, end)`: the offset just after the last record boundary in buf[start:end] (0 if
none); `start` is a record boundary."""
HeadEnd = Callable[[bytearray, int], int]
"""`head_end(buf, end)`: the offset just after the first record in buf[:end] (0 if not there)."""


class Splitter:
    """Cuts a stream into blocks of whole records, in order (`blocks`), after its first record
    (`read_head`), with `cut` (CSV: a line break outside quotes; JSON lines: a line break). `what`
    names a record in the error for one larger than `max_record_bytes`.

    A block handed out stays untouched until its buffer is given back with `release`, so blocks
    can be parsed while the next ones are read; `close` once none is read any more. Made by
    `Splitter.over`: in place over a stream that hands over its own buffers (`InPlaceSplitter`),
    else copied into buffers of the splitter's own (`CopyingSplitter`). Both give the same
    blocks' bytes, offsets and errors.
    """

    def __init__(self, stream: Any, block_size: int, cut: Cut, what: str, max_record_bytes: int) -> None:
        self.stream = stream
        self.cut = cut
        self.what = what
        self.size = max(block_size, 16)
        self.max_record_bytes = max_record_bytes
        self.offset = 0
        """Input offset of the next block."""
        self.header_lines = 1
        """Line breaks in the first record (`read_head`), at least 1."""
        self.whole_buffers = False
        """In place, a buffer of up to WHOLE_BUFFER_BLOCKS block sizes is one block: set where the
        C scanner parses the blocks (the Python path's memory grows with its blocks); the copying
        splitter keeps its block size either way."""
        self.wide: tuple[int, bool] | None = None
        """The block size and `whole_buffers` before `fit` first changed them."""
        self.narrowed = False
        """Blocks are cut narrow (`fit`)."""
        self._open()

    @staticmethod
    def over(stream: ByteStream, block_size: int, cut: Cut, what: str, max_record_bytes: int) -> Splitter:
        """An `InPlaceSplitter` over a stream that hands over its buffers, else a `CopyingSplitter`."""
        if callable(getattr(stream, "next_chunk", None)) and callable(getattr(stream, "give_back", None)):
            return InPlaceSplitter(stream, block_size, cut, what, max_record_bytes)
        return CopyingSplitter(stream, block_size, cut, what, max_record_bytes)

    def _open(self) -> None:
        """The state of one kind of splitter."""

    def read_head(self, head_end: HeadEnd) -> bytes:
        """The first record (the CSV header), b"" if the input is empty; blocks start after it."""
        raise NotImplementedError

    def blocks(self) -> Iterator[Block]:
        """Blocks of whole records, in order."""
        raise NotImplementedError

    def release(self, buf: bytearray) -> None:
        """Give back the buffer of a block that is no longer read."""
        raise NotImplementedError

    def close(self) -> None:
        """No block is read any more."""

    def fit(self, groups: int, block_bytes: int) -> None:
        """Block sizes fitted to the groups a block of `block_bytes` held (in place only: a
        copying splitter keeps its buffers' size): past MANY_GROUPS, blocks of at most
        NARROW_BLOCK_SIZE from the next cut on, never a whole buffer; back to the splitter's own
        sizes once a block of those would hold fewer (`narrow_blocks`)."""

    def start_narrow(self) -> None:
        """Blocks cut narrow from the start, as `fit` cuts them past MANY_GROUPS (a result written as
        data: its groups may be many, and the first blocks are read before any is counted)."""

    def _too_long(self, what: str) -> InputDataError:
        return InputDataError(
            f"{what} at byte {self.offset} is longer than {self.max_record_bytes // 2**20} MiB "
            "(or the input has no line breaks)"
        )


def narrow_blocks(groups: int, block_bytes: int, widest: int, narrowed: bool) -> bool:
    """Whether the blocks after one of `block_bytes` bytes that held `groups` groups are narrow
    (pure): wide ones narrowed past MANY_GROUPS; narrow ones widened again only where a block of
    `widest` bytes would hold no more, at the same groups per byte."""
    if not narrowed:
        return groups > MANY_GROUPS
    return groups * widest > MANY_GROUPS * max(block_bytes, 1)


class CopyingSplitter(Splitter):
    """A `Splitter` that reads the stream into buffers of its own, a block at a time. The first
    blocks are smaller (1/8, 1/4, 1/2 of the block size), so the parsing threads start early."""

    def _open(self) -> None:
        self.taken: list[bytearray] = []
        """Buffers of the block size in use, kept for the next input by `close`."""
        self.free: list[bytearray] = []
        self.buf = self._new_buffer()
        self.target = max(16, self.size // 8)
        """Bytes to read before looking for a cut: doubles up to the buffer's size."""
        self.start = 0
        self.filled = 0
        self.eof = False

    def read_head(self, head_end: HeadEnd) -> bytes:
        while True:
            self._fill(min(len(self.buf), self.target))
            if self.filled == 0:
                return b""
            end = head_end(self.buf, self.filled)
            if end or self.eof:
                break
            if self.filled < len(self.buf):
                self.target = len(self.buf)
            else:
                self._grow("the header line")
        end = end or self.filled
        raw = bytes(self.buf[:end])
        self.header_lines = max(1, line_breaks(raw))
        self.start = self.offset = end
        return raw

    def blocks(self) -> Iterator[Block]:
        while True:
            self._fill(min(len(self.buf), self.start + self.target))
            if self.filled == self.start:
                if self.eof:
                    return
                self._make_room()  # the buffer ended just where the header did: not the end
                continue
            cut = self.filled if self.eof else self.cut(self.buf, self.start, self.filled)
            if cut == 0:
                self._make_room()
                continue
            data = pa.py_buffer(self.buf).slice(self.start, cut - self.start)
            yield Block(data, self.offset, self.buf, self.start, cut)
            self.offset += cut - self.start
            self.target = min(2 * self.target, len(self.buf))
            self._swap(cut)

    def release(self, buf: bytearray) -> None:
        self.free.append(buf)

    def close(self) -> None:
        """Keep the buffers for the next input (once no thread reads them any more)."""
        _BLOCK_BUFFERS.put(self.taken)
        self.taken = []

    def _new_buffer(self) -> bytearray:
        buf = _take_buffer(self.size)
        self.taken.append(buf)
        return buf

    def _fill(self, limit: int) -> None:
        with memoryview(self.buf) as view:
            while self.filled < limit and not self.eof:
                n = readinto(self.stream, view[self.filled : limit])
                if n == 0:
                    self.eof = True
                self.filled += n

    def _swap(self, cut: int) -> None:
        """Carry the partial record after `cut` to a free buffer and switch to it."""
        rest = self.filled - cut
        other = self.free.pop() if self.free else self._new_buffer()
        if len(other) < len(self.buf):
            other = bytearray(len(self.buf))
        other[:rest] = self.buf[cut : self.filled]
        self.buf = other
        self.start, self.filled = 0, rest

    def _make_room(self) -> None:
        """No record boundary in the data: read more, move the data to the front, or grow."""
        if self.filled < len(self.buf) and not self.eof:
            self.target = len(self.buf)
        elif self.start > 0:
            rest = self.filled - self.start
            self.buf[:rest] = self.buf[self.start : self.filled]
            self.start, self.filled = 0, rest
        else:
            self._grow(self.what)

    def _grow(self, what: str) -> None:
        if len(self.buf) >= self.max_record_bytes:
            raise self._too_long(what)
        grown = bytearray(min(2 * len(self.buf), self.max_record_bytes))  # the bound, whatever the block size
        grown[: self.filled] = self.buf[: self.filled]
        self.buf = grown
        self.target = len(grown)


class ChunkStream(Protocol):
    """A stream that hands over its own buffers (the blob reader's `BlobStream`): no copy."""

    def next_chunk(self) -> tuple[bytearray, int, int] | None: ...

    def give_back(self, buf: bytearray) -> None: ...


WHOLE_BUFFER_BLOCKS: Final = 2
"""In place, for the C scanner (`Splitter.whole_buffers`), a buffer of up to this many block sizes
is parsed as one block. Its bytes came from the socket on a reading thread, not from a copy just
made, so a smaller block finds nothing more in the CPU caches and costs one more hand-off between
threads. The blob reader's 8 MiB buffers as one block instead of two of 4 MiB, interleaved rounds
on Azurite: the engine over the reader 0-6% faster with ~4% less CPU at 300 MB and 1 GB, the same
at 30 MB (docs/performance.md). Not for the Python path: its peak memory grows with its blocks
(1 GB of CSV: 299 MB against 253 MB). The copying splitter keeps `block_size` blocks: there 4 MiB
was faster than 6 and 8 (the copy just made is still in the caches)."""
SEAM_BYTES: Final = 64 * 1024
"""Bytes after a record that spans two buffers copied with it (`InPlaceSplitter`), doubled as
needed: the seam block ends at the last record boundary in them."""


class InPlaceSplitter(Splitter):
    """A `Splitter` over a stream that hands over its own buffers (`ChunkStream`): blocks are
    slices of those buffers, parsed where the reader wrote them.

    Each buffer is cut into blocks of about `block_size` at record boundaries, its rest whole
    once under 1.5 block sizes; with `whole_buffers`, a buffer of up to `WHOLE_BUFFER_BLOCKS`
    block sizes (the blob reader's 8 MiB) is one block, ending at its last record boundary. Each
    cut starts where the last ended, so the bytes are looked at once. A buffer goes back to the
    stream once every block cut from it is released.
    Only a record that spans two buffers is copied: the bytes after the last boundary, with
    the next buffer's first `SEAM_BYTES` (more if the record is longer), form a small block of
    their own, cut at its last boundary.
    """

    stream: ChunkStream

    def _open(self) -> None:
        self.refs: dict[int, list[Any]] = {}
        """id(buffer) -> [buffer, blocks not released + 1 while it is being cut]."""
        self.chunk: tuple[bytearray, int, int] | None = None
        """The buffer being cut and its bytes not yet in a block: (buffer, start, end)."""
        self.carry = bytearray()
        """A record begun at the end of the last buffer (a copy)."""

    def read_head(self, head_end: HeadEnd) -> bytes:
        window = bytearray()
        end = 0
        while self._current() is not None:

            def header(data: bytearray) -> int:
                at = head_end(data, len(data))
                return 0 if at == len(data) and data.endswith(b"\r") else at  # \r\n may straddle

            end = self._extend(window, header, "the header line")
            if end:
                break
        if not window:
            return b""
        end = end or len(window)
        raw = bytes(window[:end])
        self.header_lines = max(1, raw.count(b"\n"))
        self.offset = end
        return raw

    def blocks(self) -> Iterator[Block]:
        while True:
            current = self._current()
            if current is None:
                if self.carry:  # the last record, without a line break at the end
                    seam, self.carry = self.carry, bytearray()
                    yield self._block(seam, 0, len(seam))
                return
            if self.carry:
                window, self.carry = self.carry, bytearray()
                cut = 0
                while not cut and self._current() is not None:
                    cut = self._extend(window, lambda data: self.cut(data, 0, len(data)), self.what)
                if cut:
                    del window[cut:]
                    yield self._block(window, 0, cut)
                else:
                    self.carry = window  # the input ends within this record
                continue
            buf, lo, hi = current
            while lo < hi:  # each cut starts where the last ended: every byte is looked at once
                whole = (
                    WHOLE_BUFFER_BLOCKS * self.size if self.whole_buffers else self.size + self.size // 2 - 1
                )
                end = 0
                if hi - lo > whole:  # else the rest is one block
                    end = self.cut(buf, lo, lo + self.size)
                end = end or self.cut(buf, lo, hi)
                if end == 0:
                    break
                self.chunk = (buf, end, hi)
                self.refs[id(buf)][1] += 1
                yield self._block(buf, lo, end)
                lo = end
            if lo < hi:  # a record that ends in a later buffer (or the input's last one)
                self.carry = bytearray(memoryview(buf)[lo:hi])
            self._done(buf)

    def fit(self, groups: int, block_bytes: int) -> None:
        size, whole = self._wide_sizes()
        widest = WHOLE_BUFFER_BLOCKS * size if whole else size
        self._cut_narrow(narrow_blocks(groups, block_bytes, widest, self.narrowed))

    def start_narrow(self) -> None:
        self._cut_narrow(True)

    def _wide_sizes(self) -> tuple[int, bool]:
        if self.wide is None:
            self.wide = (self.size, self.whole_buffers)
        return self.wide

    def _cut_narrow(self, narrow: bool) -> None:
        size, whole = self._wide_sizes()
        self.narrowed = narrow
        self.size, self.whole_buffers = (min(size, NARROW_BLOCK_SIZE), False) if narrow else (size, whole)

    def release(self, buf: bytearray) -> None:
        ref = self.refs.get(id(buf))
        if ref is not None and ref[0] is buf:
            ref[1] -= 1
            if ref[1] == 0:
                del self.refs[id(buf)]
                self.stream.give_back(buf)

    def close(self) -> None:
        self.refs.clear()
        self.chunk = None

    def hand_back(self, blocks: Sequence[Block]) -> bytearray:
        """A copy of `blocks` (the last ones handed out, in order, none released) and of the bytes
        taken from the stream after them; every buffer held goes back to the stream. The splitter
        is done: a new one over `Replay(copy, stream)` cuts them again, then the rest."""
        again = bytearray()
        for block in blocks:
            again += memoryview(block.buf)[block.start : block.end]
        if self.chunk is not None:
            buf, lo, hi = self.chunk
            again += memoryview(buf)[lo:hi]
        again += self.carry
        for buf, _count in list(self.refs.values()):
            self.stream.give_back(buf)
        self.refs.clear()
        self.chunk, self.carry = None, bytearray()
        return again

    def _block(self, buf: bytearray, start: int, end: int) -> Block:
        block = Block(pa.py_buffer(buf).slice(start, end - start), self.offset, buf, start, end)
        self.offset += end - start
        return block

    def _current(self) -> tuple[bytearray, int, int] | None:
        """The buffer being cut, the stream's next one when it is used up; None at the end."""
        while self.chunk is None or self.chunk[1] >= self.chunk[2]:
            if self.chunk is not None:
                self._done(self.chunk[0])
            got = self.stream.next_chunk()
            if got is None:
                return None
            self.chunk = got
            self.refs[id(got[0])] = [got[0], 1]
        return self.chunk

    def _done(self, buf: bytearray) -> None:
        """The buffer is cut: it goes back once its blocks are released."""
        if self.chunk is not None and self.chunk[0] is buf:
            self.chunk = None
        self.release(buf)

    def _extend(self, window: bytearray, find: Callable[[bytearray], int], what: str) -> int:
        """Append the current buffer's next bytes to `window` (at least SEAM_BYTES, doubling) and
        return `find(window)`; the bytes past it stay in the buffer. 0: not found yet."""
        assert self.chunk is not None
        buf, lo, hi = self.chunk
        before = len(window)
        step = min(hi - lo, max(SEAM_BYTES, before))
        with memoryview(buf) as view:
            window += view[lo : lo + step]
        found = find(window)
        if found >= before and found:  # (a boundary within the bytes carried is not one: none is)
            self.chunk = (buf, lo + found - before, hi)
            return found
        self.chunk = (buf, lo + step, hi)
        if len(window) > self.max_record_bytes:
            raise self._too_long(what)
        return 0


class Replay:
    """A `ChunkStream` that hands out `head` (bytes taken from `stream` earlier) first, then
    `stream`'s own buffers: an `InPlaceSplitter` cuts input again without reading it again."""

    def __init__(self, head: bytearray, stream: ChunkStream) -> None:
        self.head: bytearray | None = head
        """Not handed out yet."""
        self.lent: bytearray | None = None
        """Handed out, not given back yet."""
        self.stream = stream

    def next_chunk(self) -> tuple[bytearray, int, int] | None:
        if self.head is not None:
            self.lent, self.head = self.head, None
            return self.lent, 0, len(self.lent)
        return self.stream.next_chunk()

    def give_back(self, buf: bytearray) -> None:
        if buf is self.lent:  # this object's own copy: freed
            self.lent = None
        else:
            self.stream.give_back(buf)


def readinto(stream: ByteStream, view: memoryview) -> int:
    """Bytes read from `stream` into `view` (its `readinto` when it has one): 0 at the end."""
    method = getattr(stream, "readinto", None)
    if method is not None:
        n = method(view)
        return int(n or 0)
    data = stream.read(len(view)) or b""
    view[: len(data)] = data
    return len(data)
