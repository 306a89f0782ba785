"""The `aggregate` payload: validated into an `AggregateSpec` (pure), every problem listed.

Payload::

    {"input": "<container>/<blob path>", "format": "csv" | "jsonl" | "parquet",
     "group_by": [column, ...],                       # optional, [] = one global group
     "metrics": [{"op": "count"} | {"op": "count" | "sum" | "mean" | "min" | "max",
                                    "column": name, "as": output name (optional)}],
     "engine": "auto" | "inline" | "spark",           # optional, default auto
     "null_values": ["", "NA"],                       # optional, default ["", "NA"]
     "output": {"format": "json" | "parquet" | "csv"}} # optional, default json (`output`)

The function validates a payload before it queues or runs the job; the Spark job parses the same
payload with the same function.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from shared.aggregation.output import parse_output
from shared.aggregation.spec import (
    DEFAULT_NULL_VALUES,
    ENGINES,
    FORMATS,
    NUMERIC_OPS,
    OPS,
    AggregateSpec,
    Engine,
    Format,
    MetricSpec,
    Op,
)
from shared.core.containers import is_host_container
from shared.core.errors import PayloadError

MAX_BLOB_PATH: Final = 1024
MAX_COLUMN_NAME: Final = 256
MAX_NULL_VALUES: Final = 100
_CONTAINER_RE = re.compile(r"^[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]$")
_TOP_KEYS = ("input", "format", "group_by", "metrics", "engine", "null_values", "output")
_METRIC_KEYS = ("op", "column", "as")


def check_blob_path(text: object, field: str) -> list[str]:
    """Problems with a blob path taken from a message (empty list: safe to use).

    Refuses path tricks: empty, longer than 1024 characters, a leading or doubled '/', a
    trailing '/', '.' or '..' segments, backslashes and control characters.
    """
    if not isinstance(text, str):
        return [f"{field}: must be a string, got {_json_type(text)}"]
    if not text:
        return [f"{field}: must not be empty"]
    problems: list[str] = []
    if len(text) > MAX_BLOB_PATH:
        problems.append(f"{field}: longer than {MAX_BLOB_PATH} characters ({len(text)})")
    if text.startswith("/"):
        problems.append(f"{field}: must not start with '/'")
    if text.endswith("/"):
        problems.append(f"{field}: must not end with '/'")
    if "//" in text:
        problems.append(f"{field}: must not contain '//'")
    if "\\" in text:
        problems.append(f"{field}: must not contain a backslash")
    if any(ord(ch) < 32 or 127 <= ord(ch) < 160 for ch in text):
        problems.append(f"{field}: must not contain control characters")
    if any(segment in (".", "..") for segment in text.split("/")):
        problems.append(f"{field}: must not contain '.' or '..' segments")
    return problems


def check_container_name(text: str, field: str) -> list[str]:
    """Problems with a blob container name (3-63 lower-case letters, digits, single hyphens)."""
    if _CONTAINER_RE.match(text):
        return []
    return [
        f"{field}: container {_quoted(text)} is not a valid container name "
        "(3-63 lower-case letters, digits and single hyphens)"
    ]


def parse_aggregate_payload(payload: object) -> AggregateSpec:
    """Validate an `aggregate` payload (pure); raises PayloadError listing every problem."""
    if not isinstance(payload, Mapping):
        raise PayloadError([f"payload: must be an object, got {_json_type(payload)}"])
    problems: list[str] = []
    for key in payload:
        if key not in _TOP_KEYS:
            problems.append(f"payload{_member(key)}: unknown key (allowed: {', '.join(_TOP_KEYS)})")
    container, blob = _input(payload, problems)
    fmt = _choice(payload, "format", FORMATS, None, problems)
    group_by = _string_list(payload, "group_by", problems, unique=True, column=True)
    metrics = _metrics(payload.get("metrics"), group_by, problems)
    engine = _choice(payload, "engine", ENGINES, "auto", problems)
    null_values = _string_list(payload, "null_values", problems, default=DEFAULT_NULL_VALUES)
    if len(null_values) > MAX_NULL_VALUES:
        problems.append(f"payload.null_values: at most {MAX_NULL_VALUES} values")
    output = parse_output(payload.get("output"), problems)
    if problems:
        raise PayloadError(problems)
    return AggregateSpec(
        container=container,
        blob=blob,
        format=_as_format(fmt),
        group_by=group_by,
        metrics=metrics,
        engine=_as_engine(engine),
        null_values=null_values,
        output=output,
    )


def _input(payload: Mapping[str, Any], problems: list[str]) -> tuple[str, str]:
    value = payload.get("input")
    field = "payload.input"
    if value is None:
        problems.append(f"{field}: required ('<container>/<blob path>')")
        return "", ""
    if not isinstance(value, str):
        problems.append(f"{field}: must be a string, got {_json_type(value)}")
        return "", ""
    container, sep, blob = value.partition("/")
    if not sep or not container:
        problems.append(f"{field}: must be '<container>/<blob path>', got {_quoted(value)}")
        return "", ""
    if is_host_container(container):  # needs no settings: refused here, at validation
        problems.append(
            f"{field}: container {_quoted(container)} belongs to the Functions host "
            "(azure-webjobs-* and $-prefixed containers are never job input)"
        )
    else:
        problems.extend(check_container_name(container, field))
    problems.extend(check_blob_path(blob, f"{field} (blob path)"))
    return container, blob


def _choice(
    payload: Mapping[str, Any], key: str, allowed: Sequence[str], default: str | None, problems: list[str]
) -> str:
    field = f"payload.{key}"
    value = payload.get(key, default)
    if value is None:
        problems.append(f"{field}: required (one of {', '.join(allowed)})")
        return allowed[0]
    if not isinstance(value, str):
        problems.append(f"{field}: must be a string, got {_json_type(value)}")
        return allowed[0]
    if value not in allowed:
        problems.append(f"{field}: {_quoted(value)} is not one of {', '.join(allowed)}")
        return allowed[0]
    return value


def _string_list(
    payload: Mapping[str, Any],
    key: str,
    problems: list[str],
    *,
    default: Sequence[str] = (),
    unique: bool = False,
    column: bool = False,
) -> tuple[str, ...]:
    field = f"payload.{key}"
    value = payload.get(key, list(default))
    if not isinstance(value, list):
        problems.append(f"{field}: must be a list of strings, got {_json_type(value)}")
        return ()
    items: list[str] = []
    for i, item in enumerate(value):
        item_problems = _column_problems(item, f"{field}[{i}]") if column else []
        if not isinstance(item, str):
            problems.append(f"{field}[{i}]: must be a string, got {_json_type(item)}")
        elif item_problems:
            problems.extend(item_problems)
        elif unique and item in items:
            problems.append(f"{field}[{i}]: {_quoted(item)} is listed twice")
        else:
            items.append(item)
    return tuple(items)


def _column_problems(value: object, field: str) -> list[str]:
    if not isinstance(value, str):
        return []
    if not value:
        return [f"{field}: a column name must not be empty"]
    if len(value) > MAX_COLUMN_NAME:
        return [f"{field}: a column name must be at most {MAX_COLUMN_NAME} characters"]
    return []


def _metrics(value: object, group_by: tuple[str, ...], problems: list[str]) -> tuple[MetricSpec, ...]:
    field = "payload.metrics"
    if value is None:
        problems.append(f"{field}: required (a non-empty list of {{'op': ..., 'column': ...}})")
        return ()
    if not isinstance(value, list):
        problems.append(f"{field}: must be a list, got {_json_type(value)}")
        return ()
    if not value:
        problems.append(f"{field}: must not be empty")
        return ()
    metrics: list[MetricSpec] = []
    names: dict[str, int] = {}
    for i, item in enumerate(value):
        metric = _metric(item, f"{field}[{i}]", problems)
        if metric is None:
            continue
        where = f"{field}[{i}]" + (".as" if isinstance(item, Mapping) and "as" in item else "")
        if metric.name in group_by:
            problems.append(f"{where}: output name {_quoted(metric.name)} collides with a group_by column")
        elif metric.name in names:
            problems.append(
                f"{where}: output name {_quoted(metric.name)} is already used by {field}[{names[metric.name]}]"
            )
        else:
            names[metric.name] = i
        metrics.append(metric)
    return tuple(metrics)


def _metric(item: object, field: str, problems: list[str]) -> MetricSpec | None:
    if not isinstance(item, Mapping):
        problems.append(f"{field}: must be an object, got {_json_type(item)}")
        return None
    before = len(problems)
    for key in item:
        if key not in _METRIC_KEYS:
            problems.append(f"{field}{_member(key)}: unknown key (allowed: {', '.join(_METRIC_KEYS)})")
    op = item.get("op")
    if op is None:
        problems.append(f"{field}.op: required (one of {', '.join(OPS)})")
    elif not isinstance(op, str):
        problems.append(f"{field}.op: must be a string, got {_json_type(op)}")
    elif op not in OPS:
        problems.append(f"{field}.op: {_quoted(op)} is not one of {', '.join(OPS)}")
    column = item.get("column")
    if column is None:
        if op in NUMERIC_OPS:
            problems.append(f"{field}.column: required for op {op!r}")
    elif not isinstance(column, str):
        problems.append(f"{field}.column: must be a string, got {_json_type(column)}")
    else:
        problems.extend(_column_problems(column, f"{field}.column"))
    name = item.get("as")
    if name is not None and not isinstance(name, str):
        problems.append(f"{field}.as: must be a string, got {_json_type(name)}")
    elif name is not None:
        problems.extend(_column_problems(name, f"{field}.as"))
    if len(problems) > before or not isinstance(op, str):
        return None
    col = column if isinstance(column, str) else None
    default = "count" if col is None else f"{op}_{col}"
    return MetricSpec(op=_as_op(op), column=col, name=name if isinstance(name, str) else default)


def _as_op(value: str) -> Op:
    for op in ("count", "sum", "mean", "min", "max"):
        if value == op:
            return op
    raise ValueError(value)


def _as_format(value: str) -> Format:
    for fmt in ("csv", "jsonl", "parquet"):
        if value == fmt:
            return fmt
    raise ValueError(value)


def _as_engine(value: str) -> Engine:
    for engine in ("auto", "inline", "spark"):
        if value == engine:
            return engine
    raise ValueError(value)


MAX_SHOWN: Final = 80
"""Characters of a name or value shown in a problem (escaped, then cut)."""


def _member(key: object) -> str:
    """`.key` for a plain printable key; `["..."]` (JSON-escaped, cut) for any other key."""
    if isinstance(key, str) and key.isprintable() and "." not in key and len(key) <= MAX_SHOWN:
        return f".{key}"
    if isinstance(key, str | int | float | bool) or key is None:
        text = json.dumps(key[: MAX_SHOWN + 1] if isinstance(key, str) else key)
    else:
        text = f"<{type(key).__name__}>"
    return f"[{_cut(text)}]"


def _quoted(value: str) -> str:
    """`value` quoted and escaped (repr: printable text), cut to MAX_SHOWN characters."""
    return _cut(repr(value[: MAX_SHOWN + 1]))


def _cut(text: str) -> str:
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__
