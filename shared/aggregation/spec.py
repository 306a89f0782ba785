"""What an aggregate job asks for (`AggregateSpec`), what it gives (`AggregateResult`), and the
input the engine reads (`ByteStream`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from shared.aggregation.output import JSON_OUTPUT, OutputSpec
from shared.core.errors import LimitExceeded

Op = Literal["count", "sum", "mean", "min", "max"]
Format = Literal["csv", "jsonl", "parquet"]
Engine = Literal["auto", "inline", "spark"]

OPS: Final = ("count", "sum", "mean", "min", "max")
NUMERIC_OPS: Final = ("sum", "mean", "min", "max")
FORMATS: Final = ("csv", "jsonl", "parquet")
ENGINES: Final = ("auto", "inline", "spark")
DEFAULT_NULL_VALUES: Final = ("", "NA")


class TooManyGroups(LimitExceeded):
    """The input has more distinct groups than `limit` (`seen` is how many were counted when it
    was noticed: more than the limit, not necessarily all of them)."""

    def __init__(self, limit: int, seen: int) -> None:
        self.limit, self.seen = limit, seen
        super().__init__(f"the input has more than {limit} groups ({seen} found before stopping)")


class ByteStream(Protocol):
    """A binary stream: a local file, io.BytesIO, or the blob reader. `readinto` is used when present."""

    def read(self, size: int = -1, /) -> bytes | None: ...


@dataclass(frozen=True)
class MetricSpec:
    """One output column: `op` over `column` (None: count rows), named `name`."""

    op: Op
    column: str | None
    name: str


PARTIALS: Final[Mapping[Op, tuple[str, ...]]] = {
    "count": ("count",),
    "sum": ("sum",),
    "mean": ("sum", "count"),
    "min": ("min",),
    "max": ("max",),
}
"""The partial aggregates of its column a metric needs: each can be computed per block (or per
Spark task) and combined (counts and sums add, min of mins, max of maxes); a mean is a sum over a
count. A metric without a column counts rows, which every partial table holds."""


def partials_by_column(metrics: Sequence[MetricSpec]) -> dict[str, list[str]]:
    """The value columns the metrics read (in order of first use) and the partial aggregates each
    needs (`PARTIALS`, in order of first need): the one rule of the inline engine and Spark."""
    needs: dict[str, list[str]] = {}
    for metric in metrics:
        if metric.column is None:
            continue
        funcs = needs.setdefault(metric.column, [])
        funcs.extend(f for f in PARTIALS[metric.op] if f not in funcs)
    return needs


@dataclass(frozen=True)
class AggregateSpec:
    """A validated `aggregate` payload (see `shared.aggregation.payload.parse_aggregate_payload`)."""

    container: str
    blob: str
    format: Format
    group_by: tuple[str, ...]
    metrics: tuple[MetricSpec, ...]
    engine: Engine = "auto"
    null_values: tuple[str, ...] = DEFAULT_NULL_VALUES
    output: OutputSpec = JSON_OUTPUT
    """How the result is written (`shared.aggregation.output`): json, parquet or csv."""

    @property
    def input(self) -> str:
        """The input as written in the payload: '<container>/<blob path>'."""
        return f"{self.container}/{self.blob}"


@dataclass(frozen=True)
class AggregateResult:
    """Result rows (group columns then metrics, sorted by the group columns) and rows read."""

    rows: list[dict[str, Any]]
    input_rows: int

    @property
    def groups(self) -> int:
        return len(self.rows)
