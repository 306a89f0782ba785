"""Parquet files taken apart and put back together, for tests and the fuzz: the footer and every
page header read as Thrift compact structs (field id -> (type, value)), changed at will, and the
file written again with its offsets and sizes recomputed (`Crafted.build`), so a test can build
exactly the malformed file it is about: a page header field set out of range, a page dropped or
doubled, a footer value changed.

Only what the tests need of the compact protocol: every type read and written back as it was.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

BOOL_TRUE, BOOL_FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(1, 13)

Struct = dict[int, tuple[int, Any]]
"""A Thrift struct: field id -> (compact type, value); a list is (element type, [values])."""


class _Reader:
    def __init__(self, data: bytes, at: int = 0) -> None:
        self.data, self.at = data, at

    def byte(self) -> int:
        value = self.data[self.at]
        self.at += 1
        return value

    def varint(self) -> int:
        shift = value = 0
        while True:
            b = self.byte()
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value

    def zigzag(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def value(self, kind: int) -> Any:
        if kind in (BOOL_TRUE, BOOL_FALSE):  # in a list: a byte
            return self.byte() == 1
        if kind == BYTE:
            return self.byte()
        if kind in (I16, I32, I64):
            return self.zigzag()
        if kind == DOUBLE:
            (out,) = struct.unpack("<d", self.data[self.at : self.at + 8])
            self.at += 8
            return out
        if kind == BINARY:
            n = self.varint()
            out = self.data[self.at : self.at + n]
            self.at += n
            return bytes(out)
        if kind in (LIST, SET):
            head = self.byte()
            size = head >> 4
            if size == 15:
                size = self.varint()
            element = head & 0x0F
            return (element, [self.value(element) for _ in range(size)])
        if kind == STRUCT:
            return self.struct()
        raise ValueError(f"Thrift type {kind} not handled")

    def struct(self) -> Struct:
        out: Struct = {}
        last = 0
        while True:
            b = self.byte()
            if b == 0:
                return out
            kind = b & 0x0F
            fid = last + (b >> 4) if b >> 4 else self.zigzag()
            last = fid
            if kind in (BOOL_TRUE, BOOL_FALSE):
                out[fid] = (kind, kind == BOOL_TRUE)
            else:
                out[fid] = (kind, self.value(kind))


def read_struct(data: bytes, at: int = 0) -> tuple[Struct, int]:
    """The struct at `at` and where it ends."""
    reader = _Reader(data, at)
    return reader.struct(), reader.at


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _zigzag(value: int) -> bytes:
    return _varint((value << 1) ^ (value >> 63))


def _value(kind: int, value: Any) -> bytes:
    if kind in (BOOL_TRUE, BOOL_FALSE):
        return bytes([1 if value else 2])
    if kind == BYTE:
        return bytes([value & 0xFF])
    if kind in (I16, I32, I64):
        return _zigzag(value)
    if kind == DOUBLE:
        return struct.pack("<d", value)
    if kind == BINARY:
        return _varint(len(value)) + bytes(value)
    if kind in (LIST, SET):
        element, items = value
        head = (
            bytes([(len(items) << 4) | element])
            if len(items) < 15
            else bytes([0xF0 | element]) + _varint(len(items))
        )
        return head + b"".join(_value(element, item) for item in items)
    if kind == STRUCT:
        return write_struct(value)
    raise ValueError(f"Thrift type {kind} not handled")


def write_struct(fields: Struct) -> bytes:
    out = bytearray()
    last = 0
    for fid in sorted(fields):
        kind, value = fields[fid]
        if kind in (BOOL_TRUE, BOOL_FALSE):
            kind = BOOL_TRUE if value else BOOL_FALSE
        if 0 < fid - last <= 15:
            out.append(((fid - last) << 4) | kind)
        else:
            out.append(kind)
            out += _zigzag(fid)
        last = fid
        if kind not in (BOOL_TRUE, BOOL_FALSE):
            out += _value(kind, value)
    out.append(0)
    return bytes(out)


# PageHeader: 1 type, 2 uncompressed size, 3 compressed size, 5 data page, 7 dictionary page, 8 v2
DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 2, 3
HEADER_OF = {DATA_PAGE: 5, DICTIONARY_PAGE: 7, DATA_PAGE_V2: 8}


@dataclass
class Page:
    header: Struct
    body: bytes

    @property
    def kind(self) -> int:
        return int(self.header[1][1])

    @property
    def sub(self) -> Struct:
        """The page type's own header (DataPageHeader, DictionaryPageHeader, DataPageHeaderV2)."""
        sub: Struct = self.header[HEADER_OF[self.kind]][1]
        return sub

    def bytes(self) -> bytes:
        return write_struct(self.header) + self.body


@dataclass
class Crafted:
    """A Parquet file as its footer and its column chunks' pages."""

    footer: Struct
    chunks: list[list[list[Page]]] = field(default_factory=list)
    """Pages of each row group's column chunks."""

    @classmethod
    def of(cls, data: bytes) -> Crafted:
        length = int.from_bytes(data[-8:-4], "little")
        footer, _ = read_struct(data, len(data) - 8 - length)
        out = cls(footer)
        for group in footer[4][1][1]:
            columns: list[list[Page]] = []
            for chunk in group[1][1][1]:
                meta = chunk[3][1]
                start = meta[9][1]
                if 11 in meta and 0 < meta[11][1] < start:
                    start = meta[11][1]
                end = start + meta[7][1]
                pages: list[Page] = []
                at = start
                while at < end:
                    header, body_at = read_struct(data, at)
                    size = header[3][1]
                    pages.append(Page(header, data[body_at : body_at + size]))
                    at = body_at + size
                columns.append(pages)
            out.chunks.append(columns)
        return out

    def meta(self, group: int, column: int) -> Struct:
        """The ColumnMetaData of a column chunk (changes are written as they are by `build`)."""
        meta: Struct = self.footer[4][1][1][group][1][1][1][column][3][1]
        return meta

    def row_group(self, group: int) -> Struct:
        found: Struct = self.footer[4][1][1][group]
        return found

    def build(self, keep_sizes: bool = False) -> bytes:
        """The file again: offsets recomputed (and chunk sizes, unless `keep_sizes`)."""
        out = bytearray(b"PAR1")
        for g, columns in enumerate(self.chunks):
            for c, pages in enumerate(columns):
                meta = self.meta(g, c)
                start = len(out)
                chunk = self.footer[4][1][1][g][1][1][1][c]
                chunk[2] = (I64, start)
                if pages and pages[0].kind == DICTIONARY_PAGE:
                    meta[11] = (I64, start)
                    meta[9] = (I64, start + len(pages[0].bytes()))
                else:
                    meta.pop(11, None)
                    meta[9] = (I64, start)
                for page in pages:
                    out += page.bytes()
                if not keep_sizes:
                    meta[7] = (I64, len(out) - start)
        footer = write_struct(self.footer)
        return bytes(out) + footer + len(footer).to_bytes(4, "little") + b"PAR1"


def written(table: pa.Table, **options: Any) -> bytes:
    """`table` as pyarrow writes it with `options` (no page index: the tests rebuild offsets)."""
    sink = io.BytesIO()
    pq.write_table(table, sink, **options)
    return sink.getvalue()


def pyarrow_reads(data: bytes) -> pa.Table | str:
    """pyarrow's `read_table` of the file, or its error's text."""
    try:
        return pq.read_table(io.BytesIO(data))
    except (OSError, pa.ArrowException) as exc:
        return f"error: {exc}"
