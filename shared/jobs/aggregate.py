"""The `aggregate` job kind: payload validation, engine choice, blob I/O and the handler.

The engine itself (pure, over a byte stream) is the `shared.aggregation` package.

Payload::

    {"input": "<container>/<blob path>", "format": "csv" | "jsonl",
     "group_by": [column, ...],                       # optional, [] = one global group
     "metrics": [{"op": "count"} | {"op": "count" | "sum" | "mean" | "min" | "max",
                                    "column": name, "as": output name (optional)}],
     "engine": "auto" | "inline" | "spark",           # optional, default auto
     "null_values": ["", "NA"]}                       # optional, default ["", "NA"]

Result blob `<results container>/<job id>.json`: see `result_document`.

Least privilege and bounded work: the input's container is checked before anything is read
(`shared.limits.input_refusal`: never the app's or the host's own containers; only
`INPUT_CONTAINERS` when set), and an inline run stops at `MAX_GROUPS` groups: `engine: auto` then
goes to Spark when a backend is configured, otherwise the job is poisoned naming the limit.
"""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeVar

import pyarrow as pa
from azure.core.exceptions import AzureError
from azure.storage.blob import BlobClient, ContentSettings

from shared import aggregation, blob_reader
from shared.aggregation import (
    DEFAULT_NULL_VALUES,
    ENGINES,
    FORMATS,
    NUMERIC_OPS,
    OPS,
    AggregateResult,
    AggregateSpec,
    Engine,
    Format,
    MetricSpec,
    Op,
    TooManyGroups,
    aggregate_stream,
    aggregate_table,
)
from shared.blob_reader import reader_for
from shared.containers import is_host_container
from shared.errors import (
    InputRefused,
    LimitExceeded,
    NotAvailable,
    PayloadError,
    StorageThrottled,
)
from shared.jobs import aggregate_offload, aggregate_result
from shared.jobs.base import Completed, JobContext, Outcome
from shared.limits import input_refusal, result_limit_bytes
from shared.settings import Settings
from shared.storage import StorageClients, is_throttled

if not aggregation.NATIVE:  # the remote build could not compile native/: same answers, slower
    logging.getLogger(__name__).warning(
        "the aggregate engine's C scanner (aggkernel, native/) is not installed: aggregate jobs "
        "run on the pyarrow path alone (same results; measured ~2x slower on CSV, ~4x on JSON "
        "lines); rebuild with a C compiler available (pip install ./native)"
    )

KIND: Final = "aggregate"
MAX_BLOB_PATH: Final = 1024
MAX_COLUMN_NAME: Final = 256
MAX_NULL_VALUES: Final = 100
BLOB_CHUNK_BYTES: Final = blob_reader.CHUNK_BYTES
"""Bytes per ranged GET of the input blob."""
BLOB_MAX_CONCURRENCY: Final = blob_reader.DEPTH
"""Ranged GETs in flight ahead of the engine: memory <= (this + 1 + blob_reader.LEND) *
BLOB_CHUNK_BYTES (the engine parses blocks in the reader's buffers, `LEND` at most at once)."""

T = TypeVar("T")
_CONTAINER_RE = re.compile(r"^[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]$")
_TOP_KEYS = ("input", "format", "group_by", "metrics", "engine", "null_values")
_METRIC_KEYS = ("op", "column", "as")


# --- validation --------------------------------------------------------------------------------


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
    return "jsonl" if value == "jsonl" else "csv"


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


# --- engine choice and result document ---------------------------------------------------------


def check_input(spec: AggregateSpec, settings: Settings) -> None:
    """InputRefused when the settings forbid reading the input's container (pure, no I/O).

    The reason names the field and the rule, never anything stored in the container.
    """
    refusal = input_refusal(spec.container, settings)
    if refusal is not None:
        raise InputRefused(refusal)


def spark_takes_over(spec: AggregateSpec, settings: Settings) -> bool:
    """True when an inline run that reaches MAX_GROUPS goes to Spark instead (pure)."""
    return spec.engine == "auto" and settings.spark.backend != "none"


