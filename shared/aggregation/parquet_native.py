"""A Parquet row group keyed by one dictionary-encoded string column, its metrics over flat number
columns, decoded and folded by the C scanner (`native/src/pq.c`) page by page: no Arrow array is
built. Its answer is the partial table `dict_keys` gives for the same rows.

Only the shapes it knows are taken (`native_plan`); a row group it cannot decode (another
encoding or codec, a key page that fell back to PLAIN, a NaN, anything malformed) answers None
and pyarrow decodes it, which decides, and names what is wrong with a corrupt file.

A column chunk's page headers (Thrift compact structs) are read in C at once (`pq_pages`), its
pages' bytes decompressed by Arrow's codecs, their levels, indices and values read in C.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shared.aggregation.dict_keys import WANT, groupable, partial_table
from shared.aggregation.native import kernel
from shared.aggregation.plan import Plan

DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 2, 3
PLAIN, PLAIN_DICTIONARY, RLE, RLE_DICTIONARY = 0, 2, 3, 8
CODECS: Final = {
    "UNCOMPRESSED": None,
    "SNAPPY": "snappy",
    "GZIP": "gzip",
    "ZSTD": "zstd",
    "BROTLI": "brotli",
}
"""Column chunk codecs taken (the name pyarrow's metadata gives: Arrow's codec); others go to
pyarrow, LZ4 too (the metadata names Hadoop's framing and the raw one alike)."""
PHYSICAL: Final = {"DOUBLE": (0, "<f8"), "FLOAT": (1, "<f4"), "INT32": (2, "<i4"), "INT64": (3, "<i8")}
NARROW: Final = {8: (4, "<i1"), 16: (5, "<i2")}
"""int8 / int16 columns (stored as INT32): the scanner's code and the type pyarrow narrows to (the
low bits of an out-of-range value, as pyarrow keeps them)."""
SLOT = np.dtype([("count", "<i8"), ("sum", "<f8"), ("min", "<f8"), ("max", "<f8")])


class Malformed(Exception):
    """A page this module cannot read: the row group goes to pyarrow."""


@dataclass(frozen=True)
class Column:
    index: int
    """The leaf column's index in the row group."""
    max_def: int
    physical: str
    code: int = -1
    """The scanner's value type (`pq.c`'s phys): PHYSICAL's, or NARROW's."""
    narrow: str | None = None
    """The numpy type an INT32's value is narrowed to (int8, int16)."""


@dataclass(frozen=True)
class NativePlan:
    key: Column
    values: tuple[tuple[Column, int], ...]
    """Each value column (v0, v1, ...) and the figures wanted of it (WANT's bits)."""


def native_plan(
    metadata: pq.FileMetaData, schema: pa.Schema, leaves: dict[str, list[int]], plan: Plan
) -> NativePlan | None:
    """The row groups' decode by the scanner, where the plan and the file are of its shape."""
    if kernel is None or not hasattr(kernel, "pq_fold_page") or len(plan.keys) != 1 or not plan.values:
        return None
    key_name = plan.keys[0]
    key_type = schema.field(key_name).type
    if not any(
        test(key_type)
        for test in (
            pa.types.is_string,
            pa.types.is_binary,
            pa.types.is_large_string,
            pa.types.is_large_binary,
        )
    ):  # large: as Polars writes its strings (the same BYTE_ARRAY pages)
        return None
    key = _column(metadata, leaves[key_name], "BYTE_ARRAY")
    if key is None:
        return None
    values: list[tuple[Column, int]] = []
    for i, name in enumerate(plan.values):
        kind = schema.field(name).type
        if name not in plan.numeric or not (pa.types.is_floating(kind) or pa.types.is_signed_integer(kind)):
            return None
        if pa.types.is_float16(kind):
            return None
        column = _column(metadata, leaves[name], None)
        if column is None or column.physical not in PHYSICAL:
            return None
        code, narrow = PHYSICAL[column.physical][0], None
        if pa.types.is_integer(kind) and kind.bit_width in NARROW:
            if column.physical != "INT32":
                return None
            code, narrow = NARROW[kind.bit_width]
        column = Column(column.index, column.max_def, column.physical, code, narrow)
        want = sum(WANT.get(func, 0) for part, func, _ in plan.partial if part == f"v{i}")
        values.append((column, want))
    return NativePlan(key, tuple(values))


def _column(metadata: pq.FileMetaData, leaves: list[int], physical: str | None) -> Column | None:
    if len(leaves) != 1:
        return None
    described = metadata.schema.column(leaves[0])
    if described.max_repetition_level != 0 or described.max_definition_level > 1:
        return None
    if physical is not None and described.physical_type != physical:
        return None
    return Column(leaves[0], described.max_definition_level, described.physical_type)


def native_partial(
    chunks: Sequence[tuple[int, Any]], metadata: pq.FileMetaData, index: int, plan: Plan, native: NativePlan
) -> pa.Table | None:
    """The row group's partial aggregates, or None where pyarrow must decode it."""
    group = metadata.row_group(index)
    rows = group.num_rows
    for column in (native.key, *(value for value, _ in native.values)):
        if group.column(column.index).physical_type != column.physical:
            return None  # the footer's type is not the schema's: pyarrow refuses the file
    try:
        ids = _ids(rows)
        dictionary, count_all = _key(chunks, group.column(native.key.index), native.key, ids, rows)
        if not groupable(dictionary):
            return None
        dictionary = pc.cast(dictionary, pa.string())  # not UTF-8: pyarrow's path names it
        folded: list[tuple[bytes, ...]] = []
        for column, want in native.values:
            slots = _fold(chunks, group.column(column.index), column, want, ids, rows, len(dictionary) + 1)
            if slots is None:
                return None
            folded.append(
                (
                    slots["count"].tobytes(),
                    slots["sum"].tobytes(),
                    slots["min"].tobytes(),
                    slots["max"].tobytes(),
                )
            )
    except (Malformed, pa.ArrowException, ValueError, OSError):  # pyarrow then says what is wrong
        return None
    return partial_table(plan, dictionary, (count_all.tobytes(), tuple(folded)))


_HELD = threading.local()


def _ids(rows: int) -> np.ndarray:
    """A group id a row, in this thread's buffer (reused: fresh pages cost a fault and a clear each)."""
    held: np.ndarray | None = getattr(_HELD, "ids", None)
    if held is None or len(held) < rows:
        held = np.empty(rows, dtype=np.int32)
        _HELD.ids = held
    return held[:rows]


def _key(
    chunks: Sequence[tuple[int, Any]], meta: Any, column: Column, ids: np.ndarray, rows: int
) -> tuple[pa.Array, np.ndarray]:
    dictionary: pa.Array | None = None
    count_all: np.ndarray | None = None
    row = 0
    for kind, count, encoding, levels, data in _pages(chunks, meta, column):
        if kind == DICTIONARY_PAGE:
            if dictionary is not None:
                raise Malformed("two dictionary pages")
            parts = kernel.pq_byte_arrays(data, count)
            if parts is None:
                raise Malformed("a dictionary page's byte arrays")
            offsets, values = parts
            dictionary = pa.Array.from_buffers(
                pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(values)]
            )
            count_all = np.zeros(len(dictionary) + 1, dtype=np.int64)
            continue
        if dictionary is None or count_all is None or encoding not in (PLAIN_DICTIONARY, RLE_DICTIONARY):
            raise Malformed("a key page not dictionary-encoded")
        if (
            row + count > rows
            or kernel.pq_key_page(levels, data, count, len(dictionary), ids, row, count_all) < 0
        ):
            raise Malformed("a key page")
        row += count
    if dictionary is None or count_all is None or row != rows:
        raise Malformed("the key column's rows")
    return dictionary, count_all


