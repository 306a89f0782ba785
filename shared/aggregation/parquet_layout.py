"""Which column chunks a plan needs of a Parquet file (`ParquetLayout`), and the plan's columns
checked against the file's schema by name and type before any row is read (`check_columns`)."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from shared.aggregation.plan import Plan
from shared.core.errors import InputDataError

DELTA_TEXT = frozenset({"DELTA_BYTE_ARRAY", "DELTA_LENGTH_BYTE_ARRAY"})


@dataclass(frozen=True)
class ParquetLayout:
    """Which leaf columns (column chunks) each needed top-level column is stored in."""

    metadata: pq.FileMetaData
    schema: pa.Schema
    leaves: dict[str, list[int]]
    size: int
    """The file's size: a column chunk must lie inside it (pyarrow's bound: a chunk's last
    bytes may run into the footer)."""
    keys: tuple[str, ...]

    @classmethod
    def of(cls, metadata: pq.FileMetaData, plan: Plan, size: int) -> ParquetLayout:
        try:
            schema = metadata.schema.to_arrow_schema()
        except (OSError, pa.ArrowException) as exc:
            raise InputDataError(f"the Parquet schema cannot be read: {exc}") from None
        check_columns(schema, plan)
        leaves: dict[str, list[int]] = {}
        first = 0
        for field in schema:
            count = _leaf_count(field.type)
            if field.name in plan.columns:
                leaves[field.name] = list(range(first, first + count))
            first += count
        if first != metadata.num_columns:
            raise InputDataError("the Parquet schema does not match its column chunks: the file is corrupt")
        return cls(metadata, schema, leaves, size, plan.keys)

    def dictionary_keys_of(self, row_group: int) -> list[str]:
        """Group columns of strings or bytes read dictionary-encoded (grouped by index, ~2x
        faster): those of the row group whose pages pyarrow can read so (not DELTA_BYTE_ARRAY or
        DELTA_LENGTH_BYTE_ARRAY, which it decodes to plain strings only)."""
        group = self.metadata.row_group(row_group)
        out: list[str] = []
        for name in self.leaves:
            kind = self.schema.field(name).type
            if name not in self.keys or not (pa.types.is_string(kind) or pa.types.is_binary(kind)):
                continue
            encodings = {e for i in self.leaves[name] for e in group.column(i).encodings}
            if not encodings & DELTA_TEXT:
                out.append(name)
        return out

    def holds(self, row_group: int, rows: int) -> bool:
        """Whether every flat column chunk of the row group says it holds `rows` values: where the
        footer's num_rows says otherwise, pyarrow's read_table reads what the columns hold; where
        a column says otherwise (its pages short of its values), it refuses the file."""
        group = self.metadata.row_group(row_group)
        schema = self.metadata.schema
        return all(
            group.column(i).num_values == rows
            for i in range(group.num_columns)
            if schema.column(i).max_repetition_level == 0
        )

    def needed(self, row_group: int) -> bool:
        """False for a row group of no rows whose needed column chunks hold no values (pyarrow
        reads nothing of them; their offsets may be 0): skipped."""
        group = self.metadata.row_group(row_group)
        if group.num_rows:
            return True
        return any(group.column(i).num_values for indices in self.leaves.values() for i in indices)

    def spans(self, row_group: int) -> list[tuple[int, int]]:
        """(offset, length) of each needed column chunk of a row group; InputDataError if one lies
        outside the file's data (a truncated or corrupt file)."""
        group = self.metadata.row_group(row_group)
        end = self.size
        out: list[tuple[int, int]] = []
        for name, indices in self.leaves.items():
            for index in indices:
                chunk = group.column(index)
                start = chunk.data_page_offset
                dictionary = chunk.dictionary_page_offset
                if chunk.has_dictionary_page and dictionary is not None and 0 < dictionary < start:
                    start = dictionary
                length = chunk.total_compressed_size
                if start < 4 or length <= 0 or start + length > end:
                    raise InputDataError(
                        f"row group {row_group} of the Parquet input: the data of column {name!r} lies "
                        "outside the file's data (the file is truncated or corrupt)"
                    )
                out.append((start, length))
        return out


def _leaf_count(kind: pa.DataType) -> int:
    if pa.types.is_struct(kind):
        return sum(_leaf_count(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_map(kind):
        return _leaf_count(kind.key_type) + _leaf_count(kind.item_type)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _leaf_count(kind.value_type)
    return 1


def _is_key_type(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        return _is_key_type(kind.value_type)
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
        or pa.types.is_integer(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_decimal(kind)
        or pa.types.is_date(kind)
        or pa.types.is_timestamp(kind)
    )


def _is_number_type(kind: pa.DataType) -> bool:
    if pa.types.is_dictionary(kind):
        return _is_number_type(kind.value_type)
    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind))


def check_columns(schema: pa.Schema, plan: Plan) -> None:
    """InputDataError naming the first column the plan cannot use: missing, a group column of a
    nested type, or a numeric metric's column that is not a number column."""
    names = schema.names
    missing = [c for c in plan.columns if c not in names]
    if missing:
        shown = ", ".join(names[:30]) + (", ..." if len(names) > 30 else "")
        listed = ", ".join(repr(c) for c in missing)
        raise InputDataError(f"column(s) {listed} not in the Parquet schema; the schema has: {shown}")
    doubled = [c for c in plan.columns if names.count(c) > 1]
    if doubled:
        raise InputDataError(f"column {doubled[0]!r} appears more than once in the Parquet schema")
    for name in plan.keys:
        kind = schema.field(name).type
        if not _is_key_type(kind):
            raise InputDataError(
                f"group column {name!r} is of Parquet type {kind}: a group column must be a string, "
                "number, boolean, date or timestamp column"
            )
    for name in sorted(plan.numeric):
        kind = schema.field(name).type
        if not _is_number_type(kind):
            raise InputDataError(
                f"column {name!r} is of Parquet type {kind}, not a number: sum, mean, min and max "
                "need an integer, float or decimal column"
            )
