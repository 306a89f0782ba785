"""Where the Parquet path reads its bytes from (`SpanSource`: the blob reader's `SpanReader`, bytes
in memory, a local file) and the file's footer, read first (`read_footer`): InputDataError naming
what is wrong when the input is not a whole Parquet file."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any, Final, Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from shared.core.errors import InputDataError

MAGIC: Final = b"PAR1"
TAIL_BYTES: Final = 64 * 1024
"""Bytes read from the end first: most footers fit (a larger one costs one GET more)."""
MAX_FOOTER_BYTES: Final = 64 * 1024 * 1024
"""A footer larger than this is refused (bounded memory: thousands of row groups x columns)."""


class SpanSource(Protocol):
    """Random access to the input's bytes: the blob reader's `SpanReader`, or `BytesSpans`."""

    @property
    def size(self) -> int: ...

    def read(self, spans: Sequence[tuple[int, int]]) -> list[tuple[int, Any]]:
        """(offset, bytes) of ranges covering the (offset, length) spans (a buffer-protocol object
        each; adjacent spans may come in one range)."""
        ...

    def give_back(self, ranges: Sequence[tuple[int, Any]]) -> None:
        """What `read` returned is no longer read: its buffers may be reused."""
        ...


class BytesSpans:
    """A `SpanSource` over bytes in memory or a local file (tests, benchmarks, Spark's local mode)."""

    def __init__(self, data: bytes | bytearray | memoryview | str) -> None:
        if isinstance(data, str):
            with open(data, "rb") as fh:
                data = fh.read()
        self.data = memoryview(data)
        self.requests = 0

    @property
    def size(self) -> int:
        return len(self.data)

    def read(self, spans: Sequence[tuple[int, int]]) -> list[tuple[int, Any]]:
        self.requests += 1
        start = min((offset for offset, _ in spans), default=0)
        end = max((offset + length for offset, length in spans), default=0)
        return [(start, self.data[start:end])]

    def give_back(self, ranges: Sequence[tuple[int, Any]]) -> None:
        pass


class StreamSpans:
    """A `SpanSource` over a seekable binary stream (a local file): each span read as asked."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        stream.seek(0, io.SEEK_END)
        self._size = int(stream.tell())

    @property
    def size(self) -> int:
        return self._size

    def read(self, spans: Sequence[tuple[int, int]]) -> list[tuple[int, Any]]:
        out: list[tuple[int, Any]] = []
        for offset, length in sorted(spans):
            self.stream.seek(offset)
            out.append((offset, self.stream.read(length) or b""))
        return out

    def give_back(self, ranges: Sequence[tuple[int, Any]]) -> None:
        pass


def as_source(stream: Any) -> SpanSource:
    """A `SpanSource` as it is, or one over a seekable stream (a local file)."""
    if callable(getattr(stream, "seek", None)):
        return StreamSpans(stream)
    source: SpanSource = stream
    return source


def read_footer(source: SpanSource) -> pq.FileMetaData:
    """The file's metadata from its footer (one read, two when it is larger than TAIL_BYTES);
    InputDataError naming what is wrong when the input is not a whole Parquet file."""
    size = source.size
    if size < 12:
        raise InputDataError(
            f"the input is {size} bytes: too short to be a Parquet file (truncated, or not Parquet)"
        )
    tail_len = min(size, TAIL_BYTES)
    tail = _bytes_at(source, size - tail_len, tail_len)
    if tail[-4:] != MAGIC:
        raise InputDataError(
            "the input does not end with Parquet's magic bytes 'PAR1': it is truncated, or not a Parquet file"
        )
    footer_len = int.from_bytes(tail[-8:-4], "little")
    if footer_len + 12 > size or footer_len > MAX_FOOTER_BYTES:
        raise InputDataError(
            f"the Parquet footer says it is {footer_len} bytes, which does not fit the {size}-byte "
            "input: the file is truncated or corrupt"
        )
    if footer_len + 8 > len(tail):
        tail = _bytes_at(source, size - footer_len - 8, footer_len + 8)
    try:
        return pq.read_metadata(pa.BufferReader(tail[-(footer_len + 8) :]))
    except (OSError, pa.ArrowException) as exc:
        raise InputDataError(f"the Parquet footer cannot be read (the file is corrupt): {exc}") from None


def _bytes_at(source: SpanSource, offset: int, length: int) -> bytes:
    for start, data in source.read([(offset, length)]):
        view = memoryview(data)
        if start <= offset and offset + length <= start + len(view):
            return bytes(view[offset - start : offset - start + length])
    raise InputDataError(
        f"bytes {offset}-{offset + length} of the Parquet input could not be read: truncated"
    )