def _fold(
    chunks: Sequence[tuple[int, Any]],
    meta: Any,
    column: Column,
    want: int,
    ids: np.ndarray,
    rows: int,
    groups: int,
) -> np.ndarray | None:
    slots = np.zeros(groups, dtype=SLOT)
    slots["min"], slots["max"] = np.inf, -np.inf
    dtype = PHYSICAL[column.physical][1]
    dictionary: np.ndarray | None = None
    row = 0
    for kind, count, encoding, levels, data in _pages(chunks, meta, column):
        if kind == DICTIONARY_PAGE:
            size = np.dtype(dtype).itemsize
            if dictionary is not None:
                raise Malformed("two dictionary pages")
            if count < 0 or len(data) < count * size:
                raise Malformed("a dictionary page's values")
            stored = np.frombuffer(data, dtype=dtype, count=count)
            if column.narrow is not None:
                stored = stored.astype(column.narrow)  # C's narrowing: the low bits
            dictionary = stored.astype(np.float64)
            continue
        coded = 1 if encoding in (PLAIN_DICTIONARY, RLE_DICTIONARY) else 0 if encoding == PLAIN else -1
        if coded < 0 or (coded == 1 and dictionary is None) or row + count > rows:
            raise Malformed("a value page")
        done = kernel.pq_fold_page(
            levels,
            data,
            count,
            coded,
            column.code,
            dictionary if coded else None,
            ids,
            row,
            slots.view(np.uint8),
            want,
        )
        if done < 0:
            raise Malformed("a value page")
        if done == 0:
            return None  # a NaN: Arrow decides
        row += count
    if row != rows:
        raise Malformed("a value column's rows")
    return slots


