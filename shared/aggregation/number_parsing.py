"""Number parsing: strings to float64, naming the first value that is not a number."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


class BadNumber(Exception):
    """A non-null value of a numeric metric's column is not a number (`index` in its array)."""

    def __init__(self, column: str, value: str | None, index: int) -> None:
        self.column, self.value, self.index = column, value, index
        super().__init__(f"column {column!r} has a value that is not a number: {value!r}")

    def message_parts(self) -> tuple[str, str]:
        """The error message around its line number."""
        return f"column {self.column!r} has a value that is not a number on line ", f": {self.value!r}"


def to_float(column: str, values: pa.Array) -> pa.Array:
    """Strings to float64 (surrounding blanks allowed); BadNumber for the first bad value."""
    try:
        return pc.cast(values, pa.float64())
    except pa.ArrowInvalid:
        pass
    trimmed = pc.utf8_trim_whitespace(values)
    try:
        return pc.cast(trimmed, pa.float64())
    except pa.ArrowInvalid:
        index = _first_unparsable(trimmed)
    raise BadNumber(column, values[index].as_py(), index)


def _first_unparsable(values: pa.Array) -> int:
    """Index of the first value that does not cast to float64 (bisection over slices)."""
    lo, hi = 0, len(values)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            pc.cast(values.slice(lo, mid - lo), pa.float64())
            lo = mid
        except pa.ArrowInvalid:
            hi = mid
    return lo