def too_many_groups(spec: AggregateSpec, settings: Settings, exc: TooManyGroups) -> LimitExceeded:
    """The permanent error of an inline run past MAX_GROUPS: the limit and what to do."""
    spark = (
        "configure a Spark backend (SPARK_BACKEND) and use engine 'auto'"
        if settings.spark.backend == "none"
        else "use engine 'auto' or 'spark' (a Spark backend is configured)"
    )
    grouped = ", ".join(spec.group_by)
    return LimitExceeded(
        f"the input has more than MAX_GROUPS={settings.max_groups} groups "
        f"(group_by: {_cut(grouped) or 'none'}; {exc.seen} found before stopping): "
        f"narrow group_by, raise MAX_GROUPS, or {spark}"
    )


def choose_engine(spec: AggregateSpec, blob_size: int | None, settings: Settings) -> str:
    """'inline' or 'spark' (pure). `auto` offloads inputs over the threshold when Spark exists."""
    if spec.engine != "auto":
        return spec.engine
    spark = settings.spark
    if spark.backend != "none" and blob_size is not None and blob_size > spark.offload_threshold_bytes:
        return "spark"
    return "inline"


def result_document(job_id: str, result: AggregateResult, engine: str, elapsed_s: float) -> dict[str, Any]:
    """The result blob's JSON document (shape: `shared.jobs.aggregate_result`)."""
    return aggregate_result.result_document(job_id, result.rows, result.input_rows, engine, elapsed_s)


RESULT_BATCH_ROWS: Final = 8192
"""Result rows turned into Python objects at a time while the document is written."""


def result_json(
    job_id: str,
    table: pa.Table,
    input_rows: int,
    engine: str,
    elapsed_s: float,
    max_bytes: int | None = None,
) -> bytes:
    """The bytes of `result_document` (compact JSON, UTF-8), `RESULT_BATCH_ROWS` rows at a time.

    The same bytes as json.dumps of the whole document, without ever holding every row as Python
    objects. Over `max_bytes`, LimitExceeded is raised as soon as the text passes it.
    """

    dumps = aggregate_result.dumps
    out = io.BytesIO()
    out.write(aggregate_result.head_bytes(job_id))
    first = True
    for batch in table.to_batches(max_chunksize=RESULT_BATCH_ROWS):
        if batch.num_rows == 0:
            continue
        if not first:
            out.write(b",")
        out.write(dumps(batch.to_pylist())[1:-1])
        first = False
        if max_bytes is not None and out.tell() > max_bytes:
            raise _result_too_large(out.tell(), max_bytes, done=False)
    out.write(aggregate_result.tail_bytes(input_rows, engine, elapsed_s))
    if max_bytes is not None and out.tell() > max_bytes:
        raise _result_too_large(out.tell(), max_bytes, done=True)
    return out.getvalue()


def _result_too_large(size: int, limit: int, done: bool) -> LimitExceeded:
    return LimitExceeded(
        f"the result document would be {'' if done else 'more than '}{size} bytes, over the {limit} "
        "that MAX_GROUPS allows (MAX_GROUPS x 512 bytes a row + 64 KiB): long group keys or many "
        "metrics; narrow group_by or the metrics, or raise MAX_GROUPS"
    )


# --- blob I/O ----------------------------------------------------------------------------------


BlobStream = blob_reader.BlobStream


def open_blob_stream(
    blob: BlobClient | blob_reader.Ranges,
    chunk_size: int = BLOB_CHUNK_BYTES,
    max_concurrency: int = BLOB_MAX_CONCURRENCY,
) -> BlobStream:
    """Open a blob for streaming reads (one GET now); InputMissing if it or its container is absent.

    Ranged GETs through `shared.blob_reader` with the client's account and credential; the
    engine takes its buffers as they are (`next_chunk` / `give_back`), without a copy.
    """
    ranges = (
        blob
        if isinstance(blob, blob_reader.Ranges)
        else reader_for(blob).ranges(blob.container_name, blob.blob_name)
    )
    return BlobStream(ranges, chunk_size, max_concurrency)