def _pages(
    chunks: Sequence[tuple[int, Any]], meta: Any, column: Column
) -> Iterator[tuple[int, int, int, Any, Any]]:
    """(page type, num_values, encoding, definition levels or None, values' bytes) of
    each page of a column chunk, decompressed (index pages skipped)."""
    if meta.compression not in CODECS:
        raise Malformed(f"codec {meta.compression}")
    name = CODECS[meta.compression]
    codec = pa.Codec(name) if name is not None else None
    start = meta.data_page_offset
    if (
        meta.has_dictionary_page
        and meta.dictionary_page_offset is not None
        and 0 < meta.dictionary_page_offset < start
    ):
        start = meta.dictionary_page_offset
    chunk = _span(chunks, start, meta.total_compressed_size)
    pages = kernel.pq_pages(chunk, meta.num_values)
    if pages is None:
        raise Malformed("a page header")
    for kind, at, compressed, size, count, encoding, def_encoding, _nulls, def_len, rep_len, packed in pages:
        payload = chunk[at : at + compressed]
        if kind == DICTIONARY_PAGE:
            if encoding not in (PLAIN, PLAIN_DICTIONARY):
                raise Malformed(f"a dictionary page of encoding {encoding}")
            yield kind, count, encoding, None, _decompress(codec, payload, size)
        elif kind == DATA_PAGE:
            data = _decompress(codec, payload, size)
            levels = None
            if column.max_def:
                if def_encoding != RLE or len(data) < 4:
                    raise Malformed("definition levels not RLE")
                length = int.from_bytes(bytes(data[:4]), "little")
                if 4 + length > len(data):
                    raise Malformed("definition levels past the page")
                levels, data = data[4 : 4 + length], data[4 + length :]
            yield kind, count, encoding, levels, data
        elif kind == DATA_PAGE_V2:
            if rep_len or (def_len and not column.max_def) or (column.max_def and not def_len):
                raise Malformed("levels of a v2 page")
            levels = payload[:def_len] if column.max_def else None  # whatever num_nulls says
            data = _decompress(codec if packed else None, payload[def_len:], size - def_len)
            yield kind, count, encoding, levels, data


def _span(chunks: Sequence[tuple[int, Any]], start: int, length: int) -> memoryview:
    for offset, data in chunks:
        view = memoryview(data)
        if offset <= start and start + length <= offset + len(view):
            return view[start - offset : start - offset + length]
    raise Malformed("a column chunk not read")


def _decompress(codec: pa.Codec | None, payload: memoryview, size: int) -> Any:
    """A page's bytes, `size` of them, or Malformed when its data holds another size (Arrow's
    `Codec.decompress` answers a buffer of the size asked whatever the data holds: snappy's
    preamble, or a stream read one byte past the size, says)."""
    if codec is None:
        if len(payload) != size:
            raise Malformed("an uncompressed page's size")
        return payload
    name = codec.name
    if name == "snappy" and _snappy_length(payload) != size:
        raise Malformed("a snappy page's size")
    if name in ("gzip", "brotli"):
        with pa.CompressedInputStream(pa.BufferReader(payload), name) as stream:
            data = stream.read(size + 1)
        if len(data) != size:
            raise Malformed("a page's decompressed size")
        return data
    out = codec.decompress(payload, decompressed_size=size, asbytes=False)
    if out.size != size:
        raise Malformed("a page's decompressed size")
    return out


def _snappy_length(payload: memoryview) -> int:
    """The uncompressed length a snappy block starts with (a varint of at most 5 bytes); -1 if none."""
    value = 0
    for i, byte in enumerate(payload[:5]):
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            return value
    return -1
