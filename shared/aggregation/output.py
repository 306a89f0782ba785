"""What form an aggregate job's result takes: the payload's optional `output` object (pure).

    "output": {"format": "json" | "parquet" | "csv"}      # optional, default json

`json` (the default) is the result document itself, rows inline, bounded by MAX_GROUPS.
`parquet` and `csv` are data: the rows are written as a blob of their own beside the document,
in batches (`shared.aggregation.result_data`), and the document names it (its `output` member).
Both engines write them: the inline one from its result table, the Spark driver from its rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

OutputFormat = Literal["json", "parquet", "csv"]

OUTPUT_FORMATS: Final = ("json", "parquet", "csv")
DATA_FORMATS: Final = ("parquet", "csv")
"""The formats written as a blob of their own (not the result document's rows)."""
CONTENT_TYPES: Final = {
    "parquet": "application/vnd.apache.parquet",
    "csv": "text/csv; charset=utf-8",
}
_KEYS: Final = ("format",)
_SHOWN: Final = 80


@dataclass(frozen=True)
class OutputSpec:
    """How the result is written: `format` json (the document) or a data format (a blob)."""

    format: OutputFormat = "json"

    @property
    def is_data(self) -> bool:
        """True for parquet and csv: the rows go to a blob of their own."""
        return self.format in DATA_FORMATS


JSON_OUTPUT: Final = OutputSpec()


def parse_output(value: object, problems: list[str]) -> OutputSpec:
    """The payload's `output` (None: json); every problem appended to `problems`, naming the field."""
    field = "payload.output"
    if value is None:
        return JSON_OUTPUT
    if not isinstance(value, Mapping):
        problems.append(f'{field}: must be an object such as {{"format": "parquet"}}')
        return JSON_OUTPUT
    for key in value:
        if key not in _KEYS:
            problems.append(f"{field}: unknown key {_quoted(str(key))} (allowed: {', '.join(_KEYS)})")
    fmt = value.get("format", "json")
    if not isinstance(fmt, str):
        problems.append(f"{field}.format: must be a string (one of {', '.join(OUTPUT_FORMATS)})")
        return JSON_OUTPUT
    if fmt not in OUTPUT_FORMATS:
        problems.append(f"{field}.format: {_quoted(fmt)} is not one of {', '.join(OUTPUT_FORMATS)}")
        return JSON_OUTPUT
    return OutputSpec(format=_as_format(fmt))


def data_blob(job_id: str, version: int, fmt: str) -> str:
    """The data blob's name in the results container: one per job and payload version, so a
    retried write replaces it whole and an edited payload's run never overwrites an older one."""
    return f"{job_id}.v{version}.{fmt}"


def _as_format(value: str) -> OutputFormat:
    for fmt in ("json", "parquet", "csv"):
        if value == fmt:
            return fmt
    raise ValueError(value)


def _quoted(value: str) -> str:
    text = repr(value[: _SHOWN + 1])
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."
