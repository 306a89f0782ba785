"""The aggregate result document and where it lives: defined once, for the function (inline
engine and Spark tracking), the PySpark job (shipped to the cluster with this package) and the
API.

Document (compact JSON, members in this order, so its two ends can be checked without reading
the rows): `{"id":<job id>,"rows":[...],"input_rows":N,"engine":"inline"|"spark","elapsed_s":X}`.
With a data output (`output.format` parquet or csv) the rows are in a blob of their own and the
document names it instead: `{"id","output":{"format","result_ref","rows","bytes","columns"},
"input_rows","engine","elapsed_s"}` (`data_result_document`).
A Spark run that fails writes an error report: `{"id","submission","kind","error"}`, where kind
is input_data | payload | unexpected (the first two cannot be fixed by a new run).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from shared.core.errors import LimitExceeded

if TYPE_CHECKING:
    import pyarrow as pa

ERROR_KINDS: Final = ("input_data", "payload", "unexpected")
PERMANENT_KINDS: Final = frozenset({"input_data", "payload"})
TAIL: Final = re.compile(
    rb'\],"input_rows":(\d+),"engine":("(?:[^"\\]|\\.)*"),"elapsed_s":(-?[0-9.eE+-]+)\}\s*$'
)
"""The end of a document, after its rows."""


def result_blob(job_id: str) -> str:
    """The result document's name in the results container."""
    return f"{job_id}.json"


def result_ref(container: str, job_id: str) -> str:
    """'<container>/<blob>' as the ledger records it (`result_ref`) and the API serves it."""
    return f"{container}/{result_blob(job_id)}"


def error_blob(job_id: str, submission: int) -> str:
    """The error report a failing Spark run writes (one per submission)."""
    return f"_spark/{job_id}/error-s{submission}.json"


def dumps(value: object) -> bytes:
    """Compact UTF-8 JSON, as both engines write documents."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def head_bytes(job_id: str) -> bytes:
    """How a document of `job_id` begins, up to its first row."""
    return dumps({"id": job_id})[:-1] + b',"rows":['


def tail_bytes(input_rows: int, engine: str, elapsed_s: float) -> bytes:
    """How a document ends, after its last row (`TAIL` matches it)."""
    return b"]," + dumps({"input_rows": input_rows, "engine": engine, "elapsed_s": round(elapsed_s, 3)})[1:]


def result_document(
    job_id: str, rows: list[dict[str, Any]], input_rows: int, engine: str, elapsed_s: float
) -> dict[str, Any]:
    """The document as one object (the order of its members is the file's)."""
    return {
        "id": job_id,
        "rows": rows,
        "input_rows": input_rows,
        "engine": engine,
        "elapsed_s": round(elapsed_s, 3),
    }


def data_result_document(
    job_id: str, output: Mapping[str, Any], input_rows: int, engine: str, elapsed_s: float
) -> dict[str, Any]:
    """The document of a data output (parquet, csv): `output` names the blob holding the rows
    (`format`, `result_ref`, `rows`, `bytes`, `columns`) in place of the rows themselves."""
    return {
        "id": job_id,
        "output": dict(output),
        "input_rows": input_rows,
        "engine": engine,
        "elapsed_s": round(elapsed_s, 3),
    }


def is_result_of(doc: Mapping[str, Any] | None, job_id: str) -> bool:
    """A whole document that belongs to `job_id` (a stale or foreign one is not): its rows, or
    the `output` naming the blob that holds them."""
    if doc is None or doc.get("id") != job_id:
        return False
    return isinstance(doc.get("rows"), list) or isinstance(doc.get("output"), Mapping)


def error_document(job_id: str, submission: int, kind: str, message: str) -> dict[str, Any]:
    """A failing run's report."""
    return {
        "id": job_id,
        "submission": submission,
        "kind": kind if kind in ERROR_KINDS else "unexpected",
        "error": message[:2000],
    }


RESULT_BATCH_ROWS: Final = 8192
"""Result rows turned into Python objects at a time while the document is written."""


def result_json(
    job_id: str,
    table: pa.Table,
    input_rows: int,
    engine: str,
    elapsed_s: float,
    max_bytes: int | None = None,
    batch_rows: int = RESULT_BATCH_ROWS,
) -> bytes:
    """The bytes of `result_document` (compact JSON, UTF-8), `batch_rows` rows at a time.

    The same bytes as json.dumps of the whole document, without ever holding every row as Python
    objects. Over `max_bytes`, LimitExceeded is raised as soon as the text passes it.
    """

    out = io.BytesIO()
    out.write(head_bytes(job_id))
    first = True
    for batch in table.to_batches(max_chunksize=batch_rows):
        if batch.num_rows == 0:
            continue
        if not first:
            out.write(b",")
        out.write(dumps(batch.to_pylist())[1:-1])
        first = False
        if max_bytes is not None and out.tell() > max_bytes:
            raise _result_too_large(out.tell(), max_bytes, done=False)
    out.write(tail_bytes(input_rows, engine, elapsed_s))
    if max_bytes is not None and out.tell() > max_bytes:
        raise _result_too_large(out.tell(), max_bytes, done=True)
    return out.getvalue()


def _result_too_large(size: int, limit: int, done: bool) -> LimitExceeded:
    return LimitExceeded(
        f"the result document would be {'' if done else 'more than '}{size} bytes, over the {limit} "
        "that MAX_GROUPS allows (MAX_GROUPS x 512 bytes a row + 64 KiB): long group keys or many "
        "metrics; narrow group_by or the metrics, or raise MAX_GROUPS"
    )