def write_result(blob: BlobClient, document: Mapping[str, Any] | bytes) -> None:
    """Upload the result document, or its bytes from `result_json` (overwrite: a re-run of the
    same job writes the same blob)."""
    data = document if isinstance(document, bytes) else aggregate_result.dumps(document)
    label = f"{blob.container_name}/{blob.blob_name}"
    settings = ContentSettings(content_type="application/json; charset=utf-8")
    try:
        blob.upload_blob(data, overwrite=True, content_settings=settings)
    except AzureError as exc:
        if is_throttled(exc):
            raise StorageThrottled(f"storage busy writing {label}") from exc
        raise


# --- the handler -------------------------------------------------------------------------------


class AggregateHandler:
    """Group-by aggregation of a CSV / JSON-lines blob into `<results>/<job id>.json`."""

    kind = KIND

    def validate(self, payload: Mapping[str, Any]) -> None:
        """Raise PayloadError listing every problem; no I/O."""
        parse_aggregate_payload(payload)

    def run(self, ctx: JobContext) -> Outcome:
        """Stream the input through the inline engine and write the result document."""
        spec = parse_aggregate_payload(ctx.payload)
        check_input(spec, ctx.settings)  # before any read, and before any Spark run is followed
        if ctx.resume_state is not None:  # offloaded earlier: follow the Spark run, never resubmit blindly
            return aggregate_offload.resume(ctx, spec)
        if spec.engine == "spark" and ctx.settings.spark.backend == "none":
            raise NotAvailable("engine 'spark' is not available: SPARK_BACKEND=none")
        started = time.monotonic()
        source = ctx.storage.blob.get_blob_client(spec.container, spec.blob)
        settings = ctx.settings
        over_cap = False
        with open_blob_stream(source) as stream:
            size = stream.size
            engine = choose_engine(spec, size, settings)
            if engine == "spark":
                return self.run_spark(ctx, spec, size, "engine" if spec.engine == "spark" else "size")
            try:
                table, input_rows = aggregate_table(stream, spec, max_groups=settings.max_groups)
            except TooManyGroups as exc:
                if not spark_takes_over(spec, settings):
                    raise too_many_groups(spec, settings, exc) from None
                over_cap = True  # offload once the stream and the partial aggregates are gone
        if over_cap:
            ctx.log.info(
                "aggregate %s: more than MAX_GROUPS=%d groups after %.2fs inline: handing it to Spark",
                spec.input,
                settings.max_groups,
                time.monotonic() - started,
            )
            return self.run_spark(ctx, spec, size, "max_groups")
        elapsed = time.monotonic() - started
        container = settings.results_container
        name = aggregate_result.result_blob(ctx.job_id)
        limit = result_limit_bytes(settings.max_groups)
        data = result_json(ctx.job_id, table, input_rows, "inline", elapsed, max_bytes=limit)
        groups = table.num_rows
        del table
        write_result(ctx.storage.blob.get_blob_client(container, name), data)
        ctx.log.info(
            "aggregate %s: %d rows -> %d groups in %.2fs (inline)", spec.input, input_rows, groups, elapsed
        )
        return Completed(
            result_ref=aggregate_result.result_ref(container, ctx.job_id),
            summary={"input_rows": input_rows, "groups": groups, "engine": "inline"},
        )

    def run_spark(self, ctx: JobContext, spec: AggregateSpec, blob_size: int, reason: str) -> Outcome:
        """Hand the job to the configured Spark backend; the ledger tracks it as `offloaded`.

        `reason` (engine | size | max_groups) is kept in the offload state on the ledger.
        """
        return aggregate_offload.offload(ctx, spec, reason=reason)

    def abandon(
        self, settings: Settings, storage: StorageClients, job_id: str, state: Mapping[str, Any]
    ) -> Mapping[str, Any] | None:
        """The job is poisoned while offloaded: cancel its Spark run on the cluster, free its slot."""
        return aggregate_offload.abandon(settings, storage, job_id, state)


HANDLER: Final = AggregateHandler()

__all__ = [
    "HANDLER",
    "KIND",
    "AggregateHandler",
    "AggregateResult",
    "AggregateSpec",
    "BlobStream",
    "MetricSpec",
    "aggregate_stream",
    "check_blob_path",
    "check_container_name",
    "check_input",
    "choose_engine",
    "open_blob_stream",
    "parse_aggregate_payload",
    "result_document",
    "result_json",
    "write_result",
]
